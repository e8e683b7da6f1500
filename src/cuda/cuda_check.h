// Error handling around the CUDA runtime, for src/cuda's own sources (includes cuda_runtime.h).
//
//   ARBOR_CUDA_CHECK(cudaMemcpyAsync(...));          // aborts with the call, file and line
//   ARBOR_RETURN_IF_ERROR(cuda_status(cudaMalloc(&p, n), "cudaMalloc"));
//
// A CUDA call failing is a broken invariant (CHECK) except where the environment can cause it:
// no device, out of memory, which are Status values with the numbers in the message.
#pragma once

#include <cuda_runtime.h>

#include "base/check.h"
#include "base/status.h"

#define ARBOR_CUDA_CHECK(call)                                              \
  do {                                                                      \
    const cudaError_t arbor_cuda_err_ = (call);                             \
    ARBOR_CHECK(arbor_cuda_err_ == cudaSuccess)                             \
        << #call << ": " << cudaGetErrorName(arbor_cuda_err_) << ": "      \
        << cudaGetErrorString(arbor_cuda_err_);                             \
  } while (false)

// After a kernel launch: the launch itself failed (bad configuration, no device).
#define ARBOR_CUDA_CHECK_LAUNCH() ARBOR_CUDA_CHECK(cudaGetLastError())

namespace arbor::cuda {

// ok for cudaSuccess; otherwise an internal error "<what>: <name>: <description>" (clearing the
// runtime's last error, so a failed allocation does not poison the next launch check).
inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return ok_status();
  (void)cudaGetLastError();
  return internal_error(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

}  // namespace arbor::cuda
