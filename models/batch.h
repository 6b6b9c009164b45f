// Batch: the input of one training or evaluation step.
//
// Labels, transformed dense features, and the categorical features as
// indices into the batch's unique feature ids: the worker pulls each unique
// id once and the model reads rows through `slots`.
//
// Thread-safety: Batch is a plain value. BatchBuilder: one thread only.

#ifndef EPS_MODELS_BATCH_H_
#define EPS_MODELS_BATCH_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace eps {

struct Batch {
  int num_dense = 0;
  // Categorical fields per example. Every field of every example has at
  // least one feature id (a missing value has its field's "missing" id);
  // a multi-value field may have several, which the model pools.
  int num_fields = 0;
  // [size]
  std::vector<float> labels;
  // [size * num_dense], row-major, already transformed by the parser.
  std::vector<float> dense;
  // Indexes into `keys`, field by field of example by example. With
  // `offsets` empty, every field has exactly one value: slots[i*F + f].
  std::vector<uint32_t> slots;
  // Empty, or [size * num_fields + 1] when some field has several values:
  // example i's field f has slots[offsets[i*F + f], offsets[i*F + f + 1]).
  std::vector<uint32_t> offsets;
  // The batch's unique feature ids, in first-seen order.
  std::vector<uint64_t> keys;

  int size() const { return static_cast<int>(labels.size()); }
  bool multi_value() const { return !offsets.empty(); }
  // The slots of example i's field f: [begin, end) into `slots`.
  uint32_t field_begin(int i, int f) const {
    const size_t j = static_cast<size_t>(i) * num_fields + f;
    return offsets.empty() ? static_cast<uint32_t>(j) : offsets[j];
  }
  uint32_t field_end(int i, int f) const { return field_begin(i, f + 1); }
  // CHECK-fails unless the arrays' sizes agree with each other (a model
  // reads them through raw pointers).
  void CheckShape() const;
};

// Examples [begin, end) of `batch` as a batch of their own, with its own
// unique keys (first-seen order); (*from)[k] is the index in batch.keys of
// the slice's key k, so that rows pulled for `batch` can be picked for it.
// A step that ran out of memory trains its batch in such halves.
// REQUIRES: 0 <= begin <= end <= batch.size().
Batch SliceBatch(const Batch& batch, int begin, int end, std::vector<uint32_t>* from);

class BatchBuilder {
 public:
  BatchBuilder(int num_dense, int num_fields);

  // Appends one example with one id per field.
  // REQUIRES: dense.size() == num_dense, ids.size() == num_fields.
  void Add(float label, std::span<const float> dense, std::span<const uint64_t> ids);
  // Appends one example whose field f has ids[field_ends[f-1], field_ends[f])
  // (from 0 for f = 0). The batch keeps `offsets` only once some field has
  // more than one id. REQUIRES: dense.size() == num_dense,
  // field_ends.size() == num_fields, each field has at least one id,
  // field_ends.back() == ids.size().
  void Add(float label, std::span<const float> dense, std::span<const uint64_t> ids,
           std::span<const uint32_t> field_ends);

  int size() const { return batch_.size(); }
  // Returns the batch built so far and starts an empty one.
  Batch Finish();

 private:
  uint32_t SlotOf(uint64_t id);

  Batch batch_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
};

}  // namespace eps

#endif  // EPS_MODELS_BATCH_H_
