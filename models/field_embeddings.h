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

#include <string>

#include "core/status.h"
#include "models/batch.h"

namespace eps {

// Per-example loops of the model math run on several threads (OpenMP)
// from this many examples on; smaller batches are not worth waking them.
inline constexpr int kMinParallelExamples = 64;

// How the rows of a multi-value field's ids combine (docs/models.md).
enum class Pooling { kSum, kMean };

// "sum" or "mean"; kInvalidArgument for another name.
StatusOr<Pooling> ParsePooling(const std::string& name);

// Writes each example's pooled field rows into the layout:
// out[i*stride + offset + f*dim + k] = pool over example i's field f ids of
// rows[slot*dim + k]. REQUIRES: rows holds batch.keys.size() * dim floats.
void GatherFields(const Batch& batch, const float* rows, int dim, Pooling pooling, float* out,
                  int stride, int offset);

// The gradient of GatherFields: adds d[i*stride + offset + f*dim + k]
// (divided by the field's id count for kMean) to the row of each id of
// example i's field f. A row's gradient is the sum over its uses.
void ScatterAddFields(const Batch& batch, const float* d, int stride, int offset, int dim,
                      Pooling pooling, float* grad_rows);

// Per example, the sum over fields of a dim-1 table's pooled weights:
// out[i] = sum_f pool over field f's ids of w[slot].
void SumFieldWeights(const Batch& batch, const float* w, Pooling pooling, float* out);

// The gradient of SumFieldWeights: adds dout[i] (divided by the id count
// for kMean) to grad_w of each id of each of example i's fields.
void ScatterAddFieldWeights(const Batch& batch, const float* dout, Pooling pooling, float* grad_w);

}  // namespace eps

#endif  // EPS_MODELS_FIELD_EMBEDDINGS_H_
