// RecordParser: one tab-separated text record -> label, dense features and
// categorical feature ids.
//
// The schema (core/data_schema.h) says what each column is. Empty fields are allowed: a
// missing dense value becomes 0 and a missing categorical value gets its
// field's own "missing" id (FeatureId(field, "")). Dense values are
// transformed once here: log(1 + x) for x > 0, else 0.
//
// Thread-safety: immutable after construction; safe for concurrent use.

#ifndef EPS_WORKER_RECORD_PARSER_H_
#define EPS_WORKER_RECORD_PARSER_H_

#include <cstdint>
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
  Status Parse(absl::string_view line, float* label, std::span<float> dense,
               std::span<uint64_t> ids) const;

 private:
  const Schema schema_;
};

}  // namespace eps

#endif  // EPS_WORKER_RECORD_PARSER_H_
