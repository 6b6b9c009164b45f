// AutoscalePolicy: how many workers the job should have, from one signal
// (the GPUs free in its queue and those other jobs wait for), read every
// autoscale.interval_s.
//
// Each reading recommends a size, from the current target:
//   - others wait for P GPUs, more than the F free: give back
//     ceil((P - F) / gpus_per_worker) workers ("others' demand"); P <= F
//     keeps the size (the scheduler starts them from the free GPUs, which
//     growing would take);
//   - fewer than scale_down_free_gpus free: give back enough workers to
//     free that many ("free below");
//   - at least scale_up_free_gpus free: take floor(F / gpus_per_worker)
//     more ("free at least");
//   - otherwise keep the size ("free within").
// GPUs our own workers are being started on (launched, not yet training)
// are not free: they are subtracted from F first. GPUs of our workers
// being stopped count as free for the two rules that shrink (so that a
// shrink in progress is not repeated while the workers leave), never for
// growing (the queue may already show them free: they would count twice). The recommendation is
// clamped to [min_workers, max_workers]. Then, as Kubernetes' HPA does
// with its stabilization windows, the target grows only to the lowest
// size recommended during the last scale_up_stabilization_s and shrinks
// only to the highest recommended during the last
// scale_down_stabilization_s, and no change follows another within
// cooldown_s. A signal that flaps between two values every interval so
// changes the size at most once per window. Below min_workers (at the
// start) the target rises to it at once, whatever the signal.
//
// A reading that failed holds the current target and says why; it does
// not enter the windows.
//
// Time is passed in; the unit holds no lock, reads no clock, does no I/O.
//
// Thread-safety: not thread-safe; its owner guards it.

#ifndef EPS_MASTER_AUTOSCALE_AUTOSCALE_POLICY_H_
#define EPS_MASTER_AUTOSCALE_AUTOSCALE_POLICY_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace eps {

struct AutoscaleSignal {
  int64_t free_gpus = 0;
  // GPUs other jobs of the queue wait for.
  int64_t pending_gpus = 0;
};

// GPUs of our own workers in transition, which a reading of the queue
// cannot tell from others'.
struct OwnGpus {
  // Launched, not yet training: taken, or about to be.
  int64_t starting = 0;
  // Asked to stop, not yet gone: about to be free.
  int64_t stopping = 0;
};

struct AutoscaleDecision {
  enum class Action { kHold, kUp, kDown };
  Action action = Action::kHold;
  int64_t previous = 0;  // the target before
  int64_t target = 0;    // the target after
  // The rule that fired, with the values it compared: one line.
  std::string rule;
  // The reading it was made from; nullopt when reading failed.
  std::optional<AutoscaleSignal> signal;
  absl::Time time;

  // {"action", "previous", "target", "rule", "free_gpus", "pending_gpus"}.
  nlohmann::json ToJson() const;
};

const char* ActionName(AutoscaleDecision::Action action);

// `size` within [min, max] (the options `min_option` and `max_option`),
// appending " (at OPTION = N)" to `why` when it was not.
int64_t ClampSize(int64_t size, int64_t min, const char* min_option, int64_t max,
                  const char* max_option, std::string* why);

// A size between its recommendations, as Kubernetes' HPA keeps one: it
// grows only to the lowest size recommended during the last
// autoscale.scale_up_stabilization_s, shrinks only to the highest during
// the last scale_down_stabilization_s, and changes at most once per
// cooldown_s. AutoscalePolicy's for workers, ServerScalePolicy's for servers.
class Stabilizer {
 public:
  Stabilizer(const JobConfig::Autoscale& options, int64_t start);
  // One recommendation at `now`: sets decision's previous, target and
  // action, and appends to its rule what held the size, if anything did.
  void Settle(int64_t recommended, absl::Time now, AutoscaleDecision* decision);
  int64_t target() const { return target_; }
  // The size is `size` now, by no decision of this one (servers started or
  // drained by hand): later recommendations count from it.
  void Follow(int64_t size) { target_ = size; }

 private:
  const absl::Duration up_window_;
  const absl::Duration down_window_;
  const int64_t cooldown_s_;
  int64_t target_;
  std::optional<absl::Time> last_change_;
  // Recommendations of the longer of the two windows, oldest first.
  std::deque<std::pair<absl::Time, int64_t>> recommendations_;
};

class AutoscalePolicy {
 public:
  explicit AutoscalePolicy(const JobConfig::Autoscale& options);

  // One reading of the signal (or why it failed), with the GPUs of our
  // own workers that it cannot tell apart.
  AutoscaleDecision Decide(const StatusOr<AutoscaleSignal>& signal, const OwnGpus& own,
                           absl::Time now);

  // The workers the job should have now.
  int64_t target() const { return stabilizer_.target(); }
  // The newest decision (a hold when nothing was decided yet).
  const AutoscaleDecision& last() const { return last_; }

 private:
  // The size one reading recommends, and why.
  std::pair<int64_t, std::string> Recommend(const AutoscaleSignal& signal,
                                            const OwnGpus& own) const;

  const JobConfig::Autoscale options_;
  Stabilizer stabilizer_;
  AutoscaleDecision last_;
};

}  // namespace eps

#endif  // EPS_MASTER_AUTOSCALE_AUTOSCALE_POLICY_H_
