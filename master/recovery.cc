#include "master/recovery.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/clock.h"
#include "rpc/message.h"

namespace eps {

bool Recovery::Start(const std::string& why, bool rollback, uint32_t lost, absl::Time now) {
  const bool started = !state_.has_value();
  if (started) {
    state_ = State{.why = why,
                   .started = now,
                   .rollback = rollback,
                   .lost = {},
                   .last_log = now,
                   .last_retry = {}};
    ++count_;
  }
  state_->lost.insert(lost);
  return started;
}

void Recovery::StartRollback(const std::string& why, absl::Time now) {
  state_ = State{
      .why = why, .started = now, .rollback = true, .lost = {}, .last_log = now, .last_retry = {}};
  ++count_;
}

void Recovery::AddLost(uint32_t slot) {
  if (state_.has_value()) state_->lost.insert(slot);
}

const std::string& Recovery::why() const {
  static const std::string kNone;
  return state_.has_value() ? state_->why : kNone;
}

Recovery::Step Recovery::Next(const Membership& membership,
                              const proto::CheckpointRecord& checkpoint, absl::Duration log_every,
                              absl::Duration timeout, absl::Time now) {
  Step step;
  const std::vector<uint32_t> missing = membership.MissingServers();
  if (now - state_->started > timeout) {
    step.kind = Step::Kind::kFail;
    const std::string waited = absl::StrCat("within master.recovery_timeout_s (",
                                            absl::FormatDuration(timeout), ") of ", state_->why);
    if (!missing.empty()) {
      step.error = absl::StrCat(
          "ps[", absl::StrJoin(missing, "], ps["), "] did not come back ", waited,
          ": restart each on its --data-dir (or start an eps-server on a fresh --data-dir in its "
          "place), then run eps-master --resume");
    } else if (membership.fencing()) {
      step.error = absl::StrCat("the servers did not acknowledge the fence list ", waited);
    } else {
      step.error = absl::StrCat("the restore of checkpoint ", checkpoint.id(), " did not complete ",
                                waited, state_->last_retry.empty() ? "" : ": ", state_->last_retry);
    }
    return step;
  }
  if (!missing.empty() || membership.fencing()) {
    if (now - state_->last_log >= log_every) {
      state_->last_log = now;
      step.waiting_line = absl::StrCat(
          state_->why, " ", FormatSeconds(now - state_->started), " ago; ",
          missing.empty()
              ? std::string("fencing the workers at every server")
              : absl::StrCat("waiting for ps[", absl::StrJoin(missing, "], ps["),
                             "] (restart each on its --data-dir, or start an eps-server on a "
                             "fresh --data-dir in its place)"));
    }
    return step;
  }
  const proto::ClusterMap& map_then = checkpoint.master().cluster_map();
  for (int p = 0; checkpoint.id() != 0 && p < map_then.partition_owner_size(); ++p) {
    if (membership.LeftServer(map_then.partition_owner(p)) != nullptr) {
      // Never the newest checkpoint (a slot leaves after one without it).
      step.kind = Step::Kind::kFail;
      step.error = absl::StrCat("checkpoint ", checkpoint.id(), " holds partition ", p,
                                " in the part of ps[", map_then.partition_owner(p),
                                "], which has left the job");
      return step;
    }
  }
  std::map<uint32_t, std::string> paths;  // none for checkpoint 0: empty servers
  for (const proto::ServerCheckpoint& part : checkpoint.servers()) {
    paths[part.server_id()] = part.path();
  }
  std::set<uint32_t> placed_then;  // the slots of the checkpoint's map
  for (const proto::ServerInfo& info : map_then.servers()) {
    placed_then.insert(info.id());
  }
  for (const auto& [slot, server] : membership.servers()) {
    if (!state_->rollback && !state_->lost.contains(slot)) continue;
    if (checkpoint.id() != 0 && !paths.contains(slot) && !placed_then.empty() &&
        !placed_then.contains(slot)) {
      // Joined since: it held nothing at the checkpoint.
      step.targets.push_back(RestoreTarget{
          .slot = slot, .endpoint = server.endpoint, .path = "", .joined_after = true});
      continue;
    }
    if (checkpoint.id() != 0 && !paths.contains(slot)) {
      step.kind = Step::Kind::kFail;
      step.error = absl::StrCat("checkpoint ", checkpoint.id(), " has no part of ps[", slot, "]");
      return step;
    }
    step.targets.push_back(
        RestoreTarget{.slot = slot, .endpoint = server.endpoint, .path = paths[slot]});
  }
  step.kind = Step::Kind::kRestore;
  return step;
}

Recovery::Verdict Recovery::Restored(const Membership& membership, const Step& step,
                                     uint64_t checkpoint_id,
                                     const std::vector<StatusOr<uint64_t>>& restored_bytes,
                                     std::string* error) {
  // A target replaced after it answered, or a slot lost meanwhile that was
  // not a target (continue restores only the lost ones): its new process
  // holds nothing restored yet, so the recovery is not done.
  for (const RestoreTarget& target : step.targets) {
    if (!membership.Serving({target.slot, target.endpoint})) {
      state_->last_retry = absl::StrCat("ps[", target.slot, "] was lost while it restored");
      return Verdict::kRetry;
    }
  }
  for (uint32_t slot : state_->lost) {
    const bool targeted = std::any_of(step.targets.begin(), step.targets.end(),
                                      [slot](const RestoreTarget& t) { return t.slot == slot; });
    if (!targeted) {
      state_->last_retry = absl::StrCat("ps[", slot, "] was lost meanwhile");
      return Verdict::kRetry;
    }
  }
  for (size_t i = 0; i < restored_bytes.size(); ++i) {
    if (restored_bytes[i].ok()) continue;
    const Status& status = restored_bytes[i].status();
    const RestoreTarget& target = step.targets[i];
    // A server still starting or a lost reply: the recovery goes on
    // (restoring again is harmless).
    if (ReasonOf(status) == proto::NOT_READY || absl::IsDeadlineExceeded(status)) {
      state_->last_retry = absl::StrCat("ps[", target.slot, "]: ", status.message());
      return Verdict::kRetry;
    }
    *error = absl::StrCat("cannot restore ps[", target.slot, "] to checkpoint ", checkpoint_id,
                          ": ", status.message(),
                          target.path.empty()
                              ? ""
                              : absl::StrCat(" (its part is at ", target.path,
                                             "; a replacement server must be able to read it: "
                                             "set checkpoint.dir to shared storage)"));
    return Verdict::kFail;
  }
  return Verdict::kDone;
}

void Recovery::Done(nlohmann::json result) {
  last_ = std::move(result);
  state_.reset();
}

}  // namespace eps
