#include <dlfcn.h>

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "models/cuda/cuda_context.h"

namespace eps {
namespace cuda {
namespace {

Status CudaError(const char* what, cudaError_t error) {
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA: ", what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

// Releases in destructors log instead of CHECK-failing: at process exit the
// CUDA runtime may already be unloading, which is no reason to crash.
void LogIfFailed(const char* what, cudaError_t error) {
  if (error != cudaSuccess && error != cudaErrorCudartUnloading) {
    LOG(ERROR) << "CUDA: " << what << ": " << cudaGetErrorString(error);
  }
}

// Where cuBLAS is: the library found at build time, else its soname on the
// loader's path.
constexpr const char* kCublasLibraries[] = {EPS_CUBLAS_PATH, EPS_CUBLAS_SONAME};

template <typename F>
bool Resolve(void* library, const char* name, F* function) {
  *function = reinterpret_cast<F>(dlsym(library, name));
  return *function != nullptr;
}

StatusOr<const CublasApi*> OpenCublas() {
  void* library = nullptr;
  std::string errors;
  for (const char* path : kCublasLibraries) {
    library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", dlerror());
  }
  if (library == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open cuBLAS (", errors, "); install the CUDA toolkit's cuBLAS or use --device cpu"));
  }
  // Never closed: the functions stay in use until the process exits.
  static CublasApi api;
  const bool ok = Resolve(library, "cublasCreate_v2", &api.Create) &&
                  Resolve(library, "cublasDestroy_v2", &api.Destroy) &&
                  Resolve(library, "cublasSetStream_v2", &api.SetStream) &&
                  Resolve(library, "cublasGetStream_v2", &api.GetStream) &&
                  Resolve(library, "cublasSetMathMode", &api.SetMathMode) &&
                  Resolve(library, "cublasSgemm_v2", &api.Sgemm) &&
                  Resolve(library, "cublasSgemv_v2", &api.Sgemv) &&
                  Resolve(library, "cublasGetStatusName", &api.GetStatusName) &&
                  Resolve(library, "cublasGetStatusString", &api.GetStatusString);
  if (!ok) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuBLAS lacks a function the models need: ", dlerror()));
  }
  return &api;
}

}  // namespace

StatusOr<const CublasApi*> LoadCublas() {
  static const StatusOr<const CublasApi*> loaded = OpenCublas();
  return loaded;
}

const CublasApi& Cublas() {
  StatusOr<const CublasApi*> api = LoadCublas();
  CHECK(api.ok()) << api.status();
  return **api;
}

StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create() {
  RETURN_IF_ERROR(LoadCublas().status());
  std::unique_ptr<CudaContext> context(new CudaContext());
  cudaError_t error = cudaGetDevice(&context->device_);
  if (error != cudaSuccess) return CudaError("selecting a GPU", error);
  // Force the runtime to create the device's context now, so that a GPU that
  // cannot be used fails here, as a Status, rather than in the first step.
  error = cudaFree(nullptr);
  if (error != cudaSuccess) return CudaError("initialising the GPU", error);
  // Non-blocking: the model's work need not wait for other libraries' work
  // on the legacy default stream.
  error = cudaStreamCreateWithFlags(&context->stream_, cudaStreamNonBlocking);
  if (error != cudaSuccess) return CudaError("creating a stream", error);
  cublasStatus_t status = Cublas().Create(&context->cublas_);
  if (status != CUBLAS_STATUS_SUCCESS) {
    context->cublas_ = nullptr;
    return absl::FailedPreconditionError(
        absl::StrCat("cuBLAS: creating a handle: ", Cublas().GetStatusString(status)));
  }
  status = Cublas().SetStream(context->cublas_, context->stream_);
  if (status == CUBLAS_STATUS_SUCCESS) {
    // Full FP32 products, never TF32 (the default mode keeps at least the
    // requested precision): the CUDA models must match the CPU models to
    // ~1e-5 relative, which TF32's 10-bit mantissa cannot.
    status = Cublas().SetMathMode(context->cublas_, CUBLAS_DEFAULT_MATH);
  }
  if (status != CUBLAS_STATUS_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuBLAS: configuring the handle: ", Cublas().GetStatusString(status)));
  }
  return context;
}

CudaContext::~CudaContext() {
  if (cublas_ != nullptr) {
    const cublasStatus_t status = Cublas().Destroy(cublas_);
    if (status != CUBLAS_STATUS_SUCCESS) {
      LOG(ERROR) << "cuBLAS: destroying the handle: " << Cublas().GetStatusString(status);
    }
  }
  if (stream_ != nullptr) LogIfFailed("destroying a stream", cudaStreamDestroy(stream_));
}

void CudaContext::Activate() const { EPS_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaContext::Synchronize() const { EPS_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

size_t GrownCapacity(size_t capacity, size_t needed) {
  return std::max(needed, AlignBytes(capacity + capacity / 2));
}

template <Memory kMemory>
GrowOnlyBuffer<kMemory>::~GrowOnlyBuffer() {
  if (data_ == nullptr) return;
  if constexpr (kMemory == Memory::kDevice) {
    LogIfFailed("freeing device memory", cudaFree(data_));
  } else {
    LogIfFailed("freeing pinned memory", cudaFreeHost(data_));
  }
}

// An allocation the device (or pinned host memory) cannot hold is
// std::bad_alloc, as on the CPU, so that the worker trains the batch in
// halves (worker/worker.cc); any other error is fatal. The buffer is left
// empty, and the failed call's error cleared.
static void ThrowIfOutOfMemory(cudaError_t error, void** data) {
  if (error == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    *data = nullptr;
    throw std::bad_alloc();
  }
  EPS_CUDA_CHECK(error);
}

template <Memory kMemory>
bool GrowOnlyBuffer<kMemory>::Reserve(size_t bytes) {
  if (bytes <= capacity_) return false;
  const size_t capacity = GrownCapacity(capacity_, bytes);
  if constexpr (kMemory == Memory::kDevice) {
    if (data_ != nullptr) EPS_CUDA_CHECK(cudaFree(data_));
    data_ = nullptr;
    capacity_ = 0;
    ThrowIfOutOfMemory(cudaMalloc(&data_, capacity), &data_);
  } else {
    if (data_ != nullptr) EPS_CUDA_CHECK(cudaFreeHost(data_));
    data_ = nullptr;
    capacity_ = 0;
    ThrowIfOutOfMemory(cudaMallocHost(&data_, capacity), &data_);
  }
  capacity_ = capacity;
  return true;
}

template class GrowOnlyBuffer<Memory::kDevice>;
template class GrowOnlyBuffer<Memory::kPinnedHost>;

}  // namespace cuda
}  // namespace eps
