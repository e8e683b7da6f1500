// Device helpers of the GPU matmul: reading ggml blocks (2-byte aligned) and the tensor-core
// instructions. Included by the matmul .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

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
// (q * d rounded once). Types other than matmul_supported's give NaN.
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

}  // namespace arbor::cuda::internal
