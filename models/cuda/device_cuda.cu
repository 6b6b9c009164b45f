#include <cuda_runtime.h>

#include "models/device.h"

namespace eps {

CudaProbe ProbeCuda() {
  CudaProbe probe;
  probe.compiled = true;
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // No driver, an old driver or no device: all mean "no GPU here".
    probe.reason = cudaGetErrorString(error);
    return probe;
  }
  probe.device_count = count;
  if (count == 0) probe.reason = "no CUDA device is visible";
  return probe;
}

}  // namespace eps
