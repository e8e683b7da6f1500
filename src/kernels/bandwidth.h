// Memory read-bandwidth microbenchmark: all threads of the pool stream-read disjoint parts of
// one large buffer and reduce it (AVX2 when active, else scalar), so the figure is what a
// memory-bound GEMV can at best reach.
#pragma once

#include <cstddef>

#include "kernels/thread_pool.h"

namespace arbor::kernels {

// Allocates and touches `bytes` (rounded up to 4 KiB), then times `reps` full reads and
// returns the best rate in GB/s (1e9 bytes per second). reps >= 1.
double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes = size_t{256} << 20, int reps = 5);

}  // namespace arbor::kernels
