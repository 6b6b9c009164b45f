// Clock: where the time comes from. The master reads time only through one, so
// that its units can be tested with scripted time.
//
// Thread-safety: safe for concurrent use (both Real() and ScriptedClock).

#ifndef EPS_CORE_CLOCK_H_
#define EPS_CORE_CLOCK_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace eps {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // The process's real clock (absl::Now()); never null, never destroyed.
  static Clock* Real();
};

// A clock that moves only when told: tests script time with it.
class ScriptedClock : public Clock {
 public:
  explicit ScriptedClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000));
  absl::Time Now() const override;
  // Moves the clock forward by `by`. REQUIRES: by >= 0 (CHECK-fails otherwise).
  void Advance(absl::Duration by);
  // Sets the time to `now`, which may lie before the current time.
  void Set(absl::Time now);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

// `duration` to the whole second, as absl::FormatDuration writes it
// ("1m30s"): how log lines and reasons say how long something took.
std::string FormatSeconds(absl::Duration duration);

}  // namespace eps

#endif  // EPS_CORE_CLOCK_H_
