#include "ps/table.h"

#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/hashing.h"
#include "core/logging.h"
#include "ps/initializer.h"
#include "ps/optimizer.h"

namespace eps {
namespace {

// A key's stripe is the top kStripeBits of Mix64(key); its index bucket uses
// the low bits of the same hash, so the two are independent. (Partitions use
// a differently salted Mix64, so all stripes stay busy on every server.)
constexpr int kStripeBits = 6;
constexpr uint32_t kNumStripes = 1u << kStripeBits;

// Index slots holding this row slot are empty; keys themselves can take any
// 64-bit value, so emptiness cannot be marked in the key.
constexpr uint32_t kEmptySlot = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kMinIndexCapacity = 16;
// Largest index capacity: 2^31 entries of 16 bytes is far beyond memory.
constexpr uint32_t kMaxIndexCapacity = 1u << 31;

// Arena blocks per stripe start at kMinBlockRows rows and double up to
// kMaxBlockRows (fewer for wide rows, so that a block stays near
// kMaxBlockFloats): small tables stay small, large ones allocate in steps
// of at most ~1 MiB.
constexpr uint32_t kMinBlockRows = 16;
constexpr uint32_t kMaxBlockRows = 4096;
constexpr uint64_t kMaxBlockFloats = uint64_t{1} << 18;

// Rows wider than this are a misconfiguration (64 MiB of weights per row).
constexpr uint32_t kMaxDim = 1u << 24;

// How many keys ahead Pull/Push prefetch index buckets and rows.
constexpr uint32_t kIndexPrefetchDistance = 8;
constexpr uint32_t kRowPrefetchDistance = 4;

inline uint32_t StripeOf(uint64_t hash) {
  return static_cast<uint32_t>(hash >> (64 - kStripeBits));
}

Status ValidateInitializer(const proto::InitializerSpec& spec) {
  switch (spec.kind()) {
    case proto::InitializerSpec::ZEROS:
      return Status();
    case proto::InitializerSpec::NORMAL:
    case proto::InitializerSpec::UNIFORM:
      if (!(spec.scale() >= 0) || !std::isfinite(spec.scale())) {
        return absl::InvalidArgumentError(
            absl::StrCat("initializer.scale = ", spec.scale(), ": must be finite and >= 0"));
      }
      return Status();
    default:
      return absl::InvalidArgumentError(absl::StrCat("initializer.kind: unknown initializer kind ",
                                                     static_cast<int>(spec.kind())));
  }
}

class StripedTable final : public Table {
 public:
  StripedTable(const proto::TableSpec& spec, uint64_t seed, std::unique_ptr<Optimizer> optimizer);

  const proto::TableSpec& spec() const override { return spec_; }
  void Pull(std::span<const uint64_t> keys, std::span<float> out) override;
  void Push(std::span<const uint64_t> keys, std::span<const float> grads) override;
  uint64_t num_rows() const override { return num_rows_.load(std::memory_order_relaxed); }
  uint64_t memory_bytes() const override { return memory_bytes_.load(std::memory_order_relaxed); }

 private:
  struct IndexEntry {
    uint64_t key;
    uint32_t slot;  // kEmptySlot when the entry is free
  };

  // One lock, one open-addressing index (linear probing, power-of-two
  // capacity, load <= 0.7) and one arena. Row slots are dense: slot s is the
  // s-th row created in the stripe, so num_rows is also the next free slot.
  struct alignas(64) Stripe {
    absl::Mutex mu;
    std::unique_ptr<IndexEntry[]> index ABSL_GUARDED_BY(mu);
    uint32_t index_capacity ABSL_GUARDED_BY(mu) = 0;
    uint32_t num_rows ABSL_GUARDED_BY(mu) = 0;
    // Block b holds BlockRows(b) rows; blocks are never freed or moved.
    std::vector<std::unique_ptr<float[]>> blocks ABSL_GUARDED_BY(mu);
    uint32_t arena_rows ABSL_GUARDED_BY(mu) = 0;
  };

  // Finds every key's row (creating missing ones) and calls
  // visit(position in keys, row) for each key, stripe by stripe, in request
  // order within a stripe, under that stripe's lock.
  template <typename Visit>
  void ForEachRow(std::span<const uint64_t> keys, Visit&& visit);

  float* FindOrCreateLocked(Stripe& stripe, uint64_t key, uint64_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  void GrowIndexLocked(Stripe& stripe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  float* RowLocked(const Stripe& stripe, uint32_t slot) const ABSL_SHARED_LOCKS_REQUIRED(stripe.mu);
  uint32_t BlockRows(size_t block) const {
    return block < doubling_blocks_ ? (min_block_rows_ << block) : max_block_rows_;
  }

  const proto::TableSpec spec_;
  const uint64_t seed_;
  const std::unique_ptr<Optimizer> optimizer_;
  const int dim_;
  const uint32_t row_floats_;  // dim_ weights, then the optimizer state
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
  std::atomic<uint64_t> num_rows_{0};
  std::atomic<uint64_t> memory_bytes_{0};
};

StripedTable::StripedTable(const proto::TableSpec& spec, uint64_t seed,
                           std::unique_ptr<Optimizer> optimizer)
    : spec_(spec),
      seed_(seed),
      optimizer_(std::move(optimizer)),
      dim_(static_cast<int>(spec.dim())),
      row_floats_(static_cast<uint32_t>(dim_ + optimizer_->state_floats(dim_))),
      stripes_(std::make_unique<Stripe[]>(kNumStripes)) {
  const uint64_t fit = std::max<uint64_t>(1, kMaxBlockFloats / row_floats_);
  max_block_rows_ = static_cast<uint32_t>(std::min<uint64_t>(kMaxBlockRows, std::bit_floor(fit)));
  min_block_rows_ = std::min(kMinBlockRows, max_block_rows_);
  min_block_rows_log2_ = std::countr_zero(min_block_rows_);
  max_block_rows_log2_ = std::countr_zero(max_block_rows_);
  doubling_blocks_ = static_cast<uint32_t>(max_block_rows_log2_ - min_block_rows_log2_);
  doubling_rows_ = max_block_rows_ - min_block_rows_;
}

template <typename Visit>
void StripedTable::ForEachRow(std::span<const uint64_t> keys, Visit&& visit) {
  const size_t n = keys.size();
  if (n == 0) return;
  CHECK_LT(n, size_t{std::numeric_limits<uint32_t>::max()}) << "request too large";

  // Counting sort of the positions by stripe (stable, so duplicates keep
  // their order), then one lock per stripe touched.
  auto hashes = std::make_unique_for_overwrite<uint64_t[]>(n);
  auto order = std::make_unique_for_overwrite<uint32_t[]>(n);
  auto rows = std::make_unique_for_overwrite<float*[]>(n);
  std::array<uint32_t, kNumStripes + 1> begin{};
  for (size_t i = 0; i < n; ++i) {
    hashes[i] = Mix64(keys[i]);
    ++begin[StripeOf(hashes[i]) + 1];
  }
  for (uint32_t s = 0; s < kNumStripes; ++s) begin[s + 1] += begin[s];
  std::array<uint32_t, kNumStripes> next;
  std::copy(begin.begin(), begin.begin() + kNumStripes, next.begin());
  for (size_t i = 0; i < n; ++i) order[next[StripeOf(hashes[i])]++] = static_cast<uint32_t>(i);

  for (uint32_t s = 0; s < kNumStripes; ++s) {
    const uint32_t first = begin[s];
    const uint32_t last = begin[s + 1];
    if (first == last) continue;
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    // Resolve all rows first (prefetching index buckets ahead), then visit
    // them (prefetching rows ahead). Row pointers stay valid across index
    // growth because rows never move.
    for (uint32_t j = first; j < last; ++j) {
      if (j + kIndexPrefetchDistance < last && stripe.index_capacity != 0) {
        const uint64_t ahead = hashes[order[j + kIndexPrefetchDistance]];
        __builtin_prefetch(&stripe.index[ahead & (stripe.index_capacity - 1)]);
      }
      const uint32_t i = order[j];
      rows[j] = FindOrCreateLocked(stripe, keys[i], hashes[i]);
    }
    for (uint32_t j = first; j < last; ++j) {
      if (j + kRowPrefetchDistance < last) {
        const float* ahead = rows[j + kRowPrefetchDistance];
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + row_floats_ - 1);
      }
      visit(order[j], rows[j]);
    }
  }
}

void StripedTable::Pull(std::span<const uint64_t> keys, std::span<float> out) {
  CHECK_EQ(out.size(), keys.size() * dim_) << "Pull of table " << spec_.id();
  const size_t row_bytes = sizeof(float) * dim_;
  float* const dst = out.data();
  ForEachRow(keys, [&](uint32_t i, const float* row) {
    std::memcpy(dst + size_t{i} * dim_, row, row_bytes);
  });
}

void StripedTable::Push(std::span<const uint64_t> keys, std::span<const float> grads) {
  CHECK_EQ(grads.size(), keys.size() * dim_) << "Push to table " << spec_.id();
  const float* const src = grads.data();
  const Optimizer& optimizer = *optimizer_;
  const int dim = dim_;
  ForEachRow(keys, [&](uint32_t i, float* row) {
    optimizer.Apply(row, row + dim, src + size_t{i} * dim, dim);
  });
}

float* StripedTable::FindOrCreateLocked(Stripe& stripe, uint64_t key, uint64_t hash) {
  // The free entry ending the probe; it stays valid unless the index grows.
  uint32_t pos = 0;
  if (stripe.index_capacity != 0) {
    const uint32_t mask = stripe.index_capacity - 1;
    for (pos = static_cast<uint32_t>(hash) & mask;; pos = (pos + 1) & mask) {
      const IndexEntry& entry = stripe.index[pos];
      if (entry.slot == kEmptySlot) break;
      if (entry.key == key) return RowLocked(stripe, entry.slot);
    }
  }

  // Missing: make room in the index (load <= 0.7) and in the arena.
  if (uint64_t{stripe.num_rows + 1} * 10 > uint64_t{stripe.index_capacity} * 7) {
    GrowIndexLocked(stripe);
    const uint32_t mask = stripe.index_capacity - 1;
    pos = static_cast<uint32_t>(hash) & mask;
    while (stripe.index[pos].slot != kEmptySlot) pos = (pos + 1) & mask;
  }
  const uint32_t slot = stripe.num_rows;
  if (slot == stripe.arena_rows) {
    const uint32_t rows = BlockRows(stripe.blocks.size());
    const size_t floats = size_t{rows} * row_floats_;
    stripe.blocks.push_back(std::make_unique_for_overwrite<float[]>(floats));
    stripe.arena_rows += rows;
    memory_bytes_.fetch_add(floats * sizeof(float), std::memory_order_relaxed);
  }
  float* row = RowLocked(stripe, slot);
  InitializeRow(spec_.initializer(), seed_, spec_.id(), key, row, dim_);
  optimizer_->InitState(row + dim_, dim_);

  stripe.index[pos] = IndexEntry{key, slot};
  ++stripe.num_rows;
  num_rows_.fetch_add(1, std::memory_order_relaxed);
  return row;
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
    uint32_t pos = static_cast<uint32_t>(Mix64(entry.key)) & mask;
    while (index[pos].slot != kEmptySlot) pos = (pos + 1) & mask;
    index[pos] = entry;
  }
  stripe.index = std::move(index);
  stripe.index_capacity = capacity;
  memory_bytes_.fetch_add(uint64_t{capacity - old_capacity} * sizeof(IndexEntry),
                          std::memory_order_relaxed);
}

float* StripedTable::RowLocked(const Stripe& stripe, uint32_t slot) const {
  uint32_t block;
  uint32_t offset;
  if (slot < doubling_rows_) {
    // Block b starts at slot min_rows * (2^b - 1).
    const uint32_t t = (slot >> min_block_rows_log2_) + 1;
    block = static_cast<uint32_t>(std::bit_width(t)) - 1;
    offset = slot - (((1u << block) - 1) << min_block_rows_log2_);
  } else {
    const uint32_t rest = slot - doubling_rows_;
    block = doubling_blocks_ + (rest >> max_block_rows_log2_);
    offset = rest & (max_block_rows_ - 1);
  }
  return stripe.blocks[block].get() + size_t{offset} * row_floats_;
}

}  // namespace

StatusOr<std::unique_ptr<Table>> Table::Create(const proto::TableSpec& spec, uint64_t seed) {
  const std::string name = absl::StrCat("table '", spec.name(), "' (id ", spec.id(), ")");
  if (spec.dim() == 0 || spec.dim() > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": dim = ", spec.dim(), ": must be in [1, ", kMaxDim, "]"));
  }
  RETURN_IF_ERROR_CTX(ValidateInitializer(spec.initializer()), name);
  StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::Create(spec.optimizer());
  if (!optimizer.ok()) return Annotate(optimizer.status(), name);
  return std::unique_ptr<Table>(new StripedTable(spec, seed, *std::move(optimizer)));
}

}  // namespace eps
