#include "master/trust/eval_check.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/data_schema.h"
#include "rpc/message.h"
#include "worker/line_reader.h"

namespace eps {
namespace {

// The check could not run now; the worker sends the commit again.
Status NotCheckedNow(absl::string_view why) {
  return ErrorWithReason(absl::StatusCode::kUnavailable,
                         absl::StrCat("the master cannot check this evaluation now (", why,
                                      "); send it again"),
                         proto::SLOW_DOWN);
}

// What to do about a file the master cannot read, by the read's error.
std::string Remedy(const std::string& path, const Status& status) {
  if (absl::IsPermissionDenied(status)) return absl::StrCat("give the master read access to ", path);
  if (absl::IsUnavailable(status)) return absl::StrCat("make ", path, " readable again");
  return absl::StrCat("put ", path, " back as it was when the job started (its data must not "
                      "change while it runs)");
}

}  // namespace

Status EvalCheck::Unreadable(const std::string& path, uint64_t begin, const Status& status,
                             absl::Time now) {
  // A passing read error: the worker sends the commit again, until this
  // range has failed for longer than the patience.
  std::string failing;
  if (absl::IsUnavailable(status)) {
    const absl::Time since = failing_since_.try_emplace({path, begin}, now).first->second;
    if (now - since <= read_patience_) return NotCheckedNow(status.message());
    failing = absl::StrCat(" (failing for ", absl::FormatDuration(now - since),
                           ", over half of master.progress_timeout_s)");
  }
  return absl::FailedPreconditionError(absl::StrCat("the master cannot read ", path,
                                                    " to check an evaluation commit", failing,
                                                    ": ", status.message(), "; ",
                                                    Remedy(path, status)));
}

StatusOr<std::unique_ptr<EvalCheck>> EvalCheck::Create(const JobConfig& job, int sample,
                                                       uint64_t seed) {
  ASSIGN_OR_RETURN(Schema schema, Schema::FromConfig(job));
  ASSIGN_OR_RETURN(ModelOptions options, ModelOptions::FromConfig(job));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(options));
  return std::unique_ptr<EvalCheck>(
      new EvalCheck(std::move(model), RecordParser(std::move(schema)), sample, seed,
                    // Half: the worker whose commit waits is fenced once it
                    // makes no progress for progress_timeout_s (WaitBounds),
                    // and the job should stop on the cause first.
                    absl::Seconds(job.master.progress_timeout_s) / 2));
}

Status EvalCheck::Check(const std::string& path, uint64_t first_line,
                        const proto::CommitProgressRequest& commit,
                        std::span<const float> labels, std::span<const float> predictions,
                        const ParamSource& source, absl::Time now) {
  const auto lie = [&](const std::string& what) {
    return absl::PermissionDeniedError(absl::StrCat("its evaluation of ", path, " [",
                                                    commit.begin_offset(), ", ",
                                                    commit.end_offset(), ") ", what));
  };
  StatusOr<std::unique_ptr<LineReader>> opened =
      LineReader::Open(path, commit.begin_offset(), commit.end_offset(), first_line);
  if (!opened.ok()) return Unreadable(path, commit.begin_offset(), opened.status(), now);
  std::unique_ptr<LineReader> reader = *std::move(opened);
  // Every valid record of the range, as the worker's shard loader reads it.
  const Schema& schema = parser_.schema();
  const bool multi_value = schema.has_multi_value();
  std::vector<float> dense(schema.num_dense);
  std::vector<uint64_t> ids(schema.num_cat);
  std::vector<uint32_t> field_ends(schema.num_cat);
  std::vector<uint64_t> valid_lines;
  std::vector<float> file_labels;
  uint64_t lines = 0;
  uint64_t malformed = 0;
  // Into dense, ids and field_ends, as the worker's shard loader parses.
  const auto parse = [&](absl::string_view line, float* label) {
    return multi_value
               ? parser_.Parse(line, label, std::span<float>(dense), &ids, field_ends)
               : parser_.Parse(line, label, std::span<float>(dense), std::span<uint64_t>(ids));
  };
  absl::string_view line;
  // The sample, drawn as the lines pass (reservoir sampling): distinct
  // valid records, each equally likely, as (index, text).
  const size_t k = static_cast<size_t>(std::max(sample_, 0));
  std::vector<std::pair<size_t, std::string>> sampled;
  while (reader->Next(&line)) {
    ++lines;
    float label = 0;
    if (!parse(line, &label).ok()) {
      ++malformed;
      continue;
    }
    const size_t index = file_labels.size();
    valid_lines.push_back(reader->line_number());
    file_labels.push_back(label);
    if (sampled.size() < k) {
      sampled.emplace_back(index, std::string(line));
    } else if (k > 0) {
      const size_t slot = std::uniform_int_distribution<size_t>(0, index)(random_);
      if (slot < k) sampled[slot] = {index, std::string(line)};
    }
  }
  if (!reader->status().ok()) {
    return Unreadable(path, commit.begin_offset(), reader->status(), now);
  }
  failing_since_.erase({path, commit.begin_offset()});
  if (lines != commit.lines() || malformed != commit.malformed()) {
    return lie(absl::StrCat("claims ", commit.lines(), " lines (", commit.malformed(),
                            " malformed) where the file has ", lines, " (", malformed, ")"));
  }
  if (labels.size() != file_labels.size() || predictions.size() != file_labels.size()) {
    return lie(absl::StrCat("carries ", labels.size(), " labels and ", predictions.size(),
                            " predictions for ", file_labels.size(), " records"));
  }
  for (size_t i = 0; i < file_labels.size(); ++i) {
    if (labels[i] != file_labels[i]) {
      return lie(absl::StrCat("says record ", path, ":", valid_lines[i], " has label ", labels[i],
                              "; the file says ", file_labels[i]));
    }
  }
  if (sampled.empty()) return absl::OkStatus();

  std::sort(sampled.begin(), sampled.end());
  BatchBuilder builder(schema.num_dense, schema.num_cat);
  for (const auto& [index, text] : sampled) {
    float label = 0;
    RETURN_IF_ERROR(parse(text, &label));  // parsed once already
    if (multi_value) {
      builder.Add(label, dense, ids, field_ends);
    } else {
      builder.Add(label, dense, ids);
    }
  }
  const Batch batch = builder.Finish();
  const Status pulled = source(batch, &params_);
  if (!pulled.ok()) {
    return NotCheckedNow(absl::StrCat(path, ": the parameters: ", pulled.message()));
  }
  std::vector<float> recomputed;
  model_->ForwardBackward(batch, params_, &recomputed, nullptr);
  for (size_t j = 0; j < sampled.size(); ++j) {
    const size_t index = sampled[j].first;
    const float claimed = predictions[index];
    // A NaN the model gives too is a model that diverged, not a lie:
    // JobControl::Commit stops the job on it.
    const bool same = std::isnan(claimed) ? std::isnan(recomputed[j])
                                          : std::fabs(claimed - recomputed[j]) <= kEvalCheckTolerance;
    if (!same) {
      return lie(absl::StrCat("predicts ", claimed, " for record ", path, ":", valid_lines[index],
                              " where the model predicts ", recomputed[j]));
    }
  }
  return absl::OkStatus();
}

}  // namespace eps
