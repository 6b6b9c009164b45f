#include "core/data_schema.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace eps {

Schema Schema::Criteo() {
  Schema schema;
  schema.columns.resize(40, Column::kCat);
  schema.columns[0] = Column::kLabel;
  for (int i = 1; i <= 13; ++i) schema.columns[i] = Column::kDense;
  schema.num_dense = 13;
  schema.num_cat = 26;
  return schema;
}

StatusOr<Schema> Schema::Parse(absl::string_view spec) {
  Schema schema;
  int labels = 0;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    item = absl::StripAsciiWhitespace(item);
    int repeat = 1;
    absl::string_view kind = item;
    if (const size_t star = item.find('*'); star != absl::string_view::npos) {
      kind = absl::StripAsciiWhitespace(item.substr(0, star));
      if (!absl::SimpleAtoi(item.substr(star + 1), &repeat) || repeat < 1 || repeat > 100000) {
        return absl::InvalidArgumentError(
            absl::StrCat("schema item '", item, "': the count after '*' must be 1..100000"));
      }
    }
    Column column;
    if (kind == "label") {
      column = Column::kLabel;
      labels += repeat;
    } else if (kind == "dense") {
      column = Column::kDense;
      schema.num_dense += repeat;
    } else if (kind == "cat") {
      column = Column::kCat;
      schema.num_cat += repeat;
    } else if (kind == "multicat") {
      column = Column::kMultiCat;
      schema.num_cat += repeat;
    } else if (kind == "skip") {
      column = Column::kSkip;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "schema item '", item, "': kind must be label, dense, cat, multicat or skip"));
    }
    schema.columns.insert(schema.columns.end(), repeat, column);
  }
  if (labels != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("schema must have exactly one label column (has ", labels, ")"));
  }
  return schema;
}

bool Schema::has_multi_value() const {
  for (Column column : columns) {
    if (column == Column::kMultiCat) return true;
  }
  return false;
}

StatusOr<Schema> Schema::FromConfig(const JobConfig& config) {
  if (config.data.format == "criteo") return Criteo();
  StatusOr<Schema> schema = Parse(config.data.schema);
  if (!schema.ok()) return Annotate(schema.status(), "option 'data.schema'");
  if (!config.data.multi_value_separator.empty()) {
    schema->multi_value_separator = config.data.multi_value_separator[0];
  }
  return schema;
}

}  // namespace eps
