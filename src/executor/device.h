// Where a model runs: the one place --device is resolved into the forward's
// ops.
//
//   cpu   CpuForwardOps on the runner's thread pool (RunnerOptions::make_ops
//   left null) cuda  the CUDA ops of src/cuda on GPU `cuda_device`; an error
//   when this build has no CUDA
//         or no GPU is present (the message says which)
//   auto  cuda when this build has CUDA and a GPU is present, else cpu
#pragma once

#include <string>

#include "base/status.h"
#include "executor/executor_options.h"
#include "model/runner.h"

namespace arbor::executor {

struct DeviceChoice {
  Device device = Device::kCpu;              // kCpu or kCuda, never kAuto
  model::RunnerOptions::OpsFactory make_ops; // null for the CPU
  std::string reason; // why, for the startup log ("no CUDA device: ...")
};

// Resolves `device` (logs nothing; the caller logs `reason`).
Result<DeviceChoice> choose_device(Device device, int cuda_device);

} // namespace arbor::executor
