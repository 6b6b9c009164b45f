// The master's human page (GET /): one self-contained HTML document (no
// external scripts, styles or fonts, so it works on an air-gapped cluster)
// that polls /status every 2 s and shows the job's state and progress, its
// workers and servers, checkpoints and recoveries, and a chart of the train
// loss and records/s over the job's history (/status "history").
//
// Rendering marks the page for tests and scripts: <body data-rendered="N">
// counts successful renders, and an error (a failed fetch or a script
// error) shows in #error and sets data-error.

#ifndef EPS_MASTER_HTTP_STATUS_PAGE_H_
#define EPS_MASTER_HTTP_STATUS_PAGE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace eps {

// The page for job `job_name` (HTML-escaped into its title).
std::string StatusPage(absl::string_view job_name);

}  // namespace eps

#endif  // EPS_MASTER_HTTP_STATUS_PAGE_H_
