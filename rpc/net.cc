#include "rpc/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace eps {

StatusOr<HostPort> ParseTcpEndpoint(const std::string& endpoint) {
  const std::string kScheme = "tcp://";
  if (endpoint.rfind(kScheme, 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("endpoint '", endpoint, "' must look like tcp://HOST:PORT"));
  }
  const std::string rest = endpoint.substr(kScheme.size());
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("endpoint '", endpoint, "' has no HOST:PORT"));
  }
  HostPort out;
  out.host = rest.substr(0, colon);
  // Digits only: SimpleAtoi alone would also take " 80", "+80" and "80 ".
  const std::string port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port, &out.port) || out.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("endpoint '", endpoint, "' has a bad port"));
  }
  return out;
}

StatusOr<std::string> LocalAddressFor(const std::string& endpoint) {
  ASSIGN_OR_RETURN(HostPort target, ParseTcpEndpoint(endpoint));
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc =
      getaddrinfo(target.host.c_str(), std::to_string(target.port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve host '", target.host, "': ", gai_strerror(rc)));
  }
  // Connecting a UDP socket sends nothing; it only picks the route.
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  Status status;
  std::string address;
  if (fd < 0 || connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
    status = absl::UnavailableError(
        absl::StrCat("no route to ", target.host, ": ", std::strerror(errno)));
  } else {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length);
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
    address = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  if (!status.ok()) return status;
  return address;
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

}  // namespace eps
