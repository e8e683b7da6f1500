// The device a test's models run on. A test source compiled with
// ARBOR_TEST_ON_CUDA (the gpu-labelled twins of the model and engine suites,
// tests/cuda/CMakeLists.txt) runs them on CUDA GPU 0, and every test of that
// executable is skipped, saying why, when there is none; compiled without it,
// on the CPU.
//
// Header-only: the executables that include it link arbor_executor.
#pragma once

#include <gtest/gtest.h>

#include "executor/device.h"
#include "executor/executor_options.h"
#include "model/runner.h"

namespace arbor::test {

#ifdef ARBOR_TEST_ON_CUDA
inline constexpr executor::Device kTestDevice = executor::Device::kCuda;
#else
inline constexpr executor::Device kTestDevice = executor::Device::kCpu;
#endif

// RunnerOptions::make_ops for kTestDevice (null for the CPU); fails the current
// test when the device cannot be had.
inline model::RunnerOptions::OpsFactory test_ops() {
  Result<executor::DeviceChoice> c = executor::choose_device(kTestDevice, 0);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? c->make_ops : nullptr;
}

#ifdef ARBOR_TEST_ON_CUDA
// Skips every test of the executable when no GPU is present.
class SkipWithoutGpu : public ::testing::Environment {
public:
  void SetUp() override {
    Result<executor::DeviceChoice> c =
        executor::choose_device(executor::Device::kCuda, 0);
    if (!c.ok())
      GTEST_SKIP() << c.status().message();
  }
};
inline ::testing::Environment *const kSkipWithoutGpu =
    ::testing::AddGlobalTestEnvironment(new SkipWithoutGpu());
#endif

} // namespace arbor::test
