#include "master/job_record.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "master/progress/training_progress.h"

namespace eps {

namespace {

// The options whose values differ between two fingerprints.
std::string FingerprintDifference(const std::string& saved, const std::string& now) {
  std::vector<std::string> a = absl::StrSplit(saved, '\n');
  std::vector<std::string> b = absl::StrSplit(now, '\n');
  std::vector<std::string> differ;
  for (const std::string& line : b) {
    if (std::find(a.begin(), a.end(), line) == a.end()) {
      differ.push_back(line.substr(0, line.find('=')));
    }
  }
  return differ.empty() ? "unknown options" : absl::StrJoin(differ, ", ");
}

}  // namespace

std::string JobFingerprint(const JobConfig& config, const std::vector<std::string>& train,
                           const std::vector<std::string>& eval) {
  std::vector<std::string> lines = {
      absl::StrCat("data.train=", absl::StrJoin(train, ",")),
      absl::StrCat("data.eval=", absl::StrJoin(eval, ",")),
      absl::StrCat("data.format=", config.data.format),
      absl::StrCat("data.schema=", config.data.schema),
      absl::StrCat("data.shard_records=", config.data.shard_records),
      absl::StrCat("job.seed=", config.job.seed),
      absl::StrCat("model.type=", config.model.type),
      absl::StrCat("model.embedding_dim=", config.model.embedding_dim),
      absl::StrCat("ps.partitions=", config.ps.partitions),
      absl::StrCat("ps.num_servers=", config.ps.num_servers),
  };
  return absl::StrJoin(lines, "\n");
}

Status CheckSavedJob(const proto::MasterRecord& record, const std::string& fingerprint,
                     const std::string& data_dir, bool resume) {
  if (record.format_version() != kMasterRecordFormat) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data-dir ", data_dir, " holds state of format ", record.format_version(),
        ", which this version cannot read"));
  }
  if (record.config_fingerprint() != fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data-dir ", data_dir, " holds a job whose ",
        FingerprintDifference(record.config_fingerprint(), fingerprint),
        " differ from this config; resume it with the same config, or use a fresh --data-dir"));
  }
  const JobPhase phase = static_cast<JobPhase>(record.phase());
  if (phase == JobPhase::kFinished || (phase == JobPhase::kFailed && !record.stopped())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job in --data-dir ", data_dir, " is over (",
        phase == JobPhase::kFinished ? "finished" : absl::StrCat("failed: ", record.failure()),
        "); see ", (std::filesystem::path(data_dir) / "final_status.json").string(),
        ", or use a fresh --data-dir to train again"));
  }
  if (record.stopped() && !resume) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job in --data-dir ", data_dir, " was stopped (", record.failure(),
        "); continue it from its last checkpoint with eps-master --resume, or use a fresh "
        "--data-dir to train again"));
  }
  return absl::OkStatus();
}

}  // namespace eps
