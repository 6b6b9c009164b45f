#include "master/progress/data_set.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace eps {

StatusOr<DataSet> CutIntoShards(std::vector<std::string> files, uint64_t shard_lines,
                                const ScanProgress& progress) {
  DataSet data;
  data.files = std::move(files);
  uint64_t total_bytes = 0;
  for (const std::string& path : data.files) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) {
      return absl::NotFoundError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
    }
    total_bytes += static_cast<uint64_t>(info.st_size);
  }
  data.bytes = total_bytes;

  std::vector<char> buffer(size_t{4} << 20);
  uint64_t scanned = 0;
  for (uint32_t f = 0; f < data.files.size(); ++f) {
    const std::string& path = data.files[f];
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    ShardSpec current{.file = f, .begin = 0, .end = 0, .first_line = 1, .lines = 0};
    uint64_t offset = 0;
    uint64_t line = 1;
    bool in_line = false;  // bytes seen since the last '\n'
    while (true) {
      const ssize_t got = ::read(fd, buffer.data(), buffer.size());
      if (got < 0) {
        if (errno == EINTR) continue;
        const int error = errno;
        ::close(fd);
        return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", std::strerror(error)));
      }
      if (got == 0) break;
      const char* p = buffer.data();
      const char* end = p + got;
      while (p < end) {
        const char* newline = static_cast<const char*>(std::memchr(p, '\n', end - p));
        if (newline == nullptr) {
          in_line = true;
          offset += static_cast<uint64_t>(end - p);
          break;
        }
        offset += static_cast<uint64_t>(newline - p) + 1;
        p = newline + 1;
        in_line = false;
        ++current.lines;
        ++line;
        if (current.lines == shard_lines) {
          current.end = offset;
          data.shards.push_back(current);
          data.lines += current.lines;
          current = ShardSpec{.file = f, .begin = offset, .end = 0, .first_line = line, .lines = 0};
        }
      }
      scanned += static_cast<uint64_t>(got);
      if (progress && !progress(scanned, total_bytes)) {
        ::close(fd);
        return absl::CancelledError(absl::StrCat("scan stopped while reading ", path));
      }
    }
    ::close(fd);
    if (in_line) ++current.lines;  // a last line without '\n'
    if (current.lines > 0) {
      current.end = offset;
      data.shards.push_back(current);
      data.lines += current.lines;
    }
  }
  return data;
}

Status CheckShardRange(const std::string& path, uint64_t begin, uint64_t end, uint64_t lines) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string why = absl::StrCat("cannot open it: ", std::strerror(error));
    if (error == ENOENT) return absl::NotFoundError("the file is gone");
    if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(why);
    return absl::UnavailableError(why);
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || static_cast<uint64_t>(info.st_size) < end) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("truncated: ", info.st_size,
                                            " bytes, the scan saw at least ", end));
  }
  std::vector<char> buffer(size_t{1} << 20);
  uint64_t offset = begin;
  uint64_t newlines = 0;
  char last = '\n';
  while (offset < end) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), end - offset));
    const ssize_t got = ::pread(fd, buffer.data(), want, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int error = errno;
      ::close(fd);
      return got == 0 ? absl::DataLossError(absl::StrCat("truncated at byte ", offset))
                      : absl::UnavailableError(absl::StrCat("read error at byte ", offset, ": ",
                                                            std::strerror(error)));
    }
    newlines += static_cast<uint64_t>(std::count(buffer.data(), buffer.data() + got, '\n'));
    last = buffer[static_cast<size_t>(got) - 1];
    offset += static_cast<uint64_t>(got);
  }
  ::close(fd);
  // A range ends after a '\n', or at the end of the file for a last line
  // without one.
  const uint64_t found = newlines + (begin < end && last != '\n' ? 1 : 0);
  if (found != lines) {
    return absl::DataLossError(absl::StrCat("changed: bytes ", begin, "-", end, " hold ", found,
                                            " lines, the scan saw ", lines));
  }
  return absl::OkStatus();
}

proto::DataSetRecord DataSetToRecord(const DataSet& data) {
  proto::DataSetRecord record;
  for (const std::string& file : data.files) record.add_files(file);
  record.set_records(data.lines);
  record.set_bytes(data.bytes);
  for (const ShardSpec& spec : data.shards) {
    proto::ShardRecord* shard = record.add_shards();
    shard->set_file(spec.file);
    shard->set_begin(spec.begin);
    shard->set_end(spec.end);
    shard->set_first_line(spec.first_line);
    shard->set_records(spec.lines);
  }
  return record;
}

DataSet DataSetFromRecord(const proto::DataSetRecord& record) {
  DataSet data;
  data.files.assign(record.files().begin(), record.files().end());
  data.lines = record.records();
  data.bytes = record.bytes();
  for (const proto::ShardRecord& shard : record.shards()) {
    data.shards.push_back(ShardSpec{.file = shard.file(),
                                    .begin = shard.begin(),
                                    .end = shard.end(),
                                    .first_line = shard.first_line(),
                                    .lines = shard.records()});
  }
  return data;
}

}  // namespace eps
