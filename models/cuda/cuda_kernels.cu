#include <algorithm>

#include "models/cuda/cuda_context.h"
#include "models/cuda/cuda_kernels.h"

namespace eps {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;
// Grid-stride loops cover any count; more blocks than this only queue.
constexpr int64_t kMaxBlocks = 1 << 16;

int BlocksFor(int64_t count) {
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, kMaxBlocks));
}

int BlocksForWarps(int64_t warps) {
  return static_cast<int>(
      std::min<int64_t>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks));
}

// Launches `kernel` with one thread per element over `count` elements (a
// grid-stride loop inside the kernel) and checks the launch.
template <typename Kernel, typename... Args>
void Launch(int64_t count, cudaStream_t stream, Kernel kernel, Args... args) {
  if (count <= 0) return;
  kernel<<<BlocksFor(count), kThreads, 0, stream>>>(count, args...);
  EPS_CUDA_CHECK(cudaGetLastError());
}

// As Launch, with one warp per item.
template <typename Kernel, typename... Args>
void LaunchWarps(int64_t items, cudaStream_t stream, Kernel kernel, Args... args) {
  if (items <= 0) return;
  kernel<<<BlocksForWarps(items), kThreads, 0, stream>>>(items, args...);
  EPS_CUDA_CHECK(cudaGetLastError());
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__device__ __forceinline__ float WarpSum(float value) {
  for (int delta = kWarp / 2; delta > 0; delta /= 2) {
    value += __shfl_down_sync(0xffffffffu, value, delta);
  }
  return value;
}

// Element e = (i*F + f)*dim + k of the [n, F, dim] field layout.
__global__ void GatherFieldsKernel(int64_t count, const uint32_t* slots, int num_fields,
                                   const float* rows, int dim, float* out, int stride, int offset) {
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) {
    const int64_t pair = e / dim;  // i*F + f
    const int k = static_cast<int>(e - pair * dim);
    const int64_t i = pair / num_fields;
    const int f = static_cast<int>(pair - i * num_fields);
    out[i * stride + offset + static_cast<int64_t>(f) * dim + k] =
        rows[static_cast<int64_t>(slots[pair]) * dim + k];
  }
}

__global__ void ScatterAddFieldsKernel(int64_t count, const uint32_t* slots, int num_fields,
                                       const float* d, int stride, int offset, int dim,
                                       float* grad_rows) {
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) {
    const int64_t pair = e / dim;
    const int k = static_cast<int>(e - pair * dim);
    const int64_t i = pair / num_fields;
    const int f = static_cast<int>(pair - i * num_fields);
    atomicAdd(&grad_rows[static_cast<int64_t>(slots[pair]) * dim + k],
              d[i * stride + offset + static_cast<int64_t>(f) * dim + k]);
  }
}

__global__ void WideLogitsKernel(int64_t n, const uint32_t* slots, int num_fields, const float* w,
                                 const float* x, int num_dense, const float* dense_w,
                                 const float* base, float* logits) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const uint32_t* s = slots + i * num_fields;
    float fields = 0;
    for (int f = 0; f < num_fields; ++f) fields += w[s[f]];
    const float* xi = x + i * num_dense;
    float dense = 0;
    for (int j = 0; j < num_dense; ++j) dense += xi[j] * dense_w[j];
    logits[i] = (base != nullptr ? base[i] : 0.0f) + fields + dense + dense_w[num_dense];
  }
}

__global__ void ScatterAddFieldWeightsKernel(int64_t count, const uint32_t* slots, int num_fields,
                                             const float* dlogits, float* grad_w) {
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) {
    atomicAdd(&grad_w[slots[e]], dlogits[e / num_fields]);
  }
}

// The weight of each id's row in its field's pooled row (as the CPU's).
__device__ __forceinline__ float PoolWeight(Pooling pooling, uint32_t begin, uint32_t end) {
  return pooling == Pooling::kMean ? 1.0f / static_cast<float>(end - begin) : 1.0f;
}

// The multi-value counterparts of the kernels above: field (i, f) = pair
// has the ids of slots[offsets[pair] .. offsets[pair + 1]).
__global__ void GatherPooledFieldsKernel(int64_t count, const uint32_t* slots,
                                         const uint32_t* offsets, int num_fields, const float* rows,
                                         int dim, Pooling pooling, float* out, int stride,
                                         int offset) {
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) {
    const int64_t pair = e / dim;
    const int k = static_cast<int>(e - pair * dim);
    const int64_t i = pair / num_fields;
    const int f = static_cast<int>(pair - i * num_fields);
    const uint32_t begin = offsets[pair];
    const uint32_t end = offsets[pair + 1];
    float sum = 0;
    for (uint32_t s = begin; s < end; ++s) sum += rows[static_cast<int64_t>(slots[s]) * dim + k];
    out[i * stride + offset + static_cast<int64_t>(f) * dim + k] =
        sum * PoolWeight(pooling, begin, end);
  }
}

__global__ void ScatterAddPooledFieldsKernel(int64_t count, const uint32_t* slots,
                                             const uint32_t* offsets, int num_fields,
                                             const float* d, int stride, int offset, int dim,
                                             Pooling pooling, float* grad_rows) {
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) {
    const int64_t pair = e / dim;
    const int k = static_cast<int>(e - pair * dim);
    const int64_t i = pair / num_fields;
    const int f = static_cast<int>(pair - i * num_fields);
    const uint32_t begin = offsets[pair];
    const uint32_t end = offsets[pair + 1];
    const float g = PoolWeight(pooling, begin, end) *
                    d[i * stride + offset + static_cast<int64_t>(f) * dim + k];
    for (uint32_t s = begin; s < end; ++s) {
      atomicAdd(&grad_rows[static_cast<int64_t>(slots[s]) * dim + k], g);
    }
  }
}

__global__ void PooledWideLogitsKernel(int64_t n, const uint32_t* slots, const uint32_t* offsets,
                                       int num_fields, Pooling pooling, const float* w,
                                       const float* x, int num_dense, const float* dense_w,
                                       const float* base, float* logits) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const uint32_t* o = offsets + i * num_fields;
    float fields = 0;
    for (int f = 0; f < num_fields; ++f) {
      float field = 0;
      for (uint32_t s = o[f]; s < o[f + 1]; ++s) field += w[slots[s]];
      fields += field * PoolWeight(pooling, o[f], o[f + 1]);
    }
    const float* xi = x + i * num_dense;
    float dense = 0;
    for (int j = 0; j < num_dense; ++j) dense += xi[j] * dense_w[j];
    logits[i] = (base != nullptr ? base[i] : 0.0f) + fields + dense + dense_w[num_dense];
  }
}

// Element e = i*F + f.
__global__ void ScatterAddPooledFieldWeightsKernel(int64_t count, const uint32_t* slots,
                                                   const uint32_t* offsets, int num_fields,
                                                   Pooling pooling, const float* dlogits,
                                                   float* grad_w) {
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) {
    const uint32_t begin = offsets[e];
    const uint32_t end = offsets[e + 1];
    const float g = dlogits[e / num_fields] * PoolWeight(pooling, begin, end);
    for (uint32_t s = begin; s < end; ++s) atomicAdd(&grad_w[slots[s]], g);
  }
}

__device__ __forceinline__ float Activate(Activation activation, float v) {
  switch (activation) {
    case Activation::kRelu:
      return fmaxf(v, 0.0f);
    case Activation::kSigmoid:
      return 1.0f / (1.0f + expf(-v));
    case Activation::kTanh:
      return tanhf(v);
  }
  return v;
}

__device__ __forceinline__ float Derivative(Activation activation, float y) {
  switch (activation) {
    case Activation::kRelu:
      return y > 0.0f ? 1.0f : 0.0f;
    case Activation::kSigmoid:
      return y * (1.0f - y);
    case Activation::kTanh:
      return 1.0f - y * y;
  }
  return 1.0f;
}

__global__ void AddBiasActivateKernel(int64_t count, float* y, int width, const float* bias,
                                      Activation activation, bool activate) {
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) {
    const float v = y[e] + bias[e % width];
    y[e] = activate ? Activate(activation, v) : v;
  }
}

__global__ void ActivationGradKernel(int64_t count, Activation activation, const float* y,
                                     const float* d_in, float* d_out) {
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) {
    // relu: select rather than multiply, as the CPU does (0 * inf stays 0).
    d_out[e] = activation == Activation::kRelu ? (y[e] > 0.0f ? d_in[e] : 0.0f)
                                               : d_in[e] * Derivative(activation, y[e]);
  }
}

// One warp per example; lane l owns the components k = l, l + 32, ...
__global__ void FmForwardKernel(int64_t n, const float* in, int stride, int offset, int num_fields,
                                int dim, float* logits) {
  const int lane = threadIdx.x % kWarp;
  const int64_t first = GlobalThread() / kWarp;
  const int64_t warps = GridThreads() / kWarp;
  for (int64_t i = first; i < n; i += warps) {
    const float* v = in + i * stride + offset;
    float partial = 0;
    for (int k = lane; k < dim; k += kWarp) {
      float sum = 0;
      float squares = 0;
      for (int f = 0; f < num_fields; ++f) {
        const float x = v[static_cast<int64_t>(f) * dim + k];
        sum += x;
        squares += x * x;
      }
      partial += sum * sum - squares;
    }
    partial = WarpSum(partial);
    if (lane == 0) logits[i] += 0.5f * partial;
  }
}

__global__ void FmBackwardKernel(int64_t n, const float* in, int stride, int offset, int num_fields,
                                 int dim, const float* dlogits, float* din) {
  const int lane = threadIdx.x % kWarp;
  const int64_t first = GlobalThread() / kWarp;
  const int64_t warps = GridThreads() / kWarp;
  for (int64_t i = first; i < n; i += warps) {
    const float* v = in + i * stride + offset;
    float* dv = din + i * stride + offset;
    const float g = dlogits[i];
    for (int k = lane; k < dim; k += kWarp) {
      float sum = 0;
      for (int f = 0; f < num_fields; ++f) sum += v[static_cast<int64_t>(f) * dim + k];
      for (int f = 0; f < num_fields; ++f) {
        const int64_t at = static_cast<int64_t>(f) * dim + k;
        dv[at] += g * (sum - v[at]);
      }
    }
  }
}

// The position of pair (a, b), a > b, in the order a = 1..F, b = 0..a-1.
__device__ __forceinline__ int PairIndex(int a, int b) { return a * (a - 1) / 2 + b; }

// T_a of example i: z for a = 0, field a-1 otherwise.
__device__ __forceinline__ const float* VectorOf(const float* z, const float* fields, int a,
                                                 int dim) {
  return a == 0 ? z : fields + static_cast<int64_t>(a - 1) * dim;
}

// Element e = i*P + p.
__global__ void DotForwardKernel(int64_t count, const float* z_rows, const float* in, int stride,
                                 int offset, int num_fields, int dim, float* out, int out_stride,
                                 int out_offset) {
  const int pairs = num_fields * (num_fields + 1) / 2;
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) {
    const int64_t i = e / pairs;
    const int p = static_cast<int>(e - i * pairs);
    // Invert p = a(a-1)/2 + b: the float estimate, then exact corrections.
    int a = static_cast<int>((1.0f + sqrtf(1.0f + 8.0f * p)) * 0.5f);
    while (a > 1 && PairIndex(a, 0) > p) --a;
    while (PairIndex(a + 1, 0) <= p) ++a;
    const int b = p - PairIndex(a, 0);
    const float* z = z_rows + i * dim;
    const float* fields = in + i * stride + offset;
    const float* ta = VectorOf(z, fields, a, dim);
    const float* tb = VectorOf(z, fields, b, dim);
    float dot = 0;
    for (int k = 0; k < dim; ++k) dot += ta[k] * tb[k];
    out[i * out_stride + out_offset + p] = dot;
  }
}

// Element e = (i*(F+1) + a)*dim + k: component k of the gradient of T_a,
// sum over b != a of dout(pair of a and b) * T_b[k].
__global__ void DotBackwardKernel(int64_t count, const float* z_rows, const float* in, int stride,
                                  int offset, int num_fields, int dim, const float* dout,
                                  int out_stride, int out_offset, float* dz_rows, float* din) {
  const int vectors = num_fields + 1;
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) {
    const int64_t row = e / dim;  // i*(F+1) + a
    const int k = static_cast<int>(e - row * dim);
    const int64_t i = row / vectors;
    const int a = static_cast<int>(row - i * vectors);
    const float* z = z_rows + i * dim;
    const float* fields = in + i * stride + offset;
    const float* g = dout + i * out_stride + out_offset;
    float grad = 0;
    for (int b = 0; b < vectors; ++b) {
      if (b == a) continue;
      const int p = a > b ? PairIndex(a, b) : PairIndex(b, a);
      grad += g[p] * VectorOf(z, fields, b, dim)[k];
    }
    if (a == 0) {
      dz_rows[i * dim + k] += grad;
    } else {
      din[i * stride + offset + static_cast<int64_t>(a - 1) * dim + k] = grad;
    }
  }
}

__global__ void SigmoidLogLossKernel(int64_t n, const float* logits, const float* labels,
                                     float inv_n, float* predictions, double* losses,
                                     float* dlogits) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float logit = logits[i];
    const double z = logit;
    const double y = labels[i];
    // log(1 + e^z) - y z, without overflow for large |z| (as the CPU).
    losses[i] = fmax(z, 0.0) + log1p(exp(-fabs(z))) - y * z;
    const float p = 1.0f / (1.0f + expf(-logit));
    predictions[i] = p;
    if (dlogits != nullptr) dlogits[i] = (p - labels[i]) * inv_n;
  }
}

__global__ void FillKernel(int64_t count, float* out, float value) {
  for (int64_t e = GlobalThread(); e < count; e += GridThreads()) out[e] = value;
}

}  // namespace

void GatherFields(const uint32_t* slots, const uint32_t* offsets, int n, int num_fields,
                  const float* rows, int dim, Pooling pooling, float* out, int stride, int offset,
                  cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(n) * num_fields * dim;
  if (offsets == nullptr) {
    Launch(count, stream, GatherFieldsKernel, slots, num_fields, rows, dim, out, stride, offset);
  } else {
    Launch(count, stream, GatherPooledFieldsKernel, slots, offsets, num_fields, rows, dim, pooling,
           out, stride, offset);
  }
}

void ScatterAddFields(const uint32_t* slots, const uint32_t* offsets, int n, int num_fields,
                      const float* d, int stride, int offset, int dim, Pooling pooling,
                      float* grad_rows, cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(n) * num_fields * dim;
  if (offsets == nullptr) {
    Launch(count, stream, ScatterAddFieldsKernel, slots, num_fields, d, stride, offset, dim,
           grad_rows);
  } else {
    Launch(count, stream, ScatterAddPooledFieldsKernel, slots, offsets, num_fields, d, stride,
           offset, dim, pooling, grad_rows);
  }
}

void WideLogits(const uint32_t* slots, const uint32_t* offsets, int n, int num_fields,
                Pooling pooling, const float* w, const float* x, int num_dense,
                const float* dense_w, const float* base, float* logits, cudaStream_t stream) {
  if (offsets == nullptr) {
    Launch(n, stream, WideLogitsKernel, slots, num_fields, w, x, num_dense, dense_w, base, logits);
  } else {
    Launch(n, stream, PooledWideLogitsKernel, slots, offsets, num_fields, pooling, w, x, num_dense,
           dense_w, base, logits);
  }
}

void ScatterAddFieldWeights(const uint32_t* slots, const uint32_t* offsets, int n, int num_fields,
                            Pooling pooling, const float* dlogits, float* grad_w,
                            cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(n) * num_fields;
  if (offsets == nullptr) {
    Launch(count, stream, ScatterAddFieldWeightsKernel, slots, num_fields, dlogits, grad_w);
  } else {
    Launch(count, stream, ScatterAddPooledFieldWeightsKernel, slots, offsets, num_fields, pooling,
           dlogits, grad_w);
  }
}

void AddBiasActivate(float* y, int n, int width, const float* bias, Activation activation,
                     bool activate, cudaStream_t stream) {
  Launch(static_cast<int64_t>(n) * width, stream, AddBiasActivateKernel, y, width, bias, activation,
         activate);
}

void ActivationGrad(Activation activation, const float* y, const float* d_in, float* d_out,
                    size_t count, cudaStream_t stream) {
  Launch(static_cast<int64_t>(count), stream, ActivationGradKernel, activation, y, d_in, d_out);
}

void FmForward(const float* in, int n, int stride, int offset, int num_fields, int dim,
               float* logits, cudaStream_t stream) {
  if (num_fields == 0) return;
  LaunchWarps(n, stream, FmForwardKernel, in, stride, offset, num_fields, dim, logits);
}

void FmBackward(const float* in, int n, int stride, int offset, int num_fields, int dim,
                const float* dlogits, float* din, cudaStream_t stream) {
  if (num_fields == 0) return;
  LaunchWarps(n, stream, FmBackwardKernel, in, stride, offset, num_fields, dim, dlogits, din);
}

void DotForward(const float* z_rows, const float* in, int n, int stride, int offset, int num_fields,
                int dim, float* out, int out_stride, int out_offset, cudaStream_t stream) {
  const int64_t pairs = static_cast<int64_t>(num_fields) * (num_fields + 1) / 2;
  Launch(n * pairs, stream, DotForwardKernel, z_rows, in, stride, offset, num_fields, dim, out,
         out_stride, out_offset);
}

void DotBackward(const float* z_rows, const float* in, int n, int stride, int offset,
                 int num_fields, int dim, const float* dout, int out_stride, int out_offset,
                 float* dz_rows, float* din, cudaStream_t stream) {
  // Without fields there are no pairs and z gets nothing.
  if (num_fields == 0) return;
  Launch(static_cast<int64_t>(n) * (num_fields + 1) * dim, stream, DotBackwardKernel, z_rows, in,
         stride, offset, num_fields, dim, dout, out_stride, out_offset, dz_rows, din);
}

void SigmoidLogLoss(const float* logits, const float* labels, int n, float* predictions,
                    double* losses, float* dlogits, cudaStream_t stream) {
  const float inv_n = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
  Launch(n, stream, SigmoidLogLossKernel, logits, labels, inv_n, predictions, losses, dlogits);
}

void Fill(float* out, size_t count, float value, cudaStream_t stream) {
  Launch(static_cast<int64_t>(count), stream, FillKernel, out, value);
}

void WeightedColumnSums(cublasHandle_t cublas, const float* m, int rows, int cols, const float* w,
                        float* out) {
  if (cols == 0) return;
  if (rows == 0) {
    // BLAS returns early without touching y when a dimension is 0.
    cudaStream_t stream;
    EPS_CUBLAS_CHECK(Cublas().GetStream(cublas, &stream));
    EPS_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * cols, stream));
    return;
  }
  // Row-major m [rows, cols] is column-major [cols, rows] (lda = cols):
  // out = that matrix times w.
  const float one = 1.0f;
  const float zero = 0.0f;
  EPS_CUBLAS_CHECK(
      Cublas().Sgemv(cublas, CUBLAS_OP_N, cols, rows, &one, m, cols, w, 1, &zero, out, 1));
}

}  // namespace cuda
}  // namespace eps
