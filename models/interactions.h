// Feature interactions of CTR models, forward and backward (CPU):
//
//   Fm:  DeepFM's second-order term over F field vectors of dim d,
//        fm = 1/2 * sum_k [(sum_f v_fk)^2 - sum_f v_fk^2].
//   Dot: DLRM's pairwise dot products of T = [z, v_1, ..., v_F]: T_a . T_b
//        for a = 1..F, b = 0..a-1 in that order, (F+1)F/2 values.
//
// Field vectors are read in the layout of models/field_embeddings.h:
// example i's field f at in[i*stride + offset + f*dim].
//
// Thread-safety: stateless functions; safe for concurrent use on disjoint
// outputs.

#ifndef EPS_MODELS_INTERACTIONS_H_
#define EPS_MODELS_INTERACTIONS_H_

namespace eps {

// out[i] = fm of example i.
void FmForward(const float* in, int n, int stride, int offset, int num_fields, int dim,
               float* out);

// din[i, field f, k] += dout[i] * (sum_g v_gk - v_fk).
void FmBackward(const float* in, int n, int stride, int offset, int num_fields, int dim,
                const float* dout, float* din);

// Number of dot products of Dot: (F+1)F/2.
inline int DotInteractionCount(int num_fields) { return (num_fields + 1) * num_fields / 2; }

// out[i*out_stride + out_offset + p] = p-th dot product of example i, with
// z = z_rows[i*dim ...] and the fields in `in` (stride, offset).
void DotForward(const float* z_rows, const float* in, int n, int stride, int offset,
                int num_fields, int dim, float* out, int out_stride, int out_offset);

// Given dout (same layout as DotForward's out): dz_rows[i*dim ...] += the
// gradient of z; din[i, field f] += the gradient of v_f.
void DotBackward(const float* z_rows, const float* in, int n, int stride, int offset,
                 int num_fields, int dim, const float* dout, int out_stride, int out_offset,
                 float* dz_rows, float* din);

}  // namespace eps

#endif  // EPS_MODELS_INTERACTIONS_H_
