// Arithmetic-peak microbenchmark: every thread of the pool runs independent multiply-add chains
// on registers only (no memory traffic), so the figures are what a compute-bound kernel on this
// ISA can at best reach. `arbor bench` states prefill and batched decode as a fraction of them.
#pragma once

#include "kernels/thread_pool.h"

namespace arbor::kernels {

struct ComputePeak {
  double f32_gflops = 0;  // f32 FMA: 2 flops per lane (AVX-512, else AVX2, else scalar)
  double int8_gops = 0;   // u8 x s8 -> s32 dot products (VNNI dpbusd, AVX-VNNI's on AVX2, else
                          // AVX2 maddubs + madd): 2 ops per multiply-add
  double bf16_gflops = 0;  // bf16 pair dot products into f32 (AVX-512 BF16 vdpbf16ps); 0 where
                           // the kernels do not use them
};

// Times `seconds` of each loop on all threads (best of 3) with active_isa()'s instructions.
ComputePeak measure_compute_peak(ThreadPool& pool, double seconds = 0.05);

}  // namespace arbor::kernels
