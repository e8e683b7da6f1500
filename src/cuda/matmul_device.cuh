// Device helpers of the GPU matmul: reading ggml blocks (2-byte aligned) and the tensor-core
// instructions. Included by the matmul .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/ggml_dequant.h"
#include "cuda/matmul_internal.cuh"
#include "gguf/ggml_type.h"

namespace arbor::cuda::internal {

inline constexpr int kQ8Bytes = 34;  // ggml block_q8_0: f16 d, 32 x int8
inline constexpr int kQ4Bytes = 18;  // ggml block_q4_0: f16 d, 16 bytes of nibbles

__device__ __forceinline__ float f16_bits_to_float(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float bf16_bits_to_float(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// The weight streams are read once: through the non-coherent path, not kept in L1.
__device__ __forceinline__ uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 load_u128(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// Four bytes from a 2-byte aligned address (ggml's blocks are 18 and 34 bytes long).
__device__ __forceinline__ uint32_t load_u32_a2(const uint8_t* p) {
  return static_cast<uint32_t>(load_u16(p)) | (static_cast<uint32_t>(load_u16(p + 2)) << 16);
}

// Element c of a weight row, dequantised to f32 exactly as gguf::dequantize_row does
// (Q8_0/Q4_0: q * d rounded once; the affine types: ggml::affine_weight_at). Types other than
// matmul_supported's give NaN.
__device__ __forceinline__ float weight_at(gguf::GgmlType type, const uint8_t* row, int64_t c) {
  switch (type) {
    case gguf::GgmlType::kF32:
      return reinterpret_cast<const float*>(row)[c];
    case gguf::GgmlType::kF16:
      return f16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[c]);
    case gguf::GgmlType::kBF16:
      return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[c]);
    case gguf::GgmlType::kQ8_0: {
      const uint8_t* blk = row + (c / 32) * kQ8Bytes;
      const float d = f16_bits_to_float(*reinterpret_cast<const uint16_t*>(blk));
      const int q = static_cast<int8_t>(blk[2 + c % 32]);
      return __fmul_rn(static_cast<float>(q), d);
    }
    case gguf::GgmlType::kQ4_0: {
      const uint8_t* blk = row + (c / 32) * kQ4Bytes;
      const float d = f16_bits_to_float(*reinterpret_cast<const uint16_t*>(blk));
      const int j = static_cast<int>(c % 32);
      const uint8_t byte = blk[2 + (j & 15)];
      const int q = (j < 16 ? (byte & 0xF) : (byte >> 4)) - 8;
      return __fmul_rn(static_cast<float>(q), d);
    }
    default:
      if (ggml::is_affine(type)) return ggml::affine_weight_at(type, row, static_cast<int32_t>(c));
      return __int_as_float(0x7fc00000);
  }
}

// D = A B + C, m16n8k16, f16 or bf16 inputs, f32 accumulators (fragment layouts: PTX ISA,
// "Matrix fragments for mma.m16n8k16 with floating point type").
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// D = A B, m16n8k16, int8 inputs, exact int32 results: a0 = row g, k 4q..4q+3; a1 = row g + 8,
// the same k; b0 = k 4q..4q+3 of column g (PTX ISA, "Matrix fragments for mma.m16n8k16 with
// integer type").
__device__ __forceinline__ void mma_16816_s8(int32_t (&d)[4], uint32_t a0, uint32_t a1,
                                             uint32_t b0) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
      "{%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

// D = A B, m16n8k32, int8 inputs, exact int32 results (PTX ISA, "Matrix fragments for
// mma.m16n8k32").
__device__ __forceinline__ void mma_16832_s8(int32_t (&d)[4], uint32_t a0, uint32_t a1,
                                             uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The end of every tensor-core kernel: stores each warp's partial sums (acc[j][e]: the C fragment
// of token tile j) in shared memory, then sums them in slice order 0, 1, ... and writes y.
// Consecutive threads write consecutive rows.
template <int NT>
__device__ __forceinline__ void reduce_and_store(const float (&acc)[NT][4], const MmaArgs& a,
                                                 int64_t tile_row0, int64_t tok0) {
  __shared__ float partial[kMaxSlices][NT][4][32];
  const int slice = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) partial[slice][j][e][lane] = acc[j][e];
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < NT * kTokTile * kRowTile;
       i += static_cast<int>(blockDim.x)) {
    const int row_l = i % kRowTile, tok_l = i / kRowTile;
    const int j = tok_l / kTokTile, n = tok_l % kTokTile;
    // C fragment: c0, c1 = row g, tokens 2q, 2q + 1; c2, c3 = row g + 8, the same tokens.
    const int src_lane = (row_l % 8) * 4 + n / 2;
    const int e = (row_l / 8) * 2 + (n & 1);
    float sum = partial[0][j][e][src_lane];
    for (int s = 1; s < a.plan.slices; ++s) sum = __fadd_rn(sum, partial[s][j][e][src_lane]);
    const int64_t row = tile_row0 + row_l, tok = tok0 + tok_l;
    if (row < a.rows && tok < a.num_tokens) a.y[tok * a.rows + row] = sum;
  }
}

}  // namespace arbor::cuda::internal
