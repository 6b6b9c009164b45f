#include "master/http/http_connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "master/http/json_text.h"

namespace eps {
namespace {

using SteadyClock = std::chrono::steady_clock;

// After a refusal (or any close) the client may still be sending: reading
// that for a moment before close() keeps the kernel from answering it with
// a reset, which could destroy the answer before the client has read it.
constexpr auto kLingerTime = std::chrono::seconds(1);
constexpr size_t kLingerBytes = 64 * 1024;

// The methods HTTP/1.1 routes (RFC 9110 9.3 less CONNECT and TRACE, plus
// PATCH); any other is 501.
bool KnownMethod(absl::string_view method) {
  for (absl::string_view known : {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"}) {
    if (method == known) return true;
  }
  return false;
}

absl::string_view ReasonPhrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

// A whole answer that closes the connection.
std::string Answer(int status, absl::string_view message) {
  const std::string body = DumpJson({{"error", message}});
  return absl::StrCat("HTTP/1.1 ", status, " ", ReasonPhrase(status),
                      "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

// Milliseconds until `deadline` for poll(), rounded up (0 when past).
int PollMillis(SteadyClock::duration left) {
  if (left <= SteadyClock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

// The numeric address and port of `sock`'s peer or own end.
void AddressOf(int sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  auto* raw = reinterpret_cast<sockaddr*>(&address);
  if ((peer ? getpeername(sock, raw, &length) : getsockname(sock, raw, &length)) != 0) return;
  char host[NI_MAXHOST];
  char service[NI_MAXSERV];
  if (getnameinfo(raw, length, host, sizeof(host), service, sizeof(service),
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(service);
  }
}

// What a request's head says about its body.
struct BodyFraming {
  size_t content_length = 0;
  bool chunked = false;          // any Transfer-Encoding
  bool expect_continue = false;  // Expect: 100-continue
  bool malformed = false;        // a Content-Length that is no number, or two that differ
};

// `headers`: the header lines, CRLF-separated, without the blank line. Names
// are compared as the library parses them (the bytes before ':').
BodyFraming ParseFraming(absl::string_view headers) {
  BodyFraming framing;
  std::optional<uint64_t> length;
  for (absl::string_view line : absl::StrSplit(headers, "\r\n", absl::SkipEmpty())) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "Content-Length")) {
      uint64_t parsed = 0;
      const bool digits = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
        return absl::ascii_isdigit(static_cast<unsigned char>(c));
      });
      if (!digits || !absl::SimpleAtoi(value, &parsed) || (length && *length != parsed)) {
        framing.malformed = true;
      }
      length = parsed;
    } else if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      framing.chunked = true;
    } else if (absl::EqualsIgnoreCase(name, "Expect")) {
      framing.expect_continue = absl::EqualsIgnoreCase(value, "100-continue");
    }
  }
  framing.content_length = length.value_or(0);
  return framing;
}

}  // namespace

HttpConnection::HttpConnection(int sock, int wake_fd, const HttpServiceOptions& options,
                               std::function<void(HttpRefusal)> refused)
    : sock_(sock),
      wake_fd_(wake_fd),
      options_(options),
      refused_(std::move(refused)),
      write_budget_(absl::ToChronoNanoseconds(options.write_timeout)) {}

HttpConnection::~HttpConnection() {
  ::shutdown(sock_, SHUT_WR);
  const SteadyClock::time_point until = SteadyClock::now() + kLingerTime;
  for (size_t drained = 0; drained < kLingerBytes; drained += 4096) {
    if (Fill(until, /*keep=*/false) != Filled::kData) break;
  }
  ::close(sock_);
}

HttpConnection::Filled HttpConnection::Fill(SteadyTime deadline, bool keep) {
  for (;;) {
    const int wait = PollMillis(deadline - SteadyClock::now());
    if (wait == 0) return Filled::kTimeout;
    pollfd fds[2] = {{sock_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, wait);
    if (ready < 0 && errno != EINTR) return Filled::kEnd;
    if (ready <= 0) continue;
    if (fds[1].revents != 0) return Filled::kEnd;
    char chunk[4096];
    const ssize_t n = ::recv(sock_, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n > 0) {
      if (keep) buffer_.append(chunk, static_cast<size_t>(n));
      return Filled::kData;
    }
    if (n == 0) return Filled::kEnd;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Filled::kEnd;
  }
}

bool HttpConnection::FillRequest(SteadyTime deadline) {
  switch (Fill(deadline)) {
    case Filled::kData: return true;
    case Filled::kTimeout:
      return Refuse(HttpRefusal::kRequestTimeout, 408,
                    absl::StrCat("refused: the request did not arrive whole within ",
                                 absl::FormatDuration(options_.request_timeout)));
    case Filled::kEnd: return false;
  }
  return false;
}

bool HttpConnection::ReadRequest() {
  write_budget_ = absl::ToChronoNanoseconds(options_.write_timeout);
  // Up to the request's first byte; empty lines before a request line are
  // skipped (RFC 9112 2.2).
  const SteadyTime idle_deadline =
      SteadyClock::now() + absl::ToChronoNanoseconds(options_.idle_timeout);
  for (;;) {
    const size_t start = buffer_.find_first_not_of("\r\n");
    buffer_.erase(0, start == std::string::npos ? buffer_.size() : start);
    if (!buffer_.empty()) break;
    if (Fill(idle_deadline) != Filled::kData) return false;
  }

  const SteadyTime deadline =
      SteadyClock::now() + absl::ToChronoNanoseconds(options_.request_timeout);
  const size_t max_head = options_.max_header_bytes;
  size_t head_end = std::string::npos;  // just past the blank line
  size_t scanned = 0;
  for (;;) {
    const size_t blank = buffer_.find("\r\n\r\n", scanned);
    if (blank != std::string::npos) {
      head_end = blank + 4;
      break;
    }
    if (buffer_.size() >= max_head) break;
    scanned = buffer_.size() < 3 ? 0 : buffer_.size() - 3;
    if (!FillRequest(deadline)) return false;
  }
  if (head_end == std::string::npos || head_end > max_head) {
    const size_t line_end = buffer_.find("\r\n");
    if (line_end == std::string::npos || line_end + 2 > max_head) {
      return Refuse(HttpRefusal::kUriTooLong, 414,
                    absl::StrCat("refused: a request line over ", max_head, " bytes"));
    }
    return Refuse(HttpRefusal::kHeadersTooLarge, 431,
                  absl::StrCat("refused: request headers over ", max_head, " bytes"));
  }

  const absl::string_view head(buffer_.data(), head_end - 2);
  const size_t line_end = head.find("\r\n");
  const absl::string_view request_line = head.substr(0, line_end);
  const absl::string_view method = request_line.substr(0, request_line.find(' '));
  if (!KnownMethod(method)) {
    return Refuse(HttpRefusal::kMethodNotImplemented, 501,
                  absl::StrCat("refused: method ", method.substr(0, 32), " is not implemented"));
  }
  const BodyFraming framing = ParseFraming(head.substr(line_end + 2));
  if (framing.chunked) {
    return Refuse(HttpRefusal::kLengthRequired, 411,
                  "refused: a body needs a Content-Length (Transfer-Encoding is not taken)");
  }
  if (framing.malformed) {
    return Refuse(HttpRefusal::kMalformed, 400, "refused: an invalid Content-Length");
  }
  if (framing.content_length > options_.max_body_bytes) {
    return Refuse(HttpRefusal::kBodyTooLarge, 413,
                  absl::StrCat("refused: a body over ", options_.max_body_bytes, " bytes"));
  }

  const size_t request_end = head_end + framing.content_length;
  // The client waits for this before it sends the body. The library answers
  // 100 again once it parses the head: a client reads any number of 1xx
  // answers before the final one (RFC 9110 15.2).
  if (framing.expect_continue && buffer_.size() < request_end &&
      !WriteAll("HTTP/1.1 100 Continue\r\n\r\n")) {
    return false;
  }
  while (buffer_.size() < request_end) {
    if (!FillRequest(deadline)) return false;
  }
  request_end_ = request_end;
  read_at_ = 0;
  return true;
}

void HttpConnection::EndRequest() {
  buffer_.erase(0, request_end_);
  request_end_ = 0;
  read_at_ = 0;
}

bool HttpConnection::Refuse(HttpRefusal reason, int status, absl::string_view message) {
  refused_(reason);
  WriteAll(Answer(status, message));
  return false;
}

void HttpConnection::RefuseAndClose(int sock, int status, absl::string_view message) {
  const std::string answer = Answer(status, message);
  // A new connection's send buffer takes this whole; if not, the client
  // gets less, and the close.
  (void)::send(sock, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

bool HttpConnection::WriteAll(absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(data.data(), data.size());
    if (n < 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool HttpConnection::is_readable() const { return read_at_ < request_end_; }

bool HttpConnection::is_writable() const {
  pollfd fd = {sock_, POLLOUT, 0};
  return ::poll(&fd, 1, 0) == 1 && (fd.revents & POLLOUT) != 0;
}

ssize_t HttpConnection::read(char* ptr, size_t size) {
  const size_t n = std::min(size, request_end_ - read_at_);
  std::memcpy(ptr, buffer_.data() + read_at_, n);
  read_at_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t HttpConnection::write(const char* ptr, size_t size) {
  for (;;) {
    const ssize_t n = ::send(sock_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    const int wait = PollMillis(write_budget_);
    if (wait == 0) return -1;
    pollfd fds[2] = {{sock_, POLLOUT, 0}, {wake_fd_, POLLIN, 0}};
    const SteadyTime start = SteadyClock::now();
    const int ready = ::poll(fds, 2, wait);
    write_budget_ -= SteadyClock::now() - start;
    if (ready < 0 && errno != EINTR) return -1;
    if (ready > 0 && fds[1].revents != 0) return -1;
  }
}

void HttpConnection::get_remote_ip_and_port(std::string& ip, int& port) const {
  AddressOf(sock_, /*peer=*/true, ip, port);
}

void HttpConnection::get_local_ip_and_port(std::string& ip, int& port) const {
  AddressOf(sock_, /*peer=*/false, ip, port);
}

}  // namespace eps
