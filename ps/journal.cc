#include "ps/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "xxhash.h"

namespace eps {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kMagic = 0x4a535045;  // "EPSJ" little-endian
constexpr size_t kHeaderBytes = 24;
constexpr size_t kEntryHeaderBytes = 20;
// Replay writes to the store in pieces of about this many bytes.
constexpr size_t kReplayWriteBytes = 16 << 20;

std::string SegmentPath(const std::string& dir, uint64_t first_seq) {
  return (fs::path(dir) / absl::StrFormat("%020u.log", first_seq)).string();
}

template <typename T>
void Put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}
template <typename T>
T Get(const char* in) {
  T value;
  std::memcpy(&value, in, sizeof(value));
  return value;
}

Status WriteAll(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot append to journal ", path, ": ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// The segments in `dir` by first sequence number, ascending.
StatusOr<std::vector<uint64_t>> ListSegments(const std::string& dir) {
  std::vector<uint64_t> segments;
  std::error_code error;
  if (!fs::exists(dir, error) && !error) return segments;  // no journal yet
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    uint64_t first = 0;
    if (name.size() == 24 && name.ends_with(".log") &&
        absl::SimpleAtoi(name.substr(0, 20), &first)) {
      segments.push_back(first);
    }
  }
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot list journal ", dir, ": ", error.message()));
  }
  std::sort(segments.begin(), segments.end());
  return segments;
}

// Reads `n` bytes of `fd` at `offset` into `out`.
Status ReadAt(int fd, uint64_t offset, char* out, size_t n, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::UnavailableError(absl::StrCat("cannot read journal ", path, " at byte ",
                                                 offset + done, ": ", std::strerror(errno)));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

// Whether `fd` holds only zeros from `offset` to `size`.
StatusOr<bool> ZerosFrom(int fd, uint64_t offset, uint64_t size, const std::string& path) {
  std::vector<char> piece(64 << 10);
  for (uint64_t at = offset; at < size; at += piece.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), size - at));
    RETURN_IF_ERROR(ReadAt(fd, at, piece.data(), n, path));
    if (!std::all_of(piece.begin(), piece.begin() + n, [](char c) { return c == 0; })) {
      return false;
    }
  }
  return true;
}

// Replays one segment's batches into `store`, a batch read at a time (memory:
// about kReplayWriteBytes, or one batch when larger). `last`: a torn final
// batch is dropped rather than an error.
Status ReplaySegment(const std::string& path, bool last, KvStore* store, JournalReplay* replayed) {
  std::error_code error;
  const uint64_t size = fs::file_size(path, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot read journal ", path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot open journal ", path));
  const absl::Cleanup close_fd = [fd] { ::close(fd); };

  // The batches read since the last store write; `writes` point into them.
  std::vector<std::unique_ptr<char[]>> bodies;
  std::vector<KvWrite> writes;
  size_t pending_bytes = 0;
  // Every write is synced: the journal is deleted once replayed (a write
  // per 16 MiB, so a few fsyncs per segment).
  auto write = [&]() -> Status {
    if (writes.empty()) return absl::OkStatus();
    KeepLastWritePerKey(writes);
    RETURN_IF_ERROR_CTX(store->Write(writes, /*sync=*/true),
                        absl::StrCat("replaying journal ", path));
    replayed->writes += writes.size();
    writes.clear();
    bodies.clear();
    pending_bytes = 0;
    return absl::OkStatus();
  };
  std::optional<uint32_t> table_made;  // the last table CreateTable was asked for
  uint64_t offset = 0;
  while (offset < size) {
    // The batches before a bad one are applied first. Only a batch that
    // reaches the end of the last segment can be torn (a kill in its append;
    // after a machine crash, a tail the file system filled with zeros).
    const auto bad = [&](absl::string_view what, bool reaches_end) -> Status {
      RETURN_IF_ERROR(write());
      if (last && reaches_end) {
        replayed->torn_bytes = size - offset;
        LOG(WARNING) << "journal " << path << ": dropping a torn last batch at byte " << offset
                     << " (" << (size - offset) << " bytes, " << what << ")";
        return absl::OkStatus();
      }
      return absl::DataLossError(
          absl::StrCat("journal ", path, " is corrupt at byte ", offset, ": ", what));
    };
    if (size - offset < kHeaderBytes) return bad("a partial header", true);
    char header[kHeaderBytes];
    RETURN_IF_ERROR(ReadAt(fd, offset, header, kHeaderBytes, path));
    const uint32_t count = Get<uint32_t>(header + 4);
    const uint64_t payload = Get<uint64_t>(header + 8);
    if (Get<uint32_t>(header) != kMagic) {
      ASSIGN_OR_RETURN(const bool zeros, ZerosFrom(fd, offset, size, path));
      return bad("no batch header", zeros);
    }
    if (payload > size - offset - kHeaderBytes) return bad("a partial batch", true);
    char* body = bodies.emplace_back(std::make_unique_for_overwrite<char[]>(payload)).get();
    RETURN_IF_ERROR(ReadAt(fd, offset + kHeaderBytes, body, payload, path));
    if (XXH3_64bits(body, payload) != Get<uint64_t>(header + 16)) {
      return bad("a checksum mismatch", offset + kHeaderBytes + payload == size);
    }
    size_t at = 0;
    for (uint32_t i = 0; i < count; ++i) {
      if (payload - at < kEntryHeaderBytes) return absl::DataLossError(absl::StrCat(
          "journal ", path, ": a batch at byte ", offset, " ends inside an entry"));
      KvWrite entry;
      entry.table = Get<uint32_t>(body + at);
      entry.erase = Get<uint32_t>(body + at + 4) != 0;
      entry.key = Get<uint64_t>(body + at + 8);
      const uint32_t bytes = Get<uint32_t>(body + at + 16);
      at += kEntryHeaderBytes;
      if (payload - at < bytes) return absl::DataLossError(absl::StrCat(
          "journal ", path, ": a batch at byte ", offset, " ends inside a value"));
      entry.value = absl::string_view(body + at, bytes);
      at += bytes;
      if (table_made != entry.table) {
        RETURN_IF_ERROR_CTX(store->CreateTable(entry.table), absl::StrCat("replaying ", path));
        table_made = entry.table;
      }
      writes.push_back(entry);
    }
    pending_bytes += payload;
    offset += kHeaderBytes + payload;
    ++replayed->batches;
    if (pending_bytes >= kReplayWriteBytes) RETURN_IF_ERROR(write());
  }
  return write();
}

}  // namespace

Status Journal::Apply(const std::string& dir, KvStore* store, JournalReplay* replayed) {
  JournalReplay local;
  if (replayed == nullptr) replayed = &local;
  *replayed = JournalReplay{};
  ASSIGN_OR_RETURN(const std::vector<uint64_t> segments, ListSegments(dir));
  for (size_t i = 0; i < segments.size(); ++i) {
    RETURN_IF_ERROR(ReplaySegment(SegmentPath(dir, segments[i]), i + 1 == segments.size(), store,
                                  replayed));
    ++replayed->segments;
  }
  if (segments.empty()) return absl::OkStatus();
  // Oldest first: a crash meanwhile leaves a suffix, which replays the same.
  std::error_code error;
  for (uint64_t segment : segments) {
    fs::remove(SegmentPath(dir, segment), error);
    if (error) {
      return absl::UnavailableError(absl::StrCat(
          "cannot delete replayed journal ", SegmentPath(dir, segment), ": ", error.message()));
    }
  }
  LOG(INFO) << "journal " << dir << ": replayed " << replayed->writes << " row writes of "
            << replayed->segments << " segment(s) into the store";
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& dir, KvStore* store,
                                                 uint64_t first_seq, JournalReplay* replayed) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create journal dir ", dir, ": ", error.message()));
  }
  RETURN_IF_ERROR(Apply(dir, store, replayed));
  std::unique_ptr<Journal> journal(new Journal(dir));
  RETURN_IF_ERROR(journal->OpenSegment(first_seq));
  return journal;
}

bool Journal::HasSegments(const std::string& dir) {
  StatusOr<std::vector<uint64_t>> segments = ListSegments(dir);
  return !segments.ok() || !segments->empty();  // unreadable: assume there are
}

Status Journal::Discard(const std::string& dir) {
  ASSIGN_OR_RETURN(const std::vector<uint64_t> segments, ListSegments(dir));
  std::error_code error;
  for (uint64_t segment : segments) {
    fs::remove(SegmentPath(dir, segment), error);
    if (error) {
      return absl::UnavailableError(absl::StrCat("cannot delete journal ",
                                                 SegmentPath(dir, segment), ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

Journal::~Journal() {
  if (fd_ >= 0) ::close(fd_);
}

Status Journal::OpenSegment(uint64_t first_seq) {
  const std::string path = SegmentPath(dir_, first_seq);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create journal ", path, ": ", std::strerror(errno)));
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  absl::MutexLock lock(&mu_);
  segments_.push_back(first_seq);
  segment_bytes_.push_back(0);
  return absl::OkStatus();
}

Status Journal::Append(std::span<const KvWrite> writes) {
  if (writes.empty()) return absl::OkStatus();
  buffer_.assign(kHeaderBytes, '\0');
  for (const KvWrite& write : writes) {
    const absl::string_view value = write.erase ? absl::string_view() : write.value;
    Put<uint32_t>(buffer_, write.table);
    Put<uint32_t>(buffer_, write.erase ? 1 : 0);
    Put<uint64_t>(buffer_, write.key);
    Put<uint32_t>(buffer_, static_cast<uint32_t>(value.size()));
    buffer_.append(value.data(), value.size());
  }
  const uint64_t payload = buffer_.size() - kHeaderBytes;
  const uint64_t checksum = XXH3_64bits(buffer_.data() + kHeaderBytes, payload);
  const uint32_t count = static_cast<uint32_t>(writes.size());
  std::memcpy(buffer_.data(), &kMagic, 4);
  std::memcpy(buffer_.data() + 4, &count, 4);
  std::memcpy(buffer_.data() + 8, &payload, 8);
  std::memcpy(buffer_.data() + 16, &checksum, 8);
  uint64_t first_seq;
  {
    absl::MutexLock lock(&mu_);
    first_seq = segments_.back();
  }
  RETURN_IF_ERROR(WriteAll(fd_, buffer_, SegmentPath(dir_, first_seq)));
  absl::MutexLock lock(&mu_);
  segment_bytes_.back() += buffer_.size();
  return absl::OkStatus();
}

Status Journal::Rotate(uint64_t first_seq) {
  {
    absl::MutexLock lock(&mu_);
    if (segments_.back() == first_seq) return absl::OkStatus();  // nothing written since
  }
  return OpenSegment(first_seq);
}

StatusOr<int> Journal::DropBefore(uint64_t seq) {
  int dropped = 0;
  while (true) {
    uint64_t first;
    {
      absl::MutexLock lock(&mu_);
      // The oldest segment holds seqs below the next one's first.
      if (segments_.size() < 2 || segments_[1] > seq) return dropped;
      first = segments_.front();
    }
    std::error_code error;
    fs::remove(SegmentPath(dir_, first), error);
    if (error) {
      return absl::UnavailableError(absl::StrCat("cannot delete journal ",
                                                 SegmentPath(dir_, first), ": ", error.message()));
    }
    absl::MutexLock lock(&mu_);
    segments_.erase(segments_.begin());
    segment_bytes_.erase(segment_bytes_.begin());
    ++dropped;
  }
}

uint64_t Journal::bytes() const {
  absl::MutexLock lock(&mu_);
  return std::accumulate(segment_bytes_.begin(), segment_bytes_.end(), uint64_t{0});
}

}  // namespace eps
