#include "models/field_embeddings.h"

#include <cstring>

#include "core/logging.h"

namespace eps {

void GatherFields(const Batch& batch, const float* rows, int dim, float* out, int stride,
                  int offset) {
  const int n = batch.size();
  const int num_fields = batch.num_fields;
  const size_t row_bytes = sizeof(float) * dim;
#pragma omp parallel for schedule(static) if (n >= kMinParallelExamples)
  for (int i = 0; i < n; ++i) {
    const uint32_t* slots = &batch.slots[static_cast<size_t>(i) * num_fields];
    float* dst = out + static_cast<size_t>(i) * stride + offset;
    for (int f = 0; f < num_fields; ++f) {
      std::memcpy(dst + static_cast<size_t>(f) * dim, rows + static_cast<size_t>(slots[f]) * dim,
                  row_bytes);
    }
  }
}

void ScatterAddFields(const Batch& batch, const float* d, int stride, int offset, int dim,
                      float* grad_rows) {
  // Serial: examples share rows, and the adds are cheap next to the MLPs.
  const int n = batch.size();
  const int num_fields = batch.num_fields;
  for (int i = 0; i < n; ++i) {
    const uint32_t* slots = &batch.slots[static_cast<size_t>(i) * num_fields];
    const float* src = d + static_cast<size_t>(i) * stride + offset;
    for (int f = 0; f < num_fields; ++f) {
      float* row = grad_rows + static_cast<size_t>(slots[f]) * dim;
      const float* g = src + static_cast<size_t>(f) * dim;
      for (int k = 0; k < dim; ++k) row[k] += g[k];
    }
  }
}

void SumFieldWeights(const Batch& batch, const float* w, float* out) {
  const int n = batch.size();
  const int num_fields = batch.num_fields;
  for (int i = 0; i < n; ++i) {
    const uint32_t* slots = &batch.slots[static_cast<size_t>(i) * num_fields];
    float sum = 0;
    for (int f = 0; f < num_fields; ++f) sum += w[slots[f]];
    out[i] = sum;
  }
}

void ScatterAddFieldWeights(const Batch& batch, const float* dout, float* grad_w) {
  const int n = batch.size();
  const int num_fields = batch.num_fields;
  for (int i = 0; i < n; ++i) {
    const uint32_t* slots = &batch.slots[static_cast<size_t>(i) * num_fields];
    for (int f = 0; f < num_fields; ++f) grad_w[slots[f]] += dout[i];
  }
}

}  // namespace eps
