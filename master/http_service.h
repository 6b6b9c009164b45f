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
// Thread-safety: Start and Stop from the owning thread; the handlers run on
// the service's thread and must do their own locking.

#ifndef EPS_MASTER_HTTP_SERVICE_H_
#define EPS_MASTER_HTTP_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "core/clock.h"
#include "core/status.h"
#include "httplib.h"

namespace eps {

struct HttpRoutes {
  std::function<std::string()> status_json;
  std::function<std::string()> metrics_text;
  std::string page;  // the HTML of "/"
  // POST /checkpoint: the HTTP status and the JSON answer.
  std::function<std::pair<int, std::string>()> checkpoint;
  // What mutating requests must carry as their bearer token; empty: none.
  std::string bearer_token;
};

class HttpService {
 public:
  // `clock` bounds the wait in Stop (not owned; must outlive this).
  explicit HttpService(const Clock* clock) : clock_(clock) {}
  ~HttpService() { Stop(); }
  HttpService(const HttpService&) = delete;
  HttpService& operator=(const HttpService&) = delete;

  // Binds `host`:`port` (0: any free port) and serves `routes` on a thread
  // of its own. Returns the port bound. kUnavailable naming --http-port when
  // it cannot bind.
  StatusOr<int> Start(const std::string& host, int port, HttpRoutes routes);
  // Stops serving and joins the thread; a no-op when not started.
  void Stop();

  // Mutating requests refused (no or a wrong token, a foreign origin).
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  const Clock* const clock_;
  HttpRoutes routes_;
  httplib::Server server_;
  std::thread thread_;
  // Set by thread_ when listen_after_bind returns.
  std::atomic<bool> returned_{false};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace eps

#endif  // EPS_MASTER_HTTP_SERVICE_H_
