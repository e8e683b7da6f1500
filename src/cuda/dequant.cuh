// Device-side decoding of one weight element in ggml's block encoding (F32, F16, BF16, Q8_0,
// Q4_0): the same f32 value as gguf::dequantize_row on the host (q * d rounded once in f32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gguf/ggml_type.h"

namespace arbor::cuda {

// Element c of a weight row starting at `row` (device memory).
__device__ __forceinline__ float weight_at(const uint8_t* row, gguf::GgmlType type, int64_t c) {
  switch (type) {
    case gguf::GgmlType::kF32:
      return reinterpret_cast<const float*>(row)[c];
    case gguf::GgmlType::kF16:
      return __half2float(reinterpret_cast<const __half*>(row)[c]);
    case gguf::GgmlType::kBF16:
      return __uint_as_float((uint32_t)reinterpret_cast<const uint16_t*>(row)[c] << 16);
    case gguf::GgmlType::kQ8_0: {  // 34-byte blocks: f16 scale, 32 int8
      const uint8_t* blk = row + (c / 32) * 34;
      const float d = __half2float(*reinterpret_cast<const __half*>(blk));
      return __fmul_rn((float)reinterpret_cast<const int8_t*>(blk + 2)[c % 32], d);
    }
    case gguf::GgmlType::kQ4_0: {  // 18-byte blocks: f16 scale, 16 bytes of nibbles
      const uint8_t* blk = row + (c / 32) * 18;
      const float d = __half2float(*reinterpret_cast<const __half*>(blk));
      const int j = (int)(c % 32);
      const uint8_t byte = blk[2 + (j & 15)];
      const int q = (j < 16 ? (byte & 0x0f) : (byte >> 4)) - 8;
      return __fmul_rn((float)q, d);
    }
    default:
      return __int_as_float(0x7fc00000);  // unreachable: matmul_supported() is checked on the host
  }
}

}  // namespace arbor::cuda
