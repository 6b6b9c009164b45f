#include "master/http_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace eps {

StatusOr<int> HttpService::Start(const std::string& host, int port, HttpRoutes routes) {
  routes_ = std::move(routes);
  server_.Get("/status", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(routes_.status_json(), "application/json");
  });
  server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(routes_.metrics_text(), "text/plain; version=0.0.4");
  });
  server_.Get("/", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(routes_.page, "text/html; charset=utf-8");
  });
  server_.Post("/checkpoint", [this](const httplib::Request&, httplib::Response& response) {
    auto [status, body] = routes_.checkpoint();
    response.status = status;
    response.set_content(body, "application/json");
  });
  if (port == 0) {
    port = server_.bind_to_any_port(host);
    if (port < 0) {
      return absl::UnavailableError(absl::StrCat("--http-port: cannot bind an HTTP port on ", host));
    }
  } else if (!server_.bind_to_port(host, port)) {
    return absl::UnavailableError(
        absl::StrCat("--http-port: cannot bind ", host, ":", port, " (in use?)"));
  }
  thread_ = std::thread([this] {
    server_.listen_after_bind();
    returned_.store(true);
  });
  return port;
}

void HttpService::Stop() {
  if (!thread_.joinable()) return;
  // cpp-httplib's stop() does nothing until the listening thread is in its
  // accept loop (is_running()), so a stop right after Start would leave that
  // thread listening forever. The library offers nothing to wait on: poll
  // until the thread is listening or has returned.
  const absl::Time deadline = clock_->Now() + absl::Seconds(10);
  while (!server_.is_running() && !returned_.load() && clock_->Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  server_.stop();
  thread_.join();
}

}  // namespace eps
