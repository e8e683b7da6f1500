// The CUDA runtime as arbor sees it: whether there is a device, and what it is.
//
// Usable from code not compiled by nvcc (no CUDA headers). Built with -DARBOR_CUDA=OFF, the same
// functions exist (no_cuda.cc) and report that arbor was built without CUDA. The binary links
// the CUDA runtime statically, so it runs on machines with no driver at all: there
// device_count() is 0 and describe_devices() says why.
#pragma once

#include <cstddef>
#include <string>

#include "base/status.h"

namespace arbor::cuda {

// Number of usable CUDA devices; 0 when the driver, the device or CUDA support is missing.
// Never aborts. Thread-safe.
int device_count();

// One line per device: "cuda:0: NVIDIA H100 80GB HBM3, 132 SMs, 79.1 GiB, sm_90"; or, with no
// device, "no CUDA device: <the runtime's reason>" (e.g. "CUDA driver version is insufficient
// for CUDA runtime version" where no driver is installed).
std::string describe_devices();

// Device `device`'s read bandwidth in GB/s: the best of `reps` timed passes of a streaming read
// kernel over `bytes` of device memory (after one untimed pass). `arbor bench --device cuda`
// states its "% of bw" against it. Errors: no such device, the buffer not fitting.
Result<double> measure_read_bandwidth_gbs(int device, size_t bytes = size_t{1} << 30,
                                          int reps = 5);

}  // namespace arbor::cuda
