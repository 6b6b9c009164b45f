#include "models/device.h"

namespace eps {

CudaProbe ProbeCuda() {
  CudaProbe probe;
  probe.reason = "this build has no CUDA back end (nvcc was not found at configure time)";
  return probe;
}

}  // namespace eps
