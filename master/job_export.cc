// JobControl's model files (docs/model-format.md): the export once the last
// pass is done (job.export_dir) and the warm start before training starts
// (job.init_from). The driver does the I/O (Master::Impl::AdvanceExport,
// AdvanceImport) and hands the replies back here.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "core/logging.h"
#include "master/job_control.h"
#include "master/model_export.h"
#include "rpc/message.h"

namespace eps {

std::optional<JobControl::ImportWrite> JobControl::NextImport(absl::Time now) {
  if (!import_due_ || over() || !membership_.placed() || !membership_.all_servers_alive()) {
    return std::nullopt;
  }
  ImportWrite write{.servers = membership_.LiveServers(), .attempt = import_attempts_ + 1};
  if (write.servers.empty()) return std::nullopt;
  return write;
}

void JobControl::Imported(const ImportWrite& write, const std::vector<StatusOr<uint64_t>>& replies,
                          absl::Time now) {
  if (over() || !import_due_) return;
  std::string error;
  uint64_t rows = 0;
  bool starting = false;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies[i].ok()) {
      rows += *replies[i];
      continue;
    }
    // A server that has no tables or map yet loads on a later tick; its
    // lease bounds how long it may take.
    starting |= ReasonOf(replies[i].status()) == proto::NOT_READY;
    absl::StrAppend(&error, error.empty() ? "" : "; ", "ps[",
                    i < write.servers.size() ? write.servers[i].first : 0, "]: ",
                    replies[i].status().message());
  }
  if (error.empty()) {
    LOG(INFO) << "the servers loaded " << rows << " rows of " << job_.job.init_from;
    events_->Record("model_loaded", {{"dir", job_.job.init_from}, {"rows", rows}});
    import_due_ = false;
    import_done_ = true;
    MaybeStartTraining(now);
    return;
  }
  import_error_ = error;
  if (starting) return;
  import_attempts_ = write.attempt;
  LOG(WARNING) << "loading " << job_.job.init_from << " (attempt " << write.attempt << " of "
               << kMaxExportAttempts << ") failed: " << error;
  if (import_attempts_ >= kMaxExportAttempts) {
    Fail(absl::StrCat("job.init_from: the servers could not load ", job_.job.init_from, ": ",
                      error),
         /*stopped=*/false, now);
  }
}

void JobControl::PassesDone(absl::Time now) {
  if (job_.job.export_dir.empty()) {
    Finish(now);
    return;
  }
  // A model that diverged is not exported: Finish stops the job.
  if (RuinedEvaluation().has_value()) {
    Finish(now);
    return;
  }
  export_due_ = true;
  if (export_due_since_ == absl::InfiniteFuture()) export_due_since_ = now;
  LOG(INFO) << "the last pass is done: exporting the model to " << job_.job.export_dir;
}

std::optional<JobControl::ExportWrite> JobControl::NextExport(absl::Time now) {
  if (!export_due_ || over() || recovery_.active() || !membership_.MissingServers().empty()) {
    return std::nullopt;
  }
  ExportWrite write{.dir = job_.job.export_dir,
                    .servers = membership_.LiveServers(),
                    .attempt = export_attempts_ + 1,
                    .passes_done = progress_.passes_done()};
  if (write.servers.empty()) return std::nullopt;
  events_->Record("export_started", {{"dir", write.dir}, {"attempt", write.attempt}});
  return write;
}

void JobControl::Exported(const ExportWrite& write,
                          const std::vector<StatusOr<proto::ExportReply>>& parts,
                          const Status& manifest, absl::Time now) {
  if (over() || !export_due_) return;
  const ExportTally tally = TallyExport(parts);
  std::string error = tally.error;
  const uint64_t rows = tally.rows;
  const uint64_t bytes = tally.bytes;
  if (error.empty() && !manifest.ok()) error = std::string(manifest.message());
  if (error.empty()) {
    LOG(INFO) << "exported the model to " << write.dir << ": " << rows << " rows, "
              << absl::StrFormat("%.1f", bytes / double{1 << 20}) << " MiB in "
              << FormatSeconds(now - export_due_since_);
    events_->Record("model_exported", {{"dir", write.dir},
                                       {"rows", rows},
                                       {"bytes", bytes},
                                       {"rows_expired", tally.rows_expired},
                                       {"seconds", absl::ToDoubleSeconds(now - export_due_since_)}});
    export_due_ = false;
    Finish(now);
    return;
  }
  export_attempts_ = write.attempt;
  export_error_ = error;
  LOG(WARNING) << "export " << write.attempt << " of " << kMaxExportAttempts << " to " << write.dir
               << " failed: " << error;
  events_->Record("export_failed", {{"dir", write.dir}, {"attempt", write.attempt}, {"error", error}});
  if (export_attempts_ >= kMaxExportAttempts) {
    Stop(absl::StrCat("the model could not be exported to ", write.dir, " (", kMaxExportAttempts,
                      " attempts): ", error,
                      "; fix the cause, then eps-master --resume trains on from the last "
                      "checkpoint and exports again"),
         now);
  }
}

}  // namespace eps
