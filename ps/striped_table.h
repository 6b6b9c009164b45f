// StripedTable: the one Table implementation (ps/table.h), shared by the
// files that implement it: table.cc (requests: pull, push, put, flush),
// table_slots.cc (the index and arena: insertion, eviction, expiry). Not
// for use outside ps/table*.cc.

#ifndef EPS_PS_STRIPED_TABLE_H_
#define EPS_PS_STRIPED_TABLE_H_

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/logging.h"
#include "ps/admission.h"
#include "ps/optimizer.h"
#include "ps/table.h"

namespace eps {
namespace table_internal {

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
  kUnstored = 2,    // changed since its image was last queued for the store
  kDirty = 4,       // changed since its image was last queued (journal or store)
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
// The row's image `seq` was queued for the store (or the journal only).
inline void MarkQueued(SlotMeta& meta, uint64_t seq, bool to_store) {
  CHECK_LT(seq, uint64_t{1} << kSeqBits) << "write sequence numbers exhausted";
  meta.pending_seq = seq;
  meta.flags = (meta.flags | kPending) & ~uint64_t{kDirty};
  if (to_store) meta.flags = meta.flags & ~uint64_t{kUnstored};
}

struct IndexEntry {
  uint32_t tag;
  uint32_t slot;  // kEmptySlot when the entry is free
};
static_assert(sizeof(IndexEntry) == 8);

class StripedTable final : public Table {
 public:
  // `store_started_empty`: the store's table held no row when the table
  // was made (see AbsentIsNewLocked).
  StripedTable(const proto::TableSpec& spec, uint64_t seed, std::unique_ptr<Optimizer> optimizer,
               const TableStorage& storage, bool store_started_empty);

  const proto::TableSpec& spec() const override { return spec_; }
  using Table::Pull;
  Status Pull(std::span<const uint64_t> keys, std::span<float> out, uint64_t* created) override;
  using Table::Push;
  Status Push(std::span<const uint64_t> keys, std::span<const float> grads, float lr_scale,
              uint64_t* created, uint32_t pass) override;
  Status Put(std::span<const uint64_t> keys, std::span<const float> values,
             uint32_t width) override;
  uint64_t QueueDirtyRows(bool journal_only) override;
  uint64_t EvictToBudget() override;
  TableStats stats() const override;
  uint64_t bytes_per_row() const override { return bytes_per_row_; }
  uint32_t row_floats() const override { return row_floats_; }
  uint32_t stored_floats() const override { return stored_floats_; }
  StatusOr<uint64_t> Expire(uint32_t passes_done) override;
  void VisitResident(const std::function<void(uint64_t, const float*)>& visit) override;
  Status Read(std::span<const uint64_t> keys, std::span<float> out,
              std::vector<bool>* found) override;
  void VisitUnstored(const std::function<void(uint64_t)>& visit) override;

 private:
  // Counts `rows` refused updates; warns on the first and then whenever the
  // count reaches the next power of two (not per row: pushes are hot).
  void CountRefused(uint64_t rows);

  // Under expiry: the last training pass (0-based; negative before the
  // job's first) that pushed to `row` (stored_floats_ floats).
  int32_t PassOf(const float* row) const {
    int32_t pass;
    std::memcpy(&pass, row + row_floats_, sizeof(pass));
    return pass;
  }
  void SetPass(float* row, int32_t pass) const {
    std::memcpy(row + row_floats_, &pass, sizeof(pass));
  }
  // The pass in progress as this server knows it (TableStorage.pass).
  int32_t CurrentPass() const {
    return storage_.pass == nullptr
               ? 0
               : static_cast<int32_t>(storage_.pass->load(std::memory_order_relaxed));
  }

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
    // Slots with kDirty set, each once; slots with kUnstored set (at least
    // once: a slot freed and reused may be listed twice).
    std::vector<uint32_t> dirty ABSL_GUARDED_BY(mu);
    std::vector<uint32_t> unstored ABSL_GUARDED_BY(mu);
    uint32_t clock_hand ABSL_GUARDED_BY(mu) = 0;
    // Rises with every eviction: a row read from the store while the lock
    // was released is current only if no eviction happened meanwhile.
    uint64_t evictions ABSL_GUARDED_BY(mu) = 0;
  };

  // True when a key of `stripe` that is not in memory is new, so the store
  // need not be asked about it: the table was made over an empty store
  // table and the stripe has dropped no row since (a row leaves memory
  // before the store only through DropLocked, or the expiry sweep's
  // erases, which both count as evictions).
  bool AbsentIsNewLocked(const Stripe& stripe) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    return store_started_empty_ && stripe.evictions == 0;
  }

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

  // Calls visit(stripe, slot) for every row in memory, stripe by stripe,
  // under each stripe's lock.
  template <typename Visit>
  void ForEachResident(Visit&& visit);

  // The slot holding `key`, or kEmptySlot.
  uint32_t FindLocked(const Stripe& stripe, uint64_t key, uint64_t hash) const
      ABSL_SHARED_LOCKS_REQUIRED(stripe.mu);
  // Inserts `key` (absent) with the row `image` (stored_floats_ floats) or,
  // when null, a newly initialised row. Returns its slot.
  uint32_t InsertLocked(Stripe& stripe, uint64_t key, uint64_t hash, const float* image)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  void GrowIndexLocked(Stripe& stripe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  void RemoveFromIndexLocked(Stripe& stripe, uint64_t key, uint64_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // Takes the row in `slot` out of memory (its slot is free again).
  void DropLocked(Stripe& stripe, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // Expire's two parts: the rows in memory last pushed in a pass <= `last`
  // and not waiting to be written, then the rows only in the store. Each
  // returns the rows deleted; *max_seq gets the highest deletion queued.
  uint64_t ExpireResident(int32_t last, uint64_t* max_seq);
  StatusOr<uint64_t> ExpireStored(int32_t last, uint64_t* max_seq);
  // Evicts up to `count` rows whose image is durable, in GCLOCK order,
  // while the budget is exceeded, moving the hand at most `steps` slots.
  // Returns the rows evicted.
  uint64_t EvictLocked(Stripe& stripe, uint64_t count, uint64_t steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  bool DurableLocked(const SlotMeta& meta) const;
  // One stripe's share of the rows over the budget (0 when not over).
  uint64_t ExcessShare() const;
  // Reads the rows of `keys` from the store into `images` (stored_floats_ each);
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
  // Passes a row may go untrained (TableSpec.ttl_passes); 0: no expiry.
  const uint32_t ttl_passes_;
  // row_floats_, then with expiry the row's last pass (PassOf).
  const uint32_t stored_floats_;
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
  std::atomic<uint64_t> expired_{0};
  const bool store_started_empty_;
};

inline void StripedTable::Locate(uint32_t slot, uint32_t* block, uint32_t* offset) const {
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

inline float* StripedTable::RowLocked(const Stripe& stripe, uint32_t slot) const {
  uint32_t block;
  uint32_t offset;
  Locate(slot, &block, &offset);
  return stripe.blocks[block].get() + size_t{offset} * stored_floats_;
}

inline SlotMeta& StripedTable::MetaLocked(const Stripe& stripe, uint32_t slot) const {
  uint32_t block;
  uint32_t offset;
  Locate(slot, &block, &offset);
  return stripe.meta_blocks[block][offset];
}

inline uint32_t StripedTable::FindLocked(const Stripe& stripe, uint64_t key, uint64_t hash) const {
  if (stripe.index_capacity == 0) return kEmptySlot;
  const uint32_t mask = stripe.index_capacity - 1;
  const uint32_t tag = TagOf(hash);
  for (uint32_t pos = static_cast<uint32_t>(hash) & mask;; pos = (pos + 1) & mask) {
    const IndexEntry& entry = stripe.index[pos];
    if (entry.slot == kEmptySlot) return kEmptySlot;
    if (entry.tag == tag && MetaLocked(stripe, entry.slot).key == key) return entry.slot;
  }
}

}  // namespace table_internal
}  // namespace eps

#endif  // EPS_PS_STRIPED_TABLE_H_
