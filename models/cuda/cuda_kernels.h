// The CUDA kernels of the CUDA models: the device counterparts of
// models/field_embeddings.h, models/interactions.h, models/loss.h and the
// elementwise parts of models/mlp.h, plus a cuBLAS column sum.
//
// Every function issues its work on `stream` (or the handle's stream) and
// returns without waiting; every pointer is device memory; layouts are those
// of the CPU functions (row-major, example i's field f at
// in[i*stride + offset + f*dim]). Counts of zero issue nothing.
//
// The field functions take the batch's `slots` and `offsets` (models/batch.h)
// and read each field through its pooled row (docs/models.md). With
// `offsets` null every field has one id, slots[i*F + f], and the pooling
// changes nothing; otherwise example i's field f has the ids of
// slots[offsets[i*F + f] .. offsets[i*F + f + 1]) (at least one), and
// "pool" below is their sum, or their mean for Pooling::kMean.
//
// Internal to models/: only .cu files include this header.
//
// Thread-safety: stateless; safe for concurrent use on disjoint outputs.

#ifndef EPS_MODELS_CUDA_KERNELS_H_
#define EPS_MODELS_CUDA_KERNELS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "models/field_embeddings.h"
#include "models/mlp.h"

namespace eps {
namespace cuda {

// out[i*stride + offset + f*dim + k] = pool over the ids of example i's
// field f of rows[slot*dim + k].
void GatherFields(const uint32_t* slots, const uint32_t* offsets, int n, int num_fields,
                  const float* rows, int dim, Pooling pooling, float* out, int stride, int offset,
                  cudaStream_t stream);

// GatherFields' gradient: grad_rows[slot*dim + k] += d[i*stride + offset +
// f*dim + k] (divided by the field's id count for kMean) for each id of
// example i's field f (atomic: examples and fields share rows).
void ScatterAddFields(const uint32_t* slots, const uint32_t* offsets, int n, int num_fields,
                      const float* d, int stride, int offset, int dim, Pooling pooling,
                      float* grad_rows, cudaStream_t stream);

// The wide (first-order) logit, plus an optional term:
// logits[i] = (base ? base[i] : 0) + sum_f (pool over field f's ids of w[slot])
//             + sum_j x[i*D + j] * dense_w[j] + dense_w[D].
// `base` may alias `logits`.
void WideLogits(const uint32_t* slots, const uint32_t* offsets, int n, int num_fields,
                Pooling pooling, const float* w, const float* x, int num_dense,
                const float* dense_w, const float* base, float* logits, cudaStream_t stream);

// The gradient of WideLogits' field term: grad_w[slot] += dlogits[i]
// (divided by the field's id count for kMean) for each id of each of
// example i's fields (atomic).
void ScatterAddFieldWeights(const uint32_t* slots, const uint32_t* offsets, int n, int num_fields,
                            Pooling pooling, const float* dlogits, float* grad_w,
                            cudaStream_t stream);

// y[i*width + j] += bias[j], then the activation when `activate`.
void AddBiasActivate(float* y, int n, int width, const float* bias, Activation activation,
                     bool activate, cudaStream_t stream);

// d_out[j] = d_in[j] * activation'(.), with the derivative written in terms
// of the activation's output y (relu'(0) = 0). d_out may alias d_in.
void ActivationGrad(Activation activation, const float* y, const float* d_in, float* d_out,
                    size_t count, cudaStream_t stream);

// logits[i] += fm of example i: 1/2 sum_k [(sum_f v_fk)^2 - sum_f v_fk^2].
void FmForward(const float* in, int n, int stride, int offset, int num_fields, int dim,
               float* logits, cudaStream_t stream);

// din[i, field f, k] += dlogits[i] * (sum_g v_gk - v_fk).
void FmBackward(const float* in, int n, int stride, int offset, int num_fields, int dim,
                const float* dlogits, float* din, cudaStream_t stream);

// out[i*out_stride + out_offset + p] = T_a . T_b for the p-th pair (a = 1..F
// outer, b = 0..a-1 inner) of T = [z_i, field 1, ..., field F], with z_i at
// z_rows[i*dim].
void DotForward(const float* z_rows, const float* in, int n, int stride, int offset, int num_fields,
                int dim, float* out, int out_stride, int out_offset, cudaStream_t stream);

// Given dout (DotForward's out layout): dz_rows[i*dim + k] += the gradient
// of z_i; din's field vectors are overwritten with their gradients (other
// columns of din are left alone).
void DotBackward(const float* z_rows, const float* in, int n, int stride, int offset,
                 int num_fields, int dim, const float* dout, int out_stride, int out_offset,
                 float* dz_rows, float* din, cudaStream_t stream);

// predictions[i] = sigmoid(logits[i]); losses[i] = -(y log p + (1-y)
// log(1-p)) computed in double from the logit (finite for any logit);
// unless dlogits is null, dlogits[i] = (p_i - y_i) / n.
void SigmoidLogLoss(const float* logits, const float* labels, int n, float* predictions,
                    double* losses, float* dlogits, cudaStream_t stream);

// out[0..count) = value.
void Fill(float* out, size_t count, float value, cudaStream_t stream);

// out[j] = sum_i m[i*cols + j] * w[i] for row-major m [rows, cols]: with w
// all ones, m's column sums (bias gradients); with w = dlogits, x^T dlogits.
// Overwrites out (zeros when rows == 0). Runs on the handle's stream.
void WeightedColumnSums(cublasHandle_t cublas, const float* m, int rows, int cols, const float* w,
                        float* out);

}  // namespace cuda
}  // namespace eps

#endif  // EPS_MODELS_CUDA_KERNELS_H_
