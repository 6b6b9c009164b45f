#include "core/clock.h"

#include "absl/time/clock.h"
#include "core/logging.h"

namespace eps {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock* Clock::Real() {
  // Leaked on purpose: threads may read it while static destructors run.
  static Clock* const clock = new RealClock();
  return clock;
}

ScriptedClock::ScriptedClock(absl::Time start) : now_(start) {}

absl::Time ScriptedClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void ScriptedClock::Advance(absl::Duration by) {
  CHECK_GE(by, absl::ZeroDuration()) << "ScriptedClock::Advance";
  absl::MutexLock lock(&mu_);
  now_ += by;
}

void ScriptedClock::Set(absl::Time now) {
  absl::MutexLock lock(&mu_);
  now_ = now;
}

std::string FormatSeconds(absl::Duration duration) {
  return absl::FormatDuration(absl::Trunc(duration, absl::Seconds(1)));
}

}  // namespace eps
