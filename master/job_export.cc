// JobControl's model files (docs/model-format.md) and the job's end: the
// export once the last pass is done (job.export_dir), the warm start before
// training starts (job.init_from), and Finish, which no ruined evaluation
// passes. The driver does the I/O (Master::Impl::AdvanceExport,
// AdvanceImport) and hands the replies back here.

#include <cmath>
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

// Why a warm start stopped before any training: the export (or
// job.init_from) must change, and the job then starts again (with no
// checkpoint, --resume has nothing to go on from).
static std::string ImportStopReason(const std::string& dir, absl::string_view error) {
  return absl::StrCat("job.init_from: ", error, "; nothing of ", dir,
                      " was loaded: fix the export or job.init_from and start the job again");
}

// An error of a server's warm start that another try would meet again:
// the export itself is missing, broken or of another model. An error with
// a protocol reason (NOT_READY, FENCED, ...) is about the server, not the
// export.
static bool RefusesTheExport(const Status& status) {
  if (ReasonOf(status) != proto::REASON_UNSPECIFIED) return false;
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      return true;
    default:
      return false;
  }
}

void JobControl::ImportChecked(const ImportWrite& write, const Status& checked, absl::Time now) {
  if (checked.ok() || over() || !import_due_) return;
  import_attempts_ = write.attempt;
  import_error_ = std::string(checked.message());
  Stop(ImportStopReason(job_.job.init_from, checked.message()), now);
}

void JobControl::Imported(const ImportWrite& write, const std::vector<StatusOr<uint64_t>>& replies,
                          absl::Time now) {
  if (over() || !import_due_) return;
  std::string error;
  uint64_t rows = 0;
  bool starting = false;
  bool refused = false;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies[i].ok()) {
      rows += *replies[i];
      continue;
    }
    // A server that has no tables or map yet loads on a later tick; its
    // lease bounds how long it may take.
    starting |= ReasonOf(replies[i].status()) == proto::NOT_READY;
    refused |= RefusesTheExport(replies[i].status());
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
  if (refused) {
    import_attempts_ = write.attempt;
    Stop(ImportStopReason(job_.job.init_from, error), now);
    return;
  }
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

// The job loop ends once every live peer heard that the job is over; a peer
// that stops heartbeating instead loses its lease and no longer counts. The
// deadline only guards against a peer that heartbeats without ever hearing
// (which should not happen).
static absl::Time ShutdownDeadline(const JobConfig& job, absl::Time now) {
  return now + 3 * absl::Milliseconds(job.master.lease_ms) + absl::Seconds(10);
}

std::optional<std::string> JobControl::RuinedEvaluation() const {
  const std::optional<double> auc = progress_.eval_auc();
  const std::optional<double> logloss = progress_.eval_logloss();
  if ((auc && !std::isfinite(*auc)) || (logloss && !std::isfinite(*logloss))) {
    return absl::StrCat("the evaluation is not finite (AUC ", *auc, ", log loss ", *logloss, ")");
  }
  const double factor = job_.job.divergence_factor;
  if (logloss && factor > 0 && *logloss > factor * kKnowNothingLogLoss) {
    return absl::StrFormat(
        "the model diverged: its evaluation log loss, %.5f, is over job.divergence_factor (%g) "
        "times that of a model that knows nothing (ln 2: predicting 0.5 for every record)",
        *logloss, factor);
  }
  return std::nullopt;
}

void JobControl::Finish(absl::Time now) {
  // Never "finished" with a model whose evaluation is not a number, nor
  // with one that does worse than knowing nothing.
  if (std::optional<std::string> ruined = RuinedEvaluation()) {
    StopDiverged(*ruined, now);
    return;
  }
  progress_.Finish();
  done_at_ = ShutdownDeadline(job_, now);
  ended_ = true;
  const std::optional<double> auc = progress_.eval_auc();
  LOG(INFO) << "job finished in "
            << absl::FormatDuration(absl::Trunc(now - started_, absl::Milliseconds(100))) << ": "
            << progress_.records_trained() << " records trained"
            << (auc ? absl::StrFormat(", eval AUC %.5f, eval log loss %.5f", *auc,
                                      *progress_.eval_logloss())
                    : std::string())
            << "; final status in "
            << (std::filesystem::path(data_dir_) / "final_status.json").string();
  events_->Record("job_finished", {{"records_trained", progress_.records_trained()}});
}

void JobControl::Fail(const std::string& reason, bool stopped, absl::Time now) {
  if (over()) return;
  progress_.Fail(reason, stopped);
  done_at_ = ShutdownDeadline(job_, now);
  ended_ = true;
  LOG(ERROR) << "job failed: " << reason;
  events_->Record("job_failed", {{"error", reason}});
}

void JobControl::StopDiverged(const std::string& reason, absl::Time now) {
  const std::optional<proto::CheckpointRecord>& last = checkpoints_.last();
  Stop(absl::StrCat(
           reason, "; resume from ",
           last.has_value() ? absl::StrCat("checkpoint ", last->id()) : "the last checkpoint",
           " with a smaller step: eps-master --resume --optimizer.learning_rate=... (give every "
           "server and worker the same option)"),
       now);
}

// --- Progress -------------------------------------------------------------------

}  // namespace eps
