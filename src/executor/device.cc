#include "executor/device.h"

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

Result<DeviceChoice> choose_device(Device device, int cuda_device) {
  DeviceChoice c;
  if (device == Device::kCpu) {
    c.reason = "--device cpu";
    return c;
  }
  const int count = cuda::device_count();
  if (count == 0) {
    if (device == Device::kCuda) {
      return failed_precondition("--device cuda: ", cuda::describe_devices());
    }
    c.reason = str_cat("--device auto: ", cuda::describe_devices());
    return c;
  }
  if (cuda_device < 0 || cuda_device >= count) {
    return invalid_argument("--cuda-device is ", cuda_device,
                            ", this machine has ", count, " CUDA device",
                            count == 1 ? "" : "s", " (0..", count - 1, ")");
  }
  c.device = Device::kCuda;
  c.reason =
      str_cat("--device ", device_name(device), ": ", cuda::describe_devices());
  c.make_ops = [cuda_device](const model::LlamaModel &m) {
    return cuda::make_cuda_forward_ops(m, cuda_device);
  };
  return c;
}

} // namespace arbor::executor
