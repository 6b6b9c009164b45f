#include "models/field_embeddings.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace eps {

StatusOr<Pooling> ParsePooling(const std::string& name) {
  if (name == "sum") return Pooling::kSum;
  if (name == "mean") return Pooling::kMean;
  return absl::InvalidArgumentError(
      absl::StrCat("pooling '", name, "' is not supported; supported: sum, mean"));
}

namespace {

// The weight of each id's row in its field's pooled row.
inline float PoolWeight(Pooling pooling, uint32_t begin, uint32_t end) {
  return pooling == Pooling::kMean ? 1.0f / static_cast<float>(end - begin) : 1.0f;
}

}  // namespace

void GatherFields(const Batch& batch, const float* rows, int dim, Pooling pooling, float* out,
                  int stride, int offset) {
  const int n = batch.size();
  const int num_fields = batch.num_fields;
  const size_t row_bytes = sizeof(float) * dim;
  const bool multi = batch.multi_value();
#pragma omp parallel for schedule(static) if (n >= kMinParallelExamples)
  for (int i = 0; i < n; ++i) {
    float* dst = out + static_cast<size_t>(i) * stride + offset;
    if (!multi) {
      const uint32_t* slots = &batch.slots[static_cast<size_t>(i) * num_fields];
      for (int f = 0; f < num_fields; ++f) {
        std::memcpy(dst + static_cast<size_t>(f) * dim, rows + static_cast<size_t>(slots[f]) * dim,
                    row_bytes);
      }
      continue;
    }
    for (int f = 0; f < num_fields; ++f) {
      const uint32_t begin = batch.field_begin(i, f);
      const uint32_t end = batch.field_end(i, f);
      const float weight = PoolWeight(pooling, begin, end);
      float* field = dst + static_cast<size_t>(f) * dim;
      std::memset(field, 0, row_bytes);
      for (uint32_t s = begin; s < end; ++s) {
        const float* row = rows + static_cast<size_t>(batch.slots[s]) * dim;
        for (int k = 0; k < dim; ++k) field[k] += row[k];
      }
      if (weight != 1.0f) {
        for (int k = 0; k < dim; ++k) field[k] *= weight;
      }
    }
  }
}

void ScatterAddFields(const Batch& batch, const float* d, int stride, int offset, int dim,
                      Pooling pooling, float* grad_rows) {
  // Serial: examples share rows, and the adds are cheap next to the MLPs.
  const int n = batch.size();
  const int num_fields = batch.num_fields;
  for (int i = 0; i < n; ++i) {
    const float* src = d + static_cast<size_t>(i) * stride + offset;
    for (int f = 0; f < num_fields; ++f) {
      const uint32_t begin = batch.field_begin(i, f);
      const uint32_t end = batch.field_end(i, f);
      const float weight = PoolWeight(pooling, begin, end);
      const float* g = src + static_cast<size_t>(f) * dim;
      for (uint32_t s = begin; s < end; ++s) {
        float* row = grad_rows + static_cast<size_t>(batch.slots[s]) * dim;
        for (int k = 0; k < dim; ++k) row[k] += weight * g[k];
      }
    }
  }
}

void SumFieldWeights(const Batch& batch, const float* w, Pooling pooling, float* out) {
  const int n = batch.size();
  const int num_fields = batch.num_fields;
  for (int i = 0; i < n; ++i) {
    float sum = 0;
    for (int f = 0; f < num_fields; ++f) {
      const uint32_t begin = batch.field_begin(i, f);
      const uint32_t end = batch.field_end(i, f);
      float field = 0;
      for (uint32_t s = begin; s < end; ++s) field += w[batch.slots[s]];
      sum += field * PoolWeight(pooling, begin, end);
    }
    out[i] = sum;
  }
}

void ScatterAddFieldWeights(const Batch& batch, const float* dout, Pooling pooling, float* grad_w) {
  const int n = batch.size();
  const int num_fields = batch.num_fields;
  for (int i = 0; i < n; ++i) {
    for (int f = 0; f < num_fields; ++f) {
      const uint32_t begin = batch.field_begin(i, f);
      const uint32_t end = batch.field_end(i, f);
      const float g = dout[i] * PoolWeight(pooling, begin, end);
      for (uint32_t s = begin; s < end; ++s) grad_w[batch.slots[s]] += g;
    }
  }
}

}  // namespace eps
