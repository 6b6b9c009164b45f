// Compute devices: which back end a worker runs its model on.
//
// `--device auto` picks CUDA when this build has the CUDA back end and a GPU
// is visible, else the CPU. Host code never includes CUDA headers; the
// probe lives in device_cuda.cu (or device_none.cc when CUDA is off).
//
// Thread-safety: safe for concurrent use.

#ifndef EPS_MODELS_DEVICE_H_
#define EPS_MODELS_DEVICE_H_

#include <string>

#include "core/status.h"

namespace eps {

enum class Device { kCpu, kCuda };

struct CudaProbe {
  // True when this binary was built with the CUDA back end.
  bool compiled = false;
  // Visible GPUs (0 when none or when the driver is unusable).
  int device_count = 0;
  // Why there is no GPU, in words ("driver version is insufficient ...").
  std::string reason;
};

// Asks the CUDA runtime how many GPUs are visible. Never fails: a missing
// or old driver means "no GPU", reported in `reason`.
CudaProbe ProbeCuda();

// Resolves "auto", "cpu" or "cuda" to a device. kInvalidArgument for another
// name; kFailedPrecondition when "cuda" is asked for and no GPU is usable
// (the message says why).
StatusOr<Device> ResolveDevice(const std::string& name);

// "cpu" or "cuda".
const char* DeviceName(Device device);

}  // namespace eps

#endif  // EPS_MODELS_DEVICE_H_
