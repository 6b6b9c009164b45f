#include "cluster/job_progress.h"

#include <cmath>

#include "gtest/gtest.h"

namespace eps {
namespace {

TEST(JobProgress, SaysTheJobsRateAndEta) {
  proto::HeartbeatReply reply;
  reply.set_job_records_per_s(51234.4);
  reply.set_eta_s(129.2);
  EXPECT_EQ(JobProgress(reply), "job 51234 records/s, ETA 2m10s");
}

TEST(JobProgress, UnknownEtaIsAQuestionMark) {
  proto::HeartbeatReply reply;
  EXPECT_EQ(JobProgress(reply), "job 0 records/s, ETA ?");
  reply.set_eta_s(NAN);
  EXPECT_EQ(JobProgress(reply), "job 0 records/s, ETA ?");
  reply.set_eta_s(-1);
  EXPECT_EQ(JobProgress(reply), "job 0 records/s, ETA ?");
}

}  // namespace
}  // namespace eps
