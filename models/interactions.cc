#include "models/interactions.h"

#include <cstddef>
#include <vector>

#include "models/field_embeddings.h"

namespace eps {

void FmForward(const float* in, int n, int stride, int offset, int num_fields, int dim,
               float* out) {
#pragma omp parallel if (n >= kMinParallelExamples)
  {
    std::vector<float> sum(dim);
#pragma omp for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* v = in + static_cast<size_t>(i) * stride + offset;
      float squares = 0;
      for (int k = 0; k < dim; ++k) sum[k] = 0;
      for (int f = 0; f < num_fields; ++f) {
        const float* vf = v + static_cast<size_t>(f) * dim;
        for (int k = 0; k < dim; ++k) {
          sum[k] += vf[k];
          squares += vf[k] * vf[k];
        }
      }
      float total = 0;
      for (int k = 0; k < dim; ++k) total += sum[k] * sum[k];
      out[i] = 0.5f * (total - squares);
    }
  }
}

void FmBackward(const float* in, int n, int stride, int offset, int num_fields, int dim,
                const float* dout, float* din) {
#pragma omp parallel if (n >= kMinParallelExamples)
  {
    std::vector<float> sum(dim);
#pragma omp for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* v = in + static_cast<size_t>(i) * stride + offset;
      float* dv = din + static_cast<size_t>(i) * stride + offset;
      for (int k = 0; k < dim; ++k) sum[k] = 0;
      for (int f = 0; f < num_fields; ++f) {
        for (int k = 0; k < dim; ++k) sum[k] += v[static_cast<size_t>(f) * dim + k];
      }
      const float g = dout[i];
      for (int f = 0; f < num_fields; ++f) {
        const size_t base = static_cast<size_t>(f) * dim;
        for (int k = 0; k < dim; ++k) dv[base + k] += g * (sum[k] - v[base + k]);
      }
    }
  }
}

namespace {

// T_a of example i: z for a = 0, field a-1 otherwise.
inline const float* Vector(const float* z, const float* fields, int a, int dim) {
  return a == 0 ? z : fields + static_cast<size_t>(a - 1) * dim;
}

}  // namespace

void DotForward(const float* z_rows, const float* in, int n, int stride, int offset,
                int num_fields, int dim, float* out, int out_stride, int out_offset) {
  const int vectors = num_fields + 1;
#pragma omp parallel if (n >= kMinParallelExamples)
  {
    // The example's vectors by component: columns[k * vectors + b] is
    // component k of vector b. Each dot then accumulates over k, in k's
    // order (the sums of a plain loop, bit for bit), with the pairs of
    // one vector side by side in vector lanes.
    std::vector<float> columns(static_cast<size_t>(vectors) * dim);
#pragma omp for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* z = z_rows + static_cast<size_t>(i) * dim;
      const float* fields = in + static_cast<size_t>(i) * stride + offset;
      float* dots = out + static_cast<size_t>(i) * out_stride + out_offset;
      for (int b = 0; b < vectors; ++b) {
        const float* tb = Vector(z, fields, b, dim);
        for (int k = 0; k < dim; ++k) columns[static_cast<size_t>(k) * vectors + b] = tb[k];
      }
      // The pairs (a, b < a) of vector a are dots[a (a - 1) / 2 + b].
      for (int a = 1; a <= num_fields; ++a) {
        const float* ta = Vector(z, fields, a, dim);
        float* pairs = dots + a * (a - 1) / 2;
        for (int b = 0; b < a; ++b) pairs[b] = 0;
        for (int k = 0; k < dim; ++k) {
          const float x = ta[k];
          const float* column = columns.data() + static_cast<size_t>(k) * vectors;
#pragma omp simd
          for (int b = 0; b < a; ++b) pairs[b] += x * column[b];
        }
      }
    }
  }
}

void DotBackward(const float* z_rows, const float* in, int n, int stride, int offset,
                 int num_fields, int dim, const float* dout, int out_stride, int out_offset,
                 float* dz_rows, float* din) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelExamples)
  for (int i = 0; i < n; ++i) {
    const float* z = z_rows + static_cast<size_t>(i) * dim;
    const float* fields = in + static_cast<size_t>(i) * stride + offset;
    const float* g = dout + static_cast<size_t>(i) * out_stride + out_offset;
    float* dz = dz_rows + static_cast<size_t>(i) * dim;
    float* dfields = din + static_cast<size_t>(i) * stride + offset;
    int p = 0;
    for (int a = 1; a <= num_fields; ++a) {
      const float* ta = Vector(z, fields, a, dim);
      float* dta = dfields + static_cast<size_t>(a - 1) * dim;
      for (int b = 0; b < a; ++b) {
        const float* tb = Vector(z, fields, b, dim);
        float* dtb = b == 0 ? dz : dfields + static_cast<size_t>(b - 1) * dim;
        const float gp = g[p++];
        // dta and dtb are different vectors (b < a).
#pragma omp simd
        for (int k = 0; k < dim; ++k) {
          dta[k] += gp * tb[k];
          dtb[k] += gp * ta[k];
        }
      }
    }
  }
}

}  // namespace eps
