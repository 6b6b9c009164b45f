// The limits of the master's HTTP port (master/http/http_service.h) and the
// refusals they make, shared by the service and its connections
// (master/http/http_connection.h).
//
// Thread-safety: plain values.

#ifndef EPS_MASTER_HTTP_HTTP_LIMITS_H_
#define EPS_MASTER_HTTP_HTTP_LIMITS_H_

#include <array>
#include <cstddef>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/status.h"

namespace eps {

struct HttpServiceOptions {
  // Connections served at once, each on a thread of its own; one more is
  // answered 503. Also capped at half the RLIMIT_NOFILE soft limit at Start.
  int max_connections = 4096;
  // How long a connection may stay silent before a request (its first or the
  // next): then it is closed, without an answer. Default 5 s.
  absl::Duration idle_timeout = absl::Seconds(5);
  // From a request's first byte to its last (request line, headers, body):
  // a slower request is answered 408 and its connection closed. Default 10 s.
  absl::Duration request_timeout = absl::Seconds(10);
  // How long a client may keep the server waiting to take one answer, in
  // all (the time the handler takes does not count). Default 10 s.
  absl::Duration write_timeout = absl::Seconds(10);
  // Requests on one keep-alive connection; the last answer closes it.
  // Default 100.
  int max_requests_per_connection = 100;
  // Request line and headers, blank line included: more is 431 (414 when the
  // request line alone is that long). At most 8192, the library's own bound
  // of a line. Default 8 KiB.
  size_t max_header_bytes = 8192;
  // A request's Content-Length: more is 413 (no route takes a body).
  // Default 4 KiB.
  size_t max_body_bytes = 4096;

  // kInvalidArgument naming the field when a value makes no sense.
  Status Validate() const;
};

// Why the port refused a request; each is counted. Never renumber: the
// values index the counters.
enum class HttpRefusal {
  kUnauthorized = 0,      // 401: a mutation without the bearer token
  kForeignOrigin,         // 403: a mutation from the page of another origin
  kTooManyConnections,    // 503: max_connections were open
  kRequestTimeout,        // 408: the request took longer than request_timeout
  kHeadersTooLarge,       // 431: a head over max_header_bytes
  kUriTooLong,            // 414: a request line over max_header_bytes
  kBodyTooLarge,          // 413: a Content-Length over max_body_bytes
  kLengthRequired,        // 411: a body without Content-Length
  kMethodNotImplemented,  // 501: a method not routed here (BREW, TRACE, CONNECT)
  kMethodNotAllowed,      // 405: a method the route does not take
  kMalformed,             // 400: not a parseable HTTP/1.x request
};
inline constexpr std::array<HttpRefusal, 11> kHttpRefusals = {
    HttpRefusal::kUnauthorized,         HttpRefusal::kForeignOrigin,
    HttpRefusal::kTooManyConnections,   HttpRefusal::kRequestTimeout,
    HttpRefusal::kHeadersTooLarge,      HttpRefusal::kUriTooLong,
    HttpRefusal::kBodyTooLarge,         HttpRefusal::kLengthRequired,
    HttpRefusal::kMethodNotImplemented, HttpRefusal::kMethodNotAllowed,
    HttpRefusal::kMalformed,
};

// The `reason` label of `reason` ("too_many_connections").
absl::string_view HttpRefusalName(HttpRefusal reason);

}  // namespace eps

#endif  // EPS_MASTER_HTTP_HTTP_LIMITS_H_
