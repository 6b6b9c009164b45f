// Schema: the column layout of a job's text records.
//
// Every column is a label, a dense (numeric) feature, a categorical feature
// (one value), a multi-value categorical feature (several values separated
// by data.multi_value_separator; the model pools their rows) or skipped. data.format = criteo is the fixed Criteo layout: a label, 13
// integer columns, 26 categorical ones; data.format = tsv takes data.schema.
// The master needs it for the model's shape, workers to parse.
//
// Thread-safety: a plain value.

#ifndef EPS_CORE_DATA_SCHEMA_H_
#define EPS_CORE_DATA_SCHEMA_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/job_config.h"
#include "core/status.h"

namespace eps {

struct Schema {
  enum class Column : uint8_t { kLabel, kDense, kCat, kMultiCat, kSkip };
  std::vector<Column> columns;
  int num_dense = 0;
  // Categorical fields, multi-value ones included.
  int num_cat = 0;
  // Separates the values of a kMultiCat column.
  char multi_value_separator = ',';

  bool has_multi_value() const;

  // label, 13 dense, 26 categorical.
  static Schema Criteo();
  // Parses "label,dense*13,cat*26" (kinds: label, dense, cat, multicat,
  // skip; `*N` repeats). kInvalidArgument names the bad item; exactly one label.
  static StatusOr<Schema> Parse(absl::string_view spec);
  // The schema of data.format / data.schema. kInvalidArgument naming
  // data.schema when it does not parse.
  static StatusOr<Schema> FromConfig(const JobConfig& config);
};

}  // namespace eps

#endif  // EPS_CORE_DATA_SCHEMA_H_
