#include "models/cuda/cuda_model.h"

namespace eps {

StatusOr<std::unique_ptr<Model>> CreateCudaModel(const ModelOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  return absl::FailedPreconditionError(
      "this build has no CUDA back end (nvcc was not found at configure time); "
      "use the CPU model");
}

Status LoadCudaLibraries() {
  return absl::FailedPreconditionError(
      "this build has no CUDA back end (nvcc was not found at configure time)");
}

}  // namespace eps
