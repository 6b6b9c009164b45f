// The Slurm source's and launcher's parsers, on output as Slurm 22.05's
// sinfo and squeue print it (the formats master/autoscale/slurm.cc asks for). The
// commands themselves run against a real Slurm in
// tests/integration/slurm_autoscale_test.cc.

#include "master/autoscale/slurm.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

TEST(SlurmGres, CountsGpusOfEveryTypeAndNothingElse) {
  EXPECT_EQ(SlurmGresGpus("gpu:8"), 8);
  EXPECT_EQ(SlurmGresGpus("gpu:a100:4(S:0-1)"), 4);
  EXPECT_EQ(SlurmGresGpus("gpu:a100:2(IDX:0,3),gpu:v100:1(IDX:5)"), 3);
  EXPECT_EQ(SlurmGresGpus("gpu:2(IDX:0-1),mps:100"), 2);
  EXPECT_EQ(SlurmGresGpus("mps:100"), 0);
  EXPECT_EQ(SlurmGresGpus("(null)"), 0);
  EXPECT_EQ(SlurmGresGpus(""), 0);
  EXPECT_EQ(SlurmGresGpus("gpu:lots"), 0);
}

TEST(SlurmTres, CountsGpusInEachSpelling) {
  EXPECT_EQ(SlurmTresGpus("gres:gpu:7"), 7);      // 22.05
  EXPECT_EQ(SlurmTresGpus("gres/gpu:2"), 2);      // 23.02 and later
  EXPECT_EQ(SlurmTresGpus("gres/gpu:a100=3"), 3);
  EXPECT_EQ(SlurmTresGpus("cpu=4,gres/gpu=2"), 2);
  EXPECT_EQ(SlurmTresGpus("N/A"), 0);
  EXPECT_EQ(SlurmTresGpus("gres:mps:50"), 0);
}

TEST(SlurmNodes, OnlyNodesThatTakeJobsCount) {
  for (const char* state : {"idle", "mixed", "allocated", "completing", "IDLE", "mixed+planned"}) {
    EXPECT_TRUE(SlurmNodeUsable(state)) << state;
  }
  for (const char* state : {"drained", "draining", "down", "down*", "idle*", "idle~", "idle#",
                            "mixed@", "allocated$", "fail", "maint", "reserved", "unknown"}) {
    EXPECT_FALSE(SlurmNodeUsable(state)) << state;
  }
}

TEST(SlurmFreeGpus, SumsWhatUsableNodesHaveLeft) {
  const char* sinfo =
      "node1|mixed|gpu:8|gpu:3(IDX:0-2)|\n"
      "node2|idle|gpu:a100:4(S:0-1)|gpu:a100:0|\n"
      "node3|drained|gpu:8|gpu:0|\n"
      "node4|allocated|gpu:2|gpu:2(IDX:0-1)|\n"
      "node5|idle|(null)|gpu:0|\n";
  StatusOr<int64_t> free = ParseSlurmFreeGpus(sinfo);
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_EQ(*free, 5 + 4);
  EXPECT_EQ(*ParseSlurmFreeGpus(""), 0);

  StatusOr<int64_t> bad = ParseSlurmFreeGpus("node1 mixed gpu:8\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'node1 mixed gpu:8'"));
}

TEST(SlurmPendingGpus, CountsOthersJobsWaitingForTheMachines) {
  const char* squeue =
      // Waiting for GPUs: 7, and 2 nodes x 2, and 3 for the job, and 2 tasks x 1.
      "2|other|Resources|1|1|gres:gpu:7|N/A|N/A|\n"
      "5|big|Priority|2|2|gres/gpu:2|N/A|N/A|\n"
      "6|whole|Priority|1|1|N/A|gres/gpu:3|N/A|\n"
      "7|tasks|Resources|1|2|N/A|N/A|gres/gpu:1|\n"
      // Not waiting for the machines.
      "3|held|JobHeldUser|1|1|gres:gpu:1|N/A|N/A|\n"
      "4|later|Dependency|1|1|gres:gpu:4|N/A|N/A|\n"
      // Our own worker, pending: not others' demand.
      "8|eps-ctr-worker-17|Resources|1|1|gres:gpu:1|N/A|N/A|\n"
      // No GPUs asked.
      "9|cpu-only|Resources|1|1|N/A|N/A|N/A|\n";
  StatusOr<int64_t> pending = ParseSlurmPendingGpus(squeue, "eps-ctr-worker-");
  ASSERT_TRUE(pending.ok()) << pending.status();
  EXPECT_EQ(*pending, 7 + 4 + 3 + 2);

  StatusOr<int64_t> bad = ParseSlurmPendingGpus("2|other|Resources|x|1|N/A|N/A|N/A|\n", "eps-");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("2|other|Resources|x"));
}

TEST(SlurmJobs, EndedStatesAndTheirExitCodes) {
  EXPECT_FALSE(SlurmJobEnd("PENDING", 0).has_value());
  EXPECT_FALSE(SlurmJobEnd("RUNNING", 0).has_value());
  EXPECT_FALSE(SlurmJobEnd("COMPLETING", 0).has_value());
  EXPECT_EQ(SlurmJobEnd("COMPLETED", 0), 0);
  EXPECT_EQ(SlurmJobEnd("FAILED", 3), 3);
  EXPECT_EQ(SlurmJobEnd("CANCELLED", 0), 1);
  EXPECT_EQ(SlurmJobEnd("CANCELLED by 0", 15), 15);
  EXPECT_EQ(SlurmJobEnd("NODE_FAIL", 0), 1);
  EXPECT_EQ(SlurmJobEnd("PREEMPTED", 0), 1);

  StatusOr<std::map<std::string, std::pair<std::string, int>>> states =
      ParseSlurmJobStates("1|CANCELLED|15|\n4|COMPLETED|0|\n3|PENDING|0|\n");
  ASSERT_TRUE(states.ok()) << states.status();
  ASSERT_EQ(states->size(), 3u);
  EXPECT_EQ(states->at("1"), std::make_pair(std::string("CANCELLED"), 15));
  EXPECT_EQ(states->at("3").first, "PENDING");
  EXPECT_FALSE(ParseSlurmJobStates("1|CANCELLED|\n").ok());
}

TEST(SlurmNames, WorkerJobsCarryTheJobName) {
  JobConfig job;
  job.job.name = "ctr";
  EXPECT_EQ(SlurmWorkerJobPrefix(job), "eps-ctr-worker-");
}

}  // namespace
}  // namespace eps
