#include "core/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace eps {

Status WriteFileAtomically(const std::string& path, std::string_view contents, int mode) {
  namespace fs = std::filesystem;
  const std::string temp = path + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", temp, ": ", std::strerror(errno)));
  }
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  const bool synced = written == contents.size() && ::fsync(fd) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!synced) {
    return absl::UnavailableError(
        absl::StrCat("cannot write ", temp, ": ", std::strerror(saved_errno)));
  }
  std::error_code error;
  fs::rename(temp, path, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", temp, " to ", path, ": ", error.message()));
  }
  // The rename lives in the directory: without this fsync a machine crash
  // could bring back the old file (or none) after an OK return.
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool dir_synced = dir_fd >= 0 && ::fsync(dir_fd) == 0;
  const int dir_errno = errno;
  if (dir_fd >= 0) ::close(dir_fd);
  if (!dir_synced) {
    return absl::UnavailableError(
        absl::StrCat("cannot fsync the directory of ", path, ": ", std::strerror(dir_errno)));
  }
  return absl::OkStatus();
}

StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string why = absl::StrCat("cannot open ", path, ": ", std::strerror(errno));
    if (errno == ENOENT) return absl::NotFoundError(why);
    if (errno == EACCES || errno == EPERM) return absl::PermissionDeniedError(why);
    return absl::UnavailableError(why);
  }
  std::string contents;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved_errno = errno;
      ::close(fd);
      return absl::UnavailableError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(saved_errno)));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
    if (contents.size() > max_bytes) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is larger than ", max_bytes, " bytes: not the file expected"));
    }
  }
  ::close(fd);
  return contents;
}

}  // namespace eps
