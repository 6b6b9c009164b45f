#include "ps/push_deduplicator.h"

namespace eps {

namespace {

constexpr uint64_t kMask = PushDeduplicator::kWindow - 1;
static_assert((PushDeduplicator::kWindow & kMask) == 0, "kWindow must be a power of two");

}  // namespace

bool PushDeduplicator::FirstTime(uint32_t worker, uint64_t seq) {
  if (seq == 0) return true;
  Stripe& stripe = StripeOf(worker);
  absl::MutexLock lock(&stripe.mu);
  std::unique_ptr<Window>& slot = stripe.windows[worker];
  if (slot == nullptr) slot = std::make_unique<Window>();
  Window& window = *slot;
  if (seq > window.highest) {
    // Numbers leaving the window share their bits with the numbers entering
    // it, (highest, seq]; clear those before recording seq.
    if (seq - window.highest >= kWindow) {
      window.bits.fill(0);
    } else {
      for (uint64_t s = window.highest + 1; s <= seq; ++s) {
        window.bits[(s & kMask) / 64] &= ~(uint64_t{1} << (s % 64));
      }
    }
    window.highest = seq;
  } else if (window.highest - seq >= kWindow) {
    return false;
  }
  uint64_t& word = window.bits[(seq & kMask) / 64];
  const uint64_t bit = uint64_t{1} << (seq % 64);
  if ((word & bit) != 0) return false;
  word |= bit;
  return true;
}

bool PushDeduplicator::Seen(uint32_t worker, uint64_t seq) const {
  if (seq == 0) return false;
  const Stripe& stripe = StripeOf(worker);
  absl::MutexLock lock(&stripe.mu);
  const auto it = stripe.windows.find(worker);
  if (it == stripe.windows.end()) return false;
  const Window& window = *it->second;
  if (seq > window.highest) return false;
  if (window.highest - seq >= kWindow) return true;  // as FirstTime: treated as applied
  return ((window.bits[(seq & kMask) / 64] >> (seq % 64)) & 1) != 0;
}

void PushDeduplicator::Forget(uint32_t worker) {
  Stripe& stripe = StripeOf(worker);
  absl::MutexLock lock(&stripe.mu);
  stripe.windows.erase(worker);
}

size_t PushDeduplicator::workers() const {
  size_t count = 0;
  for (const Stripe& stripe : stripes_) {
    absl::MutexLock lock(&stripe.mu);
    count += stripe.windows.size();
  }
  return count;
}

size_t PushDeduplicator::memory_bytes() const {
  size_t bytes = 0;
  for (const Stripe& stripe : stripes_) {
    absl::MutexLock lock(&stripe.mu);
    bytes += stripe.windows.capacity() * (sizeof(uint32_t) + sizeof(std::unique_ptr<Window>) + 1) +
             stripe.windows.size() * sizeof(Window);
  }
  return bytes;
}

}  // namespace eps
