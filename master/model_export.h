// The master's part of a model export (docs/model-format.md): the
// manifest, the job's config and the evaluation's predictions. The servers
// write the rows (EXPORT, ServerStorage::Export); the manifest is written
// last, so a directory with a manifest.json holds a whole export.
//
// Thread-safety: MakeExportManifest reads the job's state (call it under the
// master's mutex); WriteExportManifest does the I/O (call it without).

#ifndef EPS_MASTER_MODEL_EXPORT_H_
#define EPS_MASTER_MODEL_EXPORT_H_

#include <string>
#include <vector>

#include "cluster/model_format.h"
#include "core/job_config.h"
#include "core/status.h"
#include "master/progress/training_progress.h"
#include "nlohmann/json.hpp"
#include "proto/eps.pb.h"

namespace eps {

struct ExportManifest {
  nlohmann::json manifest;
  std::string config_ini;  // job.ini: every option, as the master has them
  // The evaluation in data order (TrainingProgress::EvalInDataOrder).
  std::vector<float> eval_labels;
  std::vector<float> eval_predictions;
};

// The manifest of the job as it is now; `servers`: the slots whose parts
// the export holds. kInvalidArgument when the config cannot be written as a
// job file (JobConfig::ToIni) or names no model.
StatusOr<ExportManifest> MakeExportManifest(const JobConfig& job, const proto::JobSpec& spec,
                                            const TrainingProgress& progress,
                                            const std::vector<uint32_t>& servers);

// What the servers' EXPORT replies add up to: rows and bytes written, and
// the errors (each naming its server) joined by "; ", empty when none.
struct ExportTally {
  uint64_t rows = 0;
  uint64_t bytes = 0;
  uint64_t rows_expired = 0;  // by the servers, before and while exporting
  std::string error;
};
ExportTally TallyExport(const std::vector<StatusOr<proto::ExportReply>>& replies);

// Writes job.ini, eval_labels.npy and eval_predictions.npy, then
// manifest.json, each whole or not at all. kUnavailable naming the file.
Status WriteExportManifest(const std::string& dir, const ExportManifest& manifest);

}  // namespace eps

#endif  // EPS_MASTER_MODEL_EXPORT_H_
