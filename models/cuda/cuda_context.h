// CUDA plumbing of the CUDA models: error checks, cuBLAS (loaded when the
// first CUDA model is made), the stream and cuBLAS handle a model computes
// on (CudaContext), and grow-only device and pinned host buffers.
//
// Internal to models/: only .cu files include this header (it includes the
// CUDA headers, which host code never sees).
//
// Thread-safety: one thread at a time per object. A CudaContext has one
// owner (the model); everything else receives it explicitly.

#ifndef EPS_MODELS_CUDA_CONTEXT_H_
#define EPS_MODELS_CUDA_CONTEXT_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "core/logging.h"
#include "core/status.h"

// A failing CUDA or cuBLAS call in the middle of a step leaves the device in
// an unknown state: a bug-level failure, not a Status.
#define EPS_CUDA_CHECK(expr)                                                                    \
  do {                                                                                          \
    const cudaError_t eps_cuda_error_ = (expr);                                                 \
    CHECK(eps_cuda_error_ == cudaSuccess) << #expr << ": " << cudaGetErrorName(eps_cuda_error_) \
                                          << ": " << cudaGetErrorString(eps_cuda_error_);       \
  } while (0)

#define EPS_CUBLAS_CHECK(expr)                                                           \
  do {                                                                                   \
    const cublasStatus_t eps_cublas_status_ = (expr);                                    \
    CHECK(eps_cublas_status_ == CUBLAS_STATUS_SUCCESS)                                   \
        << #expr << ": " << ::eps::cuda::Cublas().GetStatusName(eps_cublas_status_) << ": " \
        << ::eps::cuda::Cublas().GetStatusString(eps_cublas_status_);                    \
  } while (0)

namespace eps {
namespace cuda {

// The cuBLAS functions the models call. The library is opened (dlopen) when
// the first CUDA model is created, not linked: mapping cuBLAS costs a
// process ~200 MB of resident memory and start-up time, which a worker
// training on the CPU should never pay.
struct CublasApi {
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasDestroy_v2) Destroy;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasGetStream_v2) GetStream;
  decltype(&cublasSetMathMode) SetMathMode;
  decltype(&cublasSgemm_v2) Sgemm;
  decltype(&cublasSgemv_v2) Sgemv;
  decltype(&cublasGetStatusName) GetStatusName;
  decltype(&cublasGetStatusString) GetStatusString;
};

// Opens cuBLAS once (later calls return the first result). Safe for
// concurrent use. kFailedPrecondition naming the library and dlerror() when
// it cannot be opened or lacks a function.
StatusOr<const CublasApi*> LoadCublas();

// The loaded functions. REQUIRES: LoadCublas() has succeeded (every
// CudaContext made sure of it).
const CublasApi& Cublas();

// The GPU, stream and cuBLAS handle one model computes on. The handle is
// bound to the stream, so cuBLAS calls and our kernels run in issue order.
class CudaContext {
 public:
  // Uses the calling thread's current GPU. kFailedPrecondition (with the
  // CUDA or cuBLAS error) when the GPU cannot be used or refuses a stream or
  // handle.
  static StatusOr<std::unique_ptr<CudaContext>> Create();
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }

  // Makes device() current on the calling thread (a per-thread setting).
  void Activate() const;
  // Blocks until all work issued on stream() has finished.
  void Synchronize() const;

 private:
  CudaContext() = default;

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

// Where a GrowOnlyBuffer lives: device memory, or page-locked host memory
// (copies to and from the GPU then run asynchronously on the stream).
enum class Memory { kDevice, kPinnedHost };

// Memory that only grows: Reserve keeps the allocation when it is large
// enough. REQUIRES of Reserve: no work still in flight uses the buffer
// (reallocating frees the old memory).
template <Memory kMemory>
class GrowOnlyBuffer {
 public:
  GrowOnlyBuffer() = default;
  ~GrowOnlyBuffer();
  GrowOnlyBuffer(const GrowOnlyBuffer&) = delete;
  GrowOnlyBuffer& operator=(const GrowOnlyBuffer&) = delete;

  // Ensures room for `bytes`; the contents are lost when it grows. Returns
  // true when it grew.
  bool Reserve(size_t bytes);
  size_t capacity() const { return capacity_; }

  void* data() const { return data_; }
  // The buffer as `T`s, from byte `offset` on.
  template <typename T>
  T* as(size_t offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(data_) + offset);
  }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

using DeviceBuffer = GrowOnlyBuffer<Memory::kDevice>;
using PinnedBuffer = GrowOnlyBuffer<Memory::kPinnedHost>;

// Capacity to allocate when `needed` bytes do not fit in `capacity`: at
// least half again as much, so that slowly growing batches do not
// reallocate on every step.
size_t GrownCapacity(size_t capacity, size_t needed);

// Rounds `bytes` up to the 256-byte alignment of cudaMalloc, so that every
// tensor packed into one buffer starts aligned.
inline size_t AlignBytes(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace cuda
}  // namespace eps

#endif  // EPS_MODELS_CUDA_CONTEXT_H_
