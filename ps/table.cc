#include "ps/table.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cluster/job_spec_check.h"
#include "core/hashing.h"
#include "core/logging.h"
#include "cluster/initializer.h"
#include "ps/admission.h"
#include "ps/kv_store.h"
#include "ps/optimizer.h"
#include "ps/write_queue.h"

namespace eps {
namespace {

// Releases a held mutex for its lifetime and takes it back at its end: the
// RAII way to do blocking work (a store read) inside a locked section.
class ABSL_SCOPED_LOCKABLE ScopedUnlock {
 public:
  explicit ScopedUnlock(absl::Mutex* mu) ABSL_UNLOCK_FUNCTION(mu) : mu_(mu) { mu_->Unlock(); }
  ~ScopedUnlock() ABSL_UNLOCK_FUNCTION() { mu_->Lock(); }
  ScopedUnlock(const ScopedUnlock&) = delete;
  ScopedUnlock& operator=(const ScopedUnlock&) = delete;

 private:
  absl::Mutex* const mu_;
};

// A key's stripe is the top kStripeBits of Mix64(key), its index bucket the
// low bits and its index tag bits 26..57 of the same hash, so the three are
// independent. (Partitions use a differently salted Mix64, so all stripes
// stay busy on every server.)
constexpr int kStripeBits = 6;
constexpr uint32_t kNumStripes = 1u << kStripeBits;

// An index entry holding this slot is empty.
constexpr uint32_t kEmptySlot = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kMinIndexCapacity = 16;
// Largest index capacity: 2^31 entries is far beyond memory.
constexpr uint32_t kMaxIndexCapacity = 1u << 31;

// Arena blocks per stripe start at kMinBlockRows rows and double up to
// kMaxBlockRows (fewer for wide rows, so that a block stays near
// kMaxBlockFloats): small tables stay small, large ones allocate in steps
// of at most ~1 MiB.
constexpr uint32_t kMinBlockRows = 16;
constexpr uint32_t kMaxBlockRows = 4096;
constexpr uint64_t kMaxBlockFloats = uint64_t{1} << 18;

// How many keys ahead lookups prefetch index buckets and rows.
constexpr uint32_t kIndexPrefetchDistance = 8;
constexpr uint32_t kRowPrefetchDistance = 4;

// Rounds of store reads made without the stripe lock before one is made
// holding it (which always completes: nothing can be evicted meanwhile).
constexpr int kUnlockedFetchRounds = 3;

inline uint32_t StripeOf(uint64_t hash) {
  return static_cast<uint32_t>(hash >> (64 - kStripeBits));
}
inline uint32_t TagOf(uint64_t hash) { return static_cast<uint32_t>(hash >> 26); }

// Per-row metadata, 16 bytes, in blocks parallel to the row arena.
enum : uint8_t {
  kLive = 1,        // the slot holds a row
  kDirty = 4,       // changed since its image was last queued for the store
  kPending = 8,     // an image was queued; durable once pending_seq is
  // Bits 4-5: a use count (GCLOCK): +1 per access up to 3, -1 each time the
  // eviction hand passes; a row is evicted when the hand finds it at 0. A
  // count rather than CLOCK's single bit keeps the often-used rows of a
  // skewed (Zipf) access pattern, which a single bit cannot tell from rows
  // used once.
  kUseShift = 4,
  kUseMask = 3 << kUseShift,
};
// Sequence numbers kept per row: 56 bits never wrap (2^56 row writes is
// over 200 years at 10M rows/s). A narrower, wrapping number would make a
// row that stays unwritten for half its range look not yet durable, and so
// unevictable, until it is written again.
constexpr int kSeqBits = 56;
struct SlotMeta {
  uint64_t key;
  uint64_t flags : 8;
  uint64_t pending_seq : kSeqBits;  // the queue sequence number of its last image
};
static_assert(sizeof(SlotMeta) == 16);
inline void NoteUse(SlotMeta& meta) {
  if ((meta.flags & kUseMask) != kUseMask) meta.flags = meta.flags + (1 << kUseShift);
}
// The row's image `seq` was queued for the store.
inline void MarkQueued(SlotMeta& meta, uint64_t seq) {
  CHECK_LT(seq, uint64_t{1} << kSeqBits) << "write sequence numbers exhausted";
  meta.pending_seq = seq;
  meta.flags = (meta.flags | kPending) & ~uint64_t{kDirty};
}

struct IndexEntry {
  uint32_t tag;
  uint32_t slot;  // kEmptySlot when the entry is free
};
static_assert(sizeof(IndexEntry) == 8);

class StripedTable final : public Table {
 public:
  StripedTable(const proto::TableSpec& spec, uint64_t seed, std::unique_ptr<Optimizer> optimizer,
               const TableStorage& storage);

  const proto::TableSpec& spec() const override { return spec_; }
  using Table::Pull;
  Status Pull(std::span<const uint64_t> keys, std::span<float> out, uint64_t* created) override;
  using Table::Push;
  Status Push(std::span<const uint64_t> keys, std::span<const float> grads, float lr_scale,
              uint64_t* created) override;
  Status Put(std::span<const uint64_t> keys, std::span<const float> values,
             uint32_t width) override;
  uint64_t QueueDirtyRows() override;
  uint64_t EvictToBudget() override;
  TableStats stats() const override;
  uint64_t bytes_per_row() const override { return bytes_per_row_; }
  uint32_t row_floats() const override { return row_floats_; }
  void VisitResident(const std::function<void(uint64_t, const float*)>& visit) override;

 private:
  // Counts `rows` refused updates; warns on the first and then whenever the
  // count reaches the next power of two (not per row: pushes are hot).
  void CountRefused(uint64_t rows);

  // One lock, one open-addressing index (linear probing, power-of-two
  // capacity, load <= 0.7, backward-shift deletion) and one arena of rows
  // with their metadata. Freed slots are reused.
  struct alignas(64) Stripe {
    absl::Mutex mu;
    std::unique_ptr<IndexEntry[]> index ABSL_GUARDED_BY(mu);
    uint32_t index_capacity ABSL_GUARDED_BY(mu) = 0;
    uint32_t live ABSL_GUARDED_BY(mu) = 0;        // rows in memory
    uint32_t high_water ABSL_GUARDED_BY(mu) = 0;  // slots ever used
    std::vector<uint32_t> free_slots ABSL_GUARDED_BY(mu);
    // Block b holds BlockRows(b) rows; blocks are never freed or moved.
    std::vector<std::unique_ptr<float[]>> blocks ABSL_GUARDED_BY(mu);
    std::vector<std::unique_ptr<SlotMeta[]>> meta_blocks ABSL_GUARDED_BY(mu);
    uint32_t arena_rows ABSL_GUARDED_BY(mu) = 0;
    // Slots with kDirty set, each once.
    std::vector<uint32_t> dirty ABSL_GUARDED_BY(mu);
    uint32_t clock_hand ABSL_GUARDED_BY(mu) = 0;
    // Rises with every eviction: a row read from the store while the lock
    // was released is current only if no eviction happened meanwhile.
    uint64_t evictions ABSL_GUARDED_BY(mu) = 0;
  };

  // Resolves every key's row (reading missing ones from the store or
  // creating them), then calls visit(position in keys, row) for each key,
  // stripe by stripe, in request order within a stripe, under that stripe's
  // lock. With `modify`, visited rows are changed: they become dirty, or
  // with write_every_push are queued at once (*max_seq gets the highest
  // sequence number queued). *created counts the rows created (read from
  // neither memory nor the store).
  // Whether a row may be made for a key in neither memory nor the store.
  enum class Creation {
    kAlways,  // made by the initializer
    kNever,   // not made: visited with a null row
    kAdmit,   // made when admission_ admits it (Sight); else visited with null
  };
  template <typename Visit>
  Status ForEachRow(std::span<const uint64_t> keys, bool modify, uint64_t* max_seq,
                    uint64_t* created, Visit&& visit, Creation creation = Creation::kAlways);

  // The slot holding `key`, or kEmptySlot.
  uint32_t FindLocked(const Stripe& stripe, uint64_t key, uint64_t hash) const
      ABSL_SHARED_LOCKS_REQUIRED(stripe.mu);
  // Inserts `key` (absent) with the row `image` (row_floats_ floats) or,
  // when null, a newly initialised row. Returns its slot.
  uint32_t InsertLocked(Stripe& stripe, uint64_t key, uint64_t hash, const float* image)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  void GrowIndexLocked(Stripe& stripe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  void RemoveFromIndexLocked(Stripe& stripe, uint64_t key, uint64_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // Evicts up to `count` rows whose image is durable, in GCLOCK order,
  // while the budget is exceeded, moving the hand at most `steps` slots.
  // Returns the rows evicted.
  uint64_t EvictLocked(Stripe& stripe, uint64_t count, uint64_t steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  bool DurableLocked(const SlotMeta& meta) const;
  // One stripe's share of the rows over the budget (0 when not over).
  uint64_t ExcessShare() const;
  // Reads the rows of `keys` from the store into `images` (row_floats_ each);
  // found[i] says which exist.
  Status Fetch(const std::vector<uint64_t>& keys, std::vector<float>* images,
               std::vector<bool>* found);

  float* RowLocked(const Stripe& stripe, uint32_t slot) const ABSL_SHARED_LOCKS_REQUIRED(stripe.mu);
  SlotMeta& MetaLocked(const Stripe& stripe, uint32_t slot) const
      ABSL_SHARED_LOCKS_REQUIRED(stripe.mu);
  void Locate(uint32_t slot, uint32_t* block, uint32_t* offset) const;
  uint32_t BlockRows(size_t block) const {
    return block < doubling_blocks_ ? (min_block_rows_ << block) : max_block_rows_;
  }

  const proto::TableSpec spec_;
  const uint64_t seed_;
  const std::unique_ptr<Optimizer> optimizer_;
  const TableStorage storage_;
  const int dim_;
  const uint32_t row_floats_;  // dim_ weights, then the optimizer state
  // Budget charge per resident row: the row, its metadata, and its share of
  // an index kept between 35% and 70% full.
  const uint64_t bytes_per_row_;
  // Arena geometry (see kMinBlockRows): blocks [0, doubling_blocks_) hold
  // min_block_rows_ << b rows, doubling_rows_ in all; later ones
  // max_block_rows_. Both row counts are powers of two.
  uint32_t min_block_rows_;
  uint32_t max_block_rows_;
  int min_block_rows_log2_;
  int max_block_rows_log2_;
  uint32_t doubling_blocks_;
  uint32_t doubling_rows_;

  std::unique_ptr<Stripe[]> stripes_;
  std::atomic<uint64_t> rows_{0};
  std::atomic<uint64_t> memory_bytes_{0};
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> updates_refused_{0};
  // Null unless spec_.admission_min_count() >= 2.
  std::unique_ptr<AdmissionFilter> admission_;
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> rejected_{0};
};

StripedTable::StripedTable(const proto::TableSpec& spec, uint64_t seed,
                           std::unique_ptr<Optimizer> optimizer, const TableStorage& storage)
    : spec_(spec),
      seed_(seed),
      optimizer_(std::move(optimizer)),
      storage_(storage),
      dim_(static_cast<int>(spec.dim())),
      row_floats_(static_cast<uint32_t>(dim_ + optimizer_->state_floats(dim_))),
      bytes_per_row_(sizeof(float) * row_floats_ + sizeof(SlotMeta) + 2 * sizeof(IndexEntry)),
      stripes_(std::make_unique<Stripe[]>(kNumStripes)) {
  const uint64_t fit = std::max<uint64_t>(1, kMaxBlockFloats / row_floats_);
  max_block_rows_ = static_cast<uint32_t>(std::min<uint64_t>(kMaxBlockRows, std::bit_floor(fit)));
  min_block_rows_ = std::min(kMinBlockRows, max_block_rows_);
  min_block_rows_log2_ = std::countr_zero(min_block_rows_);
  max_block_rows_log2_ = std::countr_zero(max_block_rows_);
  doubling_blocks_ = static_cast<uint32_t>(max_block_rows_log2_ - min_block_rows_log2_);
  doubling_rows_ = max_block_rows_ - min_block_rows_;
  if (spec.admission_min_count() >= 2) {
    admission_ = std::make_unique<AdmissionFilter>(spec.admission_min_count(),
                                                   storage.admission_candidates);
  }
}

Status StripedTable::Fetch(const std::vector<uint64_t>& keys, std::vector<float>* images,
                           std::vector<bool>* found) {
  images->resize(keys.size() * row_floats_);
  const size_t row_bytes = sizeof(float) * row_floats_;
  return storage_.store->MultiGet(
      spec_.id(), keys, row_bytes,
      std::span<char>(reinterpret_cast<char*>(images->data()), keys.size() * row_bytes), found);
}

template <typename Visit>
Status StripedTable::ForEachRow(std::span<const uint64_t> keys, bool modify, uint64_t* max_seq,
                                uint64_t* created, Visit&& visit, Creation creation) {
  const size_t n = keys.size();
  if (n == 0) return absl::OkStatus();
  CHECK_LT(n, size_t{std::numeric_limits<uint32_t>::max()}) << "request too large";

  // Counting sort of the positions by stripe (stable, so duplicates keep
  // their order), then one lock per stripe touched.
  auto hashes = std::make_unique_for_overwrite<uint64_t[]>(n);
  auto order = std::make_unique_for_overwrite<uint32_t[]>(n);
  auto slots = std::make_unique_for_overwrite<uint32_t[]>(n);
  std::array<uint32_t, kNumStripes + 1> begin{};
  for (size_t i = 0; i < n; ++i) {
    hashes[i] = Mix64(keys[i]);
    ++begin[StripeOf(hashes[i]) + 1];
  }
  for (uint32_t s = 0; s < kNumStripes; ++s) begin[s + 1] += begin[s];
  std::array<uint32_t, kNumStripes> next;
  std::copy(begin.begin(), begin.begin() + kNumStripes, next.begin());
  for (size_t i = 0; i < n; ++i) order[next[StripeOf(hashes[i])]++] = static_cast<uint32_t>(i);

  const size_t row_bytes = sizeof(float) * row_floats_;
  uint64_t hits = 0;
  uint64_t misses = 0;
  // Positions j whose key got no row (Creation kNever or not admitted):
  // visited with a null row.
  std::vector<bool> rowless;
  if (creation != Creation::kAlways) rowless.assign(n, false);
  const auto may_create = [&](uint64_t key) {
    switch (creation) {
      case Creation::kAlways: return true;
      case Creation::kNever: return false;
      case Creation::kAdmit: return admission_->Sight(key);
    }
    return true;
  };

  // With a store: first find, stripe by stripe, which rows are not in
  // memory, and read them all with one MultiGet without holding any lock.
  // A stripe uses what was read only if it evicted nothing meanwhile (an
  // eviction could make a read stale); otherwise it reads again itself.
  std::vector<uint64_t> fetch_keys;
  std::vector<float> images;
  std::vector<bool> found;
  std::array<uint64_t, kNumStripes> evictions_seen{};
  // prefetched[j]: index into fetch_keys of the row read for position j.
  std::unique_ptr<uint32_t[]> prefetched;
  if (storage_.store != nullptr) {
    prefetched = std::make_unique_for_overwrite<uint32_t[]>(n);
    for (uint32_t s = 0; s < kNumStripes; ++s) {
      if (begin[s] == begin[s + 1]) continue;
      Stripe& stripe = stripes_[s];
      absl::MutexLock lock(&stripe.mu);
      evictions_seen[s] = stripe.evictions;
      for (uint32_t j = begin[s]; j < begin[s + 1]; ++j) {
        const uint32_t i = order[j];
        prefetched[j] = kEmptySlot;
        if (FindLocked(stripe, keys[i], hashes[i]) != kEmptySlot) continue;
        prefetched[j] = static_cast<uint32_t>(fetch_keys.size());
        fetch_keys.push_back(keys[i]);
      }
    }
    if (!fetch_keys.empty()) {
      RETURN_IF_ERROR_CTX(Fetch(fetch_keys, &images, &found),
                          absl::StrCat("reading rows of table '", spec_.name(), "'"));
    }
  }

  // Each stripe evicts what the request may add to it plus its share of
  // the excess over the budget when the request began, so that an excess
  // left behind (rows that could not leave memory until written) shrinks
  // as requests arrive, not by one row per stripe and request.
  const uint64_t excess_share = ExcessShare();

  std::vector<uint32_t> absent;  // positions j (into order) not in memory
  std::vector<uint64_t> refetch_keys;
  std::vector<float> refetch_images;
  std::vector<bool> refetch_found;
  for (uint32_t s = 0; s < kNumStripes; ++s) {
    const uint32_t first = begin[s];
    const uint32_t last = begin[s + 1];
    if (first == last) continue;
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    const bool prefetch_current = storage_.store != nullptr && stripe.evictions == evictions_seen[s];
    for (int round = 0;; ++round) {
      absent.clear();
      for (uint32_t j = first; j < last; ++j) {
        if (j + kIndexPrefetchDistance < last && stripe.index_capacity != 0) {
          const uint64_t ahead = hashes[order[j + kIndexPrefetchDistance]];
          __builtin_prefetch(&stripe.index[ahead & (stripe.index_capacity - 1)]);
        }
        slots[j] = FindLocked(stripe, keys[order[j]], hashes[order[j]]);
        if (slots[j] == kEmptySlot && (rowless.empty() || !rowless[j])) absent.push_back(j);
      }
      if (round == 0) {
        misses += absent.size();
        hits += (last - first) - absent.size();
      }
      if (absent.empty()) break;
      if (storage_.store == nullptr) {
        for (uint32_t j : absent) {
          const uint32_t i = order[j];
          slots[j] = FindLocked(stripe, keys[i], hashes[i]);  // a duplicate inserted just now
          if (slots[j] == kEmptySlot) {
            if (!may_create(keys[i])) {
              rowless[j] = true;
              continue;
            }
            slots[j] = InsertLocked(stripe, keys[i], hashes[i], nullptr);
            ++*created;
          }
        }
        break;
      }
      if (round == 0 && prefetch_current) {
        // Every absent row was absent before the read too (nothing was
        // evicted since), so the shared read covers it.
        for (uint32_t j : absent) {
          const uint32_t i = order[j];
          if (FindLocked(stripe, keys[i], hashes[i]) != kEmptySlot) continue;  // a duplicate
          const uint32_t f = prefetched[j];
          CHECK_NE(f, kEmptySlot);
          if (!found[f] && !may_create(keys[i])) {
            rowless[j] = true;
            continue;
          }
          InsertLocked(stripe, keys[i], hashes[i],
                       found[f] ? images.data() + size_t{f} * row_floats_ : nullptr);
          *created += !found[f];
        }
        continue;  // resolve again
      }
      // Read this stripe's absent rows on its own: without the lock for a
      // few rounds, then holding it (nothing can be evicted meanwhile).
      refetch_keys.clear();
      for (uint32_t j : absent) refetch_keys.push_back(keys[order[j]]);
      const uint64_t evictions_before = stripe.evictions;
      const bool unlocked = round < kUnlockedFetchRounds;
      Status fetched;
      {
        std::optional<ScopedUnlock> unlock;
        if (unlocked) unlock.emplace(&stripe.mu);
        fetched = Fetch(refetch_keys, &refetch_images, &refetch_found);
      }
      if (!fetched.ok()) {
        return Annotate(fetched, absl::StrCat("reading rows of table '", spec_.name(), "'"));
      }
      if (unlocked && stripe.evictions != evictions_before) continue;  // maybe stale: again
      for (size_t a = 0; a < absent.size(); ++a) {
        const uint32_t i = order[absent[a]];
        if (FindLocked(stripe, keys[i], hashes[i]) != kEmptySlot) continue;  // inserted meanwhile
        if (!refetch_found[a] && !may_create(keys[i])) {
          rowless[absent[a]] = true;
          continue;
        }
        InsertLocked(stripe, keys[i], hashes[i],
                     refetch_found[a] ? refetch_images.data() + a * row_floats_ : nullptr);
        *created += !refetch_found[a];
      }
      // Resolve again: every key is present now (this round holds the lock
      // from the inserts on).
    }
    uint32_t inserted_or_touched = last - first;
    for (uint32_t j = first; j < last; ++j) {
      const uint32_t slot = slots[j];
      if (slot == kEmptySlot) {
        visit(order[j], static_cast<float*>(nullptr));  // rowless
        continue;
      }
      if (j + kRowPrefetchDistance < last && slots[j + kRowPrefetchDistance] != kEmptySlot) {
        const float* ahead = RowLocked(stripe, slots[j + kRowPrefetchDistance]);
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + row_floats_ - 1);
      }
      float* row = RowLocked(stripe, slot);
      visit(order[j], row);
      SlotMeta& meta = MetaLocked(stripe, slot);
      NoteUse(meta);
      if (!modify || storage_.store == nullptr) continue;
      if (storage_.write_every_push) {
        const uint64_t seq = storage_.queue->Append(spec_.id(), meta.key, row, row_bytes);
        MarkQueued(meta, seq);
        *max_seq = std::max(*max_seq, seq);
      } else if (!(meta.flags & kDirty)) {
        meta.flags |= kDirty;
        stripe.dirty.push_back(slot);
      }
    }
    if (storage_.budget != nullptr && storage_.budget->over()) {
      // Bounded work per request; the hand keeps its place across calls, so
      // successive calls sweep the whole stripe.
      const uint64_t count = uint64_t{inserted_or_touched} + 1 + excess_share;
      EvictLocked(stripe, count,
                  std::min<uint64_t>(2 * uint64_t{stripe.high_water}, 16 * count + 64));
    }
  }
  hits_.fetch_add(hits, std::memory_order_relaxed);
  misses_.fetch_add(misses, std::memory_order_relaxed);
  return absl::OkStatus();
}

Status StripedTable::Pull(std::span<const uint64_t> keys, std::span<float> out,
                          uint64_t* created) {
  CHECK_EQ(out.size(), keys.size() * dim_) << "Pull of table " << spec_.id();
  const size_t row_bytes = sizeof(float) * dim_;
  float* const dst = out.data();
  uint64_t max_seq = 0;
  uint64_t new_rows = 0;
  // Under admission a pull makes no row: an id without one reads as its
  // initializer makes it.
  const Status pulled = ForEachRow(
      keys, /*modify=*/false, &max_seq, &new_rows,
      [&](uint32_t i, const float* row) {
        if (row != nullptr) {
          std::memcpy(dst + size_t{i} * dim_, row, row_bytes);
        } else {
          InitializeRow(spec_.initializer(), seed_, spec_.id(), keys[i], dst + size_t{i} * dim_,
                        dim_);
        }
      },
      admission_ != nullptr ? Creation::kNever : Creation::kAlways);
  if (created != nullptr) *created = new_rows;
  return pulled;
}

Status StripedTable::Push(std::span<const uint64_t> keys, std::span<const float> grads,
                          float lr_scale, uint64_t* created) {
  CHECK_EQ(grads.size(), keys.size() * dim_) << "Push to table " << spec_.id();
  const float* const src = grads.data();
  const Optimizer& optimizer = *optimizer_;
  const int dim = dim_;
  uint64_t max_seq = 0;
  uint64_t refused = 0;
  uint64_t new_rows = 0;
  uint64_t rejected = 0;
  const Status applied = ForEachRow(
      keys, /*modify=*/true, &max_seq, &new_rows,
      [&](uint32_t i, float* row) {
        if (row == nullptr) {
          ++rejected;  // not admitted (yet): the gradient is dropped
          return;
        }
        refused += !optimizer.Apply(row, row + dim, src + size_t{i} * dim, dim, lr_scale);
      },
      admission_ != nullptr ? Creation::kAdmit : Creation::kAlways);
  if (created != nullptr) *created = new_rows;
  if (admission_ != nullptr) {
    admitted_.fetch_add(new_rows, std::memory_order_relaxed);
    rejected_.fetch_add(rejected, std::memory_order_relaxed);
  }
  // Rows updated before a store error count too.
  if (refused > 0) CountRefused(refused);
  RETURN_IF_ERROR(applied);
  if (max_seq == 0) return absl::OkStatus();
  return Annotate(storage_.queue->WaitDurable(max_seq, storage_.durability_timeout),
                  absl::StrCat("writing rows of table '", spec_.name(), "'"));
}

Status StripedTable::Put(std::span<const uint64_t> keys, std::span<const float> values,
                         uint32_t width) {
  CHECK(width == row_floats_ || width == static_cast<uint32_t>(dim_)) << "Put to table " << spec_.id();
  CHECK_EQ(values.size(), keys.size() * width) << "Put to table " << spec_.id();
  uint64_t max_seq = 0;
  uint64_t created = 0;
  RETURN_IF_ERROR(ForEachRow(keys, /*modify=*/true, &max_seq, &created, [&](uint32_t i, float* row) {
    if (row == nullptr) return;  // never: Put makes every row
    std::memcpy(row, values.data() + size_t{i} * width, sizeof(float) * width);
    if (width < row_floats_) optimizer_->InitState(row + dim_, dim_);
  }));
  if (max_seq == 0) return absl::OkStatus();
  return Annotate(storage_.queue->WaitDurable(max_seq, storage_.durability_timeout),
                  absl::StrCat("writing rows of table '", spec_.name(), "'"));
}

uint64_t StripedTable::QueueDirtyRows() {
  if (storage_.store == nullptr) return 0;
  const size_t row_bytes = sizeof(float) * row_floats_;
  uint64_t max_seq = 0;
  for (uint32_t s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (uint32_t slot : stripe.dirty) {
      SlotMeta& meta = MetaLocked(stripe, slot);
      if (!(meta.flags & kDirty)) continue;
      const uint64_t seq =
          storage_.queue->Append(spec_.id(), meta.key, RowLocked(stripe, slot), row_bytes);
      MarkQueued(meta, seq);
      max_seq = std::max(max_seq, seq);
    }
    stripe.dirty.clear();
  }
  return max_seq;
}

void StripedTable::VisitResident(const std::function<void(uint64_t, const float*)>& visit) {
  for (uint32_t s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (uint32_t i = 0; i < stripe.index_capacity; ++i) {
      const uint32_t slot = stripe.index[i].slot;
      if (slot == kEmptySlot) continue;
      visit(MetaLocked(stripe, slot).key, RowLocked(stripe, slot));
    }
  }
}

TableStats StripedTable::stats() const {
  TableStats stats;
  stats.rows_in_memory = rows_.load(std::memory_order_relaxed);
  stats.memory_bytes = memory_bytes_.load(std::memory_order_relaxed);
  stats.hits = hits_.load(std::memory_order_relaxed);
  stats.misses = misses_.load(std::memory_order_relaxed);
  stats.evictions = evictions_.load(std::memory_order_relaxed);
  stats.updates_refused = updates_refused_.load(std::memory_order_relaxed);
  stats.rows_admitted = admitted_.load(std::memory_order_relaxed);
  stats.updates_rejected = rejected_.load(std::memory_order_relaxed);
  if (admission_ != nullptr) stats.admission_candidates = admission_->candidates();
  return stats;
}

void StripedTable::CountRefused(uint64_t rows) {
  const uint64_t before = updates_refused_.fetch_add(rows, std::memory_order_relaxed);
  const uint64_t now = before + rows;
  if (std::bit_width(before) == std::bit_width(now)) return;
  LOG(WARNING) << "table '" << spec_.name() << "': " << now
               << " row update(s) refused so far: each would have made a weight or an optimizer "
                  "state non-finite, and its row kept its values (gradients too large for the "
                  "learning rate? optimizer.clip bounds them); next warning at "
               << std::bit_ceil(now + 1);
}

uint32_t StripedTable::FindLocked(const Stripe& stripe, uint64_t key, uint64_t hash) const {
  if (stripe.index_capacity == 0) return kEmptySlot;
  const uint32_t mask = stripe.index_capacity - 1;
  const uint32_t tag = TagOf(hash);
  for (uint32_t pos = static_cast<uint32_t>(hash) & mask;; pos = (pos + 1) & mask) {
    const IndexEntry& entry = stripe.index[pos];
    if (entry.slot == kEmptySlot) return kEmptySlot;
    if (entry.tag == tag && MetaLocked(stripe, entry.slot).key == key) return entry.slot;
  }
}

uint32_t StripedTable::InsertLocked(Stripe& stripe, uint64_t key, uint64_t hash,
                                    const float* image) {
  if (uint64_t{stripe.live + 1} * 10 > uint64_t{stripe.index_capacity} * 7) GrowIndexLocked(stripe);
  uint32_t slot;
  if (!stripe.free_slots.empty()) {
    slot = stripe.free_slots.back();
    stripe.free_slots.pop_back();
  } else {
    slot = stripe.high_water++;
    if (slot == stripe.arena_rows) {
      const uint32_t rows = BlockRows(stripe.blocks.size());
      stripe.blocks.push_back(std::make_unique_for_overwrite<float[]>(size_t{rows} * row_floats_));
      stripe.meta_blocks.push_back(std::make_unique<SlotMeta[]>(rows));
      stripe.arena_rows += rows;
      memory_bytes_.fetch_add(uint64_t{rows} * (row_floats_ * sizeof(float) + sizeof(SlotMeta)),
                              std::memory_order_relaxed);
    }
  }
  float* row = RowLocked(stripe, slot);
  if (image != nullptr) {
    std::memcpy(row, image, sizeof(float) * row_floats_);
  } else {
    // A new row is a pure function of (spec, seed, key): it needs no write
    // until it changes.
    InitializeRow(spec_.initializer(), seed_, spec_.id(), key, row, dim_);
    optimizer_->InitState(row + dim_, dim_);
  }
  SlotMeta& meta = MetaLocked(stripe, slot);
  meta.key = key;
  meta.pending_seq = 0;
  meta.flags = kLive;

  const uint32_t mask = stripe.index_capacity - 1;
  uint32_t pos = static_cast<uint32_t>(hash) & mask;
  while (stripe.index[pos].slot != kEmptySlot) pos = (pos + 1) & mask;
  stripe.index[pos] = IndexEntry{TagOf(hash), slot};
  ++stripe.live;
  rows_.fetch_add(1, std::memory_order_relaxed);
  if (storage_.budget != nullptr) storage_.budget->Add(static_cast<int64_t>(bytes_per_row_));
  return slot;
}

void StripedTable::GrowIndexLocked(Stripe& stripe) {
  const uint32_t old_capacity = stripe.index_capacity;
  CHECK_LT(old_capacity, kMaxIndexCapacity) << "stripe index of table " << spec_.id() << " full";
  const uint32_t capacity = old_capacity == 0 ? kMinIndexCapacity : old_capacity * 2;
  auto index = std::make_unique_for_overwrite<IndexEntry[]>(capacity);
  for (uint32_t p = 0; p < capacity; ++p) index[p].slot = kEmptySlot;
  const uint32_t mask = capacity - 1;
  for (uint32_t p = 0; p < old_capacity; ++p) {
    const IndexEntry& entry = stripe.index[p];
    if (entry.slot == kEmptySlot) continue;
    uint32_t pos = static_cast<uint32_t>(Mix64(MetaLocked(stripe, entry.slot).key)) & mask;
    while (index[pos].slot != kEmptySlot) pos = (pos + 1) & mask;
    index[pos] = entry;
  }
  stripe.index = std::move(index);
  stripe.index_capacity = capacity;
  memory_bytes_.fetch_add(uint64_t{capacity - old_capacity} * sizeof(IndexEntry),
                          std::memory_order_relaxed);
}

void StripedTable::RemoveFromIndexLocked(Stripe& stripe, uint64_t key, uint64_t hash) {
  const uint32_t mask = stripe.index_capacity - 1;
  const uint32_t tag = TagOf(hash);
  uint32_t hole = static_cast<uint32_t>(hash) & mask;
  while (true) {
    const IndexEntry& entry = stripe.index[hole];
    CHECK_NE(entry.slot, kEmptySlot) << "evicting a key the index does not hold";
    if (entry.tag == tag && MetaLocked(stripe, entry.slot).key == key) break;
    hole = (hole + 1) & mask;
  }
  // Backward-shift deletion: pull later entries of the probe run into the
  // hole when their home lies at or before it (cyclically).
  for (uint32_t next = (hole + 1) & mask;; next = (next + 1) & mask) {
    const IndexEntry entry = stripe.index[next];
    if (entry.slot == kEmptySlot) break;
    const uint32_t home = static_cast<uint32_t>(Mix64(MetaLocked(stripe, entry.slot).key)) & mask;
    // Distance from home to next, and from hole to next, along the ring.
    if (((next - home) & mask) >= ((next - hole) & mask)) {
      stripe.index[hole] = entry;
      hole = next;
    }
  }
  stripe.index[hole].slot = kEmptySlot;
}

bool StripedTable::DurableLocked(const SlotMeta& meta) const {
  if (meta.flags & kDirty) return false;
  if (!(meta.flags & kPending)) return true;
  return meta.pending_seq <= storage_.queue->durable_seq();
}

uint64_t StripedTable::ExcessShare() const {
  if (storage_.budget == nullptr) return 0;
  const int64_t excess_bytes = storage_.budget->used() - storage_.budget->limit();
  if (storage_.budget->limit() <= 0 || excess_bytes <= 0) return 0;
  return static_cast<uint64_t>(excess_bytes) / bytes_per_row_ / kNumStripes + 1;
}

uint64_t StripedTable::EvictLocked(Stripe& stripe, uint64_t count, uint64_t steps) {
  if (stripe.high_water == 0 || storage_.store == nullptr) return 0;
  // Each pass of the hand lowers a row's use count; a row at 0 goes.
  uint64_t evicted = 0;
  while (evicted < count && steps-- > 0 && storage_.budget->over()) {
    const uint32_t slot = stripe.clock_hand;
    stripe.clock_hand = stripe.clock_hand + 1 == stripe.high_water ? 0 : stripe.clock_hand + 1;
    SlotMeta& meta = MetaLocked(stripe, slot);
    if (!(meta.flags & kLive)) continue;
    if (meta.flags & kUseMask) {
      meta.flags = meta.flags - (1 << kUseShift);
      continue;
    }
    if (!DurableLocked(meta)) continue;  // the flusher has to write it first
    RemoveFromIndexLocked(stripe, meta.key, Mix64(meta.key));
    meta.flags = 0;
    stripe.free_slots.push_back(slot);
    --stripe.live;
    ++stripe.evictions;
    ++evicted;
    rows_.fetch_sub(1, std::memory_order_relaxed);
    storage_.budget->Add(-static_cast<int64_t>(bytes_per_row_));
  }
  evictions_.fetch_add(evicted, std::memory_order_relaxed);
  return evicted;
}

uint64_t StripedTable::EvictToBudget() {
  if (storage_.budget == nullptr || storage_.store == nullptr) return 0;
  // Each stripe gives up its part of the excess, in proportion to the rows
  // it holds, so that no stripe loses its hot rows for the others; with up
  // to four sweeps of its hand, since a use count is at most 3 and so every
  // durable row can go by the fourth. A stripe short of durable rows leaves
  // a remainder, which the next pass shares out again. (The budget is the
  // server's: this table evicts until it holds, whichever table used it.)
  constexpr int kMaxPasses = 4;
  constexpr uint64_t kSweeps = 4;
  uint64_t evicted = 0;
  for (int pass = 0; pass < kMaxPasses && storage_.budget->over(); ++pass) {
    const int64_t excess_bytes = storage_.budget->used() - storage_.budget->limit();
    const uint64_t rows = rows_.load(std::memory_order_relaxed);
    if (excess_bytes <= 0 || rows == 0) break;
    const uint64_t excess_rows =
        (static_cast<uint64_t>(excess_bytes) + bytes_per_row_ - 1) / bytes_per_row_;
    uint64_t evicted_in_pass = 0;
    for (uint32_t s = 0; s < kNumStripes && storage_.budget->over(); ++s) {
      Stripe& stripe = stripes_[s];
      absl::MutexLock lock(&stripe.mu);
      const auto part = static_cast<uint64_t>(
          (static_cast<unsigned __int128>(excess_rows) * stripe.live + rows - 1) / rows);
      evicted_in_pass += EvictLocked(stripe, part, kSweeps * stripe.high_water);
    }
    evicted += evicted_in_pass;
    if (evicted_in_pass == 0) break;
  }
  return evicted;
}

void StripedTable::Locate(uint32_t slot, uint32_t* block, uint32_t* offset) const {
  if (slot < doubling_rows_) {
    // Block b starts at slot min_rows * (2^b - 1).
    const uint32_t t = (slot >> min_block_rows_log2_) + 1;
    *block = static_cast<uint32_t>(std::bit_width(t)) - 1;
    *offset = slot - (((1u << *block) - 1) << min_block_rows_log2_);
  } else {
    const uint32_t rest = slot - doubling_rows_;
    *block = doubling_blocks_ + (rest >> max_block_rows_log2_);
    *offset = rest & (max_block_rows_ - 1);
  }
}

float* StripedTable::RowLocked(const Stripe& stripe, uint32_t slot) const {
  uint32_t block;
  uint32_t offset;
  Locate(slot, &block, &offset);
  return stripe.blocks[block].get() + size_t{offset} * row_floats_;
}

SlotMeta& StripedTable::MetaLocked(const Stripe& stripe, uint32_t slot) const {
  uint32_t block;
  uint32_t offset;
  Locate(slot, &block, &offset);
  return stripe.meta_blocks[block][offset];
}

}  // namespace

StatusOr<std::unique_ptr<Table>> Table::Create(const proto::TableSpec& spec, uint64_t seed,
                                               const TableStorage& storage) {
  RETURN_IF_ERROR(ValidateTableSpec(spec));
  const std::string name = absl::StrCat("table '", spec.name(), "' (id ", spec.id(), ")");
  StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::Create(spec.optimizer());
  if (!optimizer.ok()) return Annotate(optimizer.status(), name);
  if (storage.store != nullptr) {
    if (storage.queue == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": a store needs a write queue"));
    }
    RETURN_IF_ERROR_CTX(storage.store->CreateTable(spec.id()), name);
  } else if (storage.budget != nullptr && storage.budget->limit() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": a memory budget needs a store to evict rows to"));
  }
  return std::unique_ptr<Table>(new StripedTable(spec, seed, *std::move(optimizer), storage));
}

}  // namespace eps
