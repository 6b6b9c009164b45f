// Tests master/progress/data_set.h: expanding data paths, cutting files into
// shards of whole lines, and the stored form of a data set.

#include "master/progress/data_set.h"

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/eps.pb.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Each test gets a fresh directory under the test temp dir, removed after.
class DataSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/data_set_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = std::filesystem::path(pattern).lexically_normal().string();
  }
  void TearDown() override {
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }

  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream out(path, std::ios::binary);
    out << contents;
    out.close();
    return path;
  }

  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  }

  // "line 1\nline 2\n..." with `n` lines of different lengths.
  static std::string Lines(int n, bool final_newline = true) {
    std::string text;
    for (int i = 1; i <= n; ++i) {
      absl::StrAppend(&text, "line ", i, std::string(i % 7, 'x'));
      if (i < n || final_newline) text += '\n';
    }
    return text;
  }

  std::string dir_;
};

// Checks the invariants every cut must hold: per file, shards tile the
// file, start on line boundaries with the right line numbers and hold the
// lines they claim.
void ExpectShardsTileFiles(const DataSet& data, uint64_t shard_lines) {
  uint64_t total = 0;
  for (uint32_t f = 0; f < data.files.size(); ++f) {
    std::ifstream in(data.files[f], std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string text = buffer.str();
    uint64_t expected_begin = 0;
    uint64_t expected_line = 1;
    std::string joined;
    for (const ShardSpec& shard : data.shards) {
      if (shard.file != f) continue;
      EXPECT_EQ(shard.begin, expected_begin) << data.files[f];
      EXPECT_EQ(shard.first_line, expected_line) << data.files[f];
      ASSERT_LE(shard.end, text.size());
      ASSERT_LT(shard.begin, shard.end);
      const std::string piece = text.substr(shard.begin, shard.end - shard.begin);
      joined += piece;
      uint64_t lines = 0;
      for (char c : piece) lines += c == '\n';
      if (piece.back() != '\n') ++lines;
      EXPECT_EQ(lines, shard.lines);
      EXPECT_LE(shard.lines, shard_lines);
      expected_begin = shard.end;
      expected_line += shard.lines;
      total += shard.lines;
    }
    EXPECT_EQ(joined, text) << "shards of " << data.files[f] << " do not cover it";
  }
  EXPECT_EQ(total, data.lines);
}

TEST_F(DataSetTest, CutsEveryNLinesWhenNDividesTheCount) {
  const std::string path = Write("a.txt", Lines(12));
  StatusOr<DataSet> data = CutIntoShards({path}, 4);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->shards.size(), 3u);
  EXPECT_EQ(data->lines, 12u);
  EXPECT_EQ(data->bytes, ReadAll(path).size());
  EXPECT_EQ(data->shards[0].first_line, 1u);
  EXPECT_EQ(data->shards[1].first_line, 5u);
  EXPECT_EQ(data->shards[2].first_line, 9u);
  for (const ShardSpec& shard : data->shards) EXPECT_EQ(shard.lines, 4u);
  ExpectShardsTileFiles(*data, 4);
}

TEST_F(DataSetTest, LastShardIsShorterWhenNDoesNotDivide) {
  const std::string path = Write("a.txt", Lines(10));
  StatusOr<DataSet> data = CutIntoShards({path}, 4);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->shards.size(), 3u);
  EXPECT_EQ(data->shards[2].lines, 2u);
  EXPECT_EQ(data->shards[2].first_line, 9u);
  EXPECT_EQ(data->shards[2].end, ReadAll(path).size());
  ExpectShardsTileFiles(*data, 4);
}

TEST_F(DataSetTest, LastLineWithoutNewlineIsARecord) {
  const std::string path = Write("a.txt", Lines(9, /*final_newline=*/false));
  StatusOr<DataSet> data = CutIntoShards({path}, 4);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->lines, 9u);
  ASSERT_EQ(data->shards.size(), 3u);
  EXPECT_EQ(data->shards[2].lines, 1u);
  EXPECT_EQ(data->shards[2].end, ReadAll(path).size());
  ExpectShardsTileFiles(*data, 4);

  // Exactly N lines, the last without '\n': one shard, no empty tail.
  const std::string four = Write("b.txt", Lines(4, /*final_newline=*/false));
  StatusOr<DataSet> whole = CutIntoShards({four}, 4);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->shards.size(), 1u);
  EXPECT_EQ(whole->shards[0].lines, 4u);
}

TEST_F(DataSetTest, EmptyFileGivesNoShards) {
  const std::string empty = Write("empty.txt", "");
  StatusOr<DataSet> data = CutIntoShards({empty}, 4);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->shards, IsEmpty());
  EXPECT_EQ(data->lines, 0u);
}

TEST_F(DataSetTest, ShardsNeverSpanFiles) {
  const std::string a = Write("a.txt", Lines(5));
  const std::string empty = Write("b.txt", "");
  const std::string c = Write("c.txt", Lines(3, /*final_newline=*/false));
  const std::string d = Write("d.txt", Lines(8));
  StatusOr<DataSet> data = CutIntoShards({a, empty, c, d}, 4);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->lines, 16u);
  std::vector<uint32_t> files;
  std::vector<uint64_t> lines;
  std::vector<uint64_t> first_lines;
  for (const ShardSpec& shard : data->shards) {
    files.push_back(shard.file);
    lines.push_back(shard.lines);
    first_lines.push_back(shard.first_line);
  }
  EXPECT_THAT(files, ElementsAre(0, 0, 2, 3, 3));
  EXPECT_THAT(lines, ElementsAre(4, 1, 3, 4, 4));
  EXPECT_THAT(first_lines, ElementsAre(1, 5, 1, 1, 5));
  ExpectShardsTileFiles(*data, 4);
}

TEST_F(DataSetTest, LinesLongerThanTheReadBuffer) {
  // Lines that straddle the scanner's 4 MiB read buffer.
  std::string text;
  for (int i = 0; i < 5; ++i) text += std::string(size_t{3} << 20, 'a' + i) + "\n";
  const std::string path = Write("big.txt", text);
  StatusOr<DataSet> data = CutIntoShards({path}, 2);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->shards.size(), 3u);
  EXPECT_EQ(data->shards[1].begin, 2 * ((size_t{3} << 20) + 1));
  ExpectShardsTileFiles(*data, 2);
}

TEST_F(DataSetTest, ReportsScanProgress) {
  const std::string path = Write("a.txt", Lines(10));
  uint64_t last_done = 0;
  uint64_t last_total = 0;
  StatusOr<DataSet> data = CutIntoShards({path}, 4, [&](uint64_t done, uint64_t total) {
    last_done = done;
    last_total = total;
    return true;
  });
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(last_total, data->bytes);
  EXPECT_EQ(last_done, data->bytes);
}

TEST_F(DataSetTest, ProgressCanStopTheScan) {
  const std::string a = Write("a.txt", Lines(10));
  const std::string b = Write("b.txt", Lines(10));
  int calls = 0;
  StatusOr<DataSet> data = CutIntoShards({a, b}, 4, [&](uint64_t, uint64_t) {
    ++calls;
    return false;
  });
  EXPECT_EQ(data.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(calls, 1);
}

TEST_F(DataSetTest, CheckShardRangeAcceptsWhatTheScanCut) {
  const std::string path = Write("a.txt", Lines(23, /*final_newline=*/false));
  StatusOr<DataSet> data = CutIntoShards({path}, 5);
  ASSERT_TRUE(data.ok()) << data.status();
  for (const ShardSpec& shard : data->shards) {
    EXPECT_TRUE(CheckShardRange(path, shard.begin, shard.end, shard.lines).ok()) << shard.begin;
  }
  // From a committed offset inside a shard: the lines after it.
  const ShardSpec& first = data->shards[0];
  const uint64_t second_line = Lines(1).size();
  EXPECT_TRUE(CheckShardRange(path, second_line, first.end, first.lines - 1).ok());
}

TEST_F(DataSetTest, CheckShardRangeSaysWhatIsWrongWithTheFile) {
  const std::string path = Write("a.txt", Lines(20));
  StatusOr<DataSet> data = CutIntoShards({path}, 5);
  ASSERT_TRUE(data.ok()) << data.status();
  const ShardSpec last = data->shards.back();

  // Changed: the same size, a line fewer.
  std::string text = Lines(20);
  text[last.begin + 3] = '\n';
  Write("a.txt", text);
  Status changed = CheckShardRange(path, last.begin, last.end, last.lines);
  EXPECT_EQ(changed.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(changed.message(), HasSubstr("changed"));
  EXPECT_THAT(changed.message(), HasSubstr("hold 6 lines, the scan saw 5"));

  std::filesystem::resize_file(path, last.begin + 4);
  Status truncated = CheckShardRange(path, last.begin, last.end, last.lines);
  EXPECT_EQ(truncated.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(truncated.message(), HasSubstr("truncated"));
  EXPECT_TRUE(CheckShardRange(path, data->shards[0].begin, data->shards[0].end, 5).ok())
      << "the shards before the cut are whole";

  std::filesystem::remove(path);
  Status gone = CheckShardRange(path, last.begin, last.end, last.lines);
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(gone.message(), "the file is gone");
}

TEST_F(DataSetTest, MissingFileIsNamed) {
  StatusOr<DataSet> data = CutIntoShards({dir_ + "/gone.txt"}, 4);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr("gone.txt"));
}

TEST_F(DataSetTest, ExpandsAFile) {
  const std::string a = Write("a.txt", "x\n");
  StatusOr<std::vector<std::string>> files = ExpandDataPaths(a, "data.train");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(a));
}

TEST_F(DataSetTest, ExpandsRelativePathsToAbsoluteOnes) {
  // Workers may run in another directory: they get absolute paths.
  Write("rel/x.txt", "1\n");
  const std::filesystem::path before = std::filesystem::current_path();
  std::filesystem::current_path(dir_);
  StatusOr<std::vector<std::string>> files = ExpandDataPaths("./rel/../rel/x.txt", "data.train");
  std::filesystem::current_path(before);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ::testing::ElementsAre(dir_ + "/rel/x.txt"));
}

TEST_F(DataSetTest, ExpandsADirectorySortedWithoutHiddenFiles) {
  Write("data/part-2", "x\n");
  Write("data/part-0", "x\n");
  Write("data/.hidden", "x\n");
  Write("data/part-1", "x\n");
  Write("data/sub/nested", "x\n");
  StatusOr<std::vector<std::string>> files = ExpandDataPaths(dir_ + "/data", "data.train");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files,
              ElementsAre(dir_ + "/data/part-0", dir_ + "/data/part-1", dir_ + "/data/part-2"));
}

TEST_F(DataSetTest, ExpandsAGlob) {
  Write("day-1.tsv", "x\n");
  Write("day-2.tsv", "x\n");
  Write("other.txt", "x\n");
  StatusOr<std::vector<std::string>> files = ExpandDataPaths(dir_ + "/day-*.tsv", "data.train");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(dir_ + "/day-1.tsv", dir_ + "/day-2.tsv"));
}

TEST_F(DataSetTest, ExpandsACommaListWithSpacesAndDropsDuplicates) {
  const std::string a = Write("a.txt", "x\n");
  const std::string b = Write("b.txt", "x\n");
  const std::string c = Write("dir/c.txt", "x\n");
  StatusOr<std::vector<std::string>> files = ExpandDataPaths(
      absl::StrCat(" ", b, " ,", a, ", ", dir_, "/*.txt ,, ", dir_, "/dir "), "data.train");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(a, b, c));
}

TEST_F(DataSetTest, MissingEntryIsNamedWithItsOption) {
  const std::string a = Write("a.txt", "x\n");
  const std::string missing = dir_ + "/nope.txt";
  StatusOr<std::vector<std::string>> files =
      ExpandDataPaths(absl::StrCat(a, ",", missing), "data.eval");
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(files.status().message(), HasSubstr("data.eval"));
  EXPECT_THAT(files.status().message(), HasSubstr(missing));

  StatusOr<std::vector<std::string>> glob = ExpandDataPaths(dir_ + "/*.csv", "data.train");
  EXPECT_EQ(glob.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(glob.status().message(), HasSubstr("data.train"));
  EXPECT_THAT(glob.status().message(), HasSubstr("*.csv"));
}

TEST_F(DataSetTest, EmptyDirectoryIsNotFound) {
  std::filesystem::create_directories(dir_ + "/empty");
  Write("empty/.only-hidden", "x\n");
  StatusOr<std::vector<std::string>> files = ExpandDataPaths(dir_ + "/empty", "data.train");
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(files.status().message(), HasSubstr("data.train"));
  EXPECT_THAT(files.status().message(), HasSubstr(dir_ + "/empty"));
}

TEST_F(DataSetTest, EmptySpecIsNotFound) {
  EXPECT_EQ(ExpandDataPaths(" , ", "data.train").status().code(), absl::StatusCode::kNotFound);
}

// Lines are stored in the records' `records` fields.
TEST_F(DataSetTest, StoredRecordHoldsTheCutAndReadsBackTheSame) {
  const std::string a = Write("a.txt", Lines(5));
  const std::string b = Write("b.txt", Lines(3, /*final_newline=*/false));
  StatusOr<DataSet> data = CutIntoShards({a, b}, 4);
  ASSERT_TRUE(data.ok()) << data.status();

  const proto::DataSetRecord record = DataSetToRecord(*data);
  EXPECT_THAT(record.files(), ElementsAre(a, b));
  EXPECT_EQ(record.records(), 8u);
  EXPECT_EQ(record.bytes(), data->bytes);
  ASSERT_EQ(record.shards_size(), 3);
  EXPECT_EQ(record.shards(1).file(), 0u);
  EXPECT_EQ(record.shards(1).begin(), data->shards[1].begin);
  EXPECT_EQ(record.shards(1).end(), data->shards[1].end);
  EXPECT_EQ(record.shards(1).first_line(), 5u);
  EXPECT_EQ(record.shards(1).records(), 1u);
  EXPECT_EQ(record.shards(2).file(), 1u);
  EXPECT_EQ(record.shards(2).records(), 3u);

  const DataSet back = DataSetFromRecord(record);
  EXPECT_EQ(back.files, data->files);
  EXPECT_EQ(back.lines, data->lines);
  EXPECT_EQ(back.bytes, data->bytes);
  ASSERT_EQ(back.shards.size(), data->shards.size());
  for (size_t i = 0; i < back.shards.size(); ++i) {
    EXPECT_EQ(back.shards[i].file, data->shards[i].file) << i;
    EXPECT_EQ(back.shards[i].begin, data->shards[i].begin) << i;
    EXPECT_EQ(back.shards[i].end, data->shards[i].end) << i;
    EXPECT_EQ(back.shards[i].first_line, data->shards[i].first_line) << i;
    EXPECT_EQ(back.shards[i].lines, data->shards[i].lines) << i;
  }
}

}  // namespace
}  // namespace eps
