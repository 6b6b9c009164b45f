// Tests core/npy.h.

#include "core/npy.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/raw_npy.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::eps::testing::WriteRawNpy;

#define NPY_CONCAT_(a, b) a##b
#define NPY_CONCAT(a, b) NPY_CONCAT_(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                          \
  auto NPY_CONCAT(result_, __LINE__) = (expr);                                   \
  ASSERT_TRUE(NPY_CONCAT(result_, __LINE__).ok()) << NPY_CONCAT(result_, __LINE__).status(); \
  lhs = std::move(*NPY_CONCAT(result_, __LINE__))


// A truthful header of `shape` (numpy's text, e.g. "(3, 4)") for "<f4".
std::string Header(const std::string& shape) {
  return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }\n";
}

// The peak resident set of this process so far, in bytes.
uint64_t PeakRss() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;
}

TEST(Npy, StreamedRowsReadBackWithTheirShape) {
  testing::TempDir dir;
  const std::string path = dir.Join("rows.npy");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<NpyWriter> writer, NpyWriter::Create(path, "<f4", {3}));
  const std::vector<float> first = {1, 2, 3, 4, 5, 6};
  const std::vector<float> second = {7, 8, 9};
  ASSERT_TRUE(writer->Append(first.data(), 2).ok());
  // Nothing under the name until closed.
  EXPECT_FALSE(std::filesystem::exists(path));
  ASSERT_TRUE(writer->Append(second.data(), 1).ok());
  ASSERT_TRUE(writer->Close().ok());
  ASSERT_OK_AND_ASSIGN(NpyArray array, ReadNpy(path));
  EXPECT_EQ(array.descr, "<f4");
  EXPECT_THAT(array.shape, ElementsAre(3, 3));
  EXPECT_EQ(array.row_size(), 3u);
  EXPECT_EQ(std::vector<float>(array.as<float>(), array.as<float>() + 9),
            (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // numpy's own layout: the data starts at a multiple of 64.
  EXPECT_EQ(std::filesystem::file_size(path), 128u + 9 * sizeof(float));
}

TEST(Npy, OneDimensionalAndEmptyArrays) {
  testing::TempDir dir;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<NpyWriter> ids,
                       NpyWriter::Create(dir.Join("ids.npy"), "<u8", {}));
  const std::vector<uint64_t> values = {uint64_t{1} << 63, 7};
  ASSERT_TRUE(ids->Append(values.data(), 2).ok());
  ASSERT_TRUE(ids->Close().ok());
  ASSERT_OK_AND_ASSIGN(NpyArray array, ReadNpy(dir.Join("ids.npy")));
  EXPECT_THAT(array.shape, ElementsAre(2));
  EXPECT_EQ(array.as<uint64_t>()[0], uint64_t{1} << 63);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<NpyWriter> empty,
                       NpyWriter::Create(dir.Join("empty.npy"), "<f4", {16}));
  ASSERT_TRUE(empty->Close().ok());
  ASSERT_OK_AND_ASSIGN(NpyArray none, ReadNpy(dir.Join("empty.npy")));
  EXPECT_THAT(none.shape, ElementsAre(0, 16));
  EXPECT_TRUE(none.data.empty());
}

TEST(Npy, AReaderReadsRowsInPieces) {
  testing::TempDir dir;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<NpyWriter> writer,
                       NpyWriter::Create(dir.Join("rows.npy"), "<f4", {2}));
  std::vector<float> values(14);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  ASSERT_TRUE(writer->Append(values.data(), 7).ok());
  ASSERT_TRUE(writer->Close().ok());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<NpyReader> reader, NpyReader::Open(dir.Join("rows.npy")));
  EXPECT_EQ(reader->rows(), 7u);
  EXPECT_EQ(reader->row_bytes(), 8u);
  std::vector<float> read;
  std::vector<char> piece;
  for (uint64_t expected : {3u, 3u, 1u, 0u}) {
    ASSERT_OK_AND_ASSIGN(uint64_t n, reader->Read(3, &piece));
    EXPECT_EQ(n, expected);
    const float* floats = reinterpret_cast<const float*>(piece.data());
    read.insert(read.end(), floats, floats + 2 * n);
  }
  EXPECT_EQ(read, values);
}

TEST(Npy, AWriterNotClosedLeavesNoFile) {
  testing::TempDir dir;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<NpyWriter> writer,
                         NpyWriter::Create(dir.Join("a.npy"), "<f4", {}));
    const float value = 1;
    ASSERT_TRUE(writer->Append(&value, 1).ok());
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(Npy, RefusesWhatItCannotRead) {
  testing::TempDir dir;
  EXPECT_TRUE(absl::IsInvalidArgument(NpyWriter::Create(dir.Join("a.npy"), "<f8", {}).status()));
  EXPECT_TRUE(absl::IsNotFound(ReadNpy(dir.Join("missing.npy")).status()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<NpyWriter> writer,
                       NpyWriter::Create(dir.Join("rows.npy"), "<f4", {4}));
  const std::vector<float> rows(8, 1.0f);
  ASSERT_TRUE(writer->Append(rows.data(), 2).ok());
  ASSERT_TRUE(writer->Close().ok());
  std::filesystem::resize_file(dir.Join("rows.npy"), 128 + 20);
  const Status truncated = ReadNpy(dir.Join("rows.npy")).status();
  EXPECT_TRUE(absl::IsDataLoss(truncated));
  EXPECT_THAT(truncated.message(), HasSubstr("truncated"));
  std::ofstream(dir.Join("text.npy")) << "hello";
  EXPECT_TRUE(absl::IsDataLoss(ReadNpy(dir.Join("text.npy")).status()));
}

// Issue 49: a 200-byte file whose v2 header claims 0xFFFFFFF0 bytes once
// took 4 GiB before failing.
TEST(Npy, AHeaderLongerThanTheFileFailsWithoutAllocatingIt) {
  testing::TempDir dir;
  const std::string path = dir.Join("liar.npy");
  WriteRawNpy(path, /*version=*/2, /*claimed_header=*/0xFFFFFFF0u, Header("(3,)"),
              /*data_bytes=*/200 - 12 - Header("(3,)").size());
  ASSERT_EQ(std::filesystem::file_size(path), 200u);
  const uint64_t peak_before = PeakRss();
  const Status status = ReadNpy(path).status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(path));
  EXPECT_THAT(status.message(), HasSubstr("claims 4294967280 bytes"));
  EXPECT_LT(PeakRss() - peak_before, uint64_t{256} << 20);
  // The same through the row reader, and a v1 header that runs past the end.
  EXPECT_TRUE(absl::IsDataLoss(NpyReader::Open(path).status()));
  WriteRawNpy(path, /*version=*/1, /*claimed_header=*/60000, Header("(3,)"), /*data_bytes=*/12);
  EXPECT_THAT(ReadNpy(path).status().message(), HasSubstr("claims 60000 bytes"));
}

// Issue 49: a row shape of (n, 4194304) once asked for 64 GiB at once and
// died of std::bad_alloc.
TEST(Npy, AShapeTheFileDoesNotHoldFailsBeforeAllocating) {
  testing::TempDir dir;
  const std::string path = dir.Join("huge.npy");
  const std::string header = Header("(1024, 4194304)");
  WriteRawNpy(path, /*version=*/1, static_cast<uint32_t>(header.size()), header,
              /*data_bytes=*/64);
  const uint64_t peak_before = PeakRss();
  const Status opened = NpyReader::Open(path).status();
  EXPECT_TRUE(absl::IsDataLoss(opened)) << opened;
  EXPECT_THAT(opened.message(), HasSubstr(path));
  EXPECT_THAT(opened.message(), HasSubstr("(1024, 4194304) needs 17179869184 bytes"));
  const Status read = ReadNpy(path).status();
  EXPECT_TRUE(absl::IsDataLoss(read)) << read;
  EXPECT_THAT(read.message(), HasSubstr(path));
  EXPECT_LT(PeakRss() - peak_before, uint64_t{256} << 20);

  // A shape whose size overflows 64 bits, even with no rows.
  for (const std::string shape : {"(4294967296, 4294967296, 4294967296)",
                                  "(0, 4294967296, 4294967296)", "(18446744073709551615,)"}) {
    const std::string big = Header(shape);
    WriteRawNpy(path, /*version=*/1, static_cast<uint32_t>(big.size()), big, /*data_bytes=*/64);
    const Status overflow = ReadNpy(path).status();
    EXPECT_TRUE(absl::IsDataLoss(overflow)) << shape << ": " << overflow;
    EXPECT_THAT(overflow.message(), HasSubstr(path)) << shape;
  }
}

TEST(Npy, RefusesWhatIsNotARegularFileWithoutBlocking) {
  testing::TempDir dir;
  std::filesystem::create_directory(dir.Join("dir.npy"));
  const Status directory = ReadNpy(dir.Join("dir.npy")).status();
  EXPECT_TRUE(absl::IsDataLoss(directory)) << directory;
  EXPECT_THAT(directory.message(), HasSubstr(dir.Join("dir.npy")));
  EXPECT_THAT(directory.message(), HasSubstr("not a regular file"));
  // A FIFO with no writer: opening it to read would wait for one forever.
  ASSERT_EQ(::mkfifo(dir.Join("fifo.npy").c_str(), 0600), 0);
  const Status fifo = NpyReader::Open(dir.Join("fifo.npy")).status();
  EXPECT_TRUE(absl::IsDataLoss(fifo)) << fifo;
  EXPECT_THAT(fifo.message(), HasSubstr(dir.Join("fifo.npy")));
}

}  // namespace
}  // namespace eps
