#include "executor/device.h"

#include "base/log.h"
#include "cuda/cuda_forward_ops.h"
#include "cuda/runtime.h"

namespace arbor::executor {

std::string_view device_name(Device d) {
  switch (d) {
  case Device::kAuto:
    return "auto";
  case Device::kCpu:
    return "cpu";
  case Device::kCuda:
    return "cuda";
  }
  return "?";
}

namespace {

constexpr std::string_view kUnverified =
    "the CUDA executor has never passed its GPU tests on a device (kCudaVerified is false in "
    "src/executor/device.h; docs/cuda.md, \"Device choice\")";

DeviceChoice cpu_choice(std::string reason) {
  DeviceChoice c;
  c.reason = std::move(reason);
  return c;
}

}  // namespace

Result<DeviceChoice> decide_device(Device requested, int cuda_device, const DeviceFacts& facts) {
  if (requested == Device::kCpu) return cpu_choice("--device cpu");
  const int count = facts.num_cuda_devices;
  if (requested == Device::kAuto) {
    if (!facts.cuda_verified) {
      return cpu_choice(str_cat("--device auto: the CPU, because ", kUnverified,
                                "; --device cuda opts in (", facts.devices, ")"));
    }
    if (count == 0) return cpu_choice(str_cat("--device auto: ", facts.devices));
    if (!facts.model_refusal.empty()) {
      return cpu_choice(str_cat("--device auto: the CPU, because ", facts.model_refusal, " (",
                                facts.devices, ")"));
    }
  }
  if (count == 0) return failed_precondition("--device cuda: ", facts.devices);
  if (cuda_device < 0 || cuda_device >= count) {
    return invalid_argument("--cuda-device is ", cuda_device, ", this machine has ", count,
                            " CUDA device", count == 1 ? "" : "s", " (0..", count - 1, ")");
  }
  DeviceChoice c;
  c.device = Device::kCuda;
  if (facts.cuda_verified) {
    c.reason = str_cat("--device ", device_name(requested), ": the CUDA executor passed its GPU "
                       "tests on ", facts.cuda_verified_on, "; ", facts.devices);
  } else {
    c.reason = str_cat("--device cuda (opted in): ", facts.devices);
    c.warning = str_cat("--device cuda runs unverified code: ", kUnverified,
                        ". Every CUDA kernel and the CUDA forward may be wrong or crash; "
                        "--device cpu is the verified path");
  }
  c.make_ops = [cuda_device](const model::LlamaModel& m) {
    return cuda::make_cuda_forward_ops(m, cuda_device);
  };
  return c;
}

Result<DeviceChoice> choose_device(Device requested, int cuda_device,
                                   const std::string& model_path) {
  DeviceFacts facts;
  if (requested != Device::kCpu) {
    facts.num_cuda_devices = cuda::device_count();
    facts.devices = cuda::describe_devices();
  }
  if (requested == Device::kAuto && facts.cuda_verified && facts.num_cuda_devices > 0 &&
      !model_path.empty()) {
    // Mapped, not packed: the load that follows reports a file it cannot read.
    Result<std::unique_ptr<model::LlamaModel>> m =
        model::LlamaModel::load(model_path, {.pack_for_cpu = false});
    if (m.ok()) {
      const Status runs = cuda::check_cuda_runs(**m);
      if (!runs.ok()) facts.model_refusal = runs.message();
    }
  }
  Result<DeviceChoice> c = decide_device(requested, cuda_device, facts);
  if (c.ok() && !c->warning.empty()) ARBOR_LOG(kWarn) << c->warning;
  return c;
}

}  // namespace arbor::executor
