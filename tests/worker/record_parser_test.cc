#include "worker/record_parser.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "core/hashing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A Criteo line: label, 13 dense, 26 categorical, tab-separated.
std::string CriteoLine(const std::string& label, const std::vector<std::string>& dense,
                       const std::vector<std::string>& cats) {
  std::vector<std::string> columns = {label};
  columns.insert(columns.end(), dense.begin(), dense.end());
  columns.insert(columns.end(), cats.begin(), cats.end());
  return absl::StrJoin(columns, "\t");
}

std::vector<std::string> SomeDense() {
  return {"0", "1", "5", "-3", "", "2.5", "1000000", "7", "0", "", "12", "3", "1e3"};
}

std::vector<std::string> SomeCats() {
  std::vector<std::string> cats;
  for (int f = 0; f < 26; ++f) cats.push_back(f % 5 == 4 ? "" : "v" + std::to_string(f));
  return cats;
}

// Runs a Criteo parser on `line`; the outputs land in the struct.
struct Parsed {
  Status status;
  float label = -1;
  std::vector<float> dense = std::vector<float>(13, -1.0f);
  std::vector<uint64_t> ids = std::vector<uint64_t>(26, 0);
};

Parsed ParseCriteo(const std::string& line) {
  Parsed out;
  RecordParser parser(Schema::Criteo());
  out.status = parser.Parse(line, &out.label, out.dense, out.ids);
  return out;
}

std::string Message(const Status& status) { return std::string(status.message()); }

TEST(RecordParser, ParsesCriteoLine) {
  const std::vector<std::string> dense = SomeDense();
  const std::vector<std::string> cats = SomeCats();
  const Parsed parsed = ParseCriteo(CriteoLine("1", dense, cats));
  ASSERT_TRUE(parsed.status.ok()) << parsed.status;
  EXPECT_EQ(parsed.label, 1.0f);

  const double raw[13] = {0, 1, 5, -3, 0, 2.5, 1000000, 7, 0, 0, 12, 3, 1000};
  for (int d = 0; d < 13; ++d) {
    const float expected = raw[d] > 0 ? static_cast<float>(std::log1p(raw[d])) : 0.0f;
    EXPECT_FLOAT_EQ(parsed.dense[d], expected) << "dense " << d << " '" << dense[d] << "'";
  }
  for (int f = 0; f < 26; ++f) {
    EXPECT_EQ(parsed.ids[f], FeatureId(static_cast<uint32_t>(f), cats[f])) << "field " << f;
  }
  // Missing categorical values get their field's own "missing" id.
  EXPECT_EQ(parsed.ids[4], FeatureId(4, ""));
  EXPECT_NE(parsed.ids[4], parsed.ids[9]);
}

TEST(RecordParser, ParsesLabelZeroAndFractionalLabels) {
  EXPECT_EQ(ParseCriteo(CriteoLine("0", SomeDense(), SomeCats())).label, 0.0f);
  const Parsed half = ParseCriteo(CriteoLine("0.25", SomeDense(), SomeCats()));
  ASSERT_TRUE(half.status.ok()) << half.status;
  EXPECT_EQ(half.label, 0.25f);
}

TEST(RecordParser, SameValueInTwoFieldsHasDifferentIds) {
  std::vector<std::string> cats(26, "68fd1e64");
  const Parsed parsed = ParseCriteo(CriteoLine("0", SomeDense(), cats));
  ASSERT_TRUE(parsed.status.ok()) << parsed.status;
  for (int f = 1; f < 26; ++f) EXPECT_NE(parsed.ids[0], parsed.ids[f]) << "field " << f;
  EXPECT_EQ(parsed.ids[7], FeatureId(7, "68fd1e64"));
}

TEST(RecordParser, AllFieldsMissingIsValid) {
  const Parsed parsed = ParseCriteo("1" + std::string(39, '\t'));
  ASSERT_TRUE(parsed.status.ok()) << parsed.status;
  EXPECT_EQ(parsed.label, 1.0f);
  for (int d = 0; d < 13; ++d) EXPECT_EQ(parsed.dense[d], 0.0f) << "dense " << d;
  for (int f = 0; f < 26; ++f) {
    EXPECT_EQ(parsed.ids[f], FeatureId(static_cast<uint32_t>(f), "")) << "field " << f;
  }
}

TEST(RecordParser, RejectsTooFewColumns) {
  const Parsed parsed = ParseCriteo("1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12");
  EXPECT_EQ(parsed.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(parsed.status), AllOf(HasSubstr("expected 40"), HasSubstr("found 12")));
}

TEST(RecordParser, RejectsTooManyColumns) {
  const Parsed parsed = ParseCriteo(CriteoLine("1", SomeDense(), SomeCats()) + "\textra");
  EXPECT_EQ(parsed.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(parsed.status), AllOf(HasSubstr("expected 40"), HasSubstr("found 41")));
}

TEST(RecordParser, ColumnCountIsCheckedBeforeValues) {
  // A comma-separated file: one column, which is not a label either. The
  // count is the more helpful message.
  const Parsed parsed = ParseCriteo("1,2,3,a,b,c");
  EXPECT_EQ(parsed.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(parsed.status), AllOf(HasSubstr("expected 40"), HasSubstr("found 1")));
}

TEST(RecordParser, EmptyLineIsInvalid) {
  const Parsed parsed = ParseCriteo("");
  EXPECT_EQ(parsed.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(parsed.status), HasSubstr("found 1"));
}

TEST(RecordParser, RejectsNonNumericDense) {
  std::vector<std::string> dense = SomeDense();
  dense[1] = "x1";  // column 3
  const Parsed parsed = ParseCriteo(CriteoLine("1", dense, SomeCats()));
  EXPECT_EQ(parsed.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(parsed.status), AllOf(HasSubstr("column 3"), HasSubstr("'x1'")));
}

TEST(RecordParser, RejectsDenseWithTrailingGarbageOrNonFinite) {
  for (const char* bad : {"5x", " 5", "5 ", "nan", "inf", "1e999", "0x10", "--1"}) {
    std::vector<std::string> dense = SomeDense();
    dense[12] = bad;  // column 14
    const Parsed parsed = ParseCriteo(CriteoLine("0", dense, SomeCats()));
    EXPECT_EQ(parsed.status.code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_THAT(Message(parsed.status), HasSubstr("column 14")) << "'" << bad << "'";
  }
}

TEST(RecordParser, LongBadFieldIsShortenedInMessage) {
  std::vector<std::string> dense = SomeDense();
  dense[0] = std::string(1000, 'z');
  const Parsed parsed = ParseCriteo(CriteoLine("0", dense, SomeCats()));
  EXPECT_EQ(parsed.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(parsed.status), HasSubstr("..."));
  EXPECT_LT(parsed.status.message().size(), 200u);
}

TEST(RecordParser, RejectsBadLabels) {
  for (const char* bad : {"2", "-1", "1.5", "abc", "", "nan", "1\r"}) {
    const Parsed parsed = ParseCriteo(CriteoLine(bad, SomeDense(), SomeCats()));
    EXPECT_EQ(parsed.status.code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_THAT(Message(parsed.status), AllOf(HasSubstr("column 1"), HasSubstr("label")))
        << "'" << bad << "'";
  }
}

// The parser takes a line without its terminator: stripping "\r\n" is
// LineReader's job. A '\r' that reaches the parser is data, so in the last
// categorical column it is part of the value.
TEST(RecordParser, CarriageReturnIsPartOfLastValue) {
  std::vector<std::string> cats = SomeCats();
  cats[25] = "abc\r";
  const Parsed parsed = ParseCriteo(CriteoLine("1", SomeDense(), cats));
  ASSERT_TRUE(parsed.status.ok()) << parsed.status;
  EXPECT_EQ(parsed.ids[25], FeatureId(25, "abc\r"));
  EXPECT_NE(parsed.ids[25], FeatureId(25, "abc"));
}

TEST(RecordParser, CustomSchemaSkipsColumns) {
  StatusOr<Schema> schema = Schema::Parse("skip, dense*2, label, skip, cat*2");
  ASSERT_TRUE(schema.ok()) << schema.status();
  RecordParser parser(*std::move(schema));
  float label = -1;
  std::vector<float> dense(2, -1.0f);
  std::vector<uint64_t> ids(2, 0);
  ASSERT_TRUE(parser.Parse("id-17\t3\t-2\t0\tnot a number\tx\t", &label, dense, ids).ok());
  EXPECT_EQ(label, 0.0f);
  EXPECT_FLOAT_EQ(dense[0], static_cast<float>(std::log1p(3.0)));
  EXPECT_EQ(dense[1], 0.0f);
  EXPECT_EQ(ids[0], FeatureId(0, "x"));
  EXPECT_EQ(ids[1], FeatureId(1, ""));

  const Status short_line = parser.Parse("id\t1\t2\t1", &label, dense, ids);
  EXPECT_EQ(short_line.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(short_line), AllOf(HasSubstr("expected 7"), HasSubstr("found 4")));
}

TEST(RecordParser, MultiCatColumnsHaveAnIdPerValue) {
  StatusOr<Schema> schema = Schema::Parse("label, multicat, cat, multicat*2");
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->num_cat, 4);
  EXPECT_TRUE(schema->has_multi_value());
  schema->multi_value_separator = '|';
  RecordParser parser(*std::move(schema));
  float label = -1;
  std::vector<float> dense;
  std::vector<uint64_t> ids;
  std::vector<uint32_t> ends(4);
  // Field 0: a, b, c (an empty piece skipped); field 1 (cat): "x|y" is one
  // value; field 2: empty, the missing id; field 3: nothing but separators,
  // also the missing id.
  ASSERT_TRUE(parser.Parse("1	a|b||c	x|y		||", &label, dense, &ids, ends).ok());
  EXPECT_EQ(label, 1.0f);
  EXPECT_EQ(ends, (std::vector<uint32_t>{3, 4, 5, 6}));
  EXPECT_EQ(ids, (std::vector<uint64_t>{FeatureId(0, "a"), FeatureId(0, "b"), FeatureId(0, "c"),
                                        FeatureId(1, "x|y"), FeatureId(2, ""), FeatureId(3, "")}));
  // Errors as for single-value records.
  const Status bad = parser.Parse("2	a	b	c	d", &label, dense, &ids, ends);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(bad), HasSubstr("label"));
}

TEST(RecordParser, MultiValueParseOfASingleValueSchema) {
  RecordParser parser(Schema::Criteo());
  const std::string line = CriteoLine("1", SomeDense(), SomeCats());
  float label = -1;
  std::vector<float> dense(13), dense2(13);
  std::vector<uint64_t> single(26), multi;
  std::vector<uint32_t> ends(26);
  ASSERT_TRUE(parser.Parse(line, &label, dense, single).ok());
  ASSERT_TRUE(parser.Parse(line, &label, dense2, &multi, ends).ok());
  EXPECT_EQ(multi, single);
  EXPECT_EQ(dense2, dense);
  for (uint32_t f = 0; f < 26; ++f) EXPECT_EQ(ends[f], f + 1);
}

TEST(Schema, ParseOfCriteoSpecEqualsCriteo) {
  StatusOr<Schema> schema = Schema::Parse("label,dense*13,cat*26");
  ASSERT_TRUE(schema.ok()) << schema.status();
  const Schema criteo = Schema::Criteo();
  EXPECT_EQ(schema->columns, criteo.columns);
  EXPECT_EQ(schema->num_dense, 13);
  EXPECT_EQ(schema->num_cat, 26);
  EXPECT_EQ(criteo.columns.size(), 40u);
  EXPECT_EQ(criteo.num_dense, 13);
  EXPECT_EQ(criteo.num_cat, 26);
}

TEST(Schema, ParseCountsSkipColumns) {
  StatusOr<Schema> schema = Schema::Parse("skip*2,label,cat");
  ASSERT_TRUE(schema.ok()) << schema.status();
  using Column = Schema::Column;
  EXPECT_EQ(schema->columns,
            (std::vector<Column>{Column::kSkip, Column::kSkip, Column::kLabel, Column::kCat}));
  EXPECT_EQ(schema->num_dense, 0);
  EXPECT_EQ(schema->num_cat, 1);
}

TEST(Schema, ParseRejectsBadSpecs) {
  struct Case {
    const char* spec;
    const char* message;
  };
  const Case cases[] = {
      {"label,label,dense", "exactly one label"},
      {"label*2,dense", "exactly one label"},
      {"dense*13,cat*26", "exactly one label"},
      {"label,float*3", "'float*3'"},
      {"label,,cat", "kind must be"},
      {"", "kind must be"},
      {"label,dense*0", "'dense*0'"},
      {"label,dense*-1", "'dense*-1'"},
      {"label,dense*x", "'dense*x'"},
      {"label,dense*", "'dense*'"},
      {"label,dense*1000000", "'dense*1000000'"},
  };
  for (const Case& c : cases) {
    StatusOr<Schema> schema = Schema::Parse(c.spec);
    EXPECT_EQ(schema.status().code(), absl::StatusCode::kInvalidArgument) << "'" << c.spec << "'";
    EXPECT_THAT(Message(schema.status()), HasSubstr(c.message)) << "'" << c.spec << "'";
  }
}

}  // namespace
}  // namespace eps
