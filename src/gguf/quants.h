// Scalar reference codecs for ggml's block-quantised types, bit-exact with ggml-quants.c's
// `quantize_row_*_ref` and `dequantize_row_*` (which are what llama-quantize produces when no
// importance matrix is given). They are the naive reference twin for the fast kernels: slow,
// obvious, and right.
//
// Block layouts are ggml's (little-endian, no padding; sizes static_asserted in quants.cc).
// Halves (F16 scales) are stored as raw uint16_t bits, converted with base/fp16.h.
//
// Exactness notes:
//  * quants.cc is compiled with -ffp-contract=off, so products and sums round as written in C.
//    ggml built with FMA contraction (-march=native, GCC's default -ffp-contract=fast in GNU
//    mode) can differ in the last bit of an intermediate and, rarely, in a quant.
//  * Inputs must be finite (ggml's casts of NaN/inf to int are undefined behaviour too).
//  * Q8_K: when a block is all zero ggml leaves `bsums` unwritten; we write zeros.
//
// Thread-safety: all functions are pure.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "gguf/ggml_type.h"

namespace arbor::gguf {

inline constexpr int kQK4_0 = 32;
inline constexpr int kQK4_1 = 32;
inline constexpr int kQK5_0 = 32;
inline constexpr int kQK5_1 = 32;
inline constexpr int kQK8_0 = 32;
inline constexpr int kQK8_1 = 32;
inline constexpr int kQK_K = 256;
inline constexpr int kKScaleSize = 12;

// x[i] = d * (q[i] - 8); element j in the low nibble of qs[j], element j+16 in the high one.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];
};
// x[i] = d * q[i] + m.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK4_1 / 2];
};
// x[i] = d * (q[i] - 16); the fifth bit of element j is bit j of qh (little-endian u32).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK5_0 / 2];
};
// x[i] = d * q[i] + m.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};
// x[i] = d * q[i].
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};
// x[i] = d * q[i]; s = d * sum(q).
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[kQK8_1];
};
// 16 sub-blocks of 16; scales[j] = scale (low nibble) | min (high nibble);
// x = d * scale * q - dmin * min, q in 0..3.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
// 16 sub-blocks of 16 with 6-bit signed scales packed in 12 bytes; q in -4..3 (high bit in
// hmask, set means "no -4").
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
// 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes; x = d*sc*q - dmin*m, q 0..15.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qs[kQK_K / 2];
};
// As Q4_K with a fifth bit per quant in qh; q 0..31.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
// 16 sub-blocks of 16 with int8 scales; x = d * scale * (q - 32), q 0..63 (4 low bits in ql,
// 2 high bits in qh).
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
// x = d * q (d is an f32); bsums[j] = sum of qs[16j .. 16j+15].
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};

// MXFP4 (OCP microscaling FP4): x[i] = e2m1(q[i]) * 2^(e - 127), q a 4-bit E2M1 value
// (sign, 2 exponent bits, 1 mantissa bit), e an E8M0 exponent. ggml keeps the E2M1 values
// doubled (kMxfp4Values) and halves the scale (e8m0_to_fp32_half). Element j in the low nibble
// of qs[j], element j+16 in the high one.
inline constexpr int kQKMxfp4 = 32;
struct BlockMxfp4 {
  uint8_t e;
  uint8_t qs[kQKMxfp4 / 2];
};
// IQ4_NL: x[i] = d * kIq4nlValues[q[i]], nibbles as Q4_0.
inline constexpr int kQK4_NL = 32;
struct BlockIq4Nl {
  uint16_t d;
  uint8_t qs[kQK4_NL / 2];
};
// IQ4_XS: 8 sub-blocks of 32; sub-block j's 6-bit scale ls = (scales_l[j/2] >> 4*(j%2)) & 15
// | ((scales_h >> 2j) & 3) << 4, x = d * (ls - 32) * kIq4nlValues[q]; sub-block j's nibbles
// are qs[16j .. 16j+15] as in IQ4_NL.
struct BlockIq4Xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
// The codebooks: IQ4's non-linear 4-bit values and the E2M1 values times two.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 128), ggml's GGML_E8M0_TO_FP32_HALF: the E8M0 scale halved (e = 0 and 1 give the
// denormals 2^-128 and 2^-127; e = 255 gives 2^127: ggml does not treat it as NaN).
float e8m0_to_fp32_half(uint8_t e);

// One block at a time. `x`/`y` hold the block's elements: [block_size].
void quantize_block_q4_0(const float* x, BlockQ4_0* y);
void quantize_block_q4_1(const float* x, BlockQ4_1* y);
void quantize_block_q5_0(const float* x, BlockQ5_0* y);
void quantize_block_q5_1(const float* x, BlockQ5_1* y);
void quantize_block_q8_0(const float* x, BlockQ8_0* y);
void quantize_block_q8_1(const float* x, BlockQ8_1* y);
void quantize_block_q2_K(const float* x, BlockQ2_K* y);
void quantize_block_q3_K(const float* x, BlockQ3_K* y);
void quantize_block_q4_K(const float* x, BlockQ4_K* y);
void quantize_block_q5_K(const float* x, BlockQ5_K* y);
void quantize_block_q6_K(const float* x, BlockQ6_K* y);
void quantize_block_q8_K(const float* x, BlockQ8_K* y);
// ggml's quantize_mxfp4 / quantize_iq4_nl / quantize_iq4_xs without an importance matrix (what
// llama-quantize writes): MXFP4 takes e = floor(log2(amax)) - 2 + 127 (clamped to 0..255 where
// ggml's cast would be undefined) and each value's nearest codebook entry; IQ4 searches 15
// scales per block of 32 (weights x^2) for the best least-squares fit, IQ4_XS then quantises
// the 8 block scales to 6 bits against the super-block's fp16 d.
void quantize_block_mxfp4(const float* x, BlockMxfp4* y);
void quantize_block_iq4_nl(const float* x, BlockIq4Nl* y);
void quantize_block_iq4_xs(const float* x, BlockIq4Xs* y);

void dequantize_block_q4_0(const BlockQ4_0& x, float* y);
void dequantize_block_q4_1(const BlockQ4_1& x, float* y);
void dequantize_block_q5_0(const BlockQ5_0& x, float* y);
void dequantize_block_q5_1(const BlockQ5_1& x, float* y);
void dequantize_block_q8_0(const BlockQ8_0& x, float* y);
void dequantize_block_q8_1(const BlockQ8_1& x, float* y);
void dequantize_block_q2_K(const BlockQ2_K& x, float* y);
void dequantize_block_q3_K(const BlockQ3_K& x, float* y);
void dequantize_block_q4_K(const BlockQ4_K& x, float* y);
void dequantize_block_q5_K(const BlockQ5_K& x, float* y);
void dequantize_block_q6_K(const BlockQ6_K& x, float* y);
void dequantize_block_q8_K(const BlockQ8_K& x, float* y);
void dequantize_block_mxfp4(const BlockMxfp4& x, float* y);
void dequantize_block_iq4_nl(const BlockIq4Nl& x, float* y);
void dequantize_block_iq4_xs(const BlockIq4Xs& x, float* y);

// Sub-block j (0..7)'s 6-bit scale and min from Q4_K/Q5_K's 12 packed bytes `q`.
void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m);
// Q3_K's 16 six-bit scales minus 32 (so -32..31) from its 12 packed bytes. out: [16].
void unpack_scales_q3(const uint8_t* packed, int* out);

// Whether quantize_row / dequantize_row handle the type: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q8_1, Q2_K..Q8_K, MXFP4, IQ4_NL and IQ4_XS, both ways.
bool can_quantize(GgmlType type);
bool can_dequantize(GgmlType type);

// Whole rows. src: [n] floats; dst: ggml_row_size(type, n) bytes (any alignment).
// kInvalidArgument if n is negative or not a multiple of the block size; kUnimplemented for
// a type the function does not handle.
Status quantize_row(GgmlType type, const float* src, void* dst, int64_t n);
// src: ggml_row_size(type, n) bytes (any alignment); dst: [n] floats.
Status dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace arbor::gguf
