// Field embeddings: moving a batch's embedding rows into per-example
// layout and their gradients back (CPU).
//
// A batch names each example's feature id per field through `slots`
// (models/batch.h); the model holds the rows of the batch's unique ids,
// [keys, dim]. "Layout" here is a row-major matrix of `stride` floats per
// example in which field f's vector starts at `offset + f * dim`: a model's
// deep input puts the dense features first and the fields after them.
//
// Thread-safety: stateless functions; safe for concurrent use on disjoint
// outputs.

#ifndef EPS_MODELS_FIELD_EMBEDDINGS_H_
#define EPS_MODELS_FIELD_EMBEDDINGS_H_

#include "models/batch.h"

namespace eps {

// Per-example loops of the model math run on several threads (OpenMP)
// from this many examples on; smaller batches are not worth waking them.
inline constexpr int kMinParallelExamples = 64;

// out[i*stride + offset + f*dim + k] = rows[slots[i*F + f]*dim + k].
// REQUIRES: rows holds batch.keys.size() * dim floats.
void GatherFields(const Batch& batch, const float* rows, int dim, float* out, int stride,
                  int offset);

// grad_rows[slots[i*F + f]*dim + k] += d[i*stride + offset + f*dim + k]: the
// gradient of each unique row is the sum over its uses.
void ScatterAddFields(const Batch& batch, const float* d, int stride, int offset, int dim,
                      float* grad_rows);

// Per example, the sum of a dim-1 table's weights over the fields:
// out[i] = sum_f w[slots[i*F + f]].
void SumFieldWeights(const Batch& batch, const float* w, float* out);

// grad_w[slots[i*F + f]] += dout[i].
void ScatterAddFieldWeights(const Batch& batch, const float* dout, float* grad_w);

}  // namespace eps

#endif  // EPS_MODELS_FIELD_EMBEDDINGS_H_
