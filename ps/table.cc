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
#include "ps/striped_table.h"
#include "ps/write_queue.h"

namespace eps {
namespace table_internal {
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

}  // namespace

StripedTable::StripedTable(const proto::TableSpec& spec, uint64_t seed,
                           std::unique_ptr<Optimizer> optimizer, const TableStorage& storage,
                           bool store_started_empty)
    : spec_(spec),
      seed_(seed),
      optimizer_(std::move(optimizer)),
      storage_(storage),
      dim_(static_cast<int>(spec.dim())),
      row_floats_(static_cast<uint32_t>(dim_ + optimizer_->state_floats(dim_))),
      ttl_passes_(spec.ttl_passes()),
      stored_floats_(row_floats_ + (ttl_passes_ > 0 ? 1 : 0)),
      bytes_per_row_(sizeof(float) * stored_floats_ + sizeof(SlotMeta) + 2 * sizeof(IndexEntry)),
      stripes_(std::make_unique<Stripe[]>(kNumStripes)),
      store_started_empty_(store_started_empty) {
  const uint64_t fit = std::max<uint64_t>(1, kMaxBlockFloats / stored_floats_);
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
  images->resize(keys.size() * stored_floats_);
  const size_t row_bytes = sizeof(float) * stored_floats_;
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

  const size_t row_bytes = sizeof(float) * stored_floats_;
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
      // Nothing to read: its absent keys are made below without a read (an
      // eviction meanwhile sends them to the store after all).
      if (AbsentIsNewLocked(stripe)) continue;
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
  // With a journal a changed row stays unstored until a full flush.
  const bool journaled = storage_.store != nullptr && storage_.queue->journaled();

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
      if (storage_.store == nullptr || AbsentIsNewLocked(stripe)) {
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
                       found[f] ? images.data() + size_t{f} * stored_floats_ : nullptr);
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
                     refetch_found[a] ? refetch_images.data() + a * stored_floats_ : nullptr);
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
        __builtin_prefetch(ahead + stored_floats_ - 1);
      }
      float* row = RowLocked(stripe, slot);
      visit(order[j], row);
      SlotMeta& meta = MetaLocked(stripe, slot);
      NoteUse(meta);
      if (!modify || storage_.store == nullptr) continue;
      if (journaled && !(meta.flags & kUnstored)) {
        meta.flags |= kUnstored;
        stripe.unstored.push_back(slot);
      }
      if (storage_.write_every_push) {
        const bool to_store = !journaled;
        const uint64_t seq =
            storage_.queue->Append(spec_.id(), meta.key, row, row_bytes, to_store);
        MarkQueued(meta, seq, to_store);
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
                          float lr_scale, uint64_t* created, uint32_t pass) {
  CHECK_EQ(grads.size(), keys.size() * dim_) << "Push to table " << spec_.id();
  const float* const src = grads.data();
  const Optimizer& optimizer = *optimizer_;
  const int dim = dim_;
  uint64_t max_seq = 0;
  uint64_t refused = 0;
  uint64_t new_rows = 0;
  uint64_t rejected = 0;
  const bool expiry = ttl_passes_ > 0;
  // A worker's pass, at most one past the passes done as the master said
  // (a heartbeat may lag a pass's end): a row stamped far ahead would never
  // expire.
  const int32_t stamp =
      pass > 0 ? static_cast<int32_t>(std::min<int64_t>(pass - 1, int64_t{CurrentPass()} + 1))
               : CurrentPass();
  const Status applied = ForEachRow(
      keys, /*modify=*/true, &max_seq, &new_rows,
      [&](uint32_t i, float* row) {
        if (row == nullptr) {
          ++rejected;  // not admitted (yet): the gradient is dropped
          return;
        }
        refused += !optimizer.Apply(row, row + dim, src + size_t{i} * dim, dim, lr_scale);
        // A late push of an earlier pass does not make the row look older.
        if (expiry && PassOf(row) < stamp) SetPass(row, stamp);
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
  CHECK(width == stored_floats_ || width == row_floats_ || width == static_cast<uint32_t>(dim_))
      << "Put to table " << spec_.id();
  CHECK_EQ(values.size(), keys.size() * width) << "Put to table " << spec_.id();
  uint64_t max_seq = 0;
  uint64_t created = 0;
  RETURN_IF_ERROR(ForEachRow(keys, /*modify=*/true, &max_seq, &created, [&](uint32_t i, float* row) {
    if (row == nullptr) return;  // never: Put makes every row
    std::memcpy(row, values.data() + size_t{i} * width, sizeof(float) * width);
    if (width < row_floats_) optimizer_->InitState(row + dim_, dim_);
    // A warm start's rows were trained before this job's first pass; a
    // stored row (width stored_floats) keeps its own.
    if (ttl_passes_ > 0 && width < stored_floats_) SetPass(row, -1);
  }));
  if (max_seq == 0) return absl::OkStatus();
  return Annotate(storage_.queue->WaitDurable(max_seq, storage_.durability_timeout),
                  absl::StrCat("writing rows of table '", spec_.name(), "'"));
}

uint64_t StripedTable::QueueDirtyRows(bool journal_only) {
  if (storage_.store == nullptr) return 0;
  const bool journaled = storage_.queue->journaled();
  const bool to_store = !journal_only || !journaled;
  // Without a journal every image goes to the store and kDirty says which
  // rows to queue; with one, a store flush queues the kUnstored rows (every
  // dirty row among them).
  const bool by_unstored = to_store && journaled;
  const uint64_t flag = by_unstored ? kUnstored : kDirty;
  const size_t row_bytes = sizeof(float) * stored_floats_;
  uint64_t max_seq = 0;
  for (uint32_t s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (uint32_t slot : by_unstored ? stripe.unstored : stripe.dirty) {
      SlotMeta& meta = MetaLocked(stripe, slot);
      if (!(meta.flags & flag)) continue;
      const uint64_t seq = storage_.queue->Append(spec_.id(), meta.key, RowLocked(stripe, slot),
                                                  row_bytes, to_store);
      MarkQueued(meta, seq, to_store);
      max_seq = std::max(max_seq, seq);
    }
    stripe.dirty.clear();
    if (by_unstored) stripe.unstored.clear();
  }
  return max_seq;
}

template <typename Visit>
void StripedTable::ForEachResident(Visit&& visit) {
  for (uint32_t s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (uint32_t i = 0; i < stripe.index_capacity; ++i) {
      const uint32_t slot = stripe.index[i].slot;
      if (slot != kEmptySlot) visit(stripe, slot);
    }
  }
}

void StripedTable::VisitResident(const std::function<void(uint64_t, const float*)>& visit) {
  ForEachResident([&](const Stripe& stripe, uint32_t slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    visit(MetaLocked(stripe, slot).key, RowLocked(stripe, slot));
  });
}

Status StripedTable::Read(std::span<const uint64_t> keys, std::span<float> out,
                          std::vector<bool>* found) {
  CHECK_EQ(out.size(), keys.size() * stored_floats_) << "Read of table " << spec_.id();
  found->assign(keys.size(), false);
  uint64_t max_seq = 0;
  uint64_t created = 0;
  return ForEachRow(
      keys, /*modify=*/false, &max_seq, &created,
      [&](uint32_t i, const float* row) {
        if (row == nullptr) return;
        std::memcpy(out.data() + size_t{i} * stored_floats_, row,
                    sizeof(float) * stored_floats_);
        (*found)[i] = true;
      },
      Creation::kNever);
}

void StripedTable::VisitUnstored(const std::function<void(uint64_t)>& visit) {
  if (storage_.store == nullptr) return;
  ForEachResident([&](const Stripe& stripe, uint32_t slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const SlotMeta& meta = MetaLocked(stripe, slot);
    if (!DurableLocked(meta)) visit(meta.key);
  });
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
  stats.rows_expired = expired_.load(std::memory_order_relaxed);
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

}  // namespace table_internal

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
    RETURN_IF_ERROR_CTX(storage.store->CreateTable(spec.id(), storage.partitions), name);
  } else if (storage.budget != nullptr && storage.budget->limit() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": a memory budget needs a store to evict rows to"));
  }
  // A table over an empty store table knows every stored row until it
  // drops one (a restart or a restore finds rows: they are asked about as
  // before). The estimate spares a restarted server's big store the scan;
  // the scan (to the first row) is the proof. A failed look proves nothing.
  bool store_started_empty = false;
  if (storage.store != nullptr && storage.store->ApproximateRows(spec.id()) == 0) {
    store_started_empty =
        storage.store
            ->Scan(spec.id(),
                   [](uint64_t, absl::string_view) { return absl::CancelledError("a row"); })
            .ok();
  }
  return std::unique_ptr<Table>(new table_internal::StripedTable(
      spec, seed, *std::move(optimizer), storage, store_started_empty));
}

}  // namespace eps
