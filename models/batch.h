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
  // Categorical fields per example; every field of every example has
  // exactly one feature id (a missing value has its field's "missing" id).
  int num_fields = 0;
  // [size]
  std::vector<float> labels;
  // [size * num_dense], row-major, already transformed by the parser.
  std::vector<float> dense;
  // [size * num_fields]: slots[i * num_fields + f] indexes `keys`.
  std::vector<uint32_t> slots;
  // The batch's unique feature ids, in first-seen order.
  std::vector<uint64_t> keys;

  int size() const { return static_cast<int>(labels.size()); }
};

class BatchBuilder {
 public:
  BatchBuilder(int num_dense, int num_fields);

  // Appends one example.
  // REQUIRES: dense.size() == num_dense, ids.size() == num_fields.
  void Add(float label, std::span<const float> dense, std::span<const uint64_t> ids);

  int size() const { return batch_.size(); }
  // Returns the batch built so far and starts an empty one.
  Batch Finish();

 private:
  Batch batch_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
};

}  // namespace eps

#endif  // EPS_MODELS_BATCH_H_
