#include "worker/line_reader.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

struct Line {
  std::string text;
  uint64_t number;
  uint64_t offset;  // offset() after the line

  bool operator==(const Line&) const = default;
};

void PrintTo(const Line& line, std::ostream* os) {
  *os << "{'" << line.text << "', line " << line.number << ", offset " << line.offset << "}";
}

// Each test gets a fresh directory under the test temp dir, removed after.
class LineReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/line_reader_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }

  std::string WriteFile(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out << contents;
    out.close();
    EXPECT_TRUE(out) << path;
    return path;
  }

  // Reads every line of [start, end); the reader is left for status checks.
  std::vector<Line> ReadAll(const std::string& path, uint64_t start, uint64_t end,
                            uint64_t start_line = 1) {
    StatusOr<std::unique_ptr<LineReader>> reader = LineReader::Open(path, start, end, start_line);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return {};
    reader_ = *std::move(reader);
    std::vector<Line> lines;
    absl::string_view line;
    while (reader_->Next(&line)) {
      lines.push_back({std::string(line), reader_->line_number(), reader_->offset()});
    }
    return lines;
  }

  std::string dir_;
  std::unique_ptr<LineReader> reader_;
};

TEST_F(LineReaderTest, ReadsWholeFile) {
  const std::string path = WriteFile("a.txt", "alpha\nbeta\ngamma\n");
  EXPECT_EQ(ReadAll(path, 0, 17),
            (std::vector<Line>{{"alpha", 1, 6}, {"beta", 2, 11}, {"gamma", 3, 17}}));
  EXPECT_TRUE(reader_->status().ok()) << reader_->status();
  EXPECT_EQ(reader_->path(), path);
  // The end stays the end.
  absl::string_view line;
  EXPECT_FALSE(reader_->Next(&line));
  EXPECT_TRUE(reader_->status().ok());
}

TEST_F(LineReaderTest, ReadsMiddleRangeWithLineNumbers) {
  // Offsets:          0    2     5      9       14
  const std::string path = WriteFile("a.txt", "a\nbb\nccc\ndddd\neeeee\n");
  // Lines 2..4: [2, 14).
  EXPECT_EQ(ReadAll(path, 2, 14, /*start_line=*/2),
            (std::vector<Line>{{"bb", 2, 5}, {"ccc", 3, 9}, {"dddd", 4, 14}}));
  EXPECT_TRUE(reader_->status().ok()) << reader_->status();
  // The last line alone.
  EXPECT_EQ(ReadAll(path, 14, 20, /*start_line=*/5), (std::vector<Line>{{"eeeee", 5, 20}}));
}

TEST_F(LineReaderTest, EmptyRangeHasNoLines) {
  const std::string path = WriteFile("a.txt", "a\nbb\n");
  EXPECT_TRUE(ReadAll(path, 2, 2, /*start_line=*/2).empty());
  EXPECT_TRUE(reader_->status().ok()) << reader_->status();
  EXPECT_EQ(reader_->offset(), 2u);

  const std::string empty = WriteFile("empty.txt", "");
  EXPECT_TRUE(ReadAll(empty, 0, 0).empty());
  EXPECT_TRUE(reader_->status().ok()) << reader_->status();
}

TEST_F(LineReaderTest, ReadsLastLineWithoutNewline) {
  const std::string path = WriteFile("a.txt", "one\ntwo");
  EXPECT_EQ(ReadAll(path, 0, 7), (std::vector<Line>{{"one", 1, 4}, {"two", 2, 7}}));
  EXPECT_TRUE(reader_->status().ok()) << reader_->status();
}

TEST_F(LineReaderTest, StripsCrLf) {
  const std::string path = WriteFile("a.txt", "one\r\ntwo\r\n\r\nthree\r");
  EXPECT_EQ(ReadAll(path, 0, 18),
            (std::vector<Line>{{"one", 1, 5}, {"two", 2, 10}, {"", 3, 12}, {"three", 4, 18}}));
}

TEST_F(LineReaderTest, KeepsCarriageReturnInsideLine) {
  const std::string path = WriteFile("a.txt", "a\rb\n");
  EXPECT_EQ(ReadAll(path, 0, 4), (std::vector<Line>{{"a\rb", 1, 4}}));
}

TEST_F(LineReaderTest, ReturnsEmptyLines) {
  const std::string path = WriteFile("a.txt", "\na\n\n\nb\n");
  EXPECT_EQ(ReadAll(path, 0, 7), (std::vector<Line>{{"", 1, 1},
                                                    {"a", 2, 3},
                                                    {"", 3, 4},
                                                    {"", 4, 5},
                                                    {"b", 5, 7}}));
}

TEST_F(LineReaderTest, ReadsLinesLongerThanTheBuffer) {
  // The reader starts with a 1 MiB buffer; a 3 MiB line must grow it.
  std::string long_line(3 << 20, 'x');
  for (size_t i = 0; i < long_line.size(); i += 4099) long_line[i] = static_cast<char>('a' + i % 26);
  const std::string other(1000, 'y');
  const std::string contents = "first\n" + long_line + "\n" + other + "\n" + long_line;
  const std::string path = WriteFile("long.txt", contents);
  const std::vector<Line> lines = ReadAll(path, 0, contents.size());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].text, "first");
  EXPECT_TRUE(lines[1].text == long_line) << "size " << lines[1].text.size();
  EXPECT_EQ(lines[1].offset, 6 + long_line.size() + 1);
  EXPECT_EQ(lines[2].text, other);
  EXPECT_EQ(lines[2].number, 3u);
  EXPECT_TRUE(lines[3].text == long_line) << "size " << lines[3].text.size();
  EXPECT_EQ(lines[3].offset, contents.size());
  EXPECT_TRUE(reader_->status().ok()) << reader_->status();
}

TEST_F(LineReaderTest, ManyLinesAcrossBufferBoundaries) {
  // ~2.4 MB of short lines: some straddle each 1 MiB read.
  std::string contents;
  std::vector<std::string> expected;
  for (int i = 0; i < 200000; ++i) {
    expected.push_back("line-" + std::to_string(i));
    contents += expected.back() + "\n";
  }
  const std::string path = WriteFile("many.txt", contents);
  const std::vector<Line> lines = ReadAll(path, 0, contents.size());
  ASSERT_EQ(lines.size(), expected.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    offset += expected[i].size() + 1;
    ASSERT_EQ(lines[i], (Line{expected[i], i + 1, offset})) << "line " << i + 1;
  }
}

TEST_F(LineReaderTest, RejectsRangeBeyondFile) {
  const std::string path = WriteFile("a.txt", "abc\n");
  StatusOr<std::unique_ptr<LineReader>> reader = LineReader::Open(path, 0, 5, 1);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr(path));
  // start > end.
  reader = LineReader::Open(path, 3, 2, 1);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LineReaderTest, MissingFileIsNotFound) {
  const std::string path = dir_ + "/no-such-file.txt";
  StatusOr<std::unique_ptr<LineReader>> reader = LineReader::Open(path, 0, 0, 1);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr(path));
}

TEST_F(LineReaderTest, FileTruncatedAfterOpenIsDataLoss) {
  const std::string path = WriteFile("a.txt", "0123456789\nabcdefghij\nABCDEFGHIJ\n");
  StatusOr<std::unique_ptr<LineReader>> reader = LineReader::Open(path, 0, 33, 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  // Cut mid-way through line 2.
  ASSERT_EQ(::truncate(path.c_str(), 15), 0);
  absl::string_view line;
  ASSERT_TRUE((*reader)->Next(&line));
  EXPECT_EQ(line, "0123456789");
  // The partial line 2 is not returned as if it were whole.
  EXPECT_FALSE((*reader)->Next(&line));
  EXPECT_EQ((*reader)->status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string((*reader)->status().message()), HasSubstr(path));
  EXPECT_FALSE((*reader)->Next(&line));
}

// Truncate after the first read: the buffer already holds the whole file,
// yet nothing at or past the new end comes back.
TEST_F(LineReaderTest, TruncateStopsAtTheNewEndWithTheBufferAhead) {
  // Offsets:          0    4    8    12   16   20
  const std::string path = WriteFile("a.txt", "aaa\nbbb\nccc\nddd\neee\n");
  StatusOr<std::unique_ptr<LineReader>> reader = LineReader::Open(path, 0, 20, 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::string_view line;
  ASSERT_TRUE((*reader)->Next(&line));
  EXPECT_EQ(line, "aaa");
  (*reader)->Truncate(12);
  EXPECT_EQ((*reader)->end(), 12u);
  std::vector<Line> rest;
  while ((*reader)->Next(&line)) {
    rest.push_back({std::string(line), (*reader)->line_number(), (*reader)->offset()});
  }
  EXPECT_EQ(rest, (std::vector<Line>{{"bbb", 2, 8}, {"ccc", 3, 12}}));
  EXPECT_TRUE((*reader)->status().ok()) << (*reader)->status();
  EXPECT_EQ((*reader)->offset(), 12u);
  EXPECT_FALSE((*reader)->Next(&line));
}

// Truncate before anything was read, across a refill of the buffer.
TEST_F(LineReaderTest, TruncateBeforeReadingAndAcrossRefills) {
  std::string contents;
  for (int i = 0; i < 300000; ++i) contents += "line-" + std::to_string(i) + "\n";
  const std::string path = WriteFile("many.txt", contents);
  // The start of line 250001, well past the first 1 MiB read.
  const uint64_t cut = contents.find("line-250000\n");
  ASSERT_NE(cut, std::string::npos);
  StatusOr<std::unique_ptr<LineReader>> reader = LineReader::Open(path, 0, contents.size(), 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  (*reader)->Truncate(cut);
  absl::string_view line;
  uint64_t lines = 0;
  std::string last;
  while ((*reader)->Next(&line)) {
    ++lines;
    last = std::string(line);
  }
  EXPECT_TRUE((*reader)->status().ok()) << (*reader)->status();
  EXPECT_EQ(lines, 250000u);
  EXPECT_EQ(last, "line-249999");
  EXPECT_EQ((*reader)->offset(), cut);
}

TEST_F(LineReaderTest, TruncateToTheCurrentOffsetEndsAtOnce) {
  const std::string path = WriteFile("a.txt", "aaa\nbbb\nccc\n");
  StatusOr<std::unique_ptr<LineReader>> reader = LineReader::Open(path, 0, 12, 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::string_view line;
  ASSERT_TRUE((*reader)->Next(&line));
  (*reader)->Truncate((*reader)->offset());
  EXPECT_EQ((*reader)->end(), 4u);
  EXPECT_FALSE((*reader)->Next(&line));
  EXPECT_TRUE((*reader)->status().ok()) << (*reader)->status();
  EXPECT_EQ((*reader)->offset(), 4u);
  EXPECT_EQ((*reader)->line_number(), 1u);
  // Truncating to the same end again is allowed and changes nothing.
  (*reader)->Truncate(4);
  EXPECT_FALSE((*reader)->Next(&line));
}

TEST_F(LineReaderTest, FindMiddleLineFindsTheFirstLineStartAtOrAfterTheMiddle) {
  // Offsets:          0    4    8    12   16
  const std::string path = WriteFile("a.txt", "aaa\nbbb\nccc\nddd\n");
  // [0, 16): the middle, 8, is a line start itself.
  StatusOr<std::optional<LinePosition>> found = FindMiddleLine(path, 0, 1, 16);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->offset, 8u);
  EXPECT_EQ((*found)->line, 3u);
  // [4, 16) from line 2: the middle, 10, is inside line 3; line 4 follows.
  found = FindMiddleLine(path, 4, 2, 16);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->offset, 12u);
  EXPECT_EQ((*found)->line, 4u);
  // Two lines: the second.
  found = FindMiddleLine(path, 8, 3, 16);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->offset, 12u);
  EXPECT_EQ((*found)->line, 4u);
  // A long first line: the middle is inside it, the short line after it
  // starts before the end.
  const std::string skewed = WriteFile("skewed.txt", "xxxxxxxxxx\ny\n");
  found = FindMiddleLine(skewed, 0, 1, 13);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->offset, 11u);
  EXPECT_EQ((*found)->line, 2u);
}

TEST_F(LineReaderTest, FindMiddleLineIsNulloptWhenNoLineStartsInTheSecondHalf) {
  const std::string path = WriteFile("a.txt", "aaa\nbbb\nccc\nddd\n");
  // One line.
  StatusOr<std::optional<LinePosition>> found = FindMiddleLine(path, 12, 4, 16);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->has_value());
  // An empty range.
  found = FindMiddleLine(path, 4, 2, 4);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->has_value());
  // A short line, then a long one covering the middle and the end.
  const std::string skewed = WriteFile("skewed.txt", "a\nbbbbbbbbbb\n");
  found = FindMiddleLine(skewed, 0, 1, 13);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->has_value());
}

TEST_F(LineReaderTest, FindMiddleLineHandlesALastLineWithoutNewline) {
  // Offsets:              0         9
  const std::string path = WriteFile("a.txt", "aaaaaaaa\nbb");
  StatusOr<std::optional<LinePosition>> found = FindMiddleLine(path, 0, 1, 11);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->offset, 9u);
  EXPECT_EQ((*found)->line, 2u);
  // The unterminated line covers the middle and reaches the end.
  const std::string tail = WriteFile("tail.txt", "aaa\nbbbbbbbb");
  found = FindMiddleLine(tail, 0, 1, 12);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->has_value());
  // Starting on the unterminated line itself.
  found = FindMiddleLine(tail, 4, 2, 12);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->has_value());
}

TEST_F(LineReaderTest, FindMiddleLineReportsOpenErrors) {
  const std::string missing = dir_ + "/no-such-file.txt";
  StatusOr<std::optional<LinePosition>> found = FindMiddleLine(missing, 0, 1, 10);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(found.status().message()), HasSubstr(missing));
  const std::string path = WriteFile("a.txt", "aaa\n");
  found = FindMiddleLine(path, 0, 1, 10);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eps
