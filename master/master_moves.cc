// Master::Impl's partition moves (docs/design.md 2.20): the steps JobControl
// asks for, sent without mu_, POST /servers/N/drain, and the server
// autoscaler (autoscale.max_servers).

#include <signal.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/failpoint.h"
#include "core/file_util.h"
#include "master/master_impl.h"
#include "rpc/net.h"

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

StatusOr<nlohmann::json> Master::Impl::DrainServer(uint32_t slot) {
  StatusOr<nlohmann::json> drain;
  {
    absl::MutexLock lock(&mu_);
    drain = control_->Drain(slot);
    changed_.SignalAll();
  }
  RETURN_IF_ERROR(Persist());
  return drain;
}

std::pair<int, std::string> Master::Impl::PostDrain(uint32_t slot) {
  StatusOr<nlohmann::json> drain = DrainServer(slot);
  if (drain.ok()) return {200, DumpJson(*drain)};
  // Drain refuses with kNotFound or kFailedPrecondition; Persist fails
  // with kUnavailable.
  const absl::StatusCode code = drain.status().code();
  return {code == absl::StatusCode::kNotFound             ? 404
          : code == absl::StatusCode::kFailedPrecondition ? 409
                                                          : 500,
          DumpJson(nlohmann::json{{"error", std::string(drain.status().message())}})};
}

Status Master::Impl::StartServerScaler() {
  const JobConfig& job = options_.job;
  if (job.autoscale.max_servers == 0) return absl::OkStatus();
  ServerScaler::Options scaler{
      .server_binary = job.autoscale.server_binary.empty() ? NextToMaster("eps-server")
                                                           : job.autoscale.server_binary,
      .config = (std::filesystem::path(options_.data_dir) / "server.ini").string(),
      .master_endpoint = rpc_endpoint_,
      .dir = (std::filesystem::path(options_.data_dir) / "servers").string()};
  if (::access(scaler.server_binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "autoscale.server_binary: ", scaler.server_binary,
        " is not an executable eps-server; set autoscale.server_binary to one"));
  }
  ASSIGN_OR_RETURN(const std::string server_ini, job.ToIni());
  RETURN_IF_ERROR(WriteFileAtomically(scaler.config, server_ini));
  auto server_scaler = std::make_unique<ServerScaler>(
      job, std::move(scaler), [this] { return ServerView(); },
      [this](uint32_t slot) { return DrainServer(slot); },
      events_.get(), clock_);
  {
    // Before its first launch: the master admits its servers' joins.
    ServerScaler* launches = server_scaler.get();  // lives as long as the master
    absl::MutexLock lock(&mu_);
    control_->admission().VerifyLaunchesWith(
        [launches](uint64_t id, absl::string_view secret) {
          return launches->VerifyLaunch(id, secret);
        });
  }
  server_scaler->Start();
  absl::MutexLock lock(&mu_);
  server_scaler_ = std::move(server_scaler);
  return absl::OkStatus();
}

ServerScaler::View Master::Impl::ServerView() const {
  absl::MutexLock lock(&mu_);
  ServerScaler::View view;
  view.running = !control_->over();
  view.changing = control_->ServersChanging();
  view.draining = control_->drains().leaving();
  const std::string host = Hostname();
  for (const auto& [slot, server] : control_->membership().servers()) {
    if (server.state != PeerState::kAlive) continue;
    if (server.host == host) view.pids[slot] = server.pid;
    if (control_->drains().Leaving(slot)) continue;
    ServerReading reading{.slot = slot,
                          .memory_bytes = static_cast<int64_t>(server.stats.bytes()),
                          .budget_bytes = server.stats.memory_budget_bytes(),
                          .hits = server.stats.hits(),
                          .misses = server.stats.misses(),
                          .evictions = server.stats.evictions(),
                          .push_latency = {}};
    if (StatusOr<HistogramSnapshot> pushes = HistogramFromProto(server.stats.push_latency());
        pushes.ok()) {
      reading.push_latency = *std::move(pushes);
    }
    view.servers.push_back(std::move(reading));
  }
  return view;
}

}  // namespace eps
