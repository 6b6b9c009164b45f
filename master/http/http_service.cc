#include "master/http/http_service.h"

#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <system_error>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/logging.h"
#include "httplib.h"
#include "master/http/http_connection.h"
#include "master/http/json_text.h"

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
  // cpp-httplib (before 0.44) percent-decodes header values: a token with
  // '%' (one made by an older eps-keygen) arrives decoded.
  if (!absl::StartsWith(authorization, kBearer) ||
      !SameSecret(absl::string_view(authorization).substr(kBearer.size()),
                  httplib::detail::decode_url(token, /*convert_plus_to_space=*/false))) {
    return std::make_pair(
        401, std::string("refused: needs Authorization: Bearer with the job's token "
                         "(security.http_token_file; KEYS_DIR/http_token by default)"));
  }
  return std::nullopt;
}

// The methods each route takes (the Allow of a 405); nullptr for a path
// that is no route.
const char* AllowedMethods(const std::string& path) {
  if (path == "/" || path == "/status" || path == "/metrics") return "GET, HEAD";
  if (path == "/checkpoint" || path == "/export") return "POST";
  if (path.starts_with("/servers/") && path.ends_with("/drain")) return "POST";
  return nullptr;
}

// An httplib::TaskQueue that runs each task, a connection, on a thread of
// its own, at most `max_threads` at once. Over that, or when no thread can
// be started, it runs the task on the calling thread, the accepting one,
// which the Server answers 503 at once. A finished thread is joined by the
// next enqueue; shutdown joins them all.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t max_threads) : max_threads_(max_threads) {}
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    // Shared, so that it is still here to run when no thread starts.
    auto task = std::make_shared<std::function<void()>>(std::move(fn));
    {
      absl::MutexLock lock(&mu_);
      // A finished thread has only to return: joining it under mu_ is quick
      // and cannot wait for mu_.
      for (uint64_t id : finished_) {
        threads_[id].join();
        threads_.erase(id);
      }
      finished_.clear();
      if (threads_.size() < max_threads_) {
        const uint64_t id = next_id_++;
        try {
          threads_.emplace(id, std::thread([this, id, task] {
                             (*task)();
                             absl::MutexLock done(&mu_);
                             finished_.push_back(id);
                           }));
          return;
        } catch (const std::system_error&) {
          // EAGAIN: the process has no thread to spare; refused below.
        }
      }
    }
    (*task)();
  }

  void shutdown() override {
    std::map<uint64_t, std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      threads.swap(threads_);
    }
    for (auto& [id, thread] : threads) thread.join();
  }

 private:
  const size_t max_threads_;
  absl::Mutex mu_;
  std::map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

// Serves each accepted socket as an HttpConnection: reads every request
// whole within the limits, then lets the library parse and route it.
class HttpService::Server final : public httplib::Server {
 public:
  explicit Server(HttpService* service) : service_(service) {}

  // The library listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG,
  // compiled in): a burst of clients would wait on SYN retries. listen()
  // again on a listening socket only changes its backlog.
  void RaiseBacklog(int backlog) { ::listen(svr_sock_, backlog); }
  // The thread that accepts: a connection run there is one too many.
  void set_accept_thread(std::thread::id id) { accept_thread_.store(id); }

 private:
  bool process_and_close_socket(socket_t sock) override {
    if (std::this_thread::get_id() == accept_thread_.load()) {
      service_->Refused(HttpRefusal::kTooManyConnections);
      HttpConnection::RefuseAndClose(
          sock, 503,
          absl::StrCat("refused: ", service_->max_connections_,
                       " connections are open, the most this port serves at once"));
      return false;
    }
    HttpConnection connection(sock, service_->wake_fd_, service_->options_,
                              [this](HttpRefusal reason) { service_->Refused(reason); });
    const int max_requests = service_->options_.max_requests_per_connection;
    for (int served = 1; served <= max_requests; ++served) {
      if (!connection.ReadRequest()) return true;
      bool closed = false;
      const bool written = process_request(connection, /*close_connection=*/served == max_requests,
                                           closed, nullptr);
      connection.EndRequest();
      if (!written || closed) return written;
    }
    return true;
  }

  HttpService* const service_;
  std::atomic<std::thread::id> accept_thread_{};
};


HttpService::HttpService(const Clock* clock, HttpServiceOptions options)
    : clock_(clock), options_(std::move(options)) {}

HttpService::~HttpService() {
  Stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void HttpService::AddRoutes() {
  server_->Get("/status", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(routes_.status_json(), "application/json");
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(routes_.metrics_text(), "text/plain; version=0.0.4");
  });
  server_->Get("/", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(routes_.page, "text/html; charset=utf-8");
  });
  // The mutating routes: the job's token and no foreign origin, or refused
  // and counted.
  const auto mutating = [this](std::function<std::pair<int, std::string>(const httplib::Request&)>
                                   route) {
    return [this, route = std::move(route)](const httplib::Request& request,
                                            httplib::Response& response) {
      if (auto refusal = MutationRefusal(request, routes_.bearer_token)) {
        Refused(refusal->first == 401 ? HttpRefusal::kUnauthorized
                                      : HttpRefusal::kForeignOrigin);
        response.status = refusal->first;
        if (refusal->first == 401) {
          response.set_header("WWW-Authenticate", "Bearer realm=\"eps\"");
        }
        response.set_content(DumpJson({{"error", refusal->second}}), "application/json");
        return;
      }
      auto [status, body] = route(request);
      response.status = status;
      response.set_content(body, "application/json");
    };
  };
  server_->Post("/checkpoint", mutating([this](const httplib::Request&) {
                  return routes_.checkpoint();
                }));
  if (routes_.export_model) {
    server_->Post("/export", mutating([this](const httplib::Request& request) {
                    return routes_.export_model(request.get_param_value("dir"));
                  }));
  }
  if (routes_.drain) {
    server_->Post(R"(/servers/(\d{1,9})/drain)",
                  mutating([this](const httplib::Request& request) {
                    return routes_.drain(static_cast<uint32_t>(std::stoul(request.matches[1])));
                  }));
  }
  // Every answer of 400 and up passes here: the library's 400 (a request
  // it cannot parse) is counted, its 404 for a route that exists becomes
  // 405. Handled: the answer now has a body the library must measure.
  server_->set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& request, httplib::Response& response) {
        if (response.status == 400) Refused(HttpRefusal::kMalformed);
        const char* allowed = AllowedMethods(request.path);
        // A route's own 404 (an unknown server) has its body already.
        if (response.status != 404 || allowed == nullptr || !response.body.empty()) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        Refused(HttpRefusal::kMethodNotAllowed);
        response.status = 405;
        response.set_header("Allow", allowed);
        response.set_content(
            DumpJson({{"error", absl::StrCat("refused: ", request.path, " takes ", allowed)}}),
            "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
}

StatusOr<int> HttpService::Start(const std::string& host, int port, HttpRoutes routes) {
  RETURN_IF_ERROR(options_.Validate());
  routes_ = std::move(routes);
  max_connections_ = options_.max_connections;
  // Each connection holds a descriptor: half the limit stays for the job's
  // ZeroMQ sockets and RocksDB files, which fail (or abort) without one.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY &&
      files.rlim_cur / 2 < static_cast<rlim_t>(max_connections_)) {
    max_connections_ = std::max(1, static_cast<int>(files.rlim_cur / 2));
    LOG(WARNING) << "HTTP serves at most " << max_connections_
                 << " connections at once, half the open-file limit (" << files.rlim_cur
                 << "; ulimit -n)";
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("--http-port: cannot make an eventfd: ", std::strerror(errno)));
  }
  server_ = std::make_unique<Server>(this);
  server_->new_task_queue = [max = max_connections_] {
    return new ConnectionThreads(static_cast<size_t>(max));
  };
  // What the library says in its Keep-Alive header; HttpConnection enforces it.
  server_->set_keep_alive_timeout(absl::ToInt64Seconds(options_.idle_timeout));
  server_->set_keep_alive_max_count(static_cast<size_t>(options_.max_requests_per_connection));
  server_->set_payload_max_length(options_.max_body_bytes);
  AddRoutes();
  if (port == 0) {
    port = server_->bind_to_any_port(host);
    if (port < 0) {
      return absl::UnavailableError(absl::StrCat("--http-port: cannot bind an HTTP port on ", host));
    }
  } else if (!server_->bind_to_port(host, port)) {
    return absl::UnavailableError(
        absl::StrCat("--http-port: cannot bind ", host, ":", port, " (in use?)"));
  }
  server_->RaiseBacklog(max_connections_);
  thread_ = std::thread([this] {
    server_->set_accept_thread(std::this_thread::get_id());
    server_->listen_after_bind();
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
  while (!server_->is_running() && !returned_.load() && clock_->Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  // Ends every connection's wait; the accept loop then joins their threads.
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
    LOG(WARNING) << "HTTP: cannot wake the connections (" << std::strerror(errno)
                 << "); they end at their next timeout";
  }
  server_->stop();
  thread_.join();
}

void HttpService::WriteMetrics(PrometheusWriter& out) const {
  out.Family("eps_http_requests_refused_total", MetricType::kCounter,
             "HTTP requests refused, by reason: a mutation without the bearer token "
             "(unauthorized) or from another origin's page (foreign_origin); over the port's "
             "limits (too_many_connections, request_timeout, headers_too_large, uri_too_long, "
             "body_too_large, length_required); a method not implemented (501) or not "
             "allowed on its route (405); malformed.");
  for (HttpRefusal reason : kHttpRefusals) {
    out.Sample({{"reason", std::string(HttpRefusalName(reason))}},
               static_cast<double>(refused(reason)));
  }
}

}  // namespace eps
