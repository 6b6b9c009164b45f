// What a peer's progress line says about the whole job.
//
// Workers and servers hear the job's rate and ETA in every heartbeat reply
// (HeartbeatReply.job_records_per_s, eta_s) and append them to their own
// progress lines.

#ifndef EPS_CLUSTER_JOB_PROGRESS_H_
#define EPS_CLUSTER_JOB_PROGRESS_H_

#include <string>

#include "proto/eps.pb.h"

namespace eps {

// "job 51234 records/s, ETA 2m10s" ("ETA ?" while unknown).
std::string JobProgress(const proto::HeartbeatReply& reply);

}  // namespace eps

#endif  // EPS_CLUSTER_JOB_PROGRESS_H_
