// The fixture of the JobControl tests (tests/master/job_control*_test.cc):
// a small job driven through JobControl's handlers and job-loop steps with
// scripted time, a fake store that applies what TakeChanges yields, and a
// recording event sink. No sockets, files or sleeps.
//
// Thread-safety: the fixture runs on the test's thread.

#ifndef EPS_TESTS_MASTER_JOB_CONTROL_FIXTURE_H_
#define EPS_TESTS_MASTER_JOB_CONTROL_FIXTURE_H_

#include "master/job_control.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "cluster/job_options.h"
#include "core/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "master/progress/data_set.h"
#include "master/progress/shard_tracker.h"
#include "master/progress/training_progress.h"
#include "master/state_store.h"
#include "proto/eps.pb.h"
#include "rpc/message.h"
#include "tests/master/unit_testing.h"
#include "tests/testing/recording_events.h"

namespace eps {


using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

inline constexpr char kFingerprint[] = "fingerprint of the tiny job";
inline constexpr char kDataDir[] = "/nonexistent/eps-master";

// The training data: shards of 4, 4 and 2 lines; no eval data.
inline std::pair<DataSet, DataSet> TinyData() {
  return {MakeData("/data/train-0", {4, 4, 2}), DataSet()};
}

// The state a StateStore would hold after writing each update in turn
// (StateStore::Write: the clear, then the puts, then the deletes), read
// back as StateStore::Load would.
class FakeStore {
 public:
  void Write(const StateUpdate& update) {
    const PeekedUpdate peeked = PeekUpdate(update);
    if (peeked.clear_pass) {
      std::erase_if(kv_, [](const auto& entry) {
        return absl::StartsWith(entry.first, "pass/shard/") ||
               absl::StartsWith(entry.first, "eval/");
      });
    }
    for (const std::string& key : peeked.put_keys) kv_[key] = peeked.values.at(key);
    for (const std::string& key : peeked.deleted_keys) kv_.erase(key);
  }

  MasterSnapshot Load() const {
    MasterSnapshot snapshot;
    for (const auto& [key, value] : kv_) {
      absl::string_view rest = key;
      uint64_t id = 0;
      if (key == kMasterKey) {
        EXPECT_TRUE(snapshot.master.ParseFromString(value));
      } else if (key == kTrainKey) {
        EXPECT_TRUE(snapshot.train.ParseFromString(value));
      } else if (key == kEvalKey) {
        EXPECT_TRUE(snapshot.eval.ParseFromString(value));
      } else if (absl::ConsumePrefix(&rest, "pass/shard/")) {
        EXPECT_TRUE(absl::SimpleHexAtoi(rest, &id)) << key;
        EXPECT_TRUE(snapshot.shards[id].ParseFromString(value));
      } else if (absl::ConsumePrefix(&rest, "checkpoint/")) {
        EXPECT_TRUE(absl::SimpleHexAtoi(rest, &id)) << key;
        EXPECT_TRUE(snapshot.checkpoints[id].ParseFromString(value));
      }
    }
    return snapshot;
  }

 private:
  std::map<std::string, std::string> kv_;
};

class JobControlTest : public ::testing::Test {
 protected:
  JobControlTest() {
    job_.job.name = "tiny";
    job_.job.epochs = 1;
    job_.job.progress_interval_s = 10;
    job_.master.heartbeat_ms = 100;
    job_.checkpoint.interval_s = 60;
    job_.checkpoint.keep = 3;
    job_.worker.batch_size.value = 2;
    control_ = NewControl();
  }

  std::unique_ptr<JobControl> NewControl(std::string fingerprint = kFingerprint) {
    proto::JobSpec spec;
    spec.set_name("tiny");
    spec.set_num_partitions(8);
    return std::make_unique<JobControl>(job_, spec, std::move(fingerprint), kDataDir, &events_,
                                        t0_);
  }

  absl::Time At(int64_t ms) const { return t0_ + absl::Milliseconds(ms); }

  Status RegisterServer(int port, uint32_t pid, std::optional<uint32_t> stored, absl::Time now,
                        proto::RegisterServerReply* reply = nullptr) {
    proto::RegisterServerRequest request = ServerRequest(port, pid, stored);
    AddSharedOptions(job_.SharedOptions(), request.mutable_job_options());
    if (stored.has_value()) {
      request.set_stored_job(absl::StrCat(control_->job_spec().job_id(), " tiny"));
    }
    proto::RegisterServerReply ignored;
    return control_->RegisterServer(request, now, reply != nullptr ? reply : &ignored);
  }

  uint32_t AddWorker(absl::Time now) {
    proto::RegisterWorkerReply reply;
    proto::RegisterWorkerRequest request = WorkerRequest(/*pid=*/300);
    AddSharedOptions(job_.SharedOptions(), request.mutable_job_options());
    Status status = control_->RegisterWorker(request, now, &reply);
    EXPECT_TRUE(status.ok()) << status;
    return reply.worker_id();
  }

  // A new job with two servers (ports 5000, 5001) and its data scanned at
  // t0, training; workers 0 and 1 registered.
  void StartTraining() {
    control_->StartNew("job-1");
    ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
    ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, t0_).ok());
    control_->DataScanned(TinyData(), t0_);
    ASSERT_EQ(control_->progress().phase(), JobPhase::kTraining);
    ASSERT_EQ(AddWorker(t0_), 0u);
    ASSERT_EQ(AddWorker(t0_), 1u);
  }

  Status ServerBeat(uint32_t slot, absl::Time now, proto::HeartbeatReply* reply = nullptr) {
    proto::HeartbeatRequest request;
    request.set_endpoint(control_->membership().servers().at(slot).endpoint);
    proto::HeartbeatReply ignored;
    return control_->Heartbeat(ServerNode(slot), request, /*map_version=*/0, now,
                               reply != nullptr ? reply : &ignored);
  }

  // `map_version`: the cluster map the worker says it routes by.
  Status WorkerBeat(uint32_t id, absl::Time now, uint64_t paused_for = 0,
                    proto::HeartbeatReply* reply = nullptr, uint64_t map_version = 0) {
    proto::HeartbeatRequest request;
    request.set_paused_for_checkpoint(paused_for);
    proto::HeartbeatReply ignored;
    return control_->Heartbeat(WorkerNode(id), request, map_version, now,
                               reply != nullptr ? reply : &ignored);
  }

  // Heartbeats from `servers` and `workers` (not paused).
  void Beat(absl::Time now, const std::vector<uint32_t>& servers,
            const std::vector<uint32_t>& workers) {
    for (uint32_t slot : servers) EXPECT_TRUE(ServerBeat(slot, now).ok()) << "ps[" << slot << "]";
    for (uint32_t id : workers) EXPECT_TRUE(WorkerBeat(id, now).ok()) << "worker " << id;
  }

  proto::GetShardReply GetShard(uint32_t worker, absl::Time now) {
    proto::GetShardReply reply;
    Status status = control_->GetShard(WorkerNode(worker), now, &reply);
    EXPECT_TRUE(status.ok()) << status;
    return reply;
  }

  // The next shard for `worker`, which must get one.
  proto::ShardAssignment Assigned(uint32_t worker, absl::Time now) {
    proto::GetShardReply reply = GetShard(worker, now);
    EXPECT_EQ(reply.action(), proto::GetShardReply::ASSIGNED);
    return reply.shard();
  }

  Status Commit(uint32_t worker, const proto::CommitProgressRequest& commit, absl::Time now,
                proto::CommitProgressReply* reply = nullptr) {
    proto::CommitProgressReply ignored;
    return control_->Commit(WorkerNode(worker), commit, {}, {}, now,
                            reply != nullptr ? reply : &ignored);
  }

  const ShardTracker::Shard& ShardState(uint64_t id) const {
    return control_->progress().tracker()->shard(id);
  }

  // Checkpoint `id`: requested and started at `now`, both workers paused,
  // written by both servers (1000 and 2000 bytes) and recorded 50 ms later.
  void RecordCheckpoint(uint64_t id, absl::Time now, proto::CheckpointRecord* recorded) {
    ASSERT_EQ(control_->RequestCheckpoint().value(), id);
    control_->Tick(now);
    ASSERT_TRUE(WorkerBeat(0, now, /*paused_for=*/id).ok());
    ASSERT_TRUE(WorkerBeat(1, now, /*paused_for=*/id).ok());
    const std::optional<JobControl::CheckpointWrite> write = control_->NextCheckpointWrite(now);
    ASSERT_TRUE(write.has_value());
    const absl::Time written = now + absl::Milliseconds(50);
    StateUpdate update;
    const std::optional<proto::CheckpointRecord> record = control_->CheckpointWritten(
        *write, {Part(0, id, 1000), Part(1, id, 2000)}, now, written, &update);
    ASSERT_TRUE(record.has_value());
    EXPECT_THAT(PeekUpdate(update).put_keys, ElementsAre(CheckpointKey(id)));
    control_->CheckpointRecorded(*record, absl::OkStatus(), written);
    ASSERT_EQ(control_->checkpoints().last()->id(), id);
    *recorded = *record;
  }

  // What the store holds for the job now: the master record, the data
  // sets, the pass's shards and the last checkpoint.
  MasterSnapshot Snapshot() const {
    MasterSnapshot snapshot;
    snapshot.master = control_->SaveRecord();
    snapshot.train = DataSetToRecord(TinyData().first);
    snapshot.eval = DataSetToRecord(TinyData().second);
    const ShardTracker* tracker = control_->progress().tracker();
    for (uint64_t id = 0; id < tracker->num_shards(); ++id) {
      snapshot.shards[id] = tracker->ToRecord(id);
    }
    const proto::CheckpointRecord& last = *control_->checkpoints().last();
    snapshot.checkpoints[last.id()] = last;
    return snapshot;
  }

  PeekedUpdate Take(bool* ended = nullptr) {
    StateUpdate update;
    const bool job_ended = control_->TakeChanges(&update);
    if (ended != nullptr) *ended = job_ended;
    return PeekUpdate(update);
  }

  const absl::Time t0_ = absl::FromUnixSeconds(1'700'000'000);
  JobConfig job_ = TwoServerJob();
  RecordingEvents events_;
  std::unique_ptr<JobControl> control_;
};

// --- A whole job -----------------------------------------------------------------

// The liveness tests' job: two servers and workers 0 and 1 training,
// with the steps the bounds, health and trust tests share.
class JobControlLivenessTest : public JobControlTest {
 protected:
  // Training on `data` with two servers (ports 5000, 5001) and workers 0
  // and 1, all at t0.
  void StartTrainingOn(DataSet data) {
    control_->StartNew("job-1");
    ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
    ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, t0_).ok());
    control_->DataScanned(std::make_pair(std::move(data), DataSet()), t0_);
    ASSERT_EQ(control_->progress().phase(), JobPhase::kTraining);
    ASSERT_EQ(AddWorker(t0_), 0u);
    ASSERT_EQ(AddWorker(t0_), 1u);
  }

  // A job of 2 training lines and 2 eval lines: worker 0 trains them and
  // holds the evaluation's shard, returned.
  proto::ShardAssignment StartEvaluating() {
    control_->StartNew("job-1");
    EXPECT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
    EXPECT_TRUE(RegisterServer(5001, 101, std::nullopt, t0_).ok());
    control_->DataScanned(
        std::make_pair(MakeData("/data/train-0", {2}), MakeData("/data/eval", {2})), t0_);
    EXPECT_EQ(AddWorker(t0_), 0u);
    const proto::ShardAssignment train = Assigned(0, t0_);
    EXPECT_TRUE(Commit(0, CommitOf(train, train.start(), 2), At(100)).ok());
    EXPECT_EQ(control_->progress().phase(), JobPhase::kEvaluating);
    return Assigned(0, At(200));
  }

  // Checkpoint round `id`, requested at `now`, both workers paused, in
  // which ps[`failing`] fails to write.
  void FailCheckpointRound(uint64_t id, absl::Time now, uint32_t failing) {
    Beat(now, {0, 1}, {});
    ASSERT_EQ(control_->RequestCheckpoint().value(), id);
    control_->Tick(now);
    ASSERT_TRUE(WorkerBeat(0, now, id).ok());
    ASSERT_TRUE(WorkerBeat(1, now, id).ok());
    const std::optional<JobControl::CheckpointWrite> write = control_->NextCheckpointWrite(now);
    ASSERT_TRUE(write.has_value());
    std::vector<StatusOr<proto::ServerCheckpoint>> parts;
    for (uint32_t slot : {0u, 1u}) {
      if (slot == failing) {
        parts.push_back(absl::UnavailableError(absl::StrCat("ps[", slot, "]: disk full")));
      } else {
        parts.push_back(Part(slot, id));
      }
    }
    StateUpdate update;
    EXPECT_FALSE(control_->CheckpointWritten(*write, parts, now, now, &update).has_value());
  }

  // Batch `i` of 8 lines of `a` from worker 0, at `loss` per record, at
  // 100 ms + `i` ms (or at `now`).
  Status CommitBatch(const proto::ShardAssignment& a, int i, double loss,
                     std::optional<absl::Time> now = std::nullopt) {
    proto::CommitProgressRequest request = CommitOf(a, a.start() + i * 8 * kLineBytes, 8);
    request.set_loss_sum(8 * loss);
    return Commit(0, request, now.value_or(At(100 + i)));
  }

  // Worker 0's commit of the 2 records of `eval` (StartEvaluating), labels
  // 1 and 0, with `predictions`.
  Status CommitEvaluation(const proto::ShardAssignment& eval, std::vector<float> predictions) {
    proto::CommitProgressReply reply;
    return control_->Commit(WorkerNode(0), CommitOf(eval, eval.start(), 2),
                            std::vector<float>{1, 0}, predictions, At(300), &reply);
  }

  void ExpectStoppedWith(const std::string& words) {
    EXPECT_TRUE(control_->over());
    EXPECT_EQ(control_->progress().phase(), JobPhase::kFailed);
    EXPECT_TRUE(control_->progress().stopped()) << "resumable";
    EXPECT_THAT(control_->progress().failure(), HasSubstr(words));
  }
};

}  // namespace eps

#endif  // EPS_TESTS_MASTER_JOB_CONTROL_FIXTURE_H_
