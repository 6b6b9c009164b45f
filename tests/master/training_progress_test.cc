// Tests master/progress/training_progress.h: passes over a tiny hand-made DataSet
// (three training shards, one eval shard), exactly-once commits and the
// ledger, releases, epochs, the evaluation, checkpoints and what is handed
// to the store.

#include "master/progress/training_progress.h"

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "master/progress/data_set.h"
#include "master/progress/shard_tracker.h"
#include "master/state_store.h"
#include "proto/eps.pb.h"
#include "tests/master/unit_testing.h"
#include "tests/testing/recording_events.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// The rest of the assigned shard, from where the assignment starts.
proto::CommitProgressRequest RestOf(const proto::ShardAssignment& shard) {
  return CommitOf(shard, shard.start(), shard.records());
}

// Eval labels and predictions of the 4-line eval shard: AUC 3/4.
constexpr float kLabelValues[] = {1, 0, 1, 0};
constexpr float kPredictionValues[] = {0.9f, 0.6f, 0.4f, 0.1f};
constexpr std::span<const float> kLabels(kLabelValues);
constexpr std::span<const float> kPredictions(kPredictionValues);

class TrainingProgressTest : public ::testing::Test {
 protected:
  TrainingProgressTest() {
    job_.job.epochs = 2;
    job_.job.seed = 1;
    job_.worker.batch_size.value = 2;
  }

  void SetData() {
    progress_.SetData(MakeData("/data/train-0", {4, 4, 2}), MakeData("/data/eval-0", {4}));
  }

  // Hands out every queued shard to `worker` and commits each whole.
  // Returns the last commit.
  proto::CommitProgressRequest RunPass(uint32_t worker) {
    proto::CommitProgressRequest last;
    while (std::optional<proto::ShardAssignment> shard = progress_.Assign(worker)) {
      last = RestOf(*shard);
      const bool eval = shard->phase() == proto::EVAL;
      StatusOr<TrainingProgress::Committed> committed =
          progress_.Commit(worker, last, eval ? kLabels : std::span<const float>(),
                           eval ? kPredictions : std::span<const float>());
      EXPECT_TRUE(committed.ok()) << committed.status();
      EXPECT_TRUE(committed.ok() && committed->applied);
    }
    return last;
  }

  PeekedUpdate TakeChanges() {
    StateUpdate update;
    progress_.TakeChanges(&update);
    return PeekUpdate(update);
  }

  JobConfig job_;
  RecordingEvents events_;
  TrainingProgress progress_{job_, &events_};
};

TEST_F(TrainingProgressTest, StartsTheFirstEpochOverTheData) {
  EXPECT_FALSE(progress_.data_ready());
  SetData();
  EXPECT_TRUE(progress_.data_ready());
  EXPECT_EQ(progress_.phase(), JobPhase::kScanning);
  EXPECT_FALSE(progress_.Assign(0).has_value()) << "no pass before StartEpoch";

  progress_.StartEpoch(0);
  EXPECT_EQ(progress_.phase(), JobPhase::kTraining);
  EXPECT_EQ(progress_.epoch(), 0u);
  ASSERT_NE(progress_.tracker(), nullptr);
  EXPECT_EQ(progress_.tracker()->num_shards(), 3u);
  ASSERT_EQ(progress_.ledger().size(), 1u);
  EXPECT_EQ(progress_.ledger()[0].epoch(), 1u);
  EXPECT_EQ(progress_.ledger()[0].records_expected(), 10u);
  EXPECT_EQ(progress_.PassLinesLeft(), 10u);
  // This pass, the second epoch and the evaluation.
  EXPECT_EQ(progress_.JobLinesLeft(), 10.0 + 10.0 + 4.0);
  ASSERT_EQ(events_.Count("epoch_started"), 1u);
  EXPECT_EQ(events_.Named("epoch_started")[0]["epoch"], 1);
  EXPECT_EQ(events_.Named("epoch_started")[0]["shards"], 3);
}

TEST_F(TrainingProgressTest, CommitCountsEachLineOnce) {
  SetData();
  progress_.StartEpoch(0);
  std::optional<proto::ShardAssignment> shard = progress_.Assign(/*worker=*/1);
  ASSERT_TRUE(shard.has_value());
  const ShardSpec& spec = progress_.train_data().shards[shard->shard_id()];
  EXPECT_EQ(shard->epoch(), 0u);
  EXPECT_EQ(shard->phase(), proto::TRAIN);
  EXPECT_EQ(shard->path(), "/data/train-0");
  EXPECT_EQ(shard->begin(), spec.begin);
  EXPECT_EQ(shard->end(), spec.end);
  EXPECT_EQ(shard->start(), spec.begin);
  EXPECT_EQ(shard->start_line(), spec.first_line);
  EXPECT_EQ(shard->records(), spec.lines);
  // Take the shards in their shuffled order until a 4-line one comes up.
  while (shard->records() != 4) {
    ASSERT_TRUE(progress_.Commit(1, RestOf(*shard), {}, {}).ok());
    shard = progress_.Assign(1);
    ASSERT_TRUE(shard.has_value());
  }
  const uint64_t trained_before = progress_.records_trained();
  const uint64_t lines_before = progress_.ledger()[0].lines_committed();

  // Two lines, one of them malformed.
  const proto::CommitProgressRequest first = CommitOf(*shard, shard->start(), 2, /*malformed=*/1);
  StatusOr<TrainingProgress::Committed> committed = progress_.Commit(1, first, {}, {});
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(committed->applied);
  EXPECT_TRUE(committed->current_pass);
  EXPECT_EQ(committed->records_trained, 1u);
  EXPECT_EQ(progress_.records_trained(), trained_before + 1);

  // The same commit again (its reply was lost): acknowledged, not counted.
  committed = progress_.Commit(1, first, {}, {});
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_FALSE(committed->applied);
  EXPECT_TRUE(committed->current_pass);
  EXPECT_EQ(committed->records_trained, 0u);
  EXPECT_EQ(progress_.records_trained(), trained_before + 1);

  committed = progress_.Commit(1, CommitOf(*shard, shard->start() + 2 * kLineBytes, 2), {}, {});
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(committed->applied);
  EXPECT_EQ(progress_.records_trained(), trained_before + 3);
  EXPECT_EQ(progress_.records_malformed(), 1u);
  const proto::EpochLedger& entry = progress_.ledger()[0];
  EXPECT_EQ(entry.lines_committed(), lines_before + 4);
  EXPECT_EQ(entry.records_committed(), trained_before + 3);
  EXPECT_EQ(entry.malformed(), 1u);
  EXPECT_DOUBLE_EQ(entry.loss_sum(), 0.5 * static_cast<double>(trained_before + 3));
  EXPECT_EQ(progress_.RunningLoss(), 0.5);
  EXPECT_EQ(progress_.tracker()->shard(shard->shard_id()).state, ShardTracker::State::kDone);

  // The rest of the pass: every line once.
  RunPass(1);
  EXPECT_EQ(progress_.ledger()[0].lines_committed(), 10u);
  EXPECT_EQ(progress_.ledger()[0].records_committed(), 9u);
  EXPECT_EQ(progress_.records_trained(), 9u);
  EXPECT_EQ(progress_.records_committed_total(), 9u);
  EXPECT_EQ(progress_.PassLinesLeft(), 0u);
  EXPECT_DOUBLE_EQ(progress_.PassFraction(), 1.0);
}

TEST_F(TrainingProgressTest, CommitsThatCannotApplyAreRefused) {
  SetData();
  progress_.StartEpoch(0);
  std::optional<proto::ShardAssignment> shard = progress_.Assign(/*worker=*/1);
  ASSERT_TRUE(shard.has_value());

  // Not its holder.
  EXPECT_EQ(progress_.Commit(2, CommitOf(*shard, shard->start(), 1), {}, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A gap: not from the committed offset.
  EXPECT_EQ(progress_.Commit(1, CommitOf(*shard, shard->start() + kLineBytes, 1), {}, {})
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  // Past the shard's end.
  EXPECT_EQ(progress_.Commit(1, CommitOf(*shard, shard->start(), shard->records() + 1), {}, {})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A later epoch, or an evaluation that has not started.
  proto::CommitProgressRequest later = CommitOf(*shard, shard->start(), 1);
  later.set_epoch(1);
  EXPECT_EQ(progress_.Commit(1, later, {}, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  proto::CommitProgressRequest eval = CommitOf(*shard, shard->start(), 1);
  eval.set_phase(proto::EVAL);
  EXPECT_EQ(progress_.Commit(1, eval, kLabels, kPredictions).status().code(),
            absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(progress_.records_trained(), 0u);
  EXPECT_EQ(progress_.tracker()->committed_lines(), 0u);
  EXPECT_EQ(progress_.ledger()[0].lines_committed(), 0u);
}

TEST_F(TrainingProgressTest, CommitForAFinishedEpochIsAcknowledgedUnapplied) {
  SetData();
  progress_.StartEpoch(0);
  EXPECT_EQ(progress_.AdvanceIfPassDone(), TrainingProgress::PassEnd::kNone);
  const proto::CommitProgressRequest last = RunPass(1);
  EXPECT_EQ(progress_.AdvanceIfPassDone(), TrainingProgress::PassEnd::kNextEpoch);
  ASSERT_EQ(progress_.epoch(), 1u);

  StatusOr<TrainingProgress::Committed> repeat = progress_.Commit(1, last, {}, {});
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_FALSE(repeat->applied);
  EXPECT_FALSE(repeat->current_pass);
  EXPECT_EQ(progress_.records_trained(), 10u);
  EXPECT_EQ(progress_.ledger()[0].lines_committed(), 10u);
  EXPECT_EQ(progress_.ledger()[1].lines_committed(), 0u);
  EXPECT_EQ(progress_.tracker()->committed_lines(), 0u);

  // Still checked against the shard it names.
  proto::CommitProgressRequest outside = last;
  outside.set_end_offset(progress_.train_data().bytes + kLineBytes);
  EXPECT_EQ(progress_.Commit(1, outside, {}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TrainingProgressTest, ReleasePutsShardsBackAtTheCommittedOffset) {
  SetData();
  progress_.StartEpoch(0);
  std::optional<proto::ShardAssignment> a = progress_.Assign(/*worker=*/1);
  std::optional<proto::ShardAssignment> b = progress_.Assign(/*worker=*/1);
  std::optional<proto::ShardAssignment> c = progress_.Assign(/*worker=*/2);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(progress_.Commit(1, CommitOf(*a, a->start(), 1), {}, {}).ok());
  EXPECT_THAT(progress_.HoldersOfShardsInProgress(), UnorderedElementsAre(1u, 2u));

  progress_.ReleaseShardsOf(1, "lease expired", absl::Seconds(3));
  EXPECT_THAT(progress_.HoldersOfShardsInProgress(), ElementsAre(2u));
  EXPECT_EQ(progress_.reassignments(), 2u);
  EXPECT_EQ(progress_.worst_reassign_delay(), absl::Seconds(3));
  ASSERT_EQ(events_.Count("shard_reassigned"), 2u);
  for (const nlohmann::json& event : events_.Named("shard_reassigned")) {
    EXPECT_EQ(event["from_worker"], 1);
    EXPECT_EQ(event["reason"], "lease expired");
    if (event["shard"] == a->shard_id()) {
      EXPECT_EQ(event["resume_offset"], a->start() + kLineBytes);
    }
  }
  EXPECT_EQ(progress_.records_trained(), 1u) << "nothing committed is dropped";

  std::map<uint64_t, proto::ShardAssignment> again;
  while (std::optional<proto::ShardAssignment> shard = progress_.Assign(/*worker=*/3)) {
    again[shard->shard_id()] = *shard;
  }
  ASSERT_EQ(again.size(), 2u);
  const proto::ShardAssignment& resumed = again.at(a->shard_id());
  EXPECT_EQ(resumed.start(), a->start() + kLineBytes);
  EXPECT_EQ(resumed.start_line(), a->start_line() + 1);
  EXPECT_EQ(resumed.records(), a->records() - 1);
  EXPECT_EQ(again.at(b->shard_id()).start(), b->start());
  EXPECT_THAT(progress_.HoldersOfShardsInProgress(), UnorderedElementsAre(2u, 3u));
}

TEST_F(TrainingProgressTest, EpochsAdvanceThenEvaluationThenFinished) {
  SetData();
  progress_.StartEpoch(0);
  RunPass(1);
  EXPECT_EQ(progress_.AdvanceIfPassDone(), TrainingProgress::PassEnd::kNextEpoch);
  EXPECT_EQ(progress_.epoch(), 1u);
  EXPECT_EQ(progress_.phase(), JobPhase::kTraining);
  EXPECT_TRUE(progress_.EpochComplete(0));
  EXPECT_FALSE(progress_.EpochComplete(1));
  const proto::CommitProgressRequest last_train = RunPass(2);
  EXPECT_EQ(progress_.AdvanceIfPassDone(), TrainingProgress::PassEnd::kEvaluation);
  EXPECT_EQ(progress_.phase(), JobPhase::kEvaluating);
  EXPECT_FALSE(progress_.eval_auc().has_value()) << "computed only when the evaluation ends";
  EXPECT_EQ(progress_.records_trained(), 20u);
  EXPECT_EQ(progress_.ledger().size(), 2u);
  EXPECT_EQ(progress_.ledger()[1].lines_committed(), 10u);

  std::optional<proto::ShardAssignment> eval = progress_.Assign(/*worker=*/1);
  ASSERT_TRUE(eval.has_value());
  EXPECT_EQ(eval->phase(), proto::EVAL);
  EXPECT_EQ(eval->path(), "/data/eval-0");
  EXPECT_EQ(eval->records(), 4u);
  // Two commits of two lines, each with its labels and predictions.
  const std::span<const float> labels = kLabels;
  const std::span<const float> predictions = kPredictions;
  ASSERT_TRUE(progress_
                  .Commit(1, CommitOf(*eval, eval->start(), 2), labels.subspan(0, 2),
                          predictions.subspan(0, 2))
                  .ok());
  EXPECT_EQ(progress_.AdvanceIfPassDone(), TrainingProgress::PassEnd::kNone);
  const proto::CommitProgressRequest last_eval = CommitOf(*eval, eval->start() + 2 * kLineBytes, 2);
  ASSERT_TRUE(
      progress_.Commit(1, last_eval, labels.subspan(2, 2), predictions.subspan(2, 2)).ok());
  EXPECT_EQ(progress_.eval_records(), 4u);
  EXPECT_EQ(progress_.records_trained(), 20u) << "evaluation trains nothing";

  EXPECT_EQ(progress_.AdvanceIfPassDone(), TrainingProgress::PassEnd::kFinished);
  ASSERT_TRUE(progress_.eval_auc().has_value());
  EXPECT_DOUBLE_EQ(*progress_.eval_auc(), 0.75);
  // -(ln 0.9 + ln 0.4 + ln 0.4 + ln 0.9) / 4
  EXPECT_NEAR(*progress_.eval_logloss(), 0.510826, 1e-5);
  EXPECT_EQ(events_.Count("epoch_finished"), 2u);
  EXPECT_EQ(events_.Count("evaluation_started"), 1u);
  ASSERT_EQ(events_.Count("evaluation_finished"), 1u);
  EXPECT_EQ(events_.Named("evaluation_finished")[0]["records"], 4);

  progress_.Finish();
  EXPECT_EQ(progress_.phase(), JobPhase::kFinished);
  EXPECT_TRUE(progress_.over());
  EXPECT_EQ(progress_.tracker(), nullptr);
  EXPECT_DOUBLE_EQ(progress_.PassFraction(), 1.0);
  // Late repeats of the last commits are acknowledged without effect.
  StatusOr<TrainingProgress::Committed> repeat =
      progress_.Commit(1, last_eval, labels.subspan(2, 2), predictions.subspan(2, 2));
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_FALSE(repeat->applied);
  EXPECT_FALSE(repeat->current_pass);
  repeat = progress_.Commit(2, last_train, {}, {});
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_FALSE(repeat->applied);
  EXPECT_EQ(progress_.eval_records(), 4u);
  EXPECT_EQ(progress_.records_trained(), 20u);
}

TEST_F(TrainingProgressTest, WithoutEvalDataTheLastEpochFinishes) {
  job_.job.epochs = 1;
  progress_.SetData(MakeData("/data/train-0", {4, 4, 2}), DataSet());
  progress_.StartEpoch(0);
  RunPass(1);
  EXPECT_EQ(progress_.AdvanceIfPassDone(), TrainingProgress::PassEnd::kFinished);
  EXPECT_FALSE(progress_.eval_auc().has_value());
  EXPECT_EQ(events_.Count("evaluation_started"), 0u);
}

TEST_F(TrainingProgressTest, ApplyCheckpointReturnsToItsCounts) {
  SetData();
  progress_.StartEpoch(0);
  std::optional<proto::ShardAssignment> a = progress_.Assign(/*worker=*/1);
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(progress_.Commit(1, CommitOf(*a, a->start(), 1), {}, {}).ok());
  proto::CheckpointRecord checkpoint;
  checkpoint.set_id(4);
  progress_.SaveTo(checkpoint.mutable_master());
  progress_.SaveShards(&checkpoint);
  ASSERT_EQ(checkpoint.shards_size(), 3);

  // Training goes on past the checkpoint, into the next epoch.
  ASSERT_TRUE(progress_.Commit(1, CommitOf(*a, a->start() + kLineBytes, a->records() - 1), {}, {})
                  .ok());
  RunPass(2);
  ASSERT_EQ(progress_.AdvanceIfPassDone(), TrainingProgress::PassEnd::kNextEpoch);
  std::optional<proto::ShardAssignment> b = progress_.Assign(/*worker=*/2);
  ASSERT_TRUE(b.has_value());
  ASSERT_TRUE(progress_.Commit(2, RestOf(*b), {}, {}).ok());
  const uint64_t trained = progress_.records_trained();
  ASSERT_EQ(trained, 10u + b->records());
  TakeChanges();
  events_.Clear();

  ASSERT_TRUE(progress_.ApplyCheckpoint(checkpoint).ok());
  EXPECT_EQ(progress_.phase(), JobPhase::kTraining);
  EXPECT_EQ(progress_.epoch(), 0u);
  EXPECT_EQ(progress_.records_trained(), 1u);
  EXPECT_EQ(progress_.records_retrained(), trained - 1);
  ASSERT_EQ(progress_.ledger().size(), 1u);
  EXPECT_EQ(progress_.ledger()[0].lines_committed(), 1u);
  EXPECT_EQ(progress_.tracker()->committed_lines(), 1u);
  // The shard in progress then goes back to the queue from where it was.
  EXPECT_THAT(progress_.HoldersOfShardsInProgress(), IsEmpty());
  ASSERT_EQ(events_.Count("shard_reassigned"), 1u);
  EXPECT_EQ(events_.Named("shard_reassigned")[0]["reason"], "rolled back");
  std::optional<proto::ShardAssignment> resumed = progress_.Assign(/*worker=*/3);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->shard_id(), a->shard_id());
  EXPECT_EQ(resumed->epoch(), 0u);
  EXPECT_EQ(resumed->start(), a->start() + kLineBytes);
  EXPECT_EQ(resumed->records(), a->records() - 1);

  // The store gets the whole pass anew.
  const PeekedUpdate update = TakeChanges();
  EXPECT_TRUE(update.clear_pass);
  EXPECT_THAT(update.put_keys, UnorderedElementsAre(ShardKey(0), ShardKey(1), ShardKey(2)));
}

TEST_F(TrainingProgressTest, ApplyCheckpointRefusesOneNotTakenWhileTraining) {
  SetData();
  progress_.StartEpoch(0);
  proto::CheckpointRecord checkpoint;
  checkpoint.set_id(2);
  progress_.SaveTo(checkpoint.mutable_master());
  checkpoint.mutable_master()->set_phase(static_cast<uint32_t>(JobPhase::kEvaluating));
  Status applied = progress_.ApplyCheckpoint(checkpoint);
  EXPECT_EQ(applied.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(applied.message(), ::testing::HasSubstr("checkpoint 2"));
}

TEST_F(TrainingProgressTest, TakeChangesYieldsDirtyShardsAndClearsThePassOnANewEpoch) {
  SetData();
  PeekedUpdate update = TakeChanges();
  EXPECT_FALSE(update.clear_pass);
  EXPECT_THAT(update.put_keys, ElementsAre(kTrainKey, kEvalKey));
  proto::DataSetRecord train;
  ASSERT_TRUE(train.ParseFromString(update.values.at(kTrainKey)));
  EXPECT_EQ(train.records(), 10u);
  EXPECT_EQ(train.shards_size(), 3);

  progress_.StartEpoch(0);
  update = TakeChanges();
  EXPECT_TRUE(update.clear_pass);
  EXPECT_THAT(update.put_keys, ElementsAre(ShardKey(0), ShardKey(1), ShardKey(2)));
  StateUpdate nothing;
  progress_.TakeChanges(&nothing);
  EXPECT_TRUE(nothing.empty());

  std::optional<proto::ShardAssignment> shard = progress_.Assign(/*worker=*/1);
  ASSERT_TRUE(shard.has_value());
  update = TakeChanges();
  EXPECT_FALSE(update.clear_pass);
  EXPECT_THAT(update.put_keys, ElementsAre(ShardKey(shard->shard_id())));
  proto::ShardRecord record;
  ASSERT_TRUE(record.ParseFromString(update.values.at(ShardKey(shard->shard_id()))));
  EXPECT_EQ(record.state(), proto::SHARD_DOING);
  EXPECT_EQ(record.holder(), 1u);

  ASSERT_TRUE(progress_.Commit(1, CommitOf(*shard, shard->start(), 1), {}, {}).ok());
  update = TakeChanges();
  EXPECT_THAT(update.put_keys, ElementsAre(ShardKey(shard->shard_id())));
  ASSERT_TRUE(record.ParseFromString(update.values.at(ShardKey(shard->shard_id()))));
  EXPECT_EQ(record.committed(), shard->start() + kLineBytes);
  EXPECT_EQ(record.committed_records(), 1u);

  // A repeated commit changes nothing.
  ASSERT_TRUE(progress_.Commit(1, CommitOf(*shard, shard->start(), 1), {}, {}).ok());
  progress_.TakeChanges(&nothing);
  EXPECT_TRUE(nothing.empty());

  ASSERT_TRUE(progress_.Commit(1, CommitOf(*shard, shard->start() + kLineBytes,
                                           shard->records() - 1),
                               {}, {})
                  .ok());
  RunPass(1);
  ASSERT_EQ(progress_.AdvanceIfPassDone(), TrainingProgress::PassEnd::kNextEpoch);
  update = TakeChanges();
  EXPECT_TRUE(update.clear_pass) << "the next epoch replaces the stored pass";
  EXPECT_THAT(update.put_keys, ElementsAre(ShardKey(0), ShardKey(1), ShardKey(2)));
  for (uint64_t id = 0; id < 3; ++id) {
    ASSERT_TRUE(record.ParseFromString(update.values.at(ShardKey(id))));
    EXPECT_EQ(record.state(), proto::SHARD_TODO) << "shard " << id;
  }

  // Eval commits are stored with their labels and predictions.
  RunPass(1);
  ASSERT_EQ(progress_.AdvanceIfPassDone(), TrainingProgress::PassEnd::kEvaluation);
  TakeChanges();
  std::optional<proto::ShardAssignment> eval = progress_.Assign(/*worker=*/1);
  ASSERT_TRUE(eval.has_value());
  ASSERT_TRUE(progress_.Commit(1, RestOf(*eval), kLabels, kPredictions).ok());
  update = TakeChanges();
  EXPECT_THAT(update.put_keys,
              UnorderedElementsAre(ShardKey(0), absl::StrCat("eval/", absl::Hex(0, absl::kZeroPad16),
                                                             "/", absl::Hex(0, absl::kZeroPad16))));
  EXPECT_EQ(update.values.at(absl::StrCat("eval/", absl::Hex(0, absl::kZeroPad16), "/",
                                          absl::Hex(0, absl::kZeroPad16)))
                .size(),
            2 * 4 * sizeof(float));
}

// A restarted master: the stored changes, read back as a snapshot, continue
// the pass where it was.
TEST_F(TrainingProgressTest, RestoreFromTheStoredStateContinuesThePass) {
  SetData();
  progress_.StartEpoch(0);
  std::optional<proto::ShardAssignment> a = progress_.Assign(/*worker=*/1);
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(progress_.Commit(1, CommitOf(*a, a->start(), 3), {}, {}).ok());
  const PeekedUpdate update = TakeChanges();

  MasterSnapshot snapshot;
  progress_.SaveTo(&snapshot.master);
  ASSERT_TRUE(snapshot.train.ParseFromString(update.values.at(kTrainKey)));
  ASSERT_TRUE(snapshot.eval.ParseFromString(update.values.at(kEvalKey)));
  for (uint64_t id = 0; id < 3; ++id) {
    ASSERT_TRUE(snapshot.shards[id].ParseFromString(update.values.at(ShardKey(id))));
  }

  RecordingEvents events;
  TrainingProgress restored(job_, &events);
  ASSERT_TRUE(restored.RestoreFrom(snapshot).ok());
  EXPECT_EQ(restored.phase(), JobPhase::kTraining);
  EXPECT_EQ(restored.epoch(), 0u);
  EXPECT_EQ(restored.records_trained(), 3u);
  EXPECT_EQ(restored.ledger()[0].lines_committed(), 3u);
  EXPECT_EQ(restored.train_data().lines, 10u);
  EXPECT_EQ(restored.eval_data().lines, 4u);
  const ShardTracker::Shard& held = restored.tracker()->shard(a->shard_id());
  EXPECT_EQ(held.state, ShardTracker::State::kDoing);
  EXPECT_EQ(held.holder, 1u);
  EXPECT_EQ(held.committed_offset, a->start() + 3 * kLineBytes);
  EXPECT_THAT(restored.HoldersOfShardsInProgress(), ElementsAre(1u));

  // A snapshot with a gap in its shard ids does not add up.
  snapshot.shards.erase(1);
  TrainingProgress broken(job_, &events);
  EXPECT_EQ(broken.RestoreFrom(snapshot).code(), absl::StatusCode::kDataLoss);
}

TEST_F(TrainingProgressTest, SplitOffAStragglerGoesToTheIdleWorker) {
  SetData();
  progress_.StartEpoch(0);
  while (progress_.Assign(/*worker=*/1).has_value()) {
  }
  EXPECT_FALSE(progress_.SplitRequestedOf(1).has_value());
  // Idle worker 2 and nothing queued: the holder of the most lines left
  // (4, at least 2 batches of 2) is asked to split.
  std::optional<uint64_t> split = progress_.RequestSplit(/*idle_worker=*/2);
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(progress_.train_data().shards[*split].lines, 4u);
  EXPECT_EQ(progress_.SplitRequestedOf(1), split);
  ASSERT_EQ(events_.Count("split_requested"), 1u);
  EXPECT_EQ(events_.Named("split_requested")[0]["idle_worker"], 2);

  const ShardSpec& spec = progress_.train_data().shards[*split];
  proto::SplitShardRequest request;
  request.set_shard_id(*split);
  request.set_epoch(0);
  request.set_phase(proto::TRAIN);
  request.set_split_offset(spec.begin + 2 * kLineBytes);
  request.set_split_line(spec.first_line + 2);
  StatusOr<TrainingProgress::Split> answer = progress_.SplitShard(1, request);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->accepted);
  EXPECT_EQ(answer->new_shard, 3u);
  // A retry gets the same answer.
  answer = progress_.SplitShard(1, request);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->accepted);
  EXPECT_EQ(answer->new_shard, 3u);
  EXPECT_EQ(progress_.splits(), 1u);

  std::optional<proto::ShardAssignment> part = progress_.Assign(/*worker=*/2);
  ASSERT_TRUE(part.has_value());
  EXPECT_EQ(part->shard_id(), 3u);
  EXPECT_EQ(part->start(), spec.begin + 2 * kLineBytes);
  EXPECT_EQ(part->records(), 2u);
  // A split for a pass that is over is not wanted.
  request.set_epoch(1);
  answer = progress_.SplitShard(1, request);
  ASSERT_TRUE(answer.ok());
  EXPECT_FALSE(answer->accepted);
}

}  // namespace
}  // namespace eps
