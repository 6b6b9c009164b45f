// Tests core/npy.h.

#include "core/npy.h"

#include <filesystem>
#include <fstream>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

#define NPY_CONCAT_(a, b) a##b
#define NPY_CONCAT(a, b) NPY_CONCAT_(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                          \
  auto NPY_CONCAT(result_, __LINE__) = (expr);                                   \
  ASSERT_TRUE(NPY_CONCAT(result_, __LINE__).ok()) << NPY_CONCAT(result_, __LINE__).status(); \
  lhs = std::move(*NPY_CONCAT(result_, __LINE__))

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

}  // namespace
}  // namespace eps
