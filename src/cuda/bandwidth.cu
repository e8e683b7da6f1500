// measure_read_bandwidth_gbs (runtime.h): a read-only streaming kernel over one
// device buffer.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/runtime.h"

namespace arbor::cuda {
namespace {

// Launch: a grid-stride loop, 256 threads per block, 16-byte loads. Each thread
// XORs what it reads and writes one word only when it is a value no real buffer
// holds here (the buffer is zeroed), so the loads cannot be removed and almost
// nothing is written.
__global__ void read_kernel(const uint4 *__restrict__ data, size_t n,
                            uint32_t *sink) {
  uint32_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0xDEADBEEFu)
    *sink = acc;
}

} // namespace

Result<double> measure_read_bandwidth_gbs(int device, size_t bytes, int reps) {
  if (device < 0 || device >= device_count()) {
    return failed_precondition("no CUDA device ", device, ": ",
                               describe_devices());
  }
  ARBOR_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device), "cudaSetDevice"));
  cudaDeviceProp prop{};
  ARBOR_RETURN_IF_ERROR(
      cuda_status(cudaGetDeviceProperties(&prop, device), "properties"));
  bytes = std::max<size_t>(bytes / 16 * 16, 16);
  void *buf = nullptr;
  ARBOR_RETURN_IF_ERROR(
      cuda_status(cudaMalloc(&buf, bytes + 256), "cudaMalloc"));
  ARBOR_CUDA_CHECK(cudaMemset(buf, 0, bytes + 256));
  auto *sink =
      reinterpret_cast<uint32_t *>(static_cast<uint8_t *>(buf) + bytes);
  cudaEvent_t start, stop;
  ARBOR_CUDA_CHECK(cudaEventCreate(&start));
  ARBOR_CUDA_CHECK(cudaEventCreate(&stop));
  const int blocks = prop.multiProcessorCount * 8;
  float best_ms = 0.0f;
  for (int r = 0; r <= reps; ++r) { // round 0 warms up
    ARBOR_CUDA_CHECK(cudaEventRecord(start));
    read_kernel<<<blocks, 256>>>(static_cast<const uint4 *>(buf), bytes / 16,
                                 sink);
    ARBOR_CUDA_CHECK_LAUNCH();
    ARBOR_CUDA_CHECK(cudaEventRecord(stop));
    ARBOR_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    ARBOR_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r > 0 && (best_ms == 0.0f || ms < best_ms))
      best_ms = ms;
  }
  ARBOR_CUDA_CHECK(cudaEventDestroy(start));
  ARBOR_CUDA_CHECK(cudaEventDestroy(stop));
  ARBOR_CUDA_CHECK(cudaFree(buf));
  return static_cast<double>(bytes) / (best_ms * 1e-3) / 1e9;
}

} // namespace arbor::cuda
