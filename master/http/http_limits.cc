#include "master/http/http_limits.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace eps {

Status HttpServiceOptions::Validate() const {
  if (max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("http max_connections must be at least 1 (got ", max_connections, ")"));
  }
  for (const auto& [name, value] : {std::pair<const char*, absl::Duration>{"idle_timeout", idle_timeout},
                                    {"request_timeout", request_timeout},
                                    {"write_timeout", write_timeout}}) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("http ", name, " must be positive (got ",
                                                     absl::FormatDuration(value), ")"));
    }
  }
  if (max_requests_per_connection < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http max_requests_per_connection must be at least 1 (got ", max_requests_per_connection,
        ")"));
  }
  if (max_header_bytes < 64 || max_header_bytes > 8192) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http max_header_bytes must be 64..8192 (got ", max_header_bytes, ")"));
  }
  return absl::OkStatus();
}

absl::string_view HttpRefusalName(HttpRefusal reason) {
  switch (reason) {
    case HttpRefusal::kUnauthorized: return "unauthorized";
    case HttpRefusal::kForeignOrigin: return "foreign_origin";
    case HttpRefusal::kTooManyConnections: return "too_many_connections";
    case HttpRefusal::kRequestTimeout: return "request_timeout";
    case HttpRefusal::kHeadersTooLarge: return "headers_too_large";
    case HttpRefusal::kUriTooLong: return "uri_too_long";
    case HttpRefusal::kBodyTooLarge: return "body_too_large";
    case HttpRefusal::kLengthRequired: return "length_required";
    case HttpRefusal::kMethodNotImplemented: return "method_not_implemented";
    case HttpRefusal::kMethodNotAllowed: return "method_not_allowed";
    case HttpRefusal::kMalformed: return "malformed";
  }
  return "unknown";
}

}  // namespace eps
