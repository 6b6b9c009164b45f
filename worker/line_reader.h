// LineReader: streams the lines of a byte range of a text file.
//
// A data shard is a byte range [start, end) aligned to record starts: it
// begins at a line start and ends just after a '\n' (or at the end of the
// file). The reader returns each line without its terminator ("\n" or
// "\r\n"), with its 1-based line number in the file, for error messages.
//
// Thread-safety: one thread only.

#ifndef EPS_WORKER_LINE_READER_H_
#define EPS_WORKER_LINE_READER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/status.h"

namespace eps {

class LineReader {
 public:
  // Opens `path` to read [start, end); `start_line` is the line number of
  // the line at `start`. kNotFound / kPermissionDenied / kInvalidArgument
  // (range beyond the file), naming the path.
  static StatusOr<std::unique_ptr<LineReader>> Open(const std::string& path, uint64_t start,
                                                    uint64_t end, uint64_t start_line);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Sets *line to the next line; returns false at the end of the range or
  // on a read error (then status() says which). The view is valid until
  // the next call.
  bool Next(absl::string_view* line);

  // 1-based line number of the line Next returned last.
  uint64_t line_number() const { return line_number_; }
  // Byte offset just past the line Next returned last (its terminator
  // included): where a reader resuming after it would start.
  uint64_t offset() const { return offset_; }
  // Ends the range at `end` instead: lines starting there or later are not
  // returned. REQUIRES: offset() <= end <= the current end.
  void Truncate(uint64_t end);
  uint64_t end() const { return end_; }

  // OK, or the read error that ended the range early.
  const Status& status() const { return status_; }
  const std::string& path() const { return path_; }

 private:
  LineReader(std::string path, int fd, uint64_t start, uint64_t end, uint64_t start_line);
  // Reads more of the range into the buffer; false at the end or on error.
  bool Fill();

  const std::string path_;
  const int fd_;
  uint64_t end_;
  uint64_t file_pos_;       // next byte to read from the file
  uint64_t offset_;         // file offset of buffer_[head_]
  uint64_t line_number_;
  std::vector<char> buffer_;
  size_t head_ = 0;         // first unconsumed byte in buffer_
  size_t tail_ = 0;         // one past the last valid byte in buffer_
  Status status_;
};

// A record start inside a byte range, with its line number.
struct LinePosition {
  uint64_t offset = 0;
  uint64_t line = 0;
};

// The first line start at or after the middle of [from, end) of `path`,
// where `from` is a line start on line `from_line`; nullopt when no line
// starts in [middle, end). Reads the file from `from` up to that point.
// Errors as LineReader::Open, or the read error.
StatusOr<std::optional<LinePosition>> FindMiddleLine(const std::string& path, uint64_t from,
                                                     uint64_t from_line, uint64_t end);

}  // namespace eps

#endif  // EPS_WORKER_LINE_READER_H_
