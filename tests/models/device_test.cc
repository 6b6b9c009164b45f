#include "models/device.h"

#include "gtest/gtest.h"

namespace eps {
namespace {

TEST(Device, CpuIsAlwaysAvailable) {
  StatusOr<Device> device = ResolveDevice("cpu");
  ASSERT_TRUE(device.ok());
  EXPECT_EQ(*device, Device::kCpu);
  EXPECT_STREQ(DeviceName(*device), "cpu");
}

TEST(Device, RejectsUnknownNames) {
  StatusOr<Device> device = ResolveDevice("tpu");
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("tpu"), absl::string_view::npos);
}

TEST(Device, AutoFollowsTheProbeAndCudaExplainsAbsence) {
  const CudaProbe probe = ProbeCuda();
#ifdef EPS_HAVE_CUDA
  EXPECT_TRUE(probe.compiled);
#else
  EXPECT_FALSE(probe.compiled);
#endif
  StatusOr<Device> automatic = ResolveDevice("auto");
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(*automatic, probe.device_count > 0 ? Device::kCuda : Device::kCpu);
  StatusOr<Device> cuda = ResolveDevice("cuda");
  if (probe.device_count > 0) {
    ASSERT_TRUE(cuda.ok());
    EXPECT_EQ(*cuda, Device::kCuda);
  } else {
    // No GPU is not an error of the probe; asking for one is.
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(probe.reason.empty());
    EXPECT_NE(cuda.status().message().find(probe.reason), absl::string_view::npos);
  }
}

}  // namespace
}  // namespace eps
