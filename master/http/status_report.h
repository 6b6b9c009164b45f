// The master's two views of the job, built from JobControl's state: the
// /status JSON document (its contract: docs/observability.md and DESIGN.md
// section 12) and the /metrics text (Prometheus exposition format;
// docs/observability.md, "Metrics", lists the families). Tests, scripts and
// dashboards read both, so for the same state the output is the same, byte
// for byte: keys, order of families, HELP texts.
//
// Thread-safety: functions of the state; the caller holds the master's
// mutex around every call. They read no clock (time is passed in) and do no
// I/O.

#ifndef EPS_MASTER_HTTP_STATUS_REPORT_H_
#define EPS_MASTER_HTTP_STATUS_REPORT_H_

#include <string>

#include "absl/time/time.h"
#include "master/http/json_text.h"
#include "master/job_control.h"
#include "nlohmann/json.hpp"

namespace eps {

// The /status document as the job stands at `now` (elapsed_s and the
// recovery's since_s are measured to it). Never fails.
nlohmann::json StatusDocument(const JobControl& control, absl::Time now);

// The /metrics text: every family in a fixed order, each with every series
// it has. Never fails.
std::string MetricsText(const JobControl& control);


}  // namespace eps

#endif  // EPS_MASTER_HTTP_STATUS_REPORT_H_
