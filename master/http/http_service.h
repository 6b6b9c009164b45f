// HttpService: the master's HTTP port. GET /status (JSON), GET /metrics
// (Prometheus text), GET / (the status page) and POST /checkpoint (an
// operator's checkpoint, answered when it is complete or has failed).
//
// Reads are open to whoever reaches the port. A mutating request (POST)
// needs `Authorization: Bearer TOKEN` when the routes have a token (401
// otherwise), and is refused (403) when it comes from a page of another
// origin (an Origin header that is not this server's own), so that a page
// the operator opens cannot order it.
//
// Slow and idle clients cannot starve the port. cpp-httplib serves every
// connection on one thread of a fixed pool (max(8, cores - 1) threads) for as
// long as the connection stays (a request line trickled a byte every few
// seconds, or an idle keep-alive, holds its thread for good or for 5 s), so
// a few slow clients used to block /status. Here:
//  - Every connection has a thread of its own (a TaskQueue that starts one
//    per connection), up to HttpServiceOptions::max_connections at once
//    (and half the process's open-file limit, so that HTTP clients cannot
//    take the descriptors the job's ZeroMQ sockets and RocksDB need). One
//    more is answered 503 and closed at once, on the accepting thread.
//  - Every wait is bounded (HttpConnection): idle_timeout for a request to
//    start, request_timeout from its first byte to its last, head and body
//    (408 when it runs out: slowloris), write_timeout to take an answer, and
//    max_requests_per_connection on one connection.
//  - A request is read whole before the library parses it: its head within
//    max_header_bytes (431; 414 for a request line alone that long), its body
//    within max_body_bytes of Content-Length (413; a body without a length,
//    Transfer-Encoding, is 411), its method one the library routes (GET,
//    HEAD, POST, PUT, DELETE, OPTIONS, PATCH; 501 otherwise). Reading it
//    whole also keeps pipelined requests and an unread body (a GET's) apart.
//    A method a route does not take is 405 (with Allow).
// Each refusal is an HTTP answer followed by a lingering close (the
// client's pending bytes are drained for a moment, so that the answer is
// not lost to a reset), and is counted by reason (refused(), WriteMetrics).
//
// No CPPHTTPLIB_* macro is defined anywhere: Debian's cpp-httplib compiles
// the server into libcpp-httplib.so, so those macros would only make our
// translation units disagree with the library (ODR) without changing what
// the library does. The limits above are runtime settings, and the
// connection handling overrides Server::process_and_close_socket (a virtual
// the library calls for every accepted socket), still parsing and routing
// with the library's own process_request.
//
// Thread-safety: Start and Stop from the owning thread; refused() and
// WriteMetrics from any thread; the handlers run on the connections'
// threads, several at once, and must do their own locking.

#ifndef EPS_MASTER_HTTP_HTTP_SERVICE_H_
#define EPS_MASTER_HTTP_HTTP_SERVICE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "core/status.h"
#include "master/http/http_limits.h"

namespace eps {

struct HttpRoutes {
  std::function<std::string()> status_json;
  std::function<std::string()> metrics_text;
  std::string page;  // the HTML of "/"
  // POST /checkpoint: the HTTP status and the JSON answer.
  std::function<std::pair<int, std::string>()> checkpoint;
  // POST /export?dir=DIR: the HTTP status and the JSON answer; `dir` empty
  // when the request names none.
  std::function<std::pair<int, std::string>(const std::string& dir)> export_model;
  // POST /servers/N/drain: moves server N's partitions to the others
  // (docs/design.md 2.20).
  std::function<std::pair<int, std::string>(uint32_t server)> drain;
  // What mutating requests must carry as their bearer token; empty: none.
  std::string bearer_token;
};


class HttpService {
 public:
  // `clock` bounds the wait in Stop (not owned; must outlive this).
  explicit HttpService(const Clock* clock, HttpServiceOptions options = {});
  ~HttpService();
  HttpService(const HttpService&) = delete;
  HttpService& operator=(const HttpService&) = delete;

  // Binds `host`:`port` (0: any free port) and serves `routes` on a thread
  // of its own (which starts one per connection). Returns the port bound.
  // kInvalidArgument for invalid options; kUnavailable naming --http-port
  // when it cannot bind.
  StatusOr<int> Start(const std::string& host, int port, HttpRoutes routes);
  // Stops serving: wakes every connection's wait, and joins the threads
  // (a handler still running is waited for). A no-op when not started.
  void Stop();

  // Requests refused for `reason` so far.
  uint64_t refused(HttpRefusal reason) const {
    return refused_[static_cast<size_t>(reason)].load(std::memory_order_relaxed);
  }
  // The connections served at once, as Start capped them; 0 before Start.
  int max_connections() const { return max_connections_; }
  // Appends eps_http_requests_refused_total{reason} (every reason) to `out`.
  void WriteMetrics(PrometheusWriter& out) const;

 private:
  class Server;  // the httplib::Server that serves each connection itself

  void Refused(HttpRefusal reason) {
    refused_[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
  }
  void AddRoutes();

  const Clock* const clock_;
  const HttpServiceOptions options_;
  HttpRoutes routes_;
  int max_connections_ = 0;
  // Readable once Stop begins (an eventfd, never read): every connection's
  // poll watches it.
  int wake_fd_ = -1;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  // Set by thread_ when listen_after_bind returns.
  std::atomic<bool> returned_{false};
  std::array<std::atomic<uint64_t>, kHttpRefusals.size()> refused_{};
};

}  // namespace eps

#endif  // EPS_MASTER_HTTP_HTTP_SERVICE_H_
