#include "master/progress/evaluation.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "models/metrics.h"

namespace eps {

void Evaluation::Start() {
  results_.clear();
  records_ = 0;
  malformed_ = 0;
  committers_.clear();
  committers_known_ = true;
  pending_ = StateUpdate();
  lines_skipped_ = 0;
  skipped_.clear();
}

void Evaluation::Reset() {
  Start();
  auc_.reset();
  logloss_.reset();
}

void Evaluation::Add(uint32_t worker, uint64_t shard, uint64_t begin,
                     std::span<const float> labels, std::span<const float> predictions,
                     uint64_t malformed) {
  auto& [saved_labels, saved_predictions] = results_[{shard, begin}];
  saved_labels.assign(labels.begin(), labels.end());
  saved_predictions.assign(predictions.begin(), predictions.end());
  pending_.PutEvalResult(shard, begin, saved_labels, saved_predictions);
  records_ += labels.size();
  malformed_ += malformed;
  committers_.insert(worker);
}

void Evaluation::Skip(uint64_t lines, const std::string& where) {
  // The reasons are samples; the counts are exact.
  constexpr size_t kMaxSkipReasons = 20;
  lines_skipped_ += lines;
  if (skipped_.size() < kMaxSkipReasons) skipped_.push_back(where);
}

void Evaluation::Finish() {
  std::vector<float> labels;
  std::vector<float> predictions;
  labels.reserve(records_);
  predictions.reserve(records_);
  for (const auto& [key, result] : results_) {
    labels.insert(labels.end(), result.first.begin(), result.first.end());
    predictions.insert(predictions.end(), result.second.begin(), result.second.end());
  }
  auc_ = ComputeAuc(predictions, labels);
  logloss_ = ComputeLogLoss(predictions, labels);
  LOG(INFO) << "evaluation over " << labels.size() << " records: AUC "
            << absl::StrFormat("%.5f", *auc_) << ", log loss " << absl::StrFormat("%.5f", *logloss_);
  events_->Record("evaluation_finished",
                  {{"records", labels.size()}, {"eval_auc", *auc_}, {"eval_logloss", *logloss_}});
}

void Evaluation::InDataOrder(const ShardTracker& tracker, std::vector<float>* labels,
                             std::vector<float>* predictions) const {
  labels->clear();
  predictions->clear();
  // Shards of a split keep their file; a commit's begin orders it within.
  std::vector<std::pair<std::pair<uint32_t, uint64_t>, const Result*>> order;
  for (const auto& [key, result] : results_) {
    if (key.first >= tracker.num_shards()) continue;
    order.push_back({{tracker.shard(key.first).spec.file, key.second}, &result});
  }
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [where, result] : order) {
    labels->insert(labels->end(), result->first.begin(), result->first.end());
    predictions->insert(predictions->end(), result->second.begin(), result->second.end());
  }
}

void Evaluation::TakeChanges(StateUpdate* update) {
  update->Append(std::move(pending_));
  pending_ = StateUpdate();
}

void Evaluation::SaveTo(proto::MasterRecord* record) const {
  if (auc_) record->set_eval_auc(*auc_);
  if (logloss_) record->set_eval_logloss(*logloss_);
  record->set_eval_records(records_);
  record->set_eval_lines_skipped(lines_skipped_);
  for (const std::string& where : skipped_) record->add_eval_skipped(where);
}

void Evaluation::RestoreFrom(const proto::MasterRecord& record) {
  if (record.has_eval_auc()) auc_ = record.eval_auc();
  if (record.has_eval_logloss()) logloss_ = record.eval_logloss();
  lines_skipped_ = record.eval_lines_skipped();
  skipped_.assign(record.eval_skipped().begin(), record.eval_skipped().end());
}

void Evaluation::RestoreResults(const MasterSnapshot& snapshot) {
  for (const auto& [key, result] : snapshot.eval_results) {
    results_[key] = result;
    records_ += result.first.size();
  }
  // Who committed them is not stored.
  committers_known_ = snapshot.eval_results.empty();
}

}  // namespace eps
