// --device resolution (executor/device.h): auto stays on the CPU until the CUDA executor's record
// says it passed its GPU tests; --device cuda opts in with a warning while it has not; the record
// in the code and the one docs/cuda.md states agree. decide_device() is pure, so every case runs
// here with a pretended machine (GPUs present or not); choose_device() on this machine is checked
// against the record as it stands.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "executor/device.h"

namespace arbor::executor {
namespace {

constexpr char kTwoGpus[] = "cuda:0: NVIDIA H200, 132 SMs, 139.8 GiB, sm_90\n"
                            "cuda:1: NVIDIA H200, 132 SMs, 139.8 GiB, sm_90";

DeviceFacts facts(int gpus, bool verified) {
  DeviceFacts f;
  f.num_cuda_devices = gpus;
  f.devices = gpus > 0 ? kTwoGpus : "no CUDA device: CUDA driver version is insufficient";
  f.cuda_verified = verified;
  f.cuda_verified_on = verified ? "a1b2c3d on an NVIDIA H200" : "";
  return f;
}

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

TEST(DeviceChoice, AutoStaysOnTheCpuWithoutTheRecordEvenWithGpus) {
  Result<DeviceChoice> c = decide_device(Device::kAuto, 0, facts(2, false));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->device, Device::kCpu);
  EXPECT_FALSE(c->make_ops) << "auto must not build CUDA ops without the record";
  EXPECT_TRUE(c->warning.empty()) << c->warning;
  // The reason says why, where the record lives, how to opt in, and what is present.
  EXPECT_TRUE(contains(c->reason, "--device auto: the CPU, because the CUDA executor has never "
                                  "passed its GPU tests on a device"))
      << c->reason;
  EXPECT_TRUE(contains(c->reason, "kCudaVerified")) << c->reason;
  EXPECT_TRUE(contains(c->reason, "docs/cuda.md")) << c->reason;
  EXPECT_TRUE(contains(c->reason, "--device cuda opts in")) << c->reason;
  EXPECT_TRUE(contains(c->reason, "cuda:1: NVIDIA H200")) << c->reason;
}

TEST(DeviceChoice, AutoStaysOnTheCpuForAModelTheGpuPathRefuses) {
  DeviceFacts f = facts(2, true);
  f.model_refusal = "the CUDA executor has not run the qwen3 architecture on a GPU yet (qwen3); "
                    "serve this model with --device cpu";
  Result<DeviceChoice> c = decide_device(Device::kAuto, 0, f);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->device, Device::kCpu);
  EXPECT_FALSE(c->make_ops);
  EXPECT_TRUE(contains(c->reason, "--device auto: the CPU, because the CUDA executor has not run "
                                  "the qwen3 architecture"))
      << c->reason;
  EXPECT_TRUE(contains(c->reason, "cuda:1: NVIDIA H200")) << c->reason;
  // Explicit cuda still builds the GPU ops (whose load then fails with the same refusal).
  Result<DeviceChoice> cuda = decide_device(Device::kCuda, 0, f);
  ASSERT_TRUE(cuda.ok()) << cuda.status().to_string();
  EXPECT_EQ(cuda->device, Device::kCuda);
}

TEST(DeviceChoice, AutoOnThisMachineFollowsTheRecord) {
  Result<DeviceChoice> c = choose_device(Device::kAuto, 0);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  if (!kCudaVerified) {
    // On a GPU host too: the record, not the hardware, decides.
    EXPECT_EQ(c->device, Device::kCpu) << c->reason;
    EXPECT_FALSE(c->make_ops);
  }
  EXPECT_TRUE(c->warning.empty()) << c->warning;
}

TEST(DeviceChoice, TheRecordNamesItsCommitAndCardExactlyWhenSet) {
  EXPECT_EQ(kCudaVerified, !kCudaVerifiedOn.empty())
      << "kCudaVerifiedOn must name the commit and card when (and only when) kCudaVerified";
}

TEST(DeviceChoice, DocsCudaStatesTheSameRecord) {
  const std::string path = std::string(ARBOR_SOURCE_DIR) + "/docs/cuda.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  ASSERT_TRUE(contains(doc, "## Device choice")) << path << " has no \"Device choice\" section";
  // The statement is bold: **`kCudaVerified = false`** (or true, with the commit and card).
  if (kCudaVerified) {
    EXPECT_TRUE(contains(doc, "**`kCudaVerified = true`**")) << path;
    EXPECT_TRUE(contains(doc, std::string(kCudaVerifiedOn))) << path << " must name "
                                                             << kCudaVerifiedOn;
    EXPECT_FALSE(contains(doc, "**`kCudaVerified = false`**")) << path;
  } else {
    EXPECT_TRUE(contains(doc, "**`kCudaVerified = false`**")) << path;
    EXPECT_FALSE(contains(doc, "**`kCudaVerified = true`**")) << path;
  }
}

TEST(DeviceChoice, CudaOptsInWithAWarningWhileUnverified) {
  Result<DeviceChoice> c = decide_device(Device::kCuda, 1, facts(2, false));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->device, Device::kCuda);
  EXPECT_TRUE(c->make_ops);
  EXPECT_TRUE(contains(c->reason, "--device cuda (opted in)")) << c->reason;
  EXPECT_TRUE(contains(c->warning, "--device cuda runs unverified code: the CUDA executor has "
                                   "never passed its GPU tests on a device"))
      << c->warning;
  EXPECT_TRUE(contains(c->warning, "docs/cuda.md")) << c->warning;
}

TEST(DeviceChoice, AutoPicksCudaOnceVerified) {
  Result<DeviceChoice> c = decide_device(Device::kAuto, 0, facts(2, true));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->device, Device::kCuda);
  EXPECT_TRUE(c->make_ops);
  EXPECT_TRUE(c->warning.empty()) << c->warning;
  EXPECT_TRUE(contains(c->reason, "a1b2c3d on an NVIDIA H200")) << c->reason;
  Result<DeviceChoice> cuda = decide_device(Device::kCuda, 0, facts(2, true));
  ASSERT_TRUE(cuda.ok());
  EXPECT_TRUE(cuda->warning.empty()) << cuda->warning;
}

TEST(DeviceChoice, AutoWithoutAGpuIsTheCpuEitherWay) {
  for (bool verified : {false, true}) {
    Result<DeviceChoice> c = decide_device(Device::kAuto, 0, facts(0, verified));
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->device, Device::kCpu);
    EXPECT_FALSE(c->make_ops);
    EXPECT_TRUE(contains(c->reason, "no CUDA device: CUDA driver version is insufficient"))
        << c->reason;
  }
}

TEST(DeviceChoice, CpuIsTheCpuWhateverIsPresent) {
  Result<DeviceChoice> c = decide_device(Device::kCpu, 0, facts(2, true));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->device, Device::kCpu);
  EXPECT_FALSE(c->make_ops);
  EXPECT_EQ(c->reason, "--device cpu");
}

TEST(DeviceChoice, CudaWithoutAGpuIsAnError) {
  Result<DeviceChoice> c = decide_device(Device::kCuda, 0, facts(0, false));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.status().message(),
            "--device cuda: no CUDA device: CUDA driver version is insufficient");
}

TEST(DeviceChoice, CudaDeviceOutOfRangeIsAnError) {
  for (bool verified : {false, true}) {
    Result<DeviceChoice> c =
        decide_device(verified ? Device::kAuto : Device::kCuda, 2, facts(2, verified));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(c.status().message(), "--cuda-device is 2, this machine has 2 CUDA devices (0..1)");
  }
}

}  // namespace
}  // namespace arbor::executor
