#include "worker/line_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace eps {
namespace {

constexpr size_t kReadSize = size_t{1} << 20;

Status ErrnoStatus(int error, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT: return absl::NotFoundError(message);
    case EACCES: return absl::PermissionDeniedError(message);
    default: return absl::UnavailableError(message);
  }
}

}  // namespace

StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path, uint64_t start,
                                                       uint64_t end, uint64_t start_line) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    return ErrnoStatus(error, absl::StrCat("cannot stat ", path));
  }
  if (start > end || end > static_cast<uint64_t>(info.st_size)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("range [", start, ", ", end, ") is beyond ",
                                                   path, " (", info.st_size, " bytes)"));
  }
  posix_fadvise(fd, static_cast<off_t>(start), static_cast<off_t>(end - start),
                POSIX_FADV_SEQUENTIAL);
  return std::unique_ptr<LineReader>(new LineReader(path, fd, start, end, start_line));
}

LineReader::LineReader(std::string path, int fd, uint64_t start, uint64_t end,
                       uint64_t start_line)
    : path_(std::move(path)),
      fd_(fd),
      end_(end),
      file_pos_(start),
      offset_(start),
      line_number_(start_line - 1),
      buffer_(kReadSize) {}

LineReader::~LineReader() { ::close(fd_); }

bool LineReader::Fill() {
  if (file_pos_ >= end_) return false;
  // Keep the unconsumed partial line at the front, then read after it.
  if (head_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + head_, tail_ - head_);
    tail_ -= head_;
    head_ = 0;
  }
  if (buffer_.size() - tail_ < kReadSize / 2) buffer_.resize(buffer_.size() * 2);
  const size_t want = std::min<uint64_t>(buffer_.size() - tail_, end_ - file_pos_);
  ssize_t got;
  do {
    got = ::pread(fd_, buffer_.data() + tail_, want, static_cast<off_t>(file_pos_));
  } while (got < 0 && errno == EINTR);
  if (got < 0) {
    status_ = ErrnoStatus(errno, absl::StrCat("cannot read ", path_));
    return false;
  }
  if (got == 0) {
    status_ = absl::DataLossError(
        absl::StrCat(path_, " ended at byte ", file_pos_, ", before ", end_, " (file truncated?)"));
    return false;
  }
  tail_ += static_cast<size_t>(got);
  file_pos_ += static_cast<uint64_t>(got);
  return true;
}

void LineReader::Truncate(uint64_t end) {
  CHECK_LE(offset_, end);
  CHECK_LE(end, end_);
  end_ = end;
  // Drop what the buffer holds beyond the new end.
  tail_ = std::min<size_t>(tail_, head_ + static_cast<size_t>(end - offset_));
  file_pos_ = std::min(file_pos_, end);
}

bool LineReader::Next(absl::string_view* line) {
  while (true) {
    const char* begin = buffer_.data() + head_;
    const char* newline = static_cast<const char*>(std::memchr(begin, '\n', tail_ - head_));
    size_t length;
    size_t consumed;
    if (newline != nullptr) {
      length = static_cast<size_t>(newline - begin);
      consumed = length + 1;
    } else if (file_pos_ >= end_ || !status_.ok()) {
      if (head_ == tail_ || !status_.ok()) return false;
      length = tail_ - head_;  // the file's last line has no '\n'
      consumed = length;
    } else {
      if (!Fill()) {
        if (!status_.ok()) return false;
      }
      continue;
    }
    if (length > 0 && begin[length - 1] == '\r') --length;
    *line = absl::string_view(begin, length);
    head_ += consumed;
    offset_ += consumed;
    ++line_number_;
    return true;
  }
}

StatusOr<std::optional<LinePosition>> FindMiddleLine(const std::string& path, uint64_t from,
                                                     uint64_t from_line, uint64_t end) {
  const uint64_t middle = from + (end - from) / 2;
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> reader, LineReader::Open(path, from, end, from_line));
  absl::string_view line;
  // Lines that start before the middle; the next one starts at or after it.
  while (reader->offset() < middle && reader->Next(&line)) {
  }
  RETURN_IF_ERROR(reader->status());
  if (reader->offset() >= end) return std::optional<LinePosition>();
  return std::optional<LinePosition>(
      LinePosition{.offset = reader->offset(), .line = reader->line_number() + 1});
}

}  // namespace eps
