// Decoding ggml's "affine" block types (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) straight
// from their GGUF bytes, written once for the host and the device: the GPU matmul's kernels, its
// naive twin and get_rows call these functions, and tests/cuda/cuda_unit_test.cc checks them on
// the host against gguf::dequantize_block_* and the CPU's kernels::internal::decode_affine_block,
// bit for bit. Plain C++ without nvcc; under nvcc every function is __host__ __device__.
//
// Every one of these types stores one weight of a run of 32 columns as
//     w = S * v + M        (v = u - zero, u the stored unsigned quant of 2..6 bits)
// with S the scale of its sub-block (32 columns, or 16 where the type is "split") and M its
// offset (types with a min only; the others have w = S * v). Both are f32 values formed exactly
// as gguf's dequantisation forms them (e.g. Q4_K: S = f16(d) * sc, M = -(f16(dmin) * m), each
// rounded once), so S * v + M, rounded twice (no fused multiply-add), is gguf's weight.
//
// The unit of decoding is a run: 4 consecutive columns col .. col + 3 of one row, col a multiple
// of 4. A run never straddles a sub-block. Rows are read from any 2-byte aligned address (ggml's
// blocks are 20..210 bytes long, not all multiples of 4): 4-byte fields as two 2-byte loads.
//
// Thread-safety: all functions are pure (they read the row only).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/fp16.h"
#include "gguf/ggml_type.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define ARBOR_HD __host__ __device__
#else
#define ARBOR_HD
#endif

namespace arbor::cuda::ggml {

// The geometry of one affine type (block_elems == 0: not an affine type).
struct AffineTraits {
  int32_t block_elems = 0;  // 32 (legacy types) or 256 (K-quant super-blocks)
  int32_t block_bytes = 0;  // ggml's block size
  bool split = false;       // two sub-blocks of 16 per run of 32 columns (else one)
  bool has_min = false;     // w = S * v + M (else w = S * v)
  int32_t zero = 0;         // v = u - zero (0 with a min)
};

ARBOR_HD constexpr AffineTraits affine_traits(gguf::GgmlType type) {
  using gguf::GgmlType;
  switch (type) {
    case GgmlType::kQ4_1:
      return {32, 20, false, true, 0};
    case GgmlType::kQ5_0:
      return {32, 22, false, false, 16};
    case GgmlType::kQ5_1:
      return {32, 24, false, true, 0};
    case GgmlType::kQ2_K:
      return {256, 84, true, true, 0};
    case GgmlType::kQ3_K:
      return {256, 110, true, false, 4};
    case GgmlType::kQ4_K:
      return {256, 144, false, true, 0};
    case GgmlType::kQ5_K:
      return {256, 176, false, true, 0};
    case GgmlType::kQ6_K:
      return {256, 210, true, false, 32};
    default:
      return {};
  }
}

ARBOR_HD constexpr bool is_affine(gguf::GgmlType type) {
  return affine_traits(type).block_elems != 0;
}

// ---- Primitives: one code path on the host and the device. ----

ARBOR_HD inline float half_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(h));
#else
  return fp16_to_fp32(h);
#endif
}

// a * b, a + b and fma(a, b, c), each rounded once to nearest even: never contracted on the
// device (the intrinsics), nor on the host (no FMA in the baseline ISA; the tests add
// -ffp-contract=off).
ARBOR_HD inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ARBOR_HD inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ARBOR_HD inline float fma_rn(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Little-endian loads; the device reads through the read-only data cache (the scale bytes of a
// super-block serve the 8 chunks of 32 columns that a warp decodes one after the other).
ARBOR_HD inline uint32_t load_u8(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}
// p: 2-byte aligned.
ARBOR_HD inline uint32_t load_u16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const unsigned short*>(p));
#else
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
#endif
}
// Four bytes at a 2-byte aligned address.
ARBOR_HD inline uint32_t load_u32(const uint8_t* p) {
  return load_u16(p) | (load_u16(p + 2) << 16);
}

// Each byte of u minus k, wrapping (as int8 values): exact for bytes below 128 and k <= 128.
ARBOR_HD constexpr uint32_t sub_bytes(uint32_t u, uint32_t k) {
  return ((u | 0x80808080u) - k * 0x01010101u) ^ 0x80808080u;
}
// Bits 0..3 of b, bit i to bit 0 of byte i.
ARBOR_HD constexpr uint32_t spread_bits4(uint32_t b) {
  return (b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21);
}

// ---- Runs. ----

// Columns col .. col + 3 of a row: v of column col + k in byte k of q (int8), and the S and M
// of their sub-block (offset 0 for types without a min).
struct WeightRun {
  uint32_t q = 0;
  float scale = 0.0f;
  float offset = 0.0f;
};

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes at s.
ARBOR_HD inline void scale_min_k4(const uint8_t* s, int j, uint32_t* sc, uint32_t* m) {
  if (j < 4) {
    *sc = load_u8(s + j) & 63;
    *m = load_u8(s + j + 4) & 63;
  } else {
    const uint32_t packed = load_u8(s + j + 4);
    *sc = (packed & 0xF) | ((load_u8(s + j - 4) >> 6) << 4);
    *m = (packed >> 4) | ((load_u8(s + j) >> 6) << 4);
  }
}

// Q4_K (144 bytes: f16 d, f16 dmin, scales[12], qs[128]) and Q5_K (176 bytes: the same with
// qh[32] before qs). Sub-block j = column / 32 of the super-block; its element l is the low
// (j even) or high (j odd) nibble of qs[32 (j / 2) + l], Q5_K's fifth bit is bit j of qh[l].
// kScales: also S and M (the kernels skip them for the second run of a 32-column sub-block).
template <bool kQ5, bool kScales = true>
ARBOR_HD inline WeightRun decode_run_k4(const uint8_t* row, int32_t col) {
  constexpr int64_t kBytes = kQ5 ? 176 : 144;
  const uint8_t* blk = row + (col >> 8) * kBytes;
  const int i = col & 255, j = i >> 5, l = i & 31;
  WeightRun r;
  r.q = (load_u32(blk + (kQ5 ? 48 : 16) + 32 * (j >> 1) + l) >> (4 * (j & 1))) & 0x0F0F0F0Fu;
  if constexpr (kQ5) r.q |= ((load_u32(blk + 16 + l) >> j) & 0x01010101u) << 4;
  if constexpr (kScales) {
    uint32_t sc, m;
    scale_min_k4(blk + 4, j, &sc, &m);
    r.scale = mul_rn(half_to_float(static_cast<uint16_t>(load_u16(blk))), static_cast<float>(sc));
    const auto neg_dmin = static_cast<uint16_t>(load_u16(blk + 2) ^ 0x8000u);
    r.offset = mul_rn(half_to_float(neg_dmin), static_cast<float>(m));
  }
  return r;
}

// Q6_K (210 bytes: ql[128], qh[64], int8 scales[16], f16 d). Half h = column / 128, quarter
// jj = column / 32 % 4, l = column % 32: the low 4 bits are nibble jj / 2 of
// ql[64 h + 32 (jj % 2) + l], the high 2 bits are bits 2 jj.. of qh[32 h + l]; v = u - 32;
// sub-block column / 16.
template <bool kScales = true>
ARBOR_HD inline WeightRun decode_run_q6_K(const uint8_t* row, int32_t col) {
  const uint8_t* blk = row + (col >> 8) * int64_t{210};
  const int i = col & 255, h = i >> 7, jj = (i >> 5) & 3, l = i & 31;
  const uint32_t ql = load_u32(blk + 64 * h + 32 * (jj & 1) + l);
  const uint32_t qh = load_u32(blk + 128 + 32 * h + l);
  const uint32_t u =
      ((ql >> (4 * (jj >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2 * jj)) & 0x03030303u) << 4);
  WeightRun r;
  r.q = sub_bytes(u, 32);
  if constexpr (kScales) {
    const auto sc = static_cast<int8_t>(load_u8(blk + 192 + (i >> 4)));
    r.scale =
        mul_rn(half_to_float(static_cast<uint16_t>(load_u16(blk + 208))), static_cast<float>(sc));
  }
  return r;
}

// Q3_K (110 bytes: hmask[32], qs[64], scales[12], f16 d). h, jj, l as Q6_K: the low 2 bits are
// bits 2 jj.. of qs[32 h + l], the third is bit 4 h + jj of hmask[l]; v = u - 4; sub-block
// s = column / 16 with the 6-bit scale (low nibble of scales[s % 8], the high one for s >= 8;
// bits 2 (s / 4).. of scales[8 + s % 4] on top) minus 32.
template <bool kScales = true>
ARBOR_HD inline WeightRun decode_run_q3_K(const uint8_t* row, int32_t col) {
  const uint8_t* blk = row + (col >> 8) * int64_t{110};
  const int i = col & 255, h = i >> 7, jj = (i >> 5) & 3, l = i & 31;
  const uint32_t low = (load_u32(blk + 32 + 32 * h + l) >> (2 * jj)) & 0x03030303u;
  const uint32_t high = (load_u32(blk + l) >> (4 * h + jj)) & 0x01010101u;
  WeightRun r;
  r.q = sub_bytes(low | (high << 2), 4);
  if constexpr (kScales) {
    const int s = i >> 4;
    const uint32_t nib = s < 8 ? load_u8(blk + 96 + s) & 0xF : load_u8(blk + 96 + s - 8) >> 4;
    const uint32_t top = (load_u8(blk + 96 + 8 + (s & 3)) >> (2 * (s >> 2))) & 3;
    const int sc = static_cast<int>(nib | (top << 4)) - 32;
    r.scale =
        mul_rn(half_to_float(static_cast<uint16_t>(load_u16(blk + 108))), static_cast<float>(sc));
  }
  return r;
}

// Q2_K (84 bytes: scales[16], qs[64], f16 d, f16 dmin). h, jj, l as Q6_K: u is bits 2 jj.. of
// qs[32 h + l]; sub-block s = column / 16: S = d * (scales[s] & 15), M = -(dmin * (scales[s] >>
// 4)).
template <bool kScales = true>
ARBOR_HD inline WeightRun decode_run_q2_K(const uint8_t* row, int32_t col) {
  const uint8_t* blk = row + (col >> 8) * int64_t{84};
  const int i = col & 255, h = i >> 7, jj = (i >> 5) & 3, l = i & 31;
  WeightRun r;
  r.q = (load_u32(blk + 16 + 32 * h + l) >> (2 * jj)) & 0x03030303u;
  if constexpr (kScales) {
    const uint32_t sc = load_u8(blk + (i >> 4));
    r.scale = mul_rn(half_to_float(static_cast<uint16_t>(load_u16(blk + 80))),
                     static_cast<float>(sc & 0xF));
    const auto neg_dmin = static_cast<uint16_t>(load_u16(blk + 82) ^ 0x8000u);
    r.offset = mul_rn(half_to_float(neg_dmin), static_cast<float>(sc >> 4));
  }
  return r;
}

// Q4_1 (20 bytes: f16 d, f16 m, qs[16]), Q5_0 (22: f16 d, qh[4], qs[16]), Q5_1 (24: f16 d,
// f16 m, qh[4], qs[16]). Element e of the block: the low (e < 16) or high nibble of qs[e % 16],
// the fifth bit bit e of qh (little-endian u32). S = d, M = m; Q5_0: v = u - 16.
template <gguf::GgmlType T, bool kScales = true>
ARBOR_HD inline WeightRun decode_run_legacy(const uint8_t* row, int32_t col) {
  constexpr AffineTraits kT = affine_traits(T);
  constexpr bool kQh = T != gguf::GgmlType::kQ4_1;
  constexpr int kQsAt = (kT.has_min ? 4 : 2) + (kQh ? 4 : 0);
  const uint8_t* blk = row + (col >> 5) * int64_t{kT.block_bytes};
  const int e = col & 31;
  uint32_t u = (load_u32(blk + kQsAt + (e & 15)) >> (4 * (e >> 4))) & 0x0F0F0F0Fu;
  if constexpr (kQh) u |= spread_bits4(load_u32(blk + (kT.has_min ? 4 : 2)) >> e) << 4;
  WeightRun r;
  r.q = kT.zero != 0 ? sub_bytes(u, kT.zero) : u;
  if constexpr (kScales) {
    r.scale = half_to_float(static_cast<uint16_t>(load_u16(blk)));
    if constexpr (kT.has_min) r.offset = half_to_float(static_cast<uint16_t>(load_u16(blk + 2)));
  }
  return r;
}

// The run at col (a multiple of 4) of a row of type T. kScales false: only q (scale and offset
// stay 0).
template <gguf::GgmlType T, bool kScales = true>
ARBOR_HD inline WeightRun decode_run(const uint8_t* row, int32_t col) {
  using gguf::GgmlType;
  if constexpr (T == GgmlType::kQ4_K)
    return decode_run_k4<false, kScales>(row, col);
  else if constexpr (T == GgmlType::kQ5_K)
    return decode_run_k4<true, kScales>(row, col);
  else if constexpr (T == GgmlType::kQ6_K)
    return decode_run_q6_K<kScales>(row, col);
  else if constexpr (T == GgmlType::kQ3_K)
    return decode_run_q3_K<kScales>(row, col);
  else if constexpr (T == GgmlType::kQ2_K)
    return decode_run_q2_K<kScales>(row, col);
  else {
    static_assert(T == GgmlType::kQ4_1 || T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1);
    return decode_run_legacy<T, kScales>(row, col);
  }
}

// The same for a type known at run time; a type that is not affine gives an all-zero run.
ARBOR_HD inline WeightRun decode_run(gguf::GgmlType type, const uint8_t* row, int32_t col) {
  using gguf::GgmlType;
  switch (type) {
    case GgmlType::kQ4_1:
      return decode_run<GgmlType::kQ4_1>(row, col);
    case GgmlType::kQ5_0:
      return decode_run<GgmlType::kQ5_0>(row, col);
    case GgmlType::kQ5_1:
      return decode_run<GgmlType::kQ5_1>(row, col);
    case GgmlType::kQ2_K:
      return decode_run<GgmlType::kQ2_K>(row, col);
    case GgmlType::kQ3_K:
      return decode_run<GgmlType::kQ3_K>(row, col);
    case GgmlType::kQ4_K:
      return decode_run<GgmlType::kQ4_K>(row, col);
    case GgmlType::kQ5_K:
      return decode_run<GgmlType::kQ5_K>(row, col);
    case GgmlType::kQ6_K:
      return decode_run<GgmlType::kQ6_K>(row, col);
    default:
      return {};
  }
}

// v of element k (0..3) of a run.
ARBOR_HD inline int32_t run_quant(const WeightRun& r, int k) {
  return static_cast<int8_t>(static_cast<uint8_t>(r.q >> (8 * k)));
}

// Weight k of a run in f32, bit-identical to gguf::dequantize_row: S * v, plus M with a min.
ARBOR_HD inline float run_weight(const WeightRun& r, int k, bool has_min) {
  const float sv = mul_rn(r.scale, static_cast<float>(run_quant(r, k)));
  return has_min ? add_rn(sv, r.offset) : sv;
}

// Element col of a row (any col), as gguf::dequantize_row gives it.
ARBOR_HD inline float affine_weight_at(gguf::GgmlType type, const uint8_t* row, int32_t col) {
  return run_weight(decode_run(type, row, col & ~3), col & 3, affine_traits(type).has_min);
}

// ---- One block of 32 columns against one token's int8 activations. ----

// What the kernels keep per (token, block of 32 activations) besides the int8 values, as
// kernels::internal::ActBlockAffine forms them: the activation scale d (the block's; for the
// K-quants, whose activations share one scale per super-block of 256, the super-block's) and
// what a weight offset M multiplies for each half and the whole block: d * f32(sum of the int8
// values), each product rounded once, or for the K-quants f32(sum) (their d multiplies a
// super-block's sum at its end, affine_unit_end).
struct alignas(16) ActSums {
  float d = 0.0f;
  float msum0 = 0.0f;  // for q[0..15]
  float msum1 = 0.0f;  // for q[16..31]
  float msum = 0.0f;   // for q[0..31]
};

// True for the types whose activations share one scale per super-block (the K-quants): their
// blocks sum into a partial sum that the scale multiplies once (kernels::internal::
// scales_per_unit).
ARBOR_HD constexpr bool scales_per_unit(const AffineTraits& t) { return t.block_elems > 32; }

// acc plus one block's contribution, in exactly the f32 operations of the CPU's
// kernels::internal::affine_block_step. lo, hi: the exact integer dots of v with the int8
// activations of columns 0..15 and 16..31 of the block (for a type that is not split only
// lo + hi matters); run_lo, run_hi: runs of either half (their scale and offset). For the
// K-quants acc is the super-block's partial sum (started at 0; affine_unit_end adds it).
template <gguf::GgmlType T>
ARBOR_HD inline float affine_step(int32_t lo, int32_t hi, const WeightRun& run_lo,
                                  const WeightRun& run_hi, const ActSums& a, float acc) {
  constexpr AffineTraits kT = affine_traits(T);
  constexpr bool kPerUnit = scales_per_unit(kT);
  if constexpr (kT.split) {
    if constexpr (kPerUnit) {
      acc = fma_rn(static_cast<float>(lo), run_lo.scale, acc);
      acc = fma_rn(static_cast<float>(hi), run_hi.scale, acc);
    } else {
      const float t = fma_rn(static_cast<float>(lo), run_lo.scale,
                             mul_rn(static_cast<float>(hi), run_hi.scale));
      acc = fma_rn(t, a.d, acc);
    }
    if constexpr (kT.has_min) {
      acc = fma_rn(run_lo.offset, a.msum0, acc);
      acc = fma_rn(run_hi.offset, a.msum1, acc);
    }
  } else {
    const float s = kPerUnit ? run_lo.scale : mul_rn(run_lo.scale, a.d);
    acc = fma_rn(static_cast<float>(lo + hi), s, acc);
    if constexpr (kT.has_min) acc = fma_rn(run_lo.offset, a.msum, acc);
  }
  return acc;
}

// The K-quants: the running sum after a super-block whose blocks summed to `part`
// (kernels::internal::affine_unit_end).
ARBOR_HD inline float affine_unit_end(const ActSums& a, float part, float acc) {
  return fma_rn(part, a.d, acc);
}

}  // namespace arbor::cuda::ggml
