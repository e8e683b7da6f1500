// Memory read-bandwidth microbenchmark: all threads of the pool stream-read
// disjoint parts of one large buffer and reduce it (AVX2 when active, else
// scalar), so the figure is what a memory-bound GEMV can at best reach.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/thread_pool.h"

namespace arbor::kernels {

// A probe that can be read again and again (a benchmark probes next to each
// timed run, since on a shared host the bandwidth moves by 2x within seconds):
// allocates and touches its buffer of `bytes` (rounded up to 4 KiB) once. Uses
// `pool`, which must outlive it.
class ReadBandwidthProbe {
public:
  explicit ReadBandwidthProbe(ThreadPool &pool,
                              size_t bytes = size_t{256} << 20);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe &) = delete;
  ReadBandwidthProbe &operator=(const ReadBandwidthProbe &) = delete;

  // Times `reps` full reads (reps >= 1) and returns the best rate in GB/s (1e9
  // bytes per second).
  double measure(int reps);

private:
  ThreadPool &pool_;
  size_t bytes_ = 0;
  uint8_t *data_ = nullptr;
  std::unique_ptr<uint32_t[]>
      sink_; // [num_threads * 16] per-thread sums, a cache line apart
};

// ReadBandwidthProbe(pool, bytes).measure(reps): one probe, one reading.
double measure_read_bandwidth_gbs(ThreadPool &pool,
                                  size_t bytes = size_t{256} << 20,
                                  int reps = 5);

} // namespace arbor::kernels
