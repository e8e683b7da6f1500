// Where a model runs: the one place --device is resolved into the forward's ops.
//
//   cpu   CpuForwardOps on the runner's thread pool (RunnerOptions::make_ops left null)
//   cuda  the CUDA ops of src/cuda on GPU `cuda_device`: an explicit opt-in. An error when this
//         build has no CUDA or no GPU is present (the message says which); while the CUDA
//         executor is unverified (kCudaVerified below), a warning says so
//   auto  the CPU until the CUDA executor has passed its GPU tests on a device (kCudaVerified);
//         after that, cuda when this build has CUDA, a GPU is present and the GPU path runs the
//         model (cuda::check_cuda_runs: its architecture, variants and weight types), else the
//         CPU, the startup log saying why
//
// docs/cuda.md, "Device choice", states the same record and how it flips.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "executor/executor_options.h"
#include "model/runner.h"

namespace arbor::executor {

// The record of the CUDA executor on a GPU: false until `make test-gpu` (every test labelled
// gpu: cuda_ops_test, cuda_matmul_gpu_test, cuda_model_gpu_test and the GPU twins of the golden
// suites) has passed on a device. When it flips to true, kCudaVerifiedOn names the commit and
// the card ("a1b2c3d on an NVIDIA H200"), and docs/cuda.md "Device choice" says the same.
inline constexpr bool kCudaVerified = true;
inline constexpr std::string_view kCudaVerifiedOn = "43ff484 on an NVIDIA H200";

struct DeviceChoice {
  Device device = Device::kCpu;               // kCpu or kCuda, never kAuto
  model::RunnerOptions::OpsFactory make_ops;  // null for the CPU
  std::string reason;   // why this device, for the startup log at info level (the caller's)
  std::string warning;  // non-empty when the choice runs unverified code (logged as a warning)
};

// What the choice depends on besides the request: the machine and the record.
struct DeviceFacts {
  int num_cuda_devices = 0;         // cuda::device_count()
  std::string devices;              // cuda::describe_devices()
  bool cuda_verified = kCudaVerified;
  std::string_view cuda_verified_on = kCudaVerifiedOn;
  // Why the GPU path does not run the model (cuda::check_cuda_runs); empty when it does or when
  // no model was named. auto then stays on the CPU; cuda fails later, at load, with the same.
  std::string model_refusal;
};

// The decision alone (pure; logs nothing): `requested` resolved against `facts`. Errors: --device
// cuda without a device; `cuda_device` out of range when CUDA is chosen.
Result<DeviceChoice> decide_device(Device requested, int cuda_device, const DeviceFacts& facts);

// decide_device() on this machine and kCudaVerified, for the model at `model_path` (when auto
// could choose a GPU, its weights are mapped, not read, to ask cuda::check_cuda_runs; empty: no
// model check). Logs `warning`, when there is one, at warning level; the caller logs `reason` at
// info level.
Result<DeviceChoice> choose_device(Device requested, int cuda_device,
                                   const std::string& model_path = "");

}  // namespace arbor::executor
