// JobControl's coordinated checkpoints: asking for one, the round's write
// once every worker paused (a worker that never pauses is fenced), and the
// record of a complete round. The driver does the I/O
// (Master::Impl::AdvanceCheckpoint) and hands the servers' replies back
// here; CheckpointCoordinator is the round's state machine.

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "master/job_control.h"

namespace eps {

StatusOr<uint64_t> JobControl::RequestCheckpoint() {
  if (progress_.phase() != JobPhase::kTraining || over() || recovery_.active()) {
    return absl::FailedPreconditionError(
        recovery_.active() && !over()
            ? absl::StrCat("the job is being restored (", recovery_.why(),
                           "); ask again once it trains")
            : absl::StrCat("checkpoints are taken while the job trains; it is ",
                           JobPhaseName(progress_.phase())));
  }
  return checkpoints_.Request();
}

std::optional<JobControl::CheckpointWrite> JobControl::NextCheckpointWrite(absl::Time now) {
  const std::optional<uint64_t> round = checkpoints_.round_id();
  if (!round.has_value()) return std::nullopt;
  std::vector<uint32_t> not_paused;
  for (const auto& [id, worker] : membership_.workers()) {
    if (worker.state == PeerState::kAlive && worker.paused_for != *round) not_paused.push_back(id);
  }
  // One worker that never pauses must not fail every round: it is fenced
  // (its shards go back from their committed offsets) and the round goes on.
  if (!checkpoints_.OverdueToPause(now, not_paused).empty()) {
    for (uint32_t id : not_paused) {
      progress_.AddRetrained(membership_.FenceAlive(
          id, now,
          absl::StrCat("it did not pause for checkpoint ", *round, " within ",
                       absl::FormatDuration(checkpoints_.Patience()),
                       " while the other workers waited")));
    }
    not_paused.clear();  // fenced: no longer alive
  }
  std::optional<CheckpointCoordinator::Write> write =
      checkpoints_.Next(now, not_paused, membership_.awaiting_fences(), over());
  if (!write.has_value()) return std::nullopt;
  return CheckpointWrite{.write = *std::move(write), .servers = membership_.LiveServers()};
}

std::optional<proto::CheckpointRecord> JobControl::CheckpointWritten(
    const CheckpointWrite& write, std::vector<StatusOr<proto::ServerCheckpoint>> parts,
    absl::Time writing_started, absl::Time now, StateUpdate* update) {
  std::string error = write.servers.empty() ? "no live server" : "";
  proto::CheckpointRecord record = CheckpointRecordNow(write.write.id, now);
  for (auto& part : parts) {
    if (!part.ok()) {
      absl::StrAppend(&error, error.empty() ? "" : "; ", part.status().message());
      continue;
    }
    record.set_bytes(record.bytes() + part->bytes());
    *record.add_servers() = *std::move(part);
  }
  record.set_duration_ms(absl::ToDoubleMilliseconds(now - writing_started));
  record.set_pause_ms(absl::ToDoubleMilliseconds(now - write.write.started));
  if (!error.empty()) {
    checkpoints_.Fail(absl::StrCat(error, "; the previous checkpoint stands"), now);
    return std::nullopt;
  }
  *update = checkpoints_.CompleteUpdate(record);
  return record;
}

void JobControl::CheckpointRecorded(const proto::CheckpointRecord& record, const Status& written,
                                    absl::Time now) {
  if (written.ok()) {
    checkpoints_.Completed(record, now);
  } else {
    checkpoints_.Fail(
        absl::StrCat("recording it: ", written.message(), "; the previous checkpoint stands"),
        now);
  }
}

proto::CheckpointRecord JobControl::CheckpointRecordNow(uint64_t id, absl::Time now) const {
  proto::CheckpointRecord record;
  record.set_id(id);
  *record.mutable_master() = SaveRecord();
  progress_.SaveShards(&record);
  record.set_unix_ms(absl::ToUnixMillis(now));
  return record;
}

}  // namespace eps
