#include "cluster/launch_grant.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "core/file_util.h"
#include "core/logging.h"

namespace eps {

LaunchGrant LaunchGrant::FromEnvironment() {
  LaunchGrant grant;
  if (const char* value = std::getenv("EPS_LAUNCH_ID");
      value == nullptr || !absl::SimpleAtoi(value, &grant.id)) {
    grant.id = 0;
  }
  if (const char* value = std::getenv("EPS_LAUNCH_SECRET"); value != nullptr) {
    grant.secret = value;
    return grant;
  }
  const char* path = std::getenv("EPS_LAUNCH_SECRET_FILE");
  if (path == nullptr) return grant;
  StatusOr<std::string> contents = ReadSmallFile(path, 4096);
  if (!contents.ok()) {
    LOG(WARNING) << "EPS_LAUNCH_SECRET_FILE: " << contents.status().message()
                 << "; the master refuses what needs the launch's secret";
    return grant;
  }
  grant.secret = std::string(absl::StripAsciiWhitespace(
      absl::string_view(*contents).substr(0, contents->find('\n'))));
  return grant;
}

}  // namespace eps
