// Tests worker/step_pipeline.h with steps and dense pulls the test scripts:
// a fake "server" holding one dense tensor's version, pushes that the test
// releases one by one, and a log of what ran in which order. No network:
// the lanes are empty.

#include "worker/step_pipeline.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::ElementsAre;

// One dense tensor (parameter 0) on one server (index 0).
PsClient::Versions At(uint64_t version) { return {{version}}; }

// The fake cluster: a version the pushes raise, pushes that wait for the
// test to release them, and a log of events.
class Script {
 public:
  // Each push waits for Release (or for `free_pushes`); with `hold_pulls`,
  // each pull but the first waits for ReleasePull.
  explicit Script(bool free_pushes = false, bool hold_pulls = false)
      : free_(free_pushes), hold_pulls_(hold_pulls) {}

  StepPipeline::Hooks Hooks(bool dense = true) {
    StepPipeline::Hooks hooks;
    hooks.make_lane = [] { return StepPipeline::Lane{}; };
    if (dense) {
      hooks.pull_dense = [this](StepPipeline::Lane&, StepPipeline::DenseCopy* copy) {
        absl::MutexLock lock(&mu_);
        auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !hold_pulls_ || pulls_ == 0 || pulls_released_ > 0;
        };
        mu_.Await(absl::Condition(&go));
        if (pulls_++ > 0 && hold_pulls_) --pulls_released_;
        if (!pull_result_.ok()) {
          log_.push_back("pull failed");
          return pull_result_;
        }
        copy->values = {{static_cast<float>(version_)}};
        copy->versions = At(version_);
        log_.push_back(absl::StrCat("pull v", version_));
        return absl::OkStatus();
      };
    }
    hooks.abandoned = [this] { return abandoned_.load(); };
    return hooks;
  }

  // A step of `pushes` pushes (each applied as one update, plus `others`
  // updates by other workers before it), `late` late pushes (which change
  // no dense tensor; they fail with `late_result`) and a commit, named
  // `name`. Every push waits for its release.
  StepPipeline::Step Step(const std::string& name, int pushes = 1, uint64_t others = 0,
                          Status push_result = absl::OkStatus(), int late = 0,
                          Status late_result = absl::OkStatus()) {
    StepPipeline::Step step;
    for (int p = 0; p < late; ++p) {
      step.late_pushes.push_back(
          [this, name, late_result](StepPipeline::Lane&, PsClient::Versions* applied,
                                                              StepPipeline::DenseCopy*) {
            absl::MutexLock lock(&mu_);
            ++pushes_started_;
            auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return free_ || released_ > 0;
            };
            mu_.Await(absl::Condition(&go));
            if (!free_) --released_;
            log_.push_back(absl::StrCat("late push ", name, late_result.ok() ? "" : " failed"));
            *applied = At(0);  // the servers' replies name no dense tensor's version
            return late_result;
          });
    }
    for (int p = 0; p < pushes; ++p) {
      step.pushes.push_back([this, name, others, push_result](StepPipeline::Lane&,
                                                              PsClient::Versions* applied,
                                                              StepPipeline::DenseCopy* copy) {
        absl::MutexLock lock(&mu_);
        ++pushes_started_;
        auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return free_ || released_ > 0; };
        mu_.Await(absl::Condition(&go));
        if (!free_) --released_;
        if (!push_result.ok()) {
          log_.push_back(absl::StrCat("push ", name, " failed"));
          return push_result;
        }
        version_ += others + 1;
        *applied = At(version_);
        log_.push_back(absl::StrCat("push ", name));
        if (read_back_ && copy != nullptr) {
          // Read back in several messages: the first's version.
          const uint64_t version = version_ - read_back_lag_;
          copy->values = {{static_cast<float>(version)}};
          copy->versions = At(version);
          log_.push_back(absl::StrCat("read back v", version));
        }
        return absl::OkStatus();
      });
    }
    step.commit = [this, name](StepPipeline::Lane&) {
      absl::MutexLock lock(&mu_);
      log_.push_back(absl::StrCat("commit ", name));
      return absl::OkStatus();
    };
    step.on_end = [this] { ended_.fetch_add(1); };
    return step;
  }

  // Every pull from now on fails with `status`.
  void FailPulls(Status status) {
    absl::MutexLock lock(&mu_);
    pull_result_ = std::move(status);
  }
  // Steps whose on_end ran.
  int ended() const { return ended_.load(); }

  void Release(int pushes = 1) {
    absl::MutexLock lock(&mu_);
    released_ += pushes;
  }
  // The servers' version rises with no push and no reply telling of it
  // (a checkpoint applying their global batches).
  void Flush() {
    absl::MutexLock lock(&mu_);
    ++version_;
  }
  void ReleasePull() {
    absl::MutexLock lock(&mu_);
    ++pulls_released_;
  }
  void Abandon() { abandoned_ = true; }
  // Pushes from now on read the dense tensors back (PsClient::Push's
  // `after`).
  void ReadBack(uint64_t lag = 0) {
    absl::MutexLock lock(&mu_);
    read_back_ = true;
    read_back_lag_ = lag;
  }

  // Waits until `n` pushes have begun (taken by the pipeline's thread).
  void AwaitPushesStarted(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pushes_started_ >= n; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10)));
  }

  // Waits until the log has `n` entries; the log.
  std::vector<std::string> AwaitLog(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return log_.size() >= n; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10)))
        << "log: " << log_.size() << " of " << n;
    return log_;
  }
  std::vector<std::string> log() const {
    absl::MutexLock lock(&mu_);
    return log_;
  }

 private:
  const bool free_;
  const bool hold_pulls_;
  mutable absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  int released_ ABSL_GUARDED_BY(mu_) = 0;
  int pushes_started_ ABSL_GUARDED_BY(mu_) = 0;
  int pulls_ ABSL_GUARDED_BY(mu_) = 0;
  int pulls_released_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  Status pull_result_ ABSL_GUARDED_BY(mu_);
  bool read_back_ ABSL_GUARDED_BY(mu_) = false;
  // How far behind the push's own version a read-back copy is.
  uint64_t read_back_lag_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> abandoned_{false};
  std::atomic<int> ended_{0};
};

// The version of the copy AwaitDense gives.
uint64_t VersionOf(const StatusOr<std::shared_ptr<const StepPipeline::DenseCopy>>& copy) {
  EXPECT_TRUE(copy.ok()) << copy.status();
  if (!copy.ok() || *copy == nullptr) return ~uint64_t{0};
  return (*copy)->versions[0][0];
}

// AwaitDense run on another thread, so that the test can see it wait.
class AsyncAwait {
 public:
  explicit AsyncAwait(StepPipeline* pipeline)
      : thread_([this, pipeline] {
          result_ = pipeline->AwaitDense();
          done_.Notify();
        }) {}
  ~AsyncAwait() { thread_.join(); }
  bool WaitedFor(absl::Duration duration) { return !done_.WaitForNotificationWithTimeout(duration); }
  StatusOr<std::shared_ptr<const StepPipeline::DenseCopy>> result() {
    done_.WaitForNotification();
    return result_;
  }

 private:
  absl::Notification done_;
  StatusOr<std::shared_ptr<const StepPipeline::DenseCopy>> result_ = absl::UnknownError("unset");
  std::thread thread_;
};

TEST(StepPipeline, CommitsEachStepAfterItsPushesInOrder) {
  Script script(/*free_pushes=*/true);
  StepPipeline pipeline(/*max_staleness=*/4, script.Hooks(/*dense=*/false));
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a")).ok());
  ASSERT_TRUE(pipeline.Enqueue(script.Step("b", /*pushes=*/2)).ok());  // trained in halves
  ASSERT_TRUE(pipeline.Enqueue(script.Step("eval", /*pushes=*/0)).ok());
  ASSERT_TRUE(pipeline.Drain().ok());
  EXPECT_THAT(script.log(),
              ElementsAre("push a", "commit a", "push b", "push b", "commit b", "commit eval"));
  ASSERT_TRUE(pipeline.AwaitDense().ok());
  EXPECT_EQ(*pipeline.AwaitDense(), nullptr);  // the model has no dense tensors
}

// max_staleness 0: each step starts from a copy that holds every update
// the worker made: it waits for the last push and the pull after it.
TEST(StepPipeline, AtStalenessZeroEveryStepWaitsForThePreviousPushAndAFreshCopy) {
  Script script;
  StepPipeline pipeline(/*max_staleness=*/0, script.Hooks());
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 0u);  // the first copy, pulled at once
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a")).ok());
  {
    AsyncAwait next(&pipeline);
    EXPECT_TRUE(next.WaitedFor(absl::Milliseconds(200)));  // push a in flight
    script.Release();
    EXPECT_EQ(VersionOf(next.result()), 1u);
  }
  EXPECT_THAT(script.AwaitLog(4), ElementsAre("pull v0", "push a", "pull v1", "commit a"));
}

// A checkpoint applied the servers' global batches: nothing this worker
// pushed or heard tells of the new version, so the copy it holds looks
// fresh; RenewDense makes the next step wait for a copy pulled after it.
TEST(StepPipeline, ARenewedCopyIsPulledAgainBeforeTheNextStep) {
  Script script(/*free_pushes=*/true);
  StepPipeline pipeline(/*max_staleness=*/0, script.Hooks());
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 0u);
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a")).ok());
  ASSERT_TRUE(pipeline.Drain().ok());
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 1u);
  script.Flush();
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 1u) << "nothing told of version 2";
  pipeline.RenewDense();
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 2u);
  EXPECT_THAT(script.AwaitLog(5),
              ElementsAre("pull v0", "push a", "pull v1", "commit a", "pull v2"));
}

// max_staleness 1: the next step starts while the last push is in flight
// (its copy misses that one update), not while two are missing.
TEST(StepPipeline, AtStalenessOneTheNextStepOverlapsOnePush) {
  Script script;
  StepPipeline pipeline(/*max_staleness=*/1, script.Hooks());
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 0u);
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a")).ok());
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 0u);  // at once: misses push a only
  ASSERT_TRUE(pipeline.Enqueue(script.Step("b")).ok());
  {
    AsyncAwait third(&pipeline);  // would miss a and b
    EXPECT_TRUE(third.WaitedFor(absl::Milliseconds(200)));
    script.Release();  // push a, then the pull after it (v1): misses b only
    EXPECT_EQ(VersionOf(third.result()), 1u);
  }
  script.Release();
  ASSERT_TRUE(pipeline.Drain().ok());
  EXPECT_THAT(script.log(), ElementsAre("pull v0", "push a", "pull v1", "commit a", "push b",
                                        "pull v2", "commit b"));
}

// Late pushes (embedding rows) go after the pull of the new copy: at
// max_staleness 0 the next step starts once the dense gradients are
// applied and pulled back, while the late push of the step before is in
// flight; that step is committed only after it.
TEST(StepPipeline, TheNextStepDoesNotWaitForLatePushes) {
  Script script;
  StepPipeline pipeline(/*max_staleness=*/0, script.Hooks());
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 0u);
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a", 1, 0, absl::OkStatus(), /*late=*/1)).ok());
  {
    AsyncAwait next(&pipeline);
    EXPECT_TRUE(next.WaitedFor(absl::Milliseconds(200)));  // push a in flight
    script.Release();                                       // push a; its late push is held
    const bool started = !next.WaitedFor(absl::Seconds(10));
    if (!started) script.Release(4);  // lets the pipeline and the test end
    ASSERT_TRUE(started) << "the next step waited for the late push";
    EXPECT_EQ(VersionOf(next.result()), 1u);
  }
  EXPECT_THAT(script.AwaitLog(3), ElementsAre("pull v0", "push a", "pull v1"));
  ASSERT_TRUE(pipeline.Enqueue(script.Step("b", 1, 0, absl::OkStatus(), /*late=*/1)).ok());
  script.AwaitPushesStarted(2);  // a's late push, held
  EXPECT_THAT(script.log(), ElementsAre("pull v0", "push a", "pull v1"));  // a not committed
  script.Release(3);
  ASSERT_TRUE(pipeline.Drain().ok());
  EXPECT_THAT(script.log(), ElementsAre("pull v0", "push a", "pull v1", "late push a", "commit a",
                                        "push b", "pull v2", "late push b", "commit b"));
}

// A push that reads the dense tensors back spares the pull after it: the
// next step starts from what its reply carried.
TEST(StepPipeline, APushThatReadsTheCopyBackNeedsNoPull) {
  Script script;
  script.ReadBack();
  StepPipeline pipeline(/*max_staleness=*/0, script.Hooks());
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 0u);
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a", 1, /*others=*/2)).ok());
  {
    AsyncAwait next(&pipeline);
    EXPECT_TRUE(next.WaitedFor(absl::Milliseconds(200)));  // push a in flight
    script.Release();
    EXPECT_EQ(VersionOf(next.result()), 3u);  // a's and two others' updates
  }
  ASSERT_TRUE(pipeline.Drain().ok());
  EXPECT_THAT(script.log(), ElementsAre("pull v0", "push a", "read back v3", "commit a"));
}

// A copy read back behind what the push's replies said (rows from several
// messages of one server) is not installed: at max_staleness 0 the next
// step would wait for it forever. The pipeline pulls instead.
TEST(StepPipeline, ACopyReadBackBehindThePushIsPulledAgain) {
  Script script(/*free_pushes=*/true);
  script.ReadBack(/*lag=*/1);
  StepPipeline pipeline(/*max_staleness=*/0, script.Hooks());
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 0u);
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a", 1, /*others=*/2)).ok());
  AsyncAwait next(&pipeline);
  const bool started = !next.WaitedFor(absl::Seconds(10));
  if (!started) pipeline.Stop();  // ends the wait (kCancelled)
  ASSERT_TRUE(started) << "the next step waited for a copy no step would refresh";
  EXPECT_EQ(VersionOf(next.result()), 3u);
  ASSERT_TRUE(pipeline.Drain().ok());
  EXPECT_THAT(script.log(),
              ElementsAre("pull v0", "push a", "read back v2", "pull v3", "commit a"));
}

// A late push that fails stops the pipeline before the step's commit.
TEST(StepPipeline, AFailedLatePushCommitsNothing) {
  Script script(/*free_pushes=*/true);
  StepPipeline pipeline(/*max_staleness=*/0, script.Hooks());
  const Status down = absl::DeadlineExceededError("server 1 does not answer");
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a", 1, 0, absl::OkStatus(), 1, down)).ok());
  EXPECT_EQ(pipeline.Drain(), down);
  pipeline.Stop();
  EXPECT_THAT(script.log(), ElementsAre("pull v0", "push a", "pull v1", "late push a failed"));
}

// Every step started counts the updates its copy missed, their largest,
// and the time it waited for the bound.
TEST(StepPipeline, CountsWhatEachStepTrainedWithAndItsWait) {
  Script script;
  StepPipeline::Stats stats;
  StepPipeline::Hooks hooks = script.Hooks();
  hooks.stats = &stats;
  StepPipeline pipeline(/*max_staleness=*/1, hooks);
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 0u);  // misses nothing
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a")).ok());
  EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 0u);  // misses push a
  ASSERT_TRUE(pipeline.Enqueue(script.Step("b")).ok());
  {
    AsyncAwait third(&pipeline);  // would miss a and b: waits
    EXPECT_TRUE(third.WaitedFor(absl::Milliseconds(200)));
    script.Release();
    EXPECT_EQ(VersionOf(third.result()), 1u);  // misses push b
  }
  script.Release();
  ASSERT_TRUE(pipeline.Drain().ok());

  const HistogramSnapshot trained = stats.staleness.Snapshot();
  EXPECT_EQ(trained.count, 3u);
  EXPECT_DOUBLE_EQ(trained.sum, 2.0);  // 0 + 1 + 1
  ASSERT_GE(trained.counts.size(), 2u);
  EXPECT_EQ(trained.counts[0], 1u);  // bucket 0: missed none
  EXPECT_EQ(trained.counts[1], 2u);  // bucket 1: missed one
  EXPECT_EQ(stats.max_staleness.load(), 1u);
  const HistogramSnapshot waits = stats.waits.Snapshot();
  EXPECT_EQ(waits.count, 3u);
  // The third step waited for push a: nearly the test's 200 ms (its thread
  // starts its clock when scheduled, after the test's; under load, later).
  EXPECT_GE(waits.sum, 0.1);
}

// Updates by other workers that a push's reply reveals count as well: a
// copy the worker knows to miss more than max_staleness is not used, while
// one that misses only the worker's own acknowledged push is.
// Runs `step` (a commit added) to its end, then takes the next copy, which
// must come within 5 s (the pipeline is stopped otherwise, ending the wait).
void RunAndAwaitCopy(StepPipeline& pipeline, StepPipeline::Step step,
                     std::shared_ptr<const StepPipeline::DenseCopy>* copy) {
  step.commit = [](StepPipeline::Lane&) { return absl::OkStatus(); };
  ASSERT_TRUE(pipeline.Enqueue(std::move(step)).ok());
  ASSERT_TRUE(pipeline.Drain().ok());
  AsyncAwait next(&pipeline);
  if (next.WaitedFor(absl::Seconds(5))) {
    pipeline.Stop();
    FAIL() << "the copy pulled after the step was held back";
  }
  StatusOr<std::shared_ptr<const StepPipeline::DenseCopy>> result = next.result();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_NE(*result, nullptr);
  *copy = *std::move(result);
}

TEST(StepPipeline, OtherWorkersUpdatesTheRepliesRevealCount) {
  for (const uint64_t others : {uint64_t{0}, uint64_t{3}}) {
    SCOPED_TRACE(absl::StrCat(others, " pushes of others"));
    Script script(/*free_pushes=*/false, /*hold_pulls=*/true);
    StepPipeline pipeline(/*max_staleness=*/2, script.Hooks());
    EXPECT_EQ(VersionOf(pipeline.AwaitDense()), 0u);
    ASSERT_TRUE(pipeline.Enqueue(script.Step("a", 1, others)).ok());
    script.Release();
    // Push a is acknowledged (at version others + 1); the pull after it
    // is held.
    script.AwaitLog(2);
    AsyncAwait next(&pipeline);
    if (others == 0) {
      EXPECT_EQ(VersionOf(next.result()), 0u);  // v0 misses 1 <= 2
      script.ReleasePull();
    } else {
      EXPECT_TRUE(next.WaitedFor(absl::Milliseconds(200)));  // v0 misses 4 > 2
      script.ReleasePull();
      EXPECT_EQ(VersionOf(next.result()), 4u);
    }
    ASSERT_TRUE(pipeline.Drain().ok());
  }
}

// A push also answers for dense tensors the copy does not hold (those the
// loader pulls with each batch): their versions never hold the copy back.
TEST(StepPipeline, TensorsOutsideTheCopyDoNotHoldItBack) {
  StepPipeline::Hooks hooks;
  hooks.make_lane = [] { return StepPipeline::Lane{}; };
  hooks.abandoned = [] { return false; };
  std::atomic<uint64_t> version{0};
  // Tensor 0 is in the copy; tensor 1 (on server 0) is not.
  hooks.pull_dense = [&](StepPipeline::Lane&, StepPipeline::DenseCopy* copy) {
    copy->values = {{0.0f}, {}};
    copy->versions = {{version.load()}, {}};
    return absl::OkStatus();
  };
  StepPipeline pipeline(/*max_staleness=*/0, hooks);
  for (int i = 0; i < 3; ++i) {
    StepPipeline::Step step;
    step.pushes.push_back([&](StepPipeline::Lane&, PsClient::Versions* applied,
                                                              StepPipeline::DenseCopy*) {
      *applied = {{++version}, {10 * version.load()}};
      return absl::OkStatus();
    });
    std::shared_ptr<const StepPipeline::DenseCopy> copy;
    ASSERT_NO_FATAL_FAILURE(RunAndAwaitCopy(pipeline, std::move(step), &copy));
    EXPECT_EQ(copy->versions[0][0], version.load()) << "after step " << i;
  }
}

// A partition move changes which server holds a dense tensor, and a
// server's count for it: versions under the old map (server 0's, high) no
// longer compare with the new map's (another server's, low). Before the
// fix the copy stayed "behind" forever and every step waited.
TEST(StepPipeline, VersionsOfAnotherClusterMapDoNotHoldTheCopyBack) {
  StepPipeline::Hooks hooks;
  hooks.make_lane = [] { return StepPipeline::Lane{}; };
  hooks.abandoned = [] { return false; };
  std::atomic<uint64_t> map{1};
  hooks.map_version = [&](StepPipeline::Lane&) { return map.load(); };
  // Under map 1 the tensor is on server 0, which counts 1000 and up; under
  // map 2 on server 1, which counts from 1.
  std::atomic<uint64_t> version{1000};
  const auto versions = [&]() -> PsClient::Versions {
    return map.load() == 1 ? PsClient::Versions{{version.load(), 0}}
                           : PsClient::Versions{{0, version.load()}};
  };
  hooks.pull_dense = [&](StepPipeline::Lane&, StepPipeline::DenseCopy* copy) {
    copy->values = {{0.0f}};
    copy->versions = versions();
    return absl::OkStatus();
  };
  StepPipeline pipeline(/*max_staleness=*/0, hooks);
  for (int i = 0; i < 4; ++i) {
    StepPipeline::Step step;
    step.pushes.push_back([&, i](StepPipeline::Lane&, PsClient::Versions* applied,
                                 StepPipeline::DenseCopy*) {
      if (i == 2) {
        map = 2;  // the push was re-routed after a move
        version = 1;
      }
      ++version;
      *applied = versions();
      return absl::OkStatus();
    });
    std::shared_ptr<const StepPipeline::DenseCopy> copy;
    SCOPED_TRACE(absl::StrCat("step ", i));
    ASSERT_NO_FATAL_FAILURE(RunAndAwaitCopy(pipeline, std::move(step), &copy));
  }
}

// The first failure stops the pipeline: nothing after it is pushed or
// committed, the failed step is not committed, and the trainer hears it.
TEST(StepPipeline, AFailedPushCommitsNothingFromThereOn) {
  Script script(/*free_pushes=*/true);
  StepPipeline pipeline(/*max_staleness=*/8, script.Hooks());
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a")).ok());
  ASSERT_TRUE(pipeline.Drain().ok());
  const Status down = absl::DeadlineExceededError("server 1 does not answer");
  ASSERT_TRUE(pipeline.Enqueue(script.Step("b", 1, 0, down)).ok());
  Status drained = pipeline.Drain();
  EXPECT_EQ(drained, down);
  EXPECT_EQ(pipeline.Enqueue(script.Step("c")), down);
  EXPECT_EQ(pipeline.AwaitDense().status(), down);
  EXPECT_EQ(pipeline.status(), down);
  pipeline.Stop();
  EXPECT_THAT(script.log(), ElementsAre("pull v0", "push a", "pull v1", "commit a",
                                        "push b failed"));
  EXPECT_EQ(script.ended(), 3);  // a committed, b failed, c refused
}

// A step whose pushes were applied is committed even when the pull of the
// dense tensors after it fails (else its records would be trained and
// pushed twice); the pipeline stops on that failure after the commit.
TEST(StepPipeline, AFailedRefreshStillCommitsTheAppliedStep) {
  Script script(/*free_pushes=*/true);
  StepPipeline pipeline(/*max_staleness=*/1, script.Hooks());
  ASSERT_TRUE(pipeline.AwaitDense().ok());
  const Status down = absl::UnavailableError("server 0 went away");
  script.FailPulls(down);
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a")).ok());
  EXPECT_EQ(pipeline.Drain(), down);
  EXPECT_EQ(pipeline.Enqueue(script.Step("b")), down);
  pipeline.Stop();
  EXPECT_THAT(script.log(), ElementsAre("pull v0", "push a", "pull failed", "commit a"));
  EXPECT_EQ(script.ended(), 2);
}

// A session that ends (fenced) ends every wait at once, and what was
// queued is never pushed nor committed.
TEST(StepPipeline, AnAbandonedSessionEndsTheWaitsAndDropsTheQueue) {
  Script script;
  StepPipeline pipeline(/*max_staleness=*/0, script.Hooks());
  ASSERT_TRUE(pipeline.AwaitDense().ok());
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a")).ok());  // its push waits
  script.AwaitPushesStarted(1);
  ASSERT_TRUE(pipeline.Enqueue(script.Step("b")).ok());  // queued behind it
  {
    AsyncAwait next(&pipeline);
    EXPECT_TRUE(next.WaitedFor(absl::Milliseconds(100)));
    script.Abandon();
    EXPECT_TRUE(absl::IsCancelled(next.result().status())) << next.result().status();
  }
  EXPECT_TRUE(absl::IsCancelled(pipeline.Drain()));
  script.Release(2);  // push a, in flight, ends; nothing of the session goes on
  pipeline.Stop();
  for (const std::string& event : script.log()) {
    EXPECT_NE(event, "commit a");
    EXPECT_NE(event, "commit b");
    EXPECT_NE(event, "push b");
  }
  EXPECT_EQ(script.ended(), 2);  // a abandoned after its push, b dropped
}

// At most max_staleness + 1 steps wait in the queue: the trainer cannot run
// away from the pushes of a model without dense tensors either.
TEST(StepPipeline, TheQueueHoldsAtMostStalenessPlusOneSteps) {
  Script script;
  StepPipeline pipeline(/*max_staleness=*/1, script.Hooks(/*dense=*/false));
  ASSERT_TRUE(pipeline.Enqueue(script.Step("a")).ok());
  script.AwaitPushesStarted(1);  // taken by the thread: the queue is empty
  ASSERT_TRUE(pipeline.Enqueue(script.Step("b")).ok());
  ASSERT_TRUE(pipeline.Enqueue(script.Step("c")).ok());
  absl::Notification queued;
  std::thread fourth([&] {
    EXPECT_TRUE(pipeline.Enqueue(script.Step("d")).ok());
    queued.Notify();
  });
  EXPECT_FALSE(queued.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  script.Release();  // a is done, b is taken: room for d
  EXPECT_TRUE(queued.WaitForNotificationWithTimeout(absl::Seconds(10)));
  fourth.join();
  script.Release(3);
  ASSERT_TRUE(pipeline.Drain().ok());
  EXPECT_THAT(script.log(), ElementsAre("push a", "commit a", "push b", "commit b", "push c",
                                        "commit c", "push d", "commit d"));
}

// However loose the bound, the queue holds at most kMaxQueuedSteps steps
// (each holds a batch and its gradients).
TEST(StepPipeline, ALooseBoundStillCapsTheQueue) {
  Script script;
  StepPipeline pipeline(/*max_staleness=*/1024, script.Hooks(/*dense=*/false));
  ASSERT_TRUE(pipeline.Enqueue(script.Step("first")).ok());
  script.AwaitPushesStarted(1);  // taken by the thread: the queue is empty
  for (uint64_t i = 0; i < StepPipeline::kMaxQueuedSteps; ++i) {
    ASSERT_TRUE(pipeline.Enqueue(script.Step(absl::StrCat(i))).ok());
  }
  absl::Notification queued;
  std::thread one_more([&] {
    EXPECT_TRUE(pipeline.Enqueue(script.Step("last")).ok());
    queued.Notify();
  });
  EXPECT_FALSE(queued.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  script.Release();  // first is done, the next is taken: room for one
  EXPECT_TRUE(queued.WaitForNotificationWithTimeout(absl::Seconds(10)));
  one_more.join();
  script.Release(static_cast<int>(StepPipeline::kMaxQueuedSteps) + 1);
  ASSERT_TRUE(pipeline.Drain().ok());
  EXPECT_EQ(script.log().size(), 2 * (StepPipeline::kMaxQueuedSteps + 2));
}

}  // namespace
}  // namespace eps
