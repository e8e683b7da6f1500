#include "cuda/runtime.h"

#include <cstdio>

#include "base/status.h"
#include "cuda/cuda_check.h"

namespace arbor::cuda {

int device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string describe_devices() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return str_cat("no CUDA device: ", cudaGetErrorString(err));
  }
  if (n == 0) return "no CUDA device: the runtime found none";
  std::string out;
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      (void)cudaGetLastError();
      out += str_cat(d > 0 ? "\n" : "", "cuda:", d, ": (properties unavailable)");
      continue;
    }
    char gib[32];
    std::snprintf(gib, sizeof(gib), "%.1f", (double)prop.totalGlobalMem / (1ull << 30));
    out += str_cat(d > 0 ? "\n" : "", "cuda:", d, ": ", prop.name, ", ", prop.multiProcessorCount,
                   " SMs, ", gib, " GiB, sm_", prop.major, prop.minor);
  }
  return out;
}

}  // namespace arbor::cuda
