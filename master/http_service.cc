#include "master/http_service.h"

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "master/status_report.h"

namespace eps {
namespace {

// Equal strings, in a time that does not depend on where they differ.
bool SameSecret(absl::string_view a, absl::string_view b) {
  unsigned char differ = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return differ == 0;
}

// Why `request` may not change the job, as (HTTP status, message); nullopt
// when it may.
std::optional<std::pair<int, std::string>> MutationRefusal(const httplib::Request& request,
                                                            const std::string& token) {
  if (request.has_header("Origin")) {
    const std::string origin = request.get_header_value("Origin");
    if (origin != "http://" + request.get_header_value("Host")) {
      return std::make_pair(403, absl::StrCat("refused: a request from the page of another "
                                              "origin (", origin.substr(0, 100), ")"));
    }
  }
  if (token.empty()) return std::nullopt;
  const std::string authorization = request.get_header_value("Authorization");
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(authorization, kBearer) ||
      !SameSecret(absl::string_view(authorization).substr(kBearer.size()), token)) {
    return std::make_pair(
        401, std::string("refused: needs Authorization: Bearer with the job's token "
                         "(security.http_token_file; KEYS_DIR/http_token by default)"));
  }
  return std::nullopt;
}

}  // namespace

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
  server_.Post("/checkpoint", [this](const httplib::Request& request,
                                     httplib::Response& response) {
    if (auto refusal = MutationRefusal(request, routes_.bearer_token)) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      response.status = refusal->first;
      if (refusal->first == 401) response.set_header("WWW-Authenticate", "Bearer realm=\"eps\"");
      response.set_content(DumpJson({{"error", refusal->second}}), "application/json");
      return;
    }
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
