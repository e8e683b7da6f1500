// The kernels behind CudaForwardOps besides matmul and attention: host functions that launch one
// kernel each on `stream` and return at once. Every pointer is a device pointer; shapes as in
// model::ForwardOps (model/forward_ops.h), whose contracts these implement. Each op is batch
// invariant: a row's bits depend only on that row's inputs (fixed reduction orders).
// Usable from code not compiled by nvcc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/matmul.h"
#include "model/forward_ops.h"

namespace arbor::cuda {

// cos[t, i] = cos(positions[t] * inv_freq[i]) evaluated in double and rounded to f32 (so the
// tables equal the host's double-precision std::cos / std::sin); sin likewise. [n, half] each.
void launch_rope_tables(const int32_t* positions, int32_t n, const float* inv_freq, int half,
                        float* cos, float* sin, cudaStream_t stream);

// y[r] = x[rows ? rows[r] : r] / sqrt(mean(x^2) + eps) * weight, r < n; x, y: [*, dim].
// The sum of squares is reduced in one fixed order per row (256 threads, a fixed tree).
void launch_rms_norm_rows(const float* x, const int32_t* rows, int32_t n, const float* weight,
                          float* y, int dim, float eps, cudaStream_t stream);

// model::QkvEpilogue: biases, RoPE (kernels::rope_apply's arithmetic, each product and sum
// rounded separately, so the rotated values equal the host's bit for bit), K/V into the cache
// (F16 rounded to nearest even).
void launch_qkv_epilogue(const model::QkvEpilogue& p, cudaStream_t stream);

// y += x; [n].
void launch_add(float* y, const float* x, int64_t n, cudaStream_t stream);
// gate = gate / (1 + exp(-gate)) * up; [n].
void launch_silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream);
// flags[i] = 1 when row rows[i] of x ([*, dim]) has an Inf or NaN, else unchanged. [n].
void launch_flag_nonfinite(const float* x, const int32_t* rows, int32_t n, int dim,
                           uint8_t* flags, cudaStream_t stream);

// ids[r] = the lowest index of the maximum of row r of x ([n, cols]), or -1 when the row has an
// Inf or NaN. One block per row; the (value, index) pairs are reduced by a fixed tree, ties to the
// lower index. ids: [n].
void launch_argmax_rows(const float* x, int32_t n, int32_t cols, int32_t* ids,
                        cudaStream_t stream);

// model::ForwardOps::top_k_rows on the device: per row r < n of x ([n, cols]) the k best columns
// by (score descending, id ascending), score = (x - row max) * scale[r] rounded as the host does,
// written in increasing id to ids / values ([n, k]); all ids -1 for a row with an Inf or NaN.
// 1 <= k <= cols (CHECKed). One block per row: a radix select of the k-th key, then a block-wide
// prefix count gathers the keys above it and the lowest-id ties. scale: [n].
void launch_top_k_rows(const float* x, int32_t n, int32_t cols, int32_t k, const float* scale,
                       int32_t* ids, float* values, cudaStream_t stream);

// One region copy within device memory (DeviceMemory::Copy's layout, device-side).
struct CopyRegion {
  void* dst;
  const void* src;
  size_t bytes;
};
// Runs regions [0, n) of `regions` (a device array) as one kernel: one block row per region,
// 16-byte moves when the region is 16-byte aligned. The regions must not overlap one another
// (the caller splits a list with hazards into runs without). max_bytes: the largest region.
void launch_copy_regions(const CopyRegion* regions, int32_t n, size_t max_bytes,
                         cudaStream_t stream);

}  // namespace arbor::cuda
