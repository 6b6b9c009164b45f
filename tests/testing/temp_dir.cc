#include "tests/testing/temp_dir.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace eps::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/eps-test-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) std::abort();
  path_ = buffer.data();
}

TempDir::~TempDir() {
  std::error_code error;
  std::filesystem::remove_all(path_, error);
}

SmallDisk::SmallDisk(const std::string& path, int megabytes) : path_(path) {
  std::filesystem::create_directories(path);
  if (::geteuid() != 0) {
    error_ = "needs root to mount a tmpfs";
    return;
  }
  const std::string size = absl::StrCat("size=", megabytes, "m");
  if (::mount("tmpfs", path.c_str(), "tmpfs", 0, size.c_str()) != 0) {
    error_ = absl::StrCat("cannot mount a tmpfs on ", path, ": ", std::strerror(errno));
    return;
  }
  mounted_ = true;
}

SmallDisk::~SmallDisk() {
  if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
}

std::string SmallDisk::Fill(uint64_t spare) {
  const std::string filler = path_ + "/filler";
  const std::filesystem::space_info space = std::filesystem::space(path_);
  const uint64_t size = space.available > spare ? space.available - spare : 0;
  std::ofstream out(filler, std::ios::binary);
  const std::string block(1 << 20, 'x');
  for (uint64_t written = 0; written < size && out; written += block.size()) {
    out.write(block.data(),
              static_cast<std::streamsize>(std::min<uint64_t>(block.size(), size - written)));
  }
  return filler;
}

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace eps::testing
