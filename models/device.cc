#include "models/device.h"

#include "absl/strings/str_cat.h"

namespace eps {

StatusOr<Device> ResolveDevice(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name != "auto" && name != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", name, "' is not one of: auto, cpu, cuda"));
  }
  const CudaProbe probe = ProbeCuda();
  if (probe.device_count > 0) return Device::kCuda;
  if (name == "auto") return Device::kCpu;
  return absl::FailedPreconditionError(absl::StrCat("--device cuda: no usable GPU (", probe.reason, ")"));
}

const char* DeviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

}  // namespace eps
