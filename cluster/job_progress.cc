#include "cluster/job_progress.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace eps {

std::string JobProgress(const proto::HeartbeatReply& reply) {
  std::string eta = "?";
  if (reply.has_eta_s() && std::isfinite(reply.eta_s()) && reply.eta_s() >= 0) {
    eta = absl::FormatDuration(absl::Seconds(static_cast<int64_t>(std::ceil(reply.eta_s()))));
  }
  return absl::StrCat("job ", absl::StrFormat("%.0f", reply.job_records_per_s()),
                      " records/s, ETA ", eta);
}

}  // namespace eps
