// HttpConnection: one client connection of the master's HTTP port (see
// master/http/http_service.h), as cpp-httplib's request parser reads and writes
// it (an httplib::Stream).
//
// ReadRequest reads the next request whole into the connection's buffer,
// within HttpServiceOptions' limits and deadlines, and answers the ones it
// refuses itself (408, 411, 413, 414, 431, 501, and 400 for a broken
// Content-Length); the library then parses and routes the request from the
// buffer, without a socket read of its own, and its answer goes out
// through write() within write_timeout. Bytes after the request (a
// pipelined next one) stay buffered for the next ReadRequest.
//
// Every wait polls the socket and the service's wake fd too, so that Stop
// ends it at once.
//
// Thread-safety: one thread only (the connection's).

#ifndef EPS_MASTER_HTTP_HTTP_CONNECTION_H_
#define EPS_MASTER_HTTP_HTTP_CONNECTION_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

#include "absl/strings/string_view.h"
#include "httplib.h"
#include "master/http/http_limits.h"

namespace eps {

class HttpConnection final : public httplib::Stream {
 public:
  // Serves `sock` (owned: closed, after a lingering close, when this goes
  // away). `wake_fd` becomes readable when the service stops (not owned).
  // `refused` counts each refusal ReadRequest answers.
  HttpConnection(int sock, int wake_fd, const HttpServiceOptions& options,
                 std::function<void(HttpRefusal)> refused);
  ~HttpConnection() override;
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // Blocks until the next request is in the buffer, whole: true, and read()
  // serves it (and nothing after it) until EndRequest. False when the
  // connection is to be closed: the client closed it or stayed silent for
  // idle_timeout, the service stops, or the request was refused (answered
  // and counted).
  bool ReadRequest();
  // Drops the request ReadRequest buffered, read or not.
  void EndRequest();

  // Answers `status` with a JSON {"error": message} and "Connection: close"
  // on `sock`, and closes it, without waiting for anything: for the
  // accepting thread. Does not count.
  static void RefuseAndClose(int sock, int status, absl::string_view message);

  // httplib::Stream.
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return sock_; }

 private:
  using SteadyTime = std::chrono::steady_clock::time_point;
  enum class Filled { kData, kTimeout, kEnd };  // kEnd: closed, failed or stopping

  // Reads what the socket has (at most 4 KiB) into buffer_ (or drops it when
  // `keep` is false), waiting until `deadline` for some.
  Filled Fill(SteadyTime deadline, bool keep = true);
  // Fill for the request under way: true when bytes came; false when the
  // connection closed or `deadline` passed (answered 408).
  bool FillRequest(SteadyTime deadline);
  // Answers `status` (408, 413, ...), counts `reason`; returns false, for
  // ReadRequest to return.
  bool Refuse(HttpRefusal reason, int status, absl::string_view message);
  // Whole `data`, within what is left of write_timeout.
  bool WriteAll(absl::string_view data);

  const int sock_;
  const int wake_fd_;
  const HttpServiceOptions& options_;
  const std::function<void(HttpRefusal)> refused_;
  // What was read and not yet dropped: the current request, then maybe
  // bytes of the next.
  std::string buffer_;
  // The current request is buffer_[0, request_end_); read() is at read_at_.
  size_t request_end_ = 0;
  size_t read_at_ = 0;
  // What is left of write_timeout for the current answer.
  std::chrono::steady_clock::duration write_budget_;
};

}  // namespace eps

#endif  // EPS_MASTER_HTTP_HTTP_CONNECTION_H_
