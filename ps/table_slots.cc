#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cluster/initializer.h"
#include "core/hashing.h"
#include "core/logging.h"
#include "ps/kv_store.h"
#include "ps/striped_table.h"
#include "ps/write_queue.h"

namespace eps {
namespace table_internal {

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
      stripe.blocks.push_back(std::make_unique_for_overwrite<float[]>(size_t{rows} * stored_floats_));
      stripe.meta_blocks.push_back(std::make_unique<SlotMeta[]>(rows));
      stripe.arena_rows += rows;
      memory_bytes_.fetch_add(uint64_t{rows} * (stored_floats_ * sizeof(float) + sizeof(SlotMeta)),
                              std::memory_order_relaxed);
    }
  }
  float* row = RowLocked(stripe, slot);
  if (image != nullptr) {
    std::memcpy(row, image, sizeof(float) * stored_floats_);
  } else {
    // A new row is a pure function of (spec, seed, key): it needs no write
    // until it changes.
    InitializeRow(spec_.initializer(), seed_, spec_.id(), key, row, dim_);
    optimizer_->InitState(row + dim_, dim_);
    if (ttl_passes_ > 0) SetPass(row, CurrentPass());
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

void StripedTable::DropLocked(Stripe& stripe, uint32_t slot) {
  SlotMeta& meta = MetaLocked(stripe, slot);
  RemoveFromIndexLocked(stripe, meta.key, Mix64(meta.key));
  meta.flags = 0;
  stripe.free_slots.push_back(slot);
  --stripe.live;
  // A row read from the store while the lock was released may be stale now.
  ++stripe.evictions;
  rows_.fetch_sub(1, std::memory_order_relaxed);
  if (storage_.budget != nullptr) storage_.budget->Add(-static_cast<int64_t>(bytes_per_row_));
}

bool StripedTable::DurableLocked(const SlotMeta& meta) const {
  if (meta.flags & (kDirty | kUnstored)) return false;
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
    DropLocked(stripe, slot);
    ++evicted;
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

StatusOr<uint64_t> StripedTable::Expire(uint32_t passes_done) {
  if (ttl_passes_ == 0) return uint64_t{0};
  // Rows last pushed in pass `last` or before went untrained for ttl passes.
  const int64_t last = int64_t{passes_done} - 1 - ttl_passes_;
  // No row is older than pass -1 (a warm start's): nothing to look at, and
  // no scan of the store on every start.
  if (last < -1) return uint64_t{0};
  uint64_t max_seq = 0;
  uint64_t expired = ExpireResident(static_cast<int32_t>(last), &max_seq);
  if (storage_.store != nullptr) {
    // The resident rows' deletions are durable before the store is read,
    // so that its scan does not find (and count) them again.
    if (max_seq > 0) {
      RETURN_IF_ERROR_CTX(storage_.queue->WaitDurable(max_seq, storage_.durability_timeout),
                          absl::StrCat("deleting expired rows of table '", spec_.name(), "'"));
    }
    max_seq = 0;
    ASSIGN_OR_RETURN(const uint64_t stored, ExpireStored(static_cast<int32_t>(last), &max_seq));
    expired += stored;
    if (max_seq > 0) {
      RETURN_IF_ERROR_CTX(storage_.queue->WaitDurable(max_seq, storage_.durability_timeout),
                          absl::StrCat("deleting expired rows of table '", spec_.name(), "'"));
    }
  }
  expired_.fetch_add(expired, std::memory_order_relaxed);
  return expired;
}

uint64_t StripedTable::ExpireResident(int32_t last, uint64_t* max_seq) {
  uint64_t expired = 0;
  for (uint32_t s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (uint32_t slot = 0; slot < stripe.high_water; ++slot) {
      const SlotMeta& meta = MetaLocked(stripe, slot);
      if (!(meta.flags & kLive) || (meta.flags & kDirty)) continue;
      if (PassOf(RowLocked(stripe, slot)) > last) continue;
      if (storage_.store != nullptr) {
        // After any image of it already queued.
        *max_seq = std::max(*max_seq, storage_.queue->AppendErase(spec_.id(), meta.key));
      }
      DropLocked(stripe, slot);
      ++expired;
    }
  }
  return expired;
}

StatusOr<uint64_t> StripedTable::ExpireStored(int32_t last, uint64_t* max_seq) {
  const size_t row_bytes = sizeof(float) * stored_floats_;
  uint64_t expired = 0;
  // Keys found expired in the store, deleted a batch at a time under their
  // stripe's lock, and only when the row is not in memory (where a push
  // may have made it current since the scan's snapshot).
  constexpr size_t kBatch = 4096;
  struct Expired {
    uint64_t hash;  // Mix64(key), whose top bits are its stripe
    uint64_t key;
  };
  std::vector<Expired> batch;
  const auto erase = [&] {
    std::sort(batch.begin(), batch.end(),
              [](const Expired& a, const Expired& b) { return a.hash < b.hash; });
    for (size_t i = 0; i < batch.size();) {
      const uint32_t s = StripeOf(batch[i].hash);
      Stripe& stripe = stripes_[s];
      absl::MutexLock lock(&stripe.mu);
      bool erased = false;
      for (; i < batch.size() && StripeOf(batch[i].hash) == s; ++i) {
        if (FindLocked(stripe, batch[i].key, batch[i].hash) != kEmptySlot) continue;
        *max_seq = std::max(*max_seq, storage_.queue->AppendErase(spec_.id(), batch[i].key));
        erased = true;
        ++expired;
      }
      // A read of these rows made without the lock may be stale now.
      if (erased) ++stripe.evictions;
    }
    batch.clear();
  };
  RETURN_IF_ERROR(storage_.store->Scan(spec_.id(), [&](uint64_t key, absl::string_view value) {
    if (value.size() != row_bytes) {
      return absl::DataLossError(absl::StrCat("key ", key, " of table '", spec_.name(), "' holds ",
                                              value.size(), " bytes, expected ", row_bytes));
    }
    int32_t pass;
    std::memcpy(&pass, value.data() + sizeof(float) * row_floats_, sizeof(pass));
    if (pass > last) return absl::OkStatus();
    batch.push_back(Expired{Mix64(key), key});
    if (batch.size() == kBatch) erase();
    return absl::OkStatus();
  }));
  erase();
  return expired;
}

}  // namespace table_internal
}  // namespace eps
