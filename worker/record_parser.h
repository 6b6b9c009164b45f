// RecordParser: one tab-separated text record -> label, dense features and
// categorical feature ids.
//
// The schema (core/data_schema.h) says what each column is. Empty fields are allowed: a
// missing dense value becomes 0 and a missing categorical value gets its
// field's own "missing" id (FeatureId(field, "")). A multicat column's
// values each get their id, FeatureId(field, value). Dense values are
// transformed once here: log(1 + x) for x > 0, else 0.
//
// Thread-safety: immutable after construction; safe for concurrent use.

#ifndef EPS_WORKER_RECORD_PARSER_H_
#define EPS_WORKER_RECORD_PARSER_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/data_schema.h"
#include "core/status.h"

namespace eps {

class RecordParser {
 public:
  explicit RecordParser(Schema schema);

  const Schema& schema() const { return schema_; }

  // Parses `line` (no line terminator). kInvalidArgument with the reason,
  // e.g. "expected 40 columns, found 12" or "column 3: 'x1' is not a number".
  // REQUIRES: dense.size() == num_dense, ids.size() == num_cat.
  // REQUIRES: the schema has no multicat column.
  Status Parse(absl::string_view line, float* label, std::span<float> dense,
               std::span<uint64_t> ids) const;

  // Parses a record of any schema: `ids` gets every field's ids in field
  // order and field_ends[f] the end of field f's in `ids`. A multicat value
  // "a,b,,c" has the ids of a, b and c; an empty one the field's "missing"
  // id, like a cat value. Errors as Parse.
  // REQUIRES: dense.size() == num_dense, field_ends.size() == num_cat.
  Status Parse(absl::string_view line, float* label, std::span<float> dense,
               std::vector<uint64_t>* ids, std::span<uint32_t> field_ends) const;

 private:
  // Parses the columns; calls on_cat(field, value) for each categorical
  // column, in order.
  template <typename OnCat>
  Status ParseColumns(absl::string_view line, float* label, std::span<float> dense,
                      OnCat&& on_cat) const;

  const Schema schema_;
  std::vector<size_t> cat_columns_;  // [field]: its column
};

}  // namespace eps

#endif  // EPS_WORKER_RECORD_PARSER_H_
