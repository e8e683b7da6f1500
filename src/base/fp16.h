// Scalar IEEE half (F16) and bfloat16 (BF16) conversions. Round to nearest even; NaN stays NaN.
// Vectorised conversions live in the kernels module.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace arbor {

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00);  // NaN
  if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // overflow -> inf (incl. rounding)
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return (uint16_t)sign;  // below half of the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffff) | 0x800000;
    // value = mant * 2^(exp-150); a half subnormal counts units of 2^-24, so shift right by
    // 126 - exp (between 14 and 24 here).
    const uint32_t shift = 126 - exp;
    const uint32_t shifted = mant >> shift;
    // Round half to even on the bits shifted out.
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = shifted;
    if (rem > half || (rem == half && (shifted & 1))) ++r;
    return (uint16_t)(sign | r);
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits, half to even.
  uint32_t r = abs - ((127 - 15) << 23);
  r += 0xfff + ((r >> 13) & 1);
  return (uint16_t)(sign | (r >> 13));
}

inline float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>((uint32_t)h << 16); }

inline uint16_t fp32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

}  // namespace arbor
