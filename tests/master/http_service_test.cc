// Tests master/http/http_service.h: the master's HTTP port against slow, idle and
// oversized clients, over loopback with raw sockets. Routes are fakes; the
// master's /metrics of the counts is in master_status_test.cc.
//
// The latency bound (a fresh GET /status under 1 s) is a correctness bound,
// a generous one: against the stock cpp-httplib pool it took until the
// client's timeout.

#include "master/http/http_service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace eps {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kToken[] = "secret-token";

// A client connection to 127.0.0.1:port, closed when it goes away.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    const timeval bound = {5, 0};  // bounds connect() and send()
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof(bound));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return fd_ >= 0; }

  // Sends all of `data`; false when the server has closed.
  bool Send(absl::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // What the server sends until it closes the connection, or `timeout`.
  std::string ReadUntilClosed(absl::Duration timeout = absl::Seconds(5)) {
    std::string got;
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      pollfd fd = {fd_, POLLIN, 0};
      if (::poll(&fd, 1, 50) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) break;
      got.append(chunk, static_cast<size_t>(n));
    }
    return got;
  }

 private:
  int fd_ = -1;
};

// The soft open-file limit raised to at least `wanted` (restored when this
// goes away); ok() false when the hard limit is lower.
class OpenFileLimit {
 public:
  explicit OpenFileLimit(rlim_t wanted) {
    getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit raised = saved_;
    raised.rlim_cur = std::max(saved_.rlim_cur, std::min(wanted, saved_.rlim_max));
    ok_ = raised.rlim_cur >= wanted && setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }
  // Lowers the soft limit to `limit` instead.
  static OpenFileLimit Lowered(rlim_t limit) {
    OpenFileLimit lowered(0);
    rlimit now = lowered.saved_;
    now.rlim_cur = limit;
    lowered.ok_ = setrlimit(RLIMIT_NOFILE, &now) == 0;
    return lowered;
  }
  ~OpenFileLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }
  OpenFileLimit(OpenFileLimit&&) = default;
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  bool ok_ = false;
};

class HttpServiceTest : public ::testing::Test {
 protected:
  void Start(HttpServiceOptions options = {}, std::string token = kToken) {
    service_ = std::make_unique<HttpService>(Clock::Real(), options);
    HttpRoutes routes{
        .status_json = [] { return std::string(R"({"state":"running"})"); },
        .metrics_text = [] { return std::string("eps_up 1\n"); },
        .page = "<html>eps</html>",
        .checkpoint = [] { return std::make_pair(200, std::string(R"({"checkpoint":1})")); },
        .export_model =
            [](const std::string& dir) {
              return std::make_pair(200, nlohmann::json({{"dir", dir}}).dump());
            },
        .drain =
            [](uint32_t server) {
              return std::make_pair(200, nlohmann::json({{"server", server}}).dump());
            },
        .bearer_token = std::move(token),
    };
    StatusOr<int> port = service_->Start("127.0.0.1", 0, std::move(routes));
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
  }

  // A fresh GET /status: its HTTP status (-1 when none came) and how long
  // it took; the client gives up after 5 s.
  std::pair<int, absl::Duration> TimedStatus() {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(5);
    client.set_read_timeout(5);
    const absl::Time start = absl::Now();
    httplib::Result result = client.Get("/status");
    return {result ? result->status : -1, absl::Now() - start};
  }

  // Asks GET /status three times, expecting 200 within 1 s each; returns
  // the longest it took.
  absl::Duration SlowestOfThreeStatus() {
    absl::Duration slowest;
    for (int i = 0; i < 3; ++i) {
      const auto [status, took] = TimedStatus();
      EXPECT_EQ(status, 200);
      EXPECT_LT(took, absl::Seconds(1));
      slowest = std::max(slowest, took);
    }
    return slowest;
  }

  // Whether GET /status, asked again and again, answers 200 within `bound`.
  bool StatusAnswersWithin(absl::Duration bound) {
    for (const absl::Time deadline = absl::Now() + bound; absl::Now() < deadline;) {
      if (TimedStatus().first == 200) return true;
    }
    return false;
  }

  // Sends `request` on a connection of its own and returns the answer, up
  // to the server's close.
  std::string Exchange(absl::string_view request) {
    RawClient client(port_);
    if (!client.connected() || !client.Send(request)) return "(no connection)";
    return client.ReadUntilClosed();
  }

  std::unique_ptr<HttpService> service_;
  int port_ = 0;
};

// cpp-httplib percent-decodes header values: a token with '%' followed by
// hex digits (Z85 text, as older eps-keygen wrote) still matches.
TEST_F(HttpServiceTest, ATokenWithPercentEscapesMatchesAsSent) {
  const std::string token = "Ab%41c%2Fd+e%zz";
  ASSERT_NO_FATAL_FAILURE(Start({}, token));
  httplib::Client client("127.0.0.1", port_);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  client.set_bearer_token_auth(token);
  httplib::Result ordered = client.Post("/checkpoint");
  ASSERT_TRUE(ordered);
  EXPECT_EQ(ordered->status, 200);
  client.set_bearer_token_auth("AbAc/d+e%zz");
  httplib::Result decoded = client.Post("/checkpoint");
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->status, 200) << "what the library makes of the token";
  client.set_bearer_token_auth("Ab%41c%2Fd+e%zy");
  httplib::Result wrong = client.Post("/checkpoint");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
}

TEST_F(HttpServiceTest, ReadsAreOpenAndCheckpointKeepsItsChecks) {
  ASSERT_NO_FATAL_FAILURE(Start());
  httplib::Client client("127.0.0.1", port_);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  for (const char* path : {"/", "/status", "/metrics"}) {
    httplib::Result read = client.Get(path);
    ASSERT_TRUE(read) << path << ": " << httplib::to_string(read.error());
    EXPECT_EQ(read->status, 200) << path;
  }
  httplib::Result anonymous = client.Post("/checkpoint");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
  EXPECT_EQ(anonymous->get_header_value("WWW-Authenticate"), "Bearer realm=\"eps\"");
  client.set_bearer_token_auth(kToken);
  httplib::Result foreign =
      client.Post("/checkpoint", {{"Origin", "http://evil.example"}}, "", "text/plain");
  ASSERT_TRUE(foreign);
  EXPECT_EQ(foreign->status, 403);
  httplib::Result ordered = client.Post("/checkpoint");
  ASSERT_TRUE(ordered);
  EXPECT_EQ(ordered->status, 200);
  EXPECT_EQ(ordered->body, R"({"checkpoint":1})");
  // POST /export keeps the same checks, and passes its dir on.
  httplib::Result exported = client.Post("/export?dir=/models/x");
  ASSERT_TRUE(exported);
  EXPECT_EQ(exported->status, 200);
  EXPECT_EQ(exported->body, R"({"dir":"/models/x"})");
  exported = client.Post("/export", {{"Origin", "http://evil.example"}}, "", "text/plain");
  ASSERT_TRUE(exported);
  EXPECT_EQ(exported->status, 403);
  EXPECT_EQ(client.Get("/export")->status, 405);
  EXPECT_EQ(service_->refused(HttpRefusal::kUnauthorized), 1u);
  EXPECT_EQ(service_->refused(HttpRefusal::kForeignOrigin), 2u);
}

// Requests on one connection, pipelined in one write, a GET with a body
// among them: each is answered, none is read as part of another.
TEST_F(HttpServiceTest, KeepsPipelinedRequestsApart) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string answers =
      Exchange("GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
               "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
               "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(answers, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(answers, HasSubstr(R"({"state":"running"})"));
  EXPECT_THAT(answers, HasSubstr("eps_up 1\n"));
  EXPECT_THAT(answers, HasSubstr("<html>eps</html>"));
  EXPECT_EQ(service_->refused(HttpRefusal::kMalformed), 0u);
}

// 16 connections (more than the stock pool's max(8, cores - 1) threads,
// which they used to hold for good) trickle a header byte each every
// 100 ms: a fresh GET /status is answered at once all the same.
TEST_F(HttpServiceTest, AnswersStatusUnderSlowloris) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const int slow_clients = std::max(16, 2 * static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<std::unique_ptr<RawClient>> slow;
  for (int i = 0; i < slow_clients; ++i) {
    slow.push_back(std::make_unique<RawClient>(port_));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->Send("GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    while (!done.load()) {
      for (auto& client : slow) client->Send("a");
      absl::SleepFor(absl::Milliseconds(100));  // the attack's pace
    }
  });
  absl::SleepFor(absl::Milliseconds(300));  // the slow clients are in their heads now
  const absl::Duration slowest = SlowestOfThreeStatus();
  done.store(true);
  trickle.join();
  std::cout << "GET /status under " << slow_clients << " slowloris connections: at most "
            << absl::FormatDuration(slowest) << "\n";
  EXPECT_EQ(service_->refused(HttpRefusal::kRequestTimeout), 0u);  // 10 s are not over
}

// 1,000 open connections, a quarter of them in the middle of a request
// line, the rest silent: a fresh GET /status is answered at once.
TEST_F(HttpServiceTest, AnswersStatusWithThousandOpenConnections) {
  constexpr int kOpen = 1000;
  OpenFileLimit files(/*wanted=*/2 * kOpen + 256);  // both ends live in this process
  if (!files.ok()) GTEST_SKIP() << "the open-file limit cannot be raised to " << 2 * kOpen + 256;
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_GT(service_->max_connections(), kOpen);
  std::vector<std::unique_ptr<RawClient>> open;
  for (int i = 0; i < kOpen; ++i) {
    open.push_back(std::make_unique<RawClient>(port_));
    ASSERT_TRUE(open.back()->connected()) << "connection " << i;
    if (i % 4 == 0) {
      ASSERT_TRUE(open.back()->Send("GET /sta"));
    }
  }
  const absl::Duration slowest = SlowestOfThreeStatus();
  EXPECT_EQ(service_->refused(HttpRefusal::kTooManyConnections), 0u);
  // Stop wakes every connection's wait instead of sitting out idle_timeout.
  const absl::Time stopping = absl::Now();
  service_->Stop();
  const absl::Duration stop = absl::Now() - stopping;
  EXPECT_LT(stop, absl::Seconds(2));
  std::cout << "GET /status with " << kOpen << " open connections: at most "
            << absl::FormatDuration(slowest) << "; Stop took " << absl::FormatDuration(stop)
            << "\n";
}

// A request that trickles its head past request_timeout is answered 408; a
// silent connection is closed after idle_timeout, unanswered.
TEST_F(HttpServiceTest, BoundsHowLongARequestAndASilenceMayTake) {
  HttpServiceOptions options;
  options.request_timeout = absl::Milliseconds(500);
  options.idle_timeout = absl::Milliseconds(300);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  RawClient slow(port_);
  ASSERT_TRUE(slow.Send("GET /status HTTP/1.1\r\nX-Slow: "));
  const absl::Time start = absl::Now();
  std::string answer;
  while (absl::Now() - start < absl::Seconds(5) && slow.Send("a")) {
    absl::SleepFor(absl::Milliseconds(50));  // the attack's pace
  }
  answer = slow.ReadUntilClosed();
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 408 Request Timeout\r\n"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(service_->refused(HttpRefusal::kRequestTimeout), 1u);

  RawClient silent(port_);
  const absl::Time opened = absl::Now();
  EXPECT_EQ(silent.ReadUntilClosed(), "");
  EXPECT_LT(absl::Now() - opened, absl::Seconds(3));
}

TEST_F(HttpServiceTest, RefusesHeadersOverTheLimitWith431) {
  ASSERT_NO_FATAL_FAILURE(Start());
  // Ten lines of 1 KiB: each within the library's own 8 KiB line bound.
  std::string many = "GET /status HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 10; ++i) absl::StrAppend(&many, "X-Pad-", i, ": ", std::string(1000, 'a'), "\r\n");
  EXPECT_THAT(Exchange(absl::StrCat(many, "\r\n")),
              StartsWith("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
  // One line of 9 KiB, never ended: answered without waiting for the rest.
  EXPECT_THAT(Exchange(absl::StrCat("GET /status HTTP/1.1\r\nX-Big: ", std::string(9000, 'b'))),
              StartsWith("HTTP/1.1 431 "));
  EXPECT_THAT(Exchange(absl::StrCat("GET /", std::string(9000, 'c'), " HTTP/1.1\r\n\r\n")),
              StartsWith("HTTP/1.1 414 URI Too Long\r\n"));
  EXPECT_EQ(service_->refused(HttpRefusal::kHeadersTooLarge), 2u);
  EXPECT_EQ(service_->refused(HttpRefusal::kUriTooLong), 1u);
  // Just under the limit is served.
  std::string fits = "GET /status HTTP/1.1\r\nConnection: close\r\nX-Pad: ";
  fits.append(8192 - fits.size() - 4, 'd');
  EXPECT_THAT(Exchange(fits + "\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(HttpServiceTest, RefusesBodiesOverTheLimitWith413) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const absl::Time start = absl::Now();
  const std::string answer = Exchange(
      "POST /checkpoint HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\nabc");
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 413 Content Too Large\r\n"));
  EXPECT_THAT(answer, HasSubstr("Connection: close\r\n"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));  // at once, not after a read timeout
  EXPECT_THAT(Exchange("POST /checkpoint HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
              StartsWith("HTTP/1.1 411 Length Required\r\n"));
  EXPECT_THAT(Exchange("POST /checkpoint HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
              StartsWith("HTTP/1.1 400 "));
  EXPECT_EQ(service_->refused(HttpRefusal::kBodyTooLarge), 1u);
  EXPECT_EQ(service_->refused(HttpRefusal::kLengthRequired), 1u);
  EXPECT_EQ(service_->refused(HttpRefusal::kMalformed), 1u);
  // A body within the limit still reaches the route (and its token check).
  EXPECT_THAT(Exchange("POST /checkpoint HTTP/1.1\r\nConnection: close\r\nContent-Length: 4\r\n\r\nabcd"),
              StartsWith("HTTP/1.1 401 "));
}

TEST_F(HttpServiceTest, RefusesUnknownMethodsWith501AndOthersOffTheirRouteWith405) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string brewed = Exchange("BREW / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(brewed, StartsWith("HTTP/1.1 501 Not Implemented\r\n"));
  EXPECT_THAT(brewed, HasSubstr("BREW"));
  EXPECT_THAT(Exchange("TRACE / HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 501 "));
  EXPECT_EQ(service_->refused(HttpRefusal::kMethodNotImplemented), 2u);

  const std::string posted =
      Exchange("POST /status HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(posted, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n"));
  EXPECT_THAT(posted, HasSubstr("Allow: GET, HEAD\r\n"));
  const std::string got = Exchange("GET /checkpoint HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(got, StartsWith("HTTP/1.1 405 "));
  EXPECT_THAT(got, HasSubstr("Allow: POST\r\n"));
  EXPECT_EQ(service_->refused(HttpRefusal::kMethodNotAllowed), 2u);
  EXPECT_THAT(Exchange("GET /nowhere HTTP/1.1\r\nConnection: close\r\n\r\n"),
              StartsWith("HTTP/1.1 404 "));
  EXPECT_EQ(service_->refused(HttpRefusal::kMethodNotAllowed), 2u);
}

// One connection over max_connections is answered 503 at once; once one
// closes, the port serves again.
TEST_F(HttpServiceTest, RefusesConnectionsOverTheCapWith503) {
  HttpServiceOptions options;
  options.max_connections = 4;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  std::vector<std::unique_ptr<RawClient>> open;
  for (int i = 0; i < options.max_connections; ++i) {
    open.push_back(std::make_unique<RawClient>(port_));
    ASSERT_TRUE(open.back()->connected());
  }
  EXPECT_THAT(Exchange("GET /status HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 503 Service Unavailable\r\n"));
  EXPECT_EQ(service_->refused(HttpRefusal::kTooManyConnections), 1u);
  open.pop_back();
  EXPECT_TRUE(StatusAnswersWithin(absl::Seconds(5)));
}

// Clients take every descriptor the process has: the port refuses or
// waits, and serves again once they are gone.
TEST_F(HttpServiceTest, SurvivesRunningOutOfFileDescriptors) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const auto in_use = static_cast<rlim_t>(
      std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                    std::filesystem::directory_iterator{}));
  {
    OpenFileLimit files = OpenFileLimit::Lowered(in_use + 64);
    ASSERT_TRUE(files.ok());
    std::vector<std::unique_ptr<RawClient>> open;
    while (open.size() < 200) {
      open.push_back(std::make_unique<RawClient>(port_));
      if (!open.back()->connected()) break;
    }
    EXPECT_LT(open.size(), 200u) << "the descriptors never ran out";
  }
  EXPECT_TRUE(StatusAnswersWithin(absl::Seconds(5)));
}

TEST_F(HttpServiceTest, WritesEveryReasonToMetrics) {
  ASSERT_NO_FATAL_FAILURE(Start());
  EXPECT_THAT(Exchange("BREW / HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 501 "));
  PrometheusWriter out;
  service_->WriteMetrics(out);
  EXPECT_THAT(out.text(), HasSubstr("# TYPE eps_http_requests_refused_total counter\n"));
  EXPECT_THAT(out.text(),
              HasSubstr("\neps_http_requests_refused_total{reason=\"method_not_implemented\"} 1\n"));
  for (HttpRefusal reason : kHttpRefusals) {
    EXPECT_THAT(out.text(), HasSubstr(absl::StrCat("eps_http_requests_refused_total{reason=\"",
                                                   HttpRefusalName(reason), "\"}")));
  }
}

TEST(HttpServiceOptions, RejectsNonsense) {
  EXPECT_TRUE(HttpServiceOptions{}.Validate().ok());
  HttpServiceOptions no_connections;
  no_connections.max_connections = 0;
  EXPECT_EQ(no_connections.Validate().code(), absl::StatusCode::kInvalidArgument);
  HttpServiceOptions no_time;
  no_time.request_timeout = absl::ZeroDuration();
  EXPECT_EQ(no_time.Validate().code(), absl::StatusCode::kInvalidArgument);
  HttpServiceOptions huge_head;
  huge_head.max_header_bytes = 16384;
  EXPECT_EQ(huge_head.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eps
