// LaunchGrant: what a process's launcher handed it to be admitted to a job
// (docs/security.md). The autoscalers start each worker and server with a
// launch id and that launch's secret in its environment (EPS_LAUNCH_ID,
// EPS_LAUNCH_SECRET); an operator adding a server to a running job by hand
// gives it the job's HTTP token as the secret with no id
// (EPS_LAUNCH_SECRET_FILE=KEYS/http_token). A file keeps the secret out of
// the process list and the environment of children.
//
// Thread-safety: a value; FromEnvironment reads the environment once.

#ifndef EPS_CLUSTER_LAUNCH_GRANT_H_
#define EPS_CLUSTER_LAUNCH_GRANT_H_

#include <cstdint>
#include <string>

namespace eps {

struct LaunchGrant {
  // The launch id (EPS_LAUNCH_ID); 0 for none or a malformed value.
  uint64_t id = 0;
  // EPS_LAUNCH_SECRET, or the first line of the file EPS_LAUNCH_SECRET_FILE
  // names (a warning names the file it cannot read); empty when neither.
  std::string secret;

  static LaunchGrant FromEnvironment();
};

}  // namespace eps

#endif  // EPS_CLUSTER_LAUNCH_GRANT_H_
