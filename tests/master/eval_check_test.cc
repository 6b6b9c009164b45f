// Tests master/trust/eval_check.h: evaluation commits of a small file, honest and
// made up, checked against the file and the model with scripted
// parameters.

#include "master/trust/eval_check.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/data_schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/message.h"
#include "tests/testing/temp_dir.h"
#include "worker/record_parser.h"

namespace eps {
namespace {

// The time the checks run at (EvalCheck::Check's `now`).
const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

using ::testing::HasSubstr;

constexpr int kRecords = 40;

// Parameters that depend on the key only, as a server's would.
Status ScriptedParams(const std::vector<ParamSpec>& specs, const Batch& batch,
                      ParamBuffers* params) {
  params->resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<float>& values = (*params)[i];
    if (specs[i].kind == ParamSpec::Kind::kEmbedding) {
      values.resize(batch.keys.size() * specs[i].size);
      for (size_t k = 0; k < batch.keys.size(); ++k) {
        for (size_t d = 0; d < specs[i].size; ++d) {
          values[k * specs[i].size + d] =
              0.05f * static_cast<float>((batch.keys[k] * 7 + d) % 11) - 0.25f;
        }
      }
    } else {
      values.resize(specs[i].size);
      for (size_t d = 0; d < values.size(); ++d) {
        values[d] = 0.02f * static_cast<float>(d % 13) - 0.12f;
      }
    }
  }
  return absl::OkStatus();
}

class EvalCheckTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    job_.model.type = GetParam();
    // Criteo lines: a label, 13 integers, 26 categorical values; line 5 is
    // malformed.
    std::ofstream out(path_);
    for (int i = 0; i < kRecords + 1; ++i) {
      if (i == 5) {
        out << "not a record\n";
        continue;
      }
      std::string line = i % 3 == 0 ? "1" : "0";
      for (int j = 0; j < 13; ++j) absl::StrAppend(&line, "\t", (i * 7 + j) % 20);
      for (int j = 0; j < 26; ++j) absl::StrAppend(&line, "\t", absl::Hex((i * 31 + j * 17) % 50));
      out << line << "\n";
    }
    out.close();
    end_ = std::filesystem::file_size(path_);
    StatusOr<std::unique_ptr<EvalCheck>> check = EvalCheck::Create(job_, kRecords, /*seed=*/1);
    ASSERT_TRUE(check.ok()) << check.status();
    check_ = *std::move(check);
    source_ = [this](const Batch& batch, ParamBuffers* params) {
      return ScriptedParams(check_->params(), batch, params);
    };
    // The honest worker's labels and predictions: the model over every
    // record at once.
    HonestResults();
  }

  proto::CommitProgressRequest Commit() const {
    proto::CommitProgressRequest commit;
    commit.set_shard_id(0);
    commit.set_phase(proto::EVAL);
    commit.set_begin_offset(0);
    commit.set_end_offset(end_);
    commit.set_lines(kRecords + 1);
    commit.set_malformed(1);
    return commit;
  }

  void HonestResults() {
    StatusOr<ModelOptions> options = ModelOptions::FromConfig(job_);
    ASSERT_TRUE(options.ok());
    StatusOr<std::unique_ptr<Model>> model = Model::Create(*options);
    ASSERT_TRUE(model.ok());
    StatusOr<Schema> schema = Schema::FromConfig(job_);
    ASSERT_TRUE(schema.ok());
    RecordParser parser(*schema);
    BatchBuilder builder(schema->num_dense, schema->num_cat);
    std::ifstream in(path_);
    std::string line;
    std::vector<float> dense(schema->num_dense);
    std::vector<uint64_t> ids(schema->num_cat);
    while (std::getline(in, line)) {
      float label = 0;
      if (!parser.Parse(line, &label, std::span<float>(dense), std::span<uint64_t>(ids)).ok()) {
        continue;
      }
      builder.Add(label, dense, ids);
    }
    const Batch batch = builder.Finish();
    ParamBuffers params;
    ASSERT_TRUE(ScriptedParams((*model)->params(), batch, &params).ok());
    (*model)->ForwardBackward(batch, params, &predictions_, nullptr);
    labels_ = batch.labels;
    ASSERT_EQ(labels_.size(), static_cast<size_t>(kRecords));
  }

  JobConfig job_;
  testing::TempDir dir_;
  const std::string path_ = dir_.Join("eval.txt");
  uint64_t end_ = 0;
  std::unique_ptr<EvalCheck> check_;
  EvalCheck::ParamSource source_;
  std::vector<float> labels_;
  std::vector<float> predictions_;
};

TEST_P(EvalCheckTest, AnHonestCommitPasses) {
  EXPECT_TRUE(check_->Check(path_, 1, Commit(), labels_, predictions_, source_, kNow).ok());
}

TEST_P(EvalCheckTest, LabelsCopiedIntoPredictionsFail) {
  const Status refused = check_->Check(path_, 1, Commit(), labels_, labels_, source_, kNow);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("where the model predicts"));
  EXPECT_THAT(refused.message(), HasSubstr(path_ + ":"));
}

TEST_P(EvalCheckTest, OnePredictionMovedFailsWhenSampled) {
  std::vector<float> nudged = predictions_;
  nudged[17] = nudged[17] > 0.5f ? nudged[17] - 0.01f : nudged[17] + 0.01f;
  const Status refused = check_->Check(path_, 1, Commit(), labels_, nudged, source_, kNow);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  // Record 17 of the valid ones is line 19 (line 6 is malformed).
  EXPECT_THAT(refused.message(), HasSubstr(path_ + ":19 "));
  // Within the tolerance, a CUDA worker's sums: accepted.
  nudged[17] = predictions_[17] + kEvalCheckTolerance / 2;
  EXPECT_TRUE(check_->Check(path_, 1, Commit(), labels_, nudged, source_, kNow).ok());
}

TEST_P(EvalCheckTest, AFlippedLabelFails) {
  std::vector<float> labels = labels_;
  labels[3] = 1.0f - labels[3];
  EXPECT_THAT(check_->Check(path_, 1, Commit(), labels, predictions_, source_, kNow).message(),
              HasSubstr("has label"));
}

TEST_P(EvalCheckTest, MiscountedLinesFail) {
  proto::CommitProgressRequest commit = Commit();
  commit.set_malformed(0);
  EXPECT_THAT(check_->Check(path_, 1, commit, labels_, predictions_, source_, kNow).message(),
              HasSubstr("where the file has 41 (1)"));
}

TEST_P(EvalCheckTest, WithoutParametersNothingIsDecided) {
  const auto down = [](const Batch&, ParamBuffers*) {
    return absl::DeadlineExceededError("ps[0] did not answer");
  };
  const Status waits = check_->Check(path_, 1, Commit(), labels_, labels_, down, kNow);
  EXPECT_EQ(waits.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(waits), proto::SLOW_DOWN) << "the worker sends it again after a pause";
  EXPECT_THAT(waits.message(), HasSubstr("ps[0] did not answer"));
}

// A file the master can never read again (gone, or cut short) is no reason
// to send the commit again forever: the answer names it.
TEST_P(EvalCheckTest, AFileThatCannotBeReadIsNamedNotRetried) {
  const Status gone =
      check_->Check(dir_.Join("gone.txt"), 1, Commit(), labels_, predictions_, source_, kNow);
  EXPECT_EQ(gone.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ReasonOf(gone), proto::SLOW_DOWN);
  EXPECT_THAT(gone.message(), HasSubstr("the master cannot read " + dir_.Join("gone.txt")));
  std::filesystem::resize_file(path_, end_ / 2);
  const Status cut = check_->Check(path_, 1, Commit(), labels_, predictions_, source_, kNow);
  EXPECT_EQ(cut.code(), absl::StatusCode::kFailedPrecondition) << cut;
}

// A read error that may pass (here ENOTDIR: the path's directory became a
// file) is tried again, but not for ever: once the same range has failed
// for over half of master.progress_timeout_s (before WaitBounds would fence
// the waiting worker as hung), the answer names the file and what to do.
// Each range keeps its own count: another range's failures or reads do not
// restart it, its own read does. Each error says its own remedy.
TEST_P(EvalCheckTest, APassingReadErrorIsRetriedForAShardsPatienceThenNamed) {
  const std::string blocker = dir_.Join("blocker");
  const std::string under_a_file = blocker + "/eval.txt";
  std::filesystem::copy_file(path_, blocker);  // a file where a directory should be
  const absl::Duration patience = absl::Seconds(job_.master.progress_timeout_s) / 2;
  const auto check = [&](absl::Time now, uint64_t begin = 0) {
    proto::CommitProgressRequest commit = Commit();
    commit.set_begin_offset(begin);
    return check_->Check(under_a_file, 1, commit, labels_, predictions_, source_, now);
  };
  Status waits = check(kNow);
  EXPECT_EQ(waits.code(), absl::StatusCode::kUnavailable) << waits;
  EXPECT_EQ(ReasonOf(waits), proto::SLOW_DOWN);
  // Another range failing meanwhile, and a range of another file reading.
  EXPECT_EQ(check(kNow + patience / 2, /*begin=*/1).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(check_->Check(path_, 1, Commit(), labels_, predictions_, source_, kNow).ok());
  waits = check(kNow + patience);
  EXPECT_EQ(waits.code(), absl::StatusCode::kUnavailable) << waits;
  const Status named = check(kNow + patience + absl::Seconds(1));
  EXPECT_EQ(named.code(), absl::StatusCode::kFailedPrecondition) << named;
  EXPECT_THAT(named.message(), HasSubstr("master.progress_timeout_s"));
  EXPECT_THAT(named.message(), HasSubstr("make " + under_a_file + " readable again"));
  // The other range has its own count.
  EXPECT_EQ(check(kNow + patience + absl::Seconds(1), /*begin=*/1).code(),
            absl::StatusCode::kUnavailable);
  // A range that reads again starts its count afresh.
  std::filesystem::remove(blocker);
  std::filesystem::create_directory(blocker);
  std::filesystem::copy_file(path_, under_a_file);
  ASSERT_TRUE(check(kNow + patience + absl::Seconds(2)).ok());
  std::filesystem::remove_all(blocker);
  std::filesystem::copy_file(path_, blocker);
  EXPECT_EQ(check(kNow + 2 * patience).code(), absl::StatusCode::kUnavailable);

  const Status gone = check_->Check(dir_.Join("gone.txt"), 1, Commit(), labels_, predictions_,
                                    source_, kNow);
  EXPECT_THAT(gone.message(), HasSubstr("put " + dir_.Join("gone.txt") + " back as it was"));
}

// A model that diverged predicts NaN for the worker and for the master
// alike: no lie (JobControl::Commit stops the job on it); a NaN where the
// model gives a number is one.
TEST_P(EvalCheckTest, ANaNIsALieOnlyWhereTheModelGivesANumber) {
  const auto diverged = [this](const Batch& batch, ParamBuffers* params) {
    RETURN_IF_ERROR(ScriptedParams(check_->params(), batch, params));
    for (std::vector<float>& values : *params) {
      std::fill(values.begin(), values.end(), std::numeric_limits<float>::quiet_NaN());
    }
    return absl::OkStatus();
  };
  const std::vector<float> nans(predictions_.size(), std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(check_->Check(path_, 1, Commit(), labels_, nans, diverged, kNow).ok());
  const Status refused = check_->Check(path_, 1, Commit(), labels_, nans, source_, kNow);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("predicts nan"));
}

INSTANTIATE_TEST_SUITE_P(Models, EvalCheckTest, ::testing::Values("lr", "dlrm"));

}  // namespace
}  // namespace eps
