// ParamServer::Impl's storage handlers (param_server_impl.h): a
// checkpoint, an export of every row, and a restore (a warm start's load
// included).

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cluster/placement.h"
#include "core/logging.h"
#include "ps/param_server_impl.h"

namespace eps {

Status ParamServer::Impl::HandleCheckpoint(const Message& request, Message* reply) {
  if (!request.header().has_checkpoint_request()) {
    return absl::InvalidArgumentError("CHECKPOINT without its body");
  }
  const proto::CheckpointRequest& body = request.header().checkpoint_request();
  // The workers paused: what the global batches hold is applied, so that
  // the checkpoint holds every push it acknowledged and no sum.
  RETURN_IF_ERROR(FlushGlobalBatches());
  ASSIGN_OR_RETURN(CheckpointInfo info,
                   storage_->Checkpoint(body.checkpoint_id(),
                                        std::span<const uint64_t>(body.keep_ids().data(),
                                                                  body.keep_ids().size())));
  proto::CheckpointReply* out = reply->header().mutable_checkpoint_reply();
  out->set_path(info.path);
  out->set_bytes(info.bytes);
  out->set_duration_ms(absl::ToDoubleMilliseconds(info.duration));
  return absl::OkStatus();
}

Status ParamServer::Impl::HandleExport(const Message& request, Message* reply) {
  if (!request.header().has_export_request() || request.header().export_request().dir().empty()) {
    return absl::InvalidArgumentError("EXPORT without its directory");
  }
  {
    absl::MutexLock lock(&mu_);
    if (!tables_ready_) {
      return ErrorWithReason(absl::StatusCode::kUnavailable, "still starting: no tables yet",
                             proto::NOT_READY);
    }
  }
  // Rows by the master's map: a partition moved just before the export
  // is the new owner's to write (docs/design.md 2.20).
  RETURN_IF_ERROR(AwaitMapVersion(request.header().cluster_map_version()));
  const std::string& dir = request.header().export_request().dir();
  StatusOr<ExportInfo> info = absl::UnknownError("not exported");
  {
    // Not while a restore swaps the tables.
    absl::ReaderMutexLock restore_lock(&restore_mu_);
    // The model holds every push the job acknowledged: what the global
    // batches hold goes in as one last step.
    RETURN_IF_ERROR(FlushGlobalBatches());
    const proto::ExportRequest& body = request.header().export_request();
    // The partitions this server gave away stay in its store, and are
    // not its to export (docs/design.md 2.20).
    std::vector<bool> owned;
    {
      absl::MutexLock lock(&mu_);
      owned = owned_;
    }
    std::function<bool(uint64_t)> keep;
    if (!owned.empty()) {
      keep = [&owned](uint64_t key) {
        return static_cast<bool>(owned[PartitionOf(key, static_cast<uint32_t>(owned.size()))]);
      };
    }
    info = storage_->Export(dir,
                            body.has_passes_done() ? std::optional<uint32_t>(body.passes_done())
                                                   : std::nullopt,
                            keep);
  }
  RETURN_IF_ERROR_CTX(info.status(), absl::StrCat("export to ", dir));
  LOG(INFO) << "exported " << info->rows << " rows ("
            << absl::StrFormat("%.1f", info->bytes / double{1 << 20}) << " MiB) to " << dir
            << " in " << absl::StrFormat("%.0f", absl::ToDoubleMilliseconds(info->duration))
            << " ms";
  proto::ExportReply* out = reply->header().mutable_export_reply();
  out->set_rows(info->rows);
  out->set_bytes(info->bytes);
  out->set_duration_ms(absl::ToDoubleMilliseconds(info->duration));
  out->set_rows_expired(storage_->stats().rows_expired);
  return absl::OkStatus();
}

Status ParamServer::Impl::HandleRestore(const Message& request, Message* reply) {
  if (!request.header().has_restore_request()) {
    return absl::InvalidArgumentError("RESTORE without its body");
  }
  const proto::RestoreRequest& body = request.header().restore_request();
  // Checkpoint 0 is the job as training starts: no rows anywhere, or those
  // of the model export it starts from.
  if (body.path().empty() && body.checkpoint_id() != 0 && !body.joined_after()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RESTORE of checkpoint ", body.checkpoint_id(), " names no path"));
  }
  const bool import = body.checkpoint_id() == 0 && !body.init_from().empty();
  if (options_.storage.data_dir.empty() && !import) {
    return absl::FailedPreconditionError(
        "this server keeps no store to restore a checkpoint into (no data dir)");
  }
  if (options_.storage.data_dir.empty() && storage_->stats().rows_in_memory > 0) {
    // Without a store nothing can be emptied: a warm start only loads into
    // a server that holds nothing yet.
    return absl::FailedPreconditionError(
        "this server keeps no store (no --data-dir) and holds trained rows: it cannot go back "
        "to checkpoint 0 of a warm start; give the servers a --data-dir");
  }
  std::vector<bool> owned;
  {
    absl::MutexLock lock(&mu_);
    if (!tables_ready_) {
      return ErrorWithReason(absl::StatusCode::kUnavailable, "still starting: no tables yet",
                             proto::NOT_READY);
    }
    if (import && placement_ == nullptr) {
      return ErrorWithReason(absl::StatusCode::kUnavailable, "no cluster map yet",
                             proto::NOT_READY);
    }
    owned = owned_;
  }
  StatusOr<CheckpointInfo> info = CheckpointInfo{};
  StatusOr<ImportInfo> imported = ImportInfo{};
  {
    // Waits for the pulls, pushes and checkpoints in progress; later ones
    // wait for the restore.
    absl::WriterMutexLock restore_lock(&restore_mu_);
    if (!options_.storage.data_dir.empty()) info = storage_->Restore(body.path());
    // A missing or broken checkpoint is refused before anything changes;
    // otherwise the pushes applied so far are gone (even after a failure:
    // the store then holds its last flushed state).
    if (!absl::IsNotFound(info.status()) && !absl::IsDataLoss(info.status())) {
      gate_.ForgetPushes();
      ResetGlobalBatches();
    }
    if (info.ok() && import) {
      const uint32_t partitions = static_cast<uint32_t>(owned.size());
      imported = storage_->Import(
          body.init_from(),
          [&owned, partitions](uint64_t key) { return owned[PartitionOf(key, partitions)]; },
          body.init_optimizer_state());
    }
  }
  if (!info.ok()) {
    if (Status broken = storage_->status(); !broken.ok()) {
      // No database to serve from: the master must treat this server as
      // failed, and a process that exits is what it understands.
      Stop(broken);
    }
    return Annotate(info.status(), absl::StrCat("restore of checkpoint ", body.checkpoint_id()));
  }
  RETURN_IF_ERROR_CTX(imported.status(), absl::StrCat("import of ", body.init_from()));
  if (import) {
    LOG(INFO) << "checkpoint 0 is the model in " << body.init_from() << ": loaded "
              << imported->rows << " rows of its partitions"
              << (body.init_optimizer_state() ? " with their optimizer state" : "") << " in "
              << absl::StrFormat("%.0f", absl::ToDoubleMilliseconds(imported->duration)) << " ms";
  } else {
    LOG(INFO) << "restored checkpoint " << body.checkpoint_id() << " from " << info->path << ": "
              << absl::StrFormat("%.1f", info->bytes / double{1 << 20}) << " MiB in "
              << absl::StrFormat("%.0f", absl::ToDoubleMilliseconds(info->duration)) << " ms";
  }
  proto::RestoreReply* out = reply->header().mutable_restore_reply();
  out->set_bytes(info->bytes);
  out->set_duration_ms(absl::ToDoubleMilliseconds(info->duration + imported->duration));
  out->set_rows_imported(imported->rows);
  return absl::OkStatus();
}

}  // namespace eps
