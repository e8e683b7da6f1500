// The forward's small kernels (cuda/device_ops.h). Arithmetic that must match the host bit for
// bit, or stay the same whatever the compiler fuses, is written with explicit round-to-nearest
// intrinsics (__fmul_rn, __fadd_rn, ...), which nvcc never contracts into FMAs.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/device_ops.h"

namespace arbor::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int threads = kThreads) {
  return (unsigned)std::max<int64_t>(1, (n + threads - 1) / threads);
}

// Launch: one thread per (t, i), blocks of 256.
__global__ void rope_tables_kernel(const int32_t* positions, int32_t n, const float* inv_freq,
                                   int half, float* cos_out, float* sin_out) {
  const int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= (int64_t)n * half) return;
  const int64_t t = o / half;
  const int i = (int)(o % half);
  const double angle = __dmul_rn((double)positions[t], (double)inv_freq[i]);
  cos_out[o] = (float)cos(angle);
  sin_out[o] = (float)sin(angle);
}

// Threads per row of the row kernels (rms_norm_rows, flag_nonfinite, argmax_rows). A decode
// step has one row per kernel: its time is the latency of each thread's serial loads, so many
// threads, few loads each.
constexpr int kRowThreads = 1024;

// Sum of v over the block's threads, in a fixed order: a xor butterfly in each warp, then warp 0
// adds the warps' sums in warp order. Every thread gets the result. blockDim.x == kN.
template <int kN>
__device__ float block_sum(float v, float* shared /* [kN / 32 + 1] */) {
  for (int off = 16; off > 0; off /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) shared[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = shared[0];
    for (int w = 1; w < kN / 32; ++w) s = __fadd_rn(s, shared[w]);
    shared[kN / 32] = s;
  }
  __syncthreads();
  return shared[kN / 32];
}

// Launch: one block of kRowThreads per output row r; thread j handles elements j, j +
// kRowThreads, ...
__global__ void __launch_bounds__(kRowThreads) rms_norm_rows_kernel(const float* x,
                                                                   const int32_t* rows,
                                                                   const float* weight, float* y,
                                                                   int dim, float eps) {
  __shared__ float partial[kRowThreads / 32 + 1];
  const int64_t r = blockIdx.x;
  const float* xr = x + (rows != nullptr ? (int64_t)rows[r] : r) * dim;
  float ss = 0.0f;
#pragma unroll 4
  for (int i = threadIdx.x; i < dim; i += kRowThreads) ss = __fmaf_rn(xr[i], xr[i], ss);
  ss = block_sum<kRowThreads>(ss, partial);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), eps)));
  float* yr = y + r * dim;
#pragma unroll 4
  for (int i = threadIdx.x; i < dim; i += kRowThreads) {
    yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), weight[i]);
  }
}

// The cache element of (slot, kv head, d) in a [num_blocks, num_kv_heads, block_size, head_dim]
// pool.
__device__ __forceinline__ int64_t cache_index(int64_t slot, int head, int d,
                                               const model::QkvEpilogue& p) {
  const int64_t block = slot / p.block_size, off = slot % p.block_size;
  return ((block * p.num_kv_heads + head) * p.block_size + off) * p.head_dim + d;
}

__device__ __forceinline__ void store_kv(void* cache, int64_t idx, float v, kernels::KvDtype dt) {
  if (dt == kernels::KvDtype::kF16) {
    static_cast<__half*>(cache)[idx] = __float2half_rn(v);
  } else {
    static_cast<float*>(cache)[idx] = v;
  }
}

// Launch: grid (tokens, item blocks) of 128 threads: block (t, y) takes token t's items y * 128 +
// threadIdx.x, + 128 * gridDim.y, ... Work item w covers one pair of dimensions of
// one head: items [0, Hq * D/2) are q's, then k's, then v's. For q and k, pair x < rope_dim / 2
// is the rotated pair (2x, 2x+1) (or (x, x + rope_dim/2) for NeoX); the other pairs are the
// dimensions past rope_dim, two at a time. Disjoint pairs: no synchronisation.
__global__ void qkv_epilogue_kernel(model::QkvEpilogue p) {
  const int64_t t = blockIdx.x;
  const int pairs = p.head_dim / 2, half = p.rope_dim / 2;
  const int q_items = p.num_q_heads * pairs, kv_items = p.num_kv_heads * pairs;
  const int64_t slot = p.slot_mapping[t];
  for (int w = blockIdx.y * blockDim.x + threadIdx.x; w < q_items + 2 * kv_items;
       w += gridDim.y * blockDim.x) {
    const int which = w < q_items ? 0 : (w < q_items + kv_items ? 1 : 2);  // q, k, v
    const int local = which == 0 ? w : w - q_items - (which == 2 ? kv_items : 0);
    const int head = local / pairs, x = local % pairs;
    const int num_heads = which == 0 ? p.num_q_heads : p.num_kv_heads;
    float* base = which == 0 ? p.q : (which == 1 ? p.k : p.v);
    const float* bias = which == 0 ? p.bq : (which == 1 ? p.bk : p.bv);
    float* row = base + (t * num_heads + head) * p.head_dim;
    const bool rotate = which != 2 && x < half;
    int i0, i1;
    if (which == 2) {
      i0 = 2 * x;
      i1 = 2 * x + 1;
    } else if (rotate) {
      i0 = p.rope_neox ? x : 2 * x;
      i1 = p.rope_neox ? x + half : 2 * x + 1;
    } else {
      i0 = p.rope_dim + 2 * (x - half);
      i1 = i0 + 1;
    }
    float a = row[i0], b = row[i1];
    if (bias != nullptr) {
      a = __fadd_rn(a, bias[head * p.head_dim + i0]);
      b = __fadd_rn(b, bias[head * p.head_dim + i1]);
    }
    if (rotate) {
      const float c = p.cos[t * half + x], s = p.sin[t * half + x];
      const float ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      const float rb = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
      a = ra;
      b = rb;
    }
    row[i0] = a;
    row[i1] = b;
    if (which != 0) {
      void* cache = which == 1 ? p.k_cache : p.v_cache;
      store_kv(cache, cache_index(slot, head, i0, p), a, p.kv_dtype);
      store_kv(cache, cache_index(slot, head, i1, p), b, p.kv_dtype);
    }
  }
}

// Launch (add, silu_mul): one thread per element, blocks of 256.
__global__ void add_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void silu_mul_kernel(float* gate, const float* up, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  gate[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
}

// Launch: one block of kRowThreads threads per listed row.
__global__ void __launch_bounds__(kRowThreads) flag_nonfinite_kernel(const float* x, const int32_t* rows, int dim,
                                      uint8_t* flags) {
  const float* xr = x + (int64_t)rows[blockIdx.x] * dim;
  int bad = 0;
#pragma unroll 4
  for (int i = threadIdx.x; i < dim; i += blockDim.x) bad |= !isfinite(xr[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) flags[blockIdx.x] = 1;
}

// Launch: one block of kRowThreads threads per row. Each thread keeps the first maximum of its
// strided columns (so the lowest index among its equal maxima), then a fixed tree halves the
// pairs, preferring the larger value and, between equal ones, the lower index.
__global__ void __launch_bounds__(kRowThreads) argmax_rows_kernel(const float* x, int cols,
                                                                  int32_t* ids) {
  __shared__ float best_value[kRowThreads];
  __shared__ int32_t best_index[kRowThreads];
  const float* xr = x + (int64_t)blockIdx.x * cols;
  float v = -INFINITY;
  int32_t idx = INT32_MAX;
  int bad = 0;
#pragma unroll 8
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float e = xr[c];
    bad |= !isfinite(e);
    if (e > v || idx == INT32_MAX) {
      v = e;
      idx = c;
    }
  }
  best_value[threadIdx.x] = v;
  best_index[threadIdx.x] = idx;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float ov = best_value[threadIdx.x + half];
      const int32_t oi = best_index[threadIdx.x + half];
      if (ov > best_value[threadIdx.x] ||
          (ov == best_value[threadIdx.x] && oi < best_index[threadIdx.x])) {
        best_value[threadIdx.x] = ov;
        best_index[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (__syncthreads_or(bad)) {
    if (threadIdx.x == 0) ids[blockIdx.x] = -1;
  } else if (threadIdx.x == 0) {
    ids[blockIdx.x] = best_index[0];
  }
}

// Launch: grid (x, regions), 256 threads; block row y copies region y, blocks along x striding.
__global__ void copy_regions_kernel(const CopyRegion* regions) {
  const CopyRegion r = regions[blockIdx.y];
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const bool aligned = ((uintptr_t)r.dst % 16 == 0) && ((uintptr_t)r.src % 16 == 0);
  int64_t done = 0;
  if (aligned) {
    const int64_t vecs = (int64_t)(r.bytes / 16);
    for (int64_t i = first; i < vecs; i += stride) {
      static_cast<uint4*>(r.dst)[i] = static_cast<const uint4*>(r.src)[i];
    }
    done = vecs * 16;
  }
  for (int64_t i = done + first; i < (int64_t)r.bytes; i += stride) {
    static_cast<uint8_t*>(r.dst)[i] = static_cast<const uint8_t*>(r.src)[i];
  }
}

}  // namespace

void launch_rope_tables(const int32_t* positions, int32_t n, const float* inv_freq, int half,
                        float* cos, float* sin, cudaStream_t stream) {
  if (n <= 0 || half <= 0) return;
  rope_tables_kernel<<<blocks_for((int64_t)n * half), kThreads, 0, stream>>>(positions, n,
                                                                             inv_freq, half, cos,
                                                                             sin);
  ARBOR_CUDA_CHECK_LAUNCH();
}

void launch_rms_norm_rows(const float* x, const int32_t* rows, int32_t n, const float* weight,
                          float* y, int dim, float eps, cudaStream_t stream) {
  if (n <= 0) return;
  rms_norm_rows_kernel<<<(unsigned)n, kRowThreads, 0, stream>>>(x, rows, weight, y, dim, eps);
  ARBOR_CUDA_CHECK_LAUNCH();
}

void launch_qkv_epilogue(const model::QkvEpilogue& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  ARBOR_CHECK(p.head_dim % 2 == 0 && p.rope_dim % 2 == 0 && p.rope_dim <= p.head_dim)
      << "head_dim " << p.head_dim << ", rope_dim " << p.rope_dim;
  ARBOR_CHECK(p.num_q_heads > 0 && p.num_kv_heads > 0 && p.block_size > 0);
  // Enough blocks per token that a decode step's one token spreads over SMs (8B: 48 of them).
  const int items = (p.num_q_heads + 2 * p.num_kv_heads) * (p.head_dim / 2);
  const unsigned per_token = (unsigned)std::clamp((items + 127) / 128, 1, 64);
  qkv_epilogue_kernel<<<dim3((unsigned)p.num_tokens, per_token), 128, 0, stream>>>(p);
  ARBOR_CUDA_CHECK_LAUNCH();
}

void launch_add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  ARBOR_CUDA_CHECK_LAUNCH();
}

void launch_silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, n);
  ARBOR_CUDA_CHECK_LAUNCH();
}

void launch_flag_nonfinite(const float* x, const int32_t* rows, int32_t n, int dim,
                           uint8_t* flags, cudaStream_t stream) {
  if (n <= 0) return;
  flag_nonfinite_kernel<<<(unsigned)n, kRowThreads, 0, stream>>>(x, rows, dim, flags);
  ARBOR_CUDA_CHECK_LAUNCH();
}

void launch_argmax_rows(const float* x, int32_t n, int32_t cols, int32_t* ids,
                        cudaStream_t stream) {
  if (n <= 0) return;
  ARBOR_CHECK_GT(cols, 0);
  argmax_rows_kernel<<<(unsigned)n, kRowThreads, 0, stream>>>(x, cols, ids);
  ARBOR_CUDA_CHECK_LAUNCH();
}

void launch_copy_regions(const CopyRegion* regions, int32_t n, size_t max_bytes,
                         cudaStream_t stream) {
  // Enough blocks per region that a 2 MiB KV block copy spreads over several SMs.
  const unsigned x = (unsigned)std::clamp<size_t>(max_bytes / (kThreads * 16 * 4), 1, 64);
  for (int32_t first = 0; first < n; first += 65535) {  // gridDim.y limit
    const int32_t count = std::min<int32_t>(65535, n - first);
    copy_regions_kernel<<<dim3(x, (unsigned)count), kThreads, 0, stream>>>(regions + first);
    ARBOR_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace arbor::cuda
