// The job options a member (server or worker) sends when it registers, and
// the master's check of them.
//
// Every process reads the job config itself, so a server or worker started
// with another file, or with a --section.key override the master lacks,
// would train with the master's model but its own parsing, heartbeat or
// durability, or the reverse, without a word. Members send the options that
// every process must share (JobConfig::SharedOptions) in REGISTER_SERVER
// and REGISTER_WORKER; the master refuses a member whose options differ,
// naming each option and both values, before it counts the member.
//
// Thread-safety: functions of their arguments.

#ifndef EPS_CLUSTER_JOB_OPTIONS_H_
#define EPS_CLUSTER_JOB_OPTIONS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/job_config.h"
#include "core/status.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "proto/eps.pb.h"

namespace eps {

// Appends shared options (JobConfig::SharedOptions) to a registration's
// job_options.
void AddSharedOptions(const std::vector<std::pair<std::string, std::string>>& shared,
                      google::protobuf::RepeatedPtrField<proto::JobOption>* options);

// OK when the options a member registered with (`member`) are `master`'s
// shared options; otherwise kInvalidArgument (a usage error: the member
// exits 2) "the job options of this <who> differ from the master's: NAME =
// VALUE (the master has VALUE); ...; start it with the master's config".
Status CheckSharedOptions(const JobConfig& master,
                          const google::protobuf::RepeatedPtrField<proto::JobOption>& member,
                          absl::string_view who);

}  // namespace eps

#endif  // EPS_CLUSTER_JOB_OPTIONS_H_
