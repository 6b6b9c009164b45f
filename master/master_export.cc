// Master::Impl's model-file steps (master_impl.h; docs/model-format.md):
// the export at the end of the job (job.export_dir), POST /export at a
// checkpoint, and the warm start before training (job.init_from).

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/model_format.h"
#include "core/logging.h"
#include "master/master_impl.h"
#include "master/http/status_report.h"

namespace eps {
namespace {

using nlohmann::json;

// A manifest of an earlier export must not stand for parts being
// rewritten: it goes first, and comes back last.
Status RemoveManifest(const std::string& dir) {
  std::error_code error;
  std::filesystem::remove(std::filesystem::path(dir) / "manifest.json", error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot remove ", dir, "/manifest.json: ", error.message()));
  }
  return absl::OkStatus();
}

}  // namespace

std::pair<int, std::string> Master::Impl::PostExport(std::string dir) {
  absl::MutexLock lock(&mu_);
  if (dir.empty() && options_.job.job.export_dir.empty()) {
    return {400, DumpJson({{"error", "name the directory: POST /export?dir=DIR (or set "
                                     "job.export_dir, under which checkpoint-N is the default)"}})};
  }
  if (!dir.empty() && !std::filesystem::path(dir).is_absolute()) {
    return {400, DumpJson({{"error", absl::StrCat("dir = ", dir, ": give an absolute path (the "
                                                  "servers and the master write it from their "
                                                  "own working directories)")}})};
  }
  const absl::Time deadline = clock_->Now() + absl::Minutes(10);
  const JobControl& control = *control_;
  json result;
  // A round that was already writing when asked for wrote no export: the
  // next one does.
  while (result.is_null()) {
    StatusOr<uint64_t> requested = control_->RequestCheckpoint();
    if (!requested.ok()) {
      return {409, DumpJson({{"error", std::string(requested.status().message())}})};
    }
    const uint64_t id = *requested;
    const std::string target =
        !dir.empty() ? dir
                     : (std::filesystem::path(options_.job.job.export_dir) /
                        absl::StrCat("checkpoint-", id))
                           .string();
    export_requests_[id] = target;
    changed_.SignalAll();
    auto waiting = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (export_results_.contains(id) || control.over() || clock_->Now() >= deadline) {
        return false;
      }
      // The round took the export (AdvanceCheckpoint): its result comes.
      if (exports_taken_.contains(id)) return true;
      // Done without it, or failed; or abandoned by a recovery, which also
      // keeps a requested round from starting.
      return control.checkpoints().Result(id) == nullptr &&
             !(control.recovery().active() && !control.checkpoints().round_id().has_value());
    };
    while (waiting()) changed_.WaitWithDeadline(&mu_, deadline);
    export_requests_.erase(id);
    if (auto it = export_results_.find(id); it != export_results_.end()) {
      result = it->second;
      export_results_.erase(it);
    } else if (const json* round = control.checkpoints().Result(id); round != nullptr) {
      if (round->contains("error")) {
        result = {{"checkpoint", id}, {"dir", target}, {"error", (*round)["error"]}};
      } else if (clock_->Now() >= deadline) {
        result = {{"checkpoint", id}, {"dir", target}, {"error", "not complete after 10 minutes"}};
      }
      // Otherwise written before the export was asked for: ask again.
    } else {
      result = {{"checkpoint", id},
                {"dir", target},
                {"error", control.over() ? "the job ended first"
                          : control.recovery().active()
                              ? absl::StrCat("not taken: the job is being restored (",
                                             control.recovery().why(), ")")
                              : "not complete after 10 minutes; see the master's log"}};
    }
  }
  return {result.contains("error") ? 500 : 200, DumpJson(result)};
}

void Master::Impl::AdvanceExport(ServerCalls& calls) {
  std::optional<JobControl::ExportWrite> write;
  StatusOr<ExportManifest> manifest = absl::UnknownError("no manifest");
  uint64_t map_version = 0;
  {
    absl::MutexLock lock(&mu_);
    write = control_->NextExport(clock_->Now());
    if (!write.has_value()) return;
    std::vector<uint32_t> slots;
    for (const ServerAddress& server : write->servers) slots.push_back(server.first);
    manifest = MakeExportManifest(control_->job(), control_->job_spec(), control_->progress(),
                                  slots);
    map_version = control_->membership().cluster_map().version();
  }
  // Nothing pushes: every pass is done, and no worker gets a shard.
  std::vector<StatusOr<proto::ExportReply>> parts;
  if (Status cleared = RemoveManifest(write->dir); !cleared.ok()) {
    parts.push_back(cleared);
  } else {
    parts = calls.Export(
        write->dir, write->servers,
        [this](const ServerAddress& server) { return Serving(server); }, map_version,
        write->passes_done);
  }
  Status written = manifest.status();
  bool parts_ok = true;
  for (const StatusOr<proto::ExportReply>& part : parts) parts_ok = parts_ok && part.ok();
  // The manifest last: a directory with one holds a whole export.
  if (parts_ok && written.ok()) written = WriteExportManifest(write->dir, *manifest);
  absl::MutexLock lock(&mu_);
  control_->Exported(*write, parts, written, clock_->Now());
  changed_.SignalAll();
}

void Master::Impl::AdvanceImport(ServerCalls& calls) {
  std::optional<JobControl::ImportWrite> write;
  {
    absl::MutexLock lock(&mu_);
    write = control_->NextImport(clock_->Now());
  }
  if (!write.has_value()) return;
  // The master reads the manifest and every part's headers first (on each
  // try: the files may have changed): an export no server could load
  // stops the job naming the file before any server opens it.
  if (Status checked = ValidateModelExport(options_.job.job.init_from); !checked.ok()) {
    absl::MutexLock lock(&mu_);
    control_->ImportChecked(*write, checked, clock_->Now());
    changed_.SignalAll();
    return;
  }
  std::vector<Recovery::RestoreTarget> targets;
  for (const ServerAddress& server : write->servers) {
    targets.push_back({.slot = server.first, .endpoint = server.second, .path = ""});
  }
  // Checkpoint 0 of a warm start: each server empties its store and loads
  // the export's rows of its partitions.
  std::vector<StatusOr<uint64_t>> replies = calls.Restore(
      0, targets, [this](const ServerAddress& server) { return Serving(server); },
      options_.job.job.init_from, options_.job.job.init_optimizer_state);
  absl::MutexLock lock(&mu_);
  control_->Imported(*write, replies, clock_->Now());
  changed_.SignalAll();
}

Master::Impl::CheckpointExport Master::Impl::ExportAtCheckpoint(
    ServerCalls& calls, const JobControl::CheckpointWrite& write, const std::string& dir,
    const std::vector<StatusOr<proto::ServerCheckpoint>>& parts) {
  CheckpointExport exported;
  exported.id = write.write.id;
  exported.dir = dir;
  for (const ServerAddress& server : write.servers) exported.slots.push_back(server.first);
  for (const StatusOr<proto::ServerCheckpoint>& part : parts) {
    if (!part.ok()) {
      exported.status = absl::AbortedError("the checkpoint failed");
      return exported;
    }
  }
  // The workers stay paused until the record is written: the servers' rows
  // are still the checkpoint's. A failed export fails only the export.
  StatusOr<uint64_t> rows = ExportRows(calls, dir, write.servers);
  exported.status = rows.status();
  if (rows.ok()) exported.rows = *rows;
  return exported;
}

void Master::Impl::TakeCheckpointExport(bool recorded, CheckpointExport* exported) {
  if (!recorded) {
    const json* round = control_->checkpoints().Result(exported->id);
    export_results_[exported->id] = {
        {"checkpoint", exported->id},
        {"dir", exported->dir},
        {"error", round != nullptr && round->contains("error") ? (*round)["error"]
                                                               : json("the checkpoint failed")}};
    exports_taken_.erase(exported->id);
    return;
  }
  // The job as the checkpoint has it: the workers are still paused.
  if (exported->status.ok()) {
    exported->manifest = MakeExportManifest(control_->job(), control_->job_spec(),
                                            control_->progress(), exported->slots);
  }
}

void Master::Impl::FinishCheckpointExport(const Status& written, CheckpointExport exported) {
  Status status = exported.status;
  if (status.ok()) status = !written.ok() ? written : exported.manifest.status();
  if (status.ok()) {
    exported.manifest->manifest["job"]["checkpoint"] = exported.id;
    // The manifest last: a directory with one holds a whole export.
    status = WriteExportManifest(exported.dir, *exported.manifest);
  }
  absl::MutexLock lock(&mu_);
  json result = {{"checkpoint", exported.id}, {"dir", exported.dir}, {"rows", exported.rows}};
  if (!status.ok()) {
    result["error"] = std::string(status.message());
    LOG(WARNING) << "export with checkpoint " << exported.id << " to " << exported.dir
                 << " failed: " << status.message();
  } else {
    LOG(INFO) << "exported the model of checkpoint " << exported.id << " to " << exported.dir
              << ": " << exported.rows << " rows";
  }
  events_->Record(status.ok() ? "model_exported" : "export_failed",
                  {{"dir", exported.dir}, {"checkpoint", exported.id}, {"rows", exported.rows}});
  export_results_[exported.id] = std::move(result);
  exports_taken_.erase(exported.id);
  changed_.SignalAll();
}

StatusOr<uint64_t> Master::Impl::ExportRows(ServerCalls& calls, const std::string& dir,
                                            const std::vector<ServerAddress>& servers) {
  RETURN_IF_ERROR(RemoveManifest(dir));
  uint64_t map_version = 0;
  {
    absl::MutexLock lock(&mu_);
    map_version = control_->membership().cluster_map().version();
  }
  const ExportTally tally = TallyExport(calls.Export(
      dir, servers, [this](const ServerAddress& server) { return Serving(server); },
      map_version));
  if (!tally.error.empty()) return absl::UnavailableError(tally.error);
  return tally.rows;
}

}  // namespace eps
