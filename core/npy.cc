#include "core/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace eps {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
// The whole preamble (magic, version, header length, header): fixed, so
// that the final header fits where the first one was written; a multiple of
// 64 as numpy writes them.
constexpr size_t kPreambleBytes = 128;
// The longest header a reader accepts (numpy's own reader refuses those
// over 10,000 bytes unless told otherwise; eps writes 118).
constexpr uint64_t kMaxHeaderBytes = 65536;

StatusOr<size_t> DtypeBytes(const std::string& descr) {
  if (descr == "<f4") return 4;
  if (descr == "<u8") return 8;
  return absl::InvalidArgumentError(
      absl::StrCat("npy dtype '", descr, "' is not one eps writes (<f4, <u8)"));
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

Status IoError(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

uint64_t NpyArray::row_size() const {
  uint64_t size = 1;
  for (size_t i = 1; i < shape.size(); ++i) size *= shape[i];
  return size;
}

NpyWriter::NpyWriter(std::string path, std::string descr, std::vector<uint64_t> row_shape,
                     size_t row_bytes, std::FILE* file)
    : path_(std::move(path)),
      descr_(std::move(descr)),
      row_shape_(std::move(row_shape)),
      row_bytes_(row_bytes),
      file_(file) {}

StatusOr<std::unique_ptr<NpyWriter>> NpyWriter::Create(const std::string& path,
                                                        const std::string& descr,
                                                        std::vector<uint64_t> row_shape) {
  ASSIGN_OR_RETURN(size_t bytes, DtypeBytes(descr));
  for (uint64_t dim : row_shape) bytes *= dim;
  std::FILE* file = std::fopen((path + ".tmp").c_str(), "wb");
  if (file == nullptr) return IoError("cannot create", path + ".tmp");
  std::unique_ptr<NpyWriter> writer(
      new NpyWriter(path, descr, std::move(row_shape), bytes, file));
  RETURN_IF_ERROR(writer->WriteHeader());
  return writer;
}

NpyWriter::~NpyWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!closed_) std::remove((path_ + ".tmp").c_str());
}

Status NpyWriter::WriteHeader() {
  std::vector<uint64_t> shape = {rows_};
  shape.insert(shape.end(), row_shape_.begin(), row_shape_.end());
  std::string header = absl::StrCat("{'descr': '", descr_, "', 'fortran_order': False, 'shape': ",
                                    ShapeText(shape), ", }");
  const size_t header_bytes = kPreambleBytes - kMagicBytes - 4;
  header.resize(header_bytes - 1, ' ');
  header.push_back('\n');
  std::string preamble(kMagic, kMagicBytes);
  preamble += '\x01';
  preamble += '\x00';
  preamble += static_cast<char>(header_bytes & 0xff);
  preamble += static_cast<char>(header_bytes >> 8);
  preamble += header;
  if (std::fseek(file_, 0, SEEK_SET) != 0 ||
      std::fwrite(preamble.data(), 1, preamble.size(), file_) != preamble.size()) {
    return IoError("cannot write", path_ + ".tmp");
  }
  return std::fseek(file_, 0, SEEK_END) == 0 ? absl::OkStatus()
                                              : IoError("cannot write", path_ + ".tmp");
}

Status NpyWriter::Append(const void* data, uint64_t rows) {
  const size_t bytes = rows * row_bytes_;
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
    return IoError("cannot write", path_ + ".tmp");
  }
  rows_ += rows;
  return absl::OkStatus();
}

Status NpyWriter::Close() {
  RETURN_IF_ERROR(WriteHeader());
  const std::string tmp = path_ + ".tmp";
  if (std::fflush(file_) != 0 || ::fsync(fileno(file_)) != 0) return IoError("cannot write", tmp);
  const int closed = std::fclose(file_);
  file_ = nullptr;
  if (closed != 0) return IoError("cannot write", tmp);
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) return IoError("cannot rename", tmp);
  closed_ = true;
  // The rename itself survives a machine crash once the directory is synced.
  const std::string parent = std::filesystem::path(path_).parent_path().string();
  const int dir = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir < 0) return IoError("cannot open", parent);
  const int synced = ::fsync(dir);
  ::close(dir);
  return synced == 0 ? absl::OkStatus() : IoError("cannot sync", parent);
}

StatusOr<std::unique_ptr<NpyReader>> NpyReader::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO to read would wait for a writer; this way it
  // opens at once and fstat refuses it (for a regular file the flag changes
  // nothing).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat("no file ", path));
    }
    return IoError("cannot open", path);
  }
  const auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, " is not an array eps can read: ", why));
  };
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const Status error = IoError("cannot stat", path);
    ::close(fd);
    return error;
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return bad("not a regular file");
  }
  std::FILE* file = ::fdopen(fd, "rb");
  if (file == nullptr) {
    const Status error = IoError("cannot open", path);
    ::close(fd);
    return error;
  }
  std::unique_ptr<NpyReader> reader(new NpyReader(path, file));
  // Every size the header claims is checked against this before anything
  // of that size is allocated.
  const uint64_t file_bytes = static_cast<uint64_t>(info.st_size);
  char preamble[10];
  if (std::fread(preamble, 1, sizeof(preamble), file) != sizeof(preamble) ||
      std::memcmp(preamble, kMagic, kMagicBytes) != 0) {
    return bad("no .npy magic");
  }
  const int version = static_cast<unsigned char>(preamble[6]);
  if (version < 1 || version > 3) return bad(absl::StrCat("format version ", version));
  uint64_t header_bytes = static_cast<unsigned char>(preamble[8]) |
                          (static_cast<uint64_t>(static_cast<unsigned char>(preamble[9])) << 8);
  uint64_t header_offset = sizeof(preamble);
  if (version != 1) {
    // Versions 2 and 3 have a 4-byte header length.
    unsigned char more[2];
    if (std::fread(more, 1, 2, file) != 2) return bad("truncated header");
    header_bytes |= (static_cast<uint64_t>(more[0]) << 16) | (static_cast<uint64_t>(more[1]) << 24);
    header_offset += 2;
  }
  if (header_bytes > kMaxHeaderBytes || header_offset + header_bytes > file_bytes) {
    return bad(absl::StrCat("the header claims ", header_bytes, " bytes; the file has ",
                            file_bytes, " in all (a header is at most ", kMaxHeaderBytes, ")"));
  }
  std::string header(header_bytes, '\0');
  if (std::fread(header.data(), 1, header_bytes, file) != header_bytes) {
    return bad("truncated header");
  }
  const auto field = [&](absl::string_view key) -> std::string {
    const size_t at = header.find(absl::StrCat("'", key, "':"));
    if (at == std::string::npos) return "";
    size_t begin = at + key.size() + 3;
    while (begin < header.size() && header[begin] == ' ') ++begin;
    if (begin >= header.size()) return "";
    const char open = header[begin];
    const char close = open == '\'' ? '\'' : open == '(' ? ')' : ',';
    const size_t end = header.find(close, begin + 1);
    if (end == std::string::npos) return "";
    return header.substr(begin, end - begin + (close == ',' ? 0 : 1));
  };
  reader->descr_ = std::string(absl::StripSuffix(absl::StripPrefix(field("descr"), "'"), "'"));
  StatusOr<size_t> value_bytes = DtypeBytes(reader->descr_);
  if (!value_bytes.ok()) return bad(std::string(value_bytes.status().message()));
  reader->value_bytes_ = *value_bytes;
  if (field("fortran_order") != "False") return bad("not in C order");
  const std::string shape_field = field("shape");
  if (shape_field.empty()) return bad("no shape");
  std::string shape(absl::StripSuffix(absl::StripPrefix(shape_field, "("), ")"));
  for (absl::string_view piece : absl::StrSplit(shape, ',', absl::SkipWhitespace())) {
    uint64_t dim = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(piece), &dim)) return bad("bad shape");
    reader->shape_.push_back(dim);
  }
  // The data the shape claims, without overflow, against what the file
  // holds: a lying header fails here, not in an allocation.
  uint64_t row_bytes = reader->value_bytes_;
  for (size_t i = 1; i < reader->shape_.size(); ++i) {
    if (__builtin_mul_overflow(row_bytes, reader->shape_[i], &row_bytes)) {
      return bad(absl::StrCat("shape ", ShapeText(reader->shape_), " is larger than any file"));
    }
  }
  uint64_t data_bytes = 0;
  if (__builtin_mul_overflow(row_bytes, reader->rows(), &data_bytes)) {
    return bad(absl::StrCat("shape ", ShapeText(reader->shape_), " is larger than any file"));
  }
  const uint64_t data_offset = header_offset + header_bytes;
  if (data_bytes > file_bytes - data_offset) {
    return bad(absl::StrCat("truncated: shape ", ShapeText(reader->shape_), " needs ", data_bytes,
                            " bytes of data, the file holds ", file_bytes - data_offset));
  }
  return reader;
}

NpyReader::~NpyReader() {
  if (file_ != nullptr) std::fclose(file_);
}

uint64_t NpyReader::row_size() const {
  uint64_t size = 1;
  for (size_t i = 1; i < shape_.size(); ++i) size *= shape_[i];
  return size;
}

StatusOr<uint64_t> NpyReader::Read(uint64_t max_rows, std::vector<char>* out) {
  const uint64_t n = std::min(max_rows, rows() - rows_read_);
  out->resize(n * row_bytes());
  if (n > 0 && std::fread(out->data(), 1, out->size(), file_) != out->size()) {
    return absl::DataLossError(absl::StrCat(path_, " is not an array eps can read: truncated: shape ",
                                            ShapeText(shape_), " needs ", rows() * row_bytes(),
                                            " bytes of data"));
  }
  rows_read_ += n;
  return n;
}

StatusOr<NpyArray> ReadNpy(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<NpyReader> reader, NpyReader::Open(path));
  NpyArray array;
  array.descr = reader->descr();
  array.shape = reader->shape();
  RETURN_IF_ERROR(reader->Read(reader->rows(), &array.data).status());
  return array;
}

}  // namespace eps
