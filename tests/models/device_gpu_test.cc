// GPU tests (CTest label `gpu`): they skip, saying why, where no GPU is
// visible.

#include "gtest/gtest.h"
#include "models/device.h"

namespace eps {
namespace {

// Label gpu: runs only where a GPU is visible.
TEST(DeviceGpu, ProbeSeesTheGpu) {
  const CudaProbe probe = ProbeCuda();
  if (probe.device_count == 0) {
    GTEST_SKIP() << "no GPU visible (" << probe.reason << "): skipping";
  }
  EXPECT_TRUE(probe.compiled);
  EXPECT_GT(probe.device_count, 0);
}

}  // namespace
}  // namespace eps
