// Tests rpc/net.h.

#include "rpc/net.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

TEST(ParseTcpEndpoint, GoodEndpoints) {
  StatusOr<HostPort> hp = ParseTcpEndpoint("tcp://127.0.0.1:1234");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "127.0.0.1");
  EXPECT_EQ(hp->port, 1234);

  hp = ParseTcpEndpoint("tcp://example.com:0");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "example.com");
  EXPECT_EQ(hp->port, 0);

  hp = ParseTcpEndpoint("tcp://localhost:65535");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->port, 65535);
}

TEST(ParseTcpEndpoint, BadEndpoints) {
  for (const std::string bad :
       {"", "127.0.0.1:80", "udp://127.0.0.1:80", "tcp://", "tcp://127.0.0.1", "tcp://:80",
        "tcp://127.0.0.1:", "tcp://127.0.0.1:http", "tcp://127.0.0.1:65536", "tcp://127.0.0.1:-1",
        "tcp://127.0.0.1:99999999999", "tcp://127.0.0.1:+80", "tcp://127.0.0.1: 80",
        "tcp://127.0.0.1:80 ", "tcp://127.0.0.1:*"}) {
    SCOPED_TRACE(bad);
    StatusOr<HostPort> hp = ParseTcpEndpoint(bad);
    ASSERT_FALSE(hp.ok()) << hp->host << " " << hp->port;
    EXPECT_EQ(hp.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(hp.status().message()), HasSubstr("'" + bad + "'"));
  }
}

TEST(LocalAddressFor, Loopback) {
  StatusOr<std::string> address = LocalAddressFor("tcp://127.0.0.1:1234");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "127.0.0.1");
}

TEST(LocalAddressFor, MalformedEndpoint) {
  EXPECT_EQ(LocalAddressFor("127.0.0.1:1234").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalAddressFor, UnresolvableHost) {
  // .invalid never resolves (RFC 2606); no network is needed to learn that.
  StatusOr<std::string> address = LocalAddressFor("tcp://no-such-host.invalid:80");
  ASSERT_FALSE(address.ok());
  EXPECT_EQ(address.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(address.status().message()), HasSubstr("no-such-host.invalid"));
}

TEST(Hostname, IsNotEmpty) { EXPECT_FALSE(Hostname().empty()); }

}  // namespace
}  // namespace eps
