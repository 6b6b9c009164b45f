// Master::Impl's partition moves (docs/design.md 2.20): the steps JobControl
// asks for, sent without mu_, and POST /servers/N/drain.

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "core/failpoint.h"
#include "master/master_impl.h"

namespace eps {

void Master::Impl::AdvanceMoves(ServerCalls& calls) {
  // COPY, HANDOFF and TAIL back to back: the partition is refused from
  // the hand-off until the map that moves it.
  for (int steps = 0; steps < 3; ++steps) {
    std::optional<JobControl::MoveStep> step;
    {
      absl::MutexLock lock(&mu_);
      step = control_->NextMoveStep(clock_->Now());
    }
    if (!step.has_value()) return;
    // A hand-off is on disk before the old owner hears of it.
    if (!Persist().ok()) return;
    // Given up when its server dies, or when the move does (a recovery).
    const auto still_moving = [&] {
      absl::MutexLock lock(&mu_);
      const std::optional<PartitionMoves::Active>& active = control_->moves().active();
      return active.has_value() && active->move.partition == step->request.partition() &&
             active->step == step->request.step();
    };
    StatusOr<proto::MovePartitionReply> reply = calls.MovePartition(
        step->target, step->request, [&](const ServerAddress& server) {
          return Serving(server) && still_moving();
        });
    if (FailpointArmed("master.crash_in_move", static_cast<uint64_t>(step->request.step()))) {
      LOG(WARNING) << "failpoint master.crash_in_move=" << static_cast<int>(step->request.step())
                   << ": killing the master (SIGKILL) with the step's reply unread";
      raise(SIGKILL);
    }
    absl::MutexLock lock(&mu_);
    control_->MoveStepDone(*step, reply, clock_->Now());
    changed_.SignalAll();
    if (!reply.ok()) return;
  }
}

std::pair<int, std::string> Master::Impl::PostDrain(uint32_t slot) {
  StatusOr<nlohmann::json> drain;
  {
    absl::MutexLock lock(&mu_);
    drain = control_->Drain(slot);
    changed_.SignalAll();
  }
  if (Status persisted = Persist(); !persisted.ok()) {
    return {500, DumpJson(nlohmann::json{{"error", std::string(persisted.message())}})};
  }
  if (!drain.ok()) {
    const int code = drain.status().code() == absl::StatusCode::kNotFound ? 404 : 409;
    return {code, DumpJson(nlohmann::json{{"error", std::string(drain.status().message())}})};
  }
  return {200, DumpJson(*drain)};
}

}  // namespace eps
