// NumPy .npy files (format 1.0): what a model export is made of
// (docs/model-format.md), so that numpy reads it with np.load alone.
//
// NpyWriter streams one array whose first dimension grows as rows are
// appended: the header is written with room for any row count and
// rewritten with the real one on Close, so an array larger than memory is
// written in pieces. The file appears under its name only once closed
// (written to `path`.tmp, fsynced, renamed): a reader never sees a partial
// array. ReadNpy reads a whole array back.
//
// Only little-endian C-order arrays of the dtypes eps writes: "<f4"
// (float32) and "<u8" (uint64).
//
// Thread-safety: an NpyWriter is used by one thread at a time; ReadNpy is
// safe for concurrent use.

#ifndef EPS_CORE_NPY_H_
#define EPS_CORE_NPY_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace eps {

class NpyWriter {
 public:
  // An array of rows of `row_shape` (empty: scalars, {d}: rows of d
  // values) of dtype `descr` ("<f4" or "<u8"), at `path`. kInvalidArgument
  // for another dtype; kUnavailable naming the file when it cannot be made.
  static StatusOr<std::unique_ptr<NpyWriter>> Create(const std::string& path,
                                                      const std::string& descr,
                                                      std::vector<uint64_t> row_shape);
  // Removes the unfinished file unless Close succeeded.
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  // Appends `rows` rows from `data` (rows * row_bytes() bytes).
  // kUnavailable naming the file on a write error.
  Status Append(const void* data, uint64_t rows);
  // Writes the final header, fsyncs and renames the file into place.
  // kUnavailable naming the file on an error. Call once.
  Status Close();

  uint64_t rows() const { return rows_; }
  size_t row_bytes() const { return row_bytes_; }

 private:
  NpyWriter(std::string path, std::string descr, std::vector<uint64_t> row_shape,
            size_t row_bytes, std::FILE* file);
  Status WriteHeader();

  const std::string path_;
  const std::string descr_;
  const std::vector<uint64_t> row_shape_;
  const size_t row_bytes_;
  std::FILE* file_;
  uint64_t rows_ = 0;
  bool closed_ = false;
};

struct NpyArray {
  std::string descr;             // "<f4" or "<u8"
  std::vector<uint64_t> shape;   // the full shape
  std::vector<char> data;        // C order, little-endian

  uint64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  // Values per row (the product of shape[1:]).
  uint64_t row_size() const;
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data.data());
  }
};

// Reads an array row by row (rows along its first dimension), so that an
// array larger than memory is read in pieces.
class NpyReader {
 public:
  // Opens `path` and reads its header, checking every size it claims
  // against the file's size before allocating anything of that size.
  // Never blocks on a FIFO. Errors as ReadNpy's; a file that shrinks while
  // being read is found by Read.
  static StatusOr<std::unique_ptr<NpyReader>> Open(const std::string& path);
  ~NpyReader();
  NpyReader(const NpyReader&) = delete;
  NpyReader& operator=(const NpyReader&) = delete;

  const std::string& descr() const { return descr_; }
  const std::vector<uint64_t>& shape() const { return shape_; }
  uint64_t rows() const { return shape_.empty() ? 1 : shape_[0]; }
  // Values per row (the product of shape[1:]) and bytes per row.
  uint64_t row_size() const;
  size_t row_bytes() const { return row_size() * value_bytes_; }
  // Reads the next min(max_rows, rows left) rows into `out` (resized to
  // at most the file's size: Open checked it holds them all); returns how
  // many (0 at the end). kDataLoss naming the file when it ends early.
  StatusOr<uint64_t> Read(uint64_t max_rows, std::vector<char>* out);

 private:
  NpyReader(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  const std::string path_;
  std::FILE* file_;
  std::string descr_;
  std::vector<uint64_t> shape_;
  size_t value_bytes_ = 0;
  uint64_t rows_read_ = 0;
};

// Reads the array at `path`. kNotFound naming a missing file; kDataLoss
// naming the file for one that is not a regular file (a directory, a FIFO:
// refused without blocking) or not a complete .npy array of a dtype above
// (truncated, a header claiming more than the file holds, a shape whose
// size overflows, Fortran order, big-endian, ...); kUnavailable on other
// read errors. Allocates no more than the file's size.
StatusOr<NpyArray> ReadNpy(const std::string& path);

}  // namespace eps

#endif  // EPS_CORE_NPY_H_
