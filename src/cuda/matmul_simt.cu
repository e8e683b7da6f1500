// The GPU matmul's CUDA-core kernels: F32 weights (fixed-order f32 chains), the naive reference
// (double accumulation) and the row gather. docs/cuda.md, "Matmul".
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "base/check.h"
#include "cuda/matmul_device.cuh"
#include "cuda/matmul_internal.cuh"

namespace arbor::cuda::internal {
namespace {

// F32 kernel: one warp per row, kF32Warps rows per block, tokens in passes of kF32Tokens.
constexpr int kF32Warps = 8;
constexpr int kF32Tokens = 8;

// Elements c..c+3 of p; past `cols` zeros. kVec: p and c 16-byte aligned and c + 3 < cols.
template <bool kVec>
__device__ __forceinline__ float4 load4(const float* p, int c, int cols) {
  if constexpr (kVec) {
    return *reinterpret_cast<const float4*>(p + c);
  } else {
    float4 v;
    v.x = p[c];  // c < cols: the loop bound
    v.y = c + 1 < cols ? p[c + 1] : 0.0f;
    v.z = c + 2 < cols ? p[c + 2] : 0.0f;
    v.w = c + 3 < cols ? p[c + 3] : 0.0f;
    return v;
  }
}

__device__ __forceinline__ float fma4(float4 a, float4 b, float acc) {
  acc = __fmaf_rn(a.x, b.x, acc);
  acc = __fmaf_rn(a.y, b.y, acc);
  acc = __fmaf_rn(a.z, b.z, acc);
  return __fmaf_rn(a.w, b.w, acc);
}

// y[t, r] for every token t: lane l sums columns 4l..4l+3, 4l+128.. in ascending order with one
// f32 FMA chain, then the 32 lane sums meet in a fixed xor butterfly (every lane ends with the
// same bits; lane 0 stores). The chain of (t, r) does not depend on num_tokens or on the pass
// t falls in, so the kernel is batch invariant. The vector and scalar loads give the same
// chains: the scalar path pads with zeros only when cols % 4 != 0, where kVec is never used.
template <bool kVec>
__global__ void __launch_bounds__(kF32Warps * 32)
    f32_kernel(const uint8_t* w, size_t row_stride, int32_t rows, int32_t cols, const float* x,
               int32_t num_tokens, float* y) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kF32Warps + threadIdx.x / 32;
  if (r >= rows) return;
  const float* wr = reinterpret_cast<const float*>(w + r * row_stride);
  for (int32_t t0 = 0; t0 < num_tokens; t0 += kF32Tokens) {
    const int nt = min(kF32Tokens, num_tokens - t0);
    const float* xt = x + static_cast<int64_t>(t0) * cols;
    float acc[kF32Tokens];
#pragma unroll
    for (int j = 0; j < kF32Tokens; ++j) acc[j] = 0.0f;
    for (int c = lane * 4; c < cols; c += 128) {
      const float4 wv = load4<kVec>(wr, c, cols);
#pragma unroll
      for (int j = 0; j < kF32Tokens; ++j) {
        if (j < nt) acc[j] = fma4(wv, load4<kVec>(xt + static_cast<int64_t>(j) * cols, c, cols), acc[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < kF32Tokens; ++j) {
      float v = acc[j];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
      if (j < nt && lane == 0) y[static_cast<int64_t>(t0 + j) * rows + r] = v;
    }
  }
}

// y[t, r] = sum_c dequant(W[r, c]) * x[t, c] in double; thread i computes y[i / rows, i % rows].
__global__ void ref_kernel(gguf::GgmlType type, const uint8_t* w, size_t row_stride, int32_t rows,
                           int32_t cols, const float* x, int32_t num_tokens, float* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(num_tokens) * rows) return;
  const int64_t t = i / rows, r = i % rows;
  const uint8_t* row = w + r * row_stride;
  const float* xt = x + t * cols;
  double acc = 0.0;
  for (int64_t c = 0; c < cols; ++c) {
    acc += static_cast<double>(weight_at(type, row, c)) * static_cast<double>(xt[c]);
  }
  y[i] = static_cast<float>(acc);
}

// out[i] = row ids[i] dequantised; one block per gathered row. An id out of range gives NaNs.
__global__ void get_rows_kernel(gguf::GgmlType type, const uint8_t* w, size_t row_stride,
                                int32_t rows, int32_t cols, const int32_t* ids, float* out) {
  const int64_t i = blockIdx.x;
  const int32_t id = ids[i];
  const bool ok = id >= 0 && id < rows;
  const uint8_t* row = w + static_cast<int64_t>(ok ? id : 0) * row_stride;
  float* o = out + i * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    o[c] = ok ? weight_at(type, row, c) : __int_as_float(0x7fc00000);
  }
}

}  // namespace

void launch_f32(const uint8_t* w, size_t row_stride, int32_t rows, int32_t cols, const float* x,
                int32_t num_tokens, float* y, cudaStream_t stream) {
  const bool vec = cols % 4 == 0 && row_stride % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const dim3 grid((rows + kF32Warps - 1) / kF32Warps);
  if (vec) {
    f32_kernel<true><<<grid, kF32Warps * 32, 0, stream>>>(w, row_stride, rows, cols, x,
                                                          num_tokens, y);
  } else {
    f32_kernel<false><<<grid, kF32Warps * 32, 0, stream>>>(w, row_stride, rows, cols, x,
                                                           num_tokens, y);
  }
  check_launch("f32_kernel");
}

void launch_ref(gguf::GgmlType type, const uint8_t* w, size_t row_stride, int32_t rows,
                int32_t cols, const float* x, int32_t num_tokens, float* y,
                cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t n = static_cast<int64_t>(num_tokens) * rows;
  ref_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      type, w, row_stride, rows, cols, x, num_tokens, y);
  check_launch("ref_kernel");
}

void launch_get_rows(gguf::GgmlType type, const uint8_t* w, size_t row_stride, int32_t rows,
                     int32_t cols, const int32_t* ids, int32_t n, float* out,
                     cudaStream_t stream) {
  const int threads = std::clamp(cols, 32, 256);
  get_rows_kernel<<<static_cast<unsigned>(n), threads, 0, stream>>>(type, w, row_stride, rows,
                                                                    cols, ids, out);
  check_launch("get_rows_kernel");
}

}  // namespace arbor::cuda::internal
