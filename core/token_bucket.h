// TokenBucket: a rate limit as a bucket of `capacity` tokens that refills
// at `per_s` tokens a second up to its capacity. A call takes a token
// (TakeOne), or spends what it cost once known, into debt if need be
// (Spend); a bucket in debt takes nothing until it refilled past zero. A
// bucket that refilled to its capacity is as good as a new one, so its
// owner may forget it (full()).
//
// Used by the master's registrations (Membership), a server's rows created
// per worker (RowQuota) and the RPC server's per-connection limit.
//
// Time is passed in (a clock going back refills nothing).
//
// Thread-safety: a value; its owner guards it.

#ifndef EPS_CORE_TOKEN_BUCKET_H_
#define EPS_CORE_TOKEN_BUCKET_H_

#include <algorithm>

#include "absl/time/time.h"

namespace eps {

class TokenBucket {
 public:
  // Full at `now`.
  TokenBucket(double capacity, double per_s, absl::Time now)
      : capacity_(capacity), per_s_(per_s), tokens_(capacity), refilled_(now) {}

  // Adds what the time since the last refill earned, up to the capacity.
  void Refill(absl::Time now) {
    const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - refilled_));
    tokens_ = std::min(capacity_, tokens_ + elapsed * per_s_);
    refilled_ = std::max(refilled_, now);
  }
  // Takes one token when there is a whole one; false (taking nothing)
  // otherwise. Refill first.
  bool TakeOne() {
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }
  // Spends `n` tokens, into debt if need be.
  void Spend(double n) { tokens_ -= n; }

  double tokens() const { return tokens_; }
  bool full() const { return tokens_ >= capacity_; }

 private:
  double capacity_;
  double per_s_;
  double tokens_;
  absl::Time refilled_;
};

}  // namespace eps

#endif  // EPS_CORE_TOKEN_BUCKET_H_
