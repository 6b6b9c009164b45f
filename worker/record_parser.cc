#include "worker/record_parser.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/hashing.h"
#include "core/logging.h"

namespace eps {
namespace {

bool ParseNumber(absl::string_view text, double* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && std::isfinite(*out);
}

// Shortens a field for an error message.
std::string Excerpt(absl::string_view text) {
  constexpr size_t kMax = 32;
  return text.size() <= kMax ? std::string(text) : absl::StrCat(text.substr(0, kMax), "...");
}

}  // namespace

RecordParser::RecordParser(Schema schema) : schema_(std::move(schema)) {
  for (size_t c = 0; c < schema_.columns.size(); ++c) {
    if (schema_.columns[c] == Schema::Column::kCat || schema_.columns[c] == Schema::Column::kMultiCat) {
      cat_columns_.push_back(c);
    }
  }
}

Status RecordParser::Parse(absl::string_view line, float* label, std::span<float> dense,
                           std::span<uint64_t> ids) const {
  CHECK_EQ(ids.size(), static_cast<size_t>(schema_.num_cat));
  CHECK(!schema_.has_multi_value()) << "a multicat schema needs the multi-value Parse";
  return ParseColumns(line, label, dense, [&](int field, absl::string_view value) {
    ids[field] = FeatureId(static_cast<uint32_t>(field), value);
  });
}

Status RecordParser::Parse(absl::string_view line, float* label, std::span<float> dense,
                           std::vector<uint64_t>* ids, std::span<uint32_t> field_ends) const {
  CHECK_EQ(field_ends.size(), static_cast<size_t>(schema_.num_cat));
  ids->clear();
  const char separator = schema_.multi_value_separator;
  return ParseColumns(line, label, dense, [&](int field, absl::string_view value) {
    const uint32_t f = static_cast<uint32_t>(field);
    const size_t begin = ids->size();
    if (schema_.columns[cat_columns_[field]] == Schema::Column::kCat) {
      ids->push_back(FeatureId(f, value));
    } else {
      for (absl::string_view piece : absl::StrSplit(value, separator, absl::SkipEmpty())) {
        ids->push_back(FeatureId(f, piece));
      }
      // No value: the field's "missing" id, as for an empty cat value.
      if (ids->size() == begin) ids->push_back(FeatureId(f, ""));
    }
    field_ends[field] = static_cast<uint32_t>(ids->size());
  });
}

template <typename OnCat>
Status RecordParser::ParseColumns(absl::string_view line, float* label, std::span<float> dense,
                                  OnCat&& on_cat) const {
  CHECK_EQ(dense.size(), static_cast<size_t>(schema_.num_dense));
  const size_t num_columns = schema_.columns.size();
  // Count first: a line with the wrong shape (a truncated write, a
  // comma-separated file) is best explained by its column count, not by
  // whichever of its fields happens to fail to parse first.
  const size_t found = static_cast<size_t>(std::count(line.begin(), line.end(), '\t')) + 1;
  if (found != num_columns) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", num_columns, " tab-separated columns, found ", found));
  }
  size_t column = 0;
  int next_dense = 0;
  int next_cat = 0;
  bool has_label = false;
  size_t begin = 0;
  while (true) {
    size_t tab = line.find('\t', begin);
    const absl::string_view field =
        line.substr(begin, tab == absl::string_view::npos ? absl::string_view::npos : tab - begin);
    switch (schema_.columns[column]) {
      case Schema::Column::kLabel: {
        double value = 0;
        if (!ParseNumber(field, &value) || value < 0 || value > 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "column ", column + 1, ": label '", Excerpt(field), "' is not a number in [0, 1]"));
        }
        *label = static_cast<float>(value);
        has_label = true;
        break;
      }
      case Schema::Column::kDense: {
        double value = 0;
        if (!field.empty() && !ParseNumber(field, &value)) {
          return absl::InvalidArgumentError(
              absl::StrCat("column ", column + 1, ": '", Excerpt(field), "' is not a number"));
        }
        dense[next_dense++] = value > 0 ? static_cast<float>(std::log1p(value)) : 0.0f;
        break;
      }
      case Schema::Column::kCat:
      case Schema::Column::kMultiCat:
        on_cat(next_cat++, field);
        break;
      case Schema::Column::kSkip:
        break;
    }
    ++column;
    if (tab == absl::string_view::npos) break;
    begin = tab + 1;
  }
  CHECK_EQ(column, num_columns);
  CHECK(has_label);
  return absl::OkStatus();
}

}  // namespace eps
