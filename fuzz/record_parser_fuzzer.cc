// Fuzzes the worker's record parsing: the schema of data.format = tsv
// (Schema::Parse) or criteo, and RecordParser on lines of it, through both
// Parse overloads.
//
// Input: one byte, the multi-value separator; then the schema on the first
// line ("criteo", or a data.schema such as "label,dense*2,multicat,cat");
// then one record per line. Seeds: fuzz/corpus/record_parser.
//
// Invariants checked: a record that parses gives a label in [0, 1], finite
// dense values, and (the multi-value overload) every field at least one id,
// field_ends rising to the number of ids.

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/data_schema.h"
#include "core/logging.h"
#include "worker/record_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace eps;
  if (size < 1) return 0;
  const char separator = static_cast<char>(data[0]);
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t newline = text.find('\n');
  const absl::string_view spec = text.substr(0, newline);
  StatusOr<Schema> schema = spec == "criteo" ? Schema::Criteo() : Schema::Parse(spec);
  if (!schema.ok() || newline == absl::string_view::npos) return 0;
  schema->multi_value_separator = separator;
  const RecordParser parser(*schema);
  float label = -1;
  std::vector<float> dense(schema->num_dense);
  std::vector<uint64_t> ids;
  std::vector<uint64_t> one_id_each(schema->num_cat);
  std::vector<uint32_t> field_ends(schema->num_cat);
  for (absl::string_view line : absl::StrSplit(text.substr(newline + 1), '\n')) {
    if (parser.Parse(line, &label, dense, &ids, field_ends).ok()) {
      CHECK(label >= 0 && label <= 1) << label;
      for (float value : dense) CHECK(std::isfinite(value)) << value;
      uint32_t previous = 0;
      for (uint32_t end : field_ends) {
        CHECK_GT(end, previous);
        previous = end;
      }
      CHECK_EQ(previous, ids.size());
    }
    if (!schema->has_multi_value()) (void)parser.Parse(line, &label, dense, one_id_each);
  }
  return 0;
}
