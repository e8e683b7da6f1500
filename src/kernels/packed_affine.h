// Internal to the kernels module: packed weights and kernels for the "affine" block types —
// the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), the legacy Q4_1, Q5_0, Q5_1 and the 4-bit
// codebook types MXFP4, IQ4_NL, IQ4_XS. In each, one weight of row r in a run of 32 columns is
//     w = S * (u - zero) + M,
// u an unsigned integer of 2..6 bits (or a codebook's value plus zero, up to 8 bits), S the scale of its sub-block (32 columns, or 16 where
// the type's sub-blocks are 16 wide: "split"), M its offset (0 for types without mins).
// matmul() multiplies them against activations quantised to int8 blocks of 32 (ActBlockAffine),
// so each output is a sum of integer dot products with one or two f32 scales per block pair.
// For the super-block types (the K-quants and IQ4_XS: blocks_per_unit 8) the activations share
// one scale per 256 columns, as llama.cpp's Q8_K: a unit's blocks are summed with the weights'
// scales only, and the activation scale multiplies that sum once (affine_unit_end) — one f32
// product fewer per (row, token, block), which multi-token steps (verification) pay for.
// Layout, arithmetic and the per-type table: docs/kernels.md, "Affine packed types".
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "gguf/ggml_type.h"
#include "kernels/matmul.h"

namespace arbor::kernels::internal {

// The 4-bit codebook types (MXFP4, IQ4_NL, IQ4_XS) store an index u into a table of 16 int8
// values v; the kernels multiply v + zero, an unsigned byte, and subtract zero * sum(q) as for
// the fixed-zero types (kCodebookBytes: the tables with zero added).
enum class Codebook : uint8_t { kNone, kIq4nl, kFp4 };

// How one type is stored in the packed layout. Rows go 16 at a time (a group); a group's
// columns go in units of `blocks_per_unit` blocks of 32 (a K-quant super-block of 256, or one
// block of 32), each unit a header followed by its blocks' records:
//   header: [16 x fp16 d][16 x fp16 dm] (dm only with has_min); with e8m0: [16 x u8 e], the
//           rows' E8M0 exponents (d = 2^(e - 128), gguf::e8m0_to_fp32_half)
//   record: [nibble plane: 4 x 64 bytes]  (when nibbles) lane i (row i), byte m of word j holds
//                                          u[4j+m] & 15 | (u[16+4j+m] & 15) << 4
//           [crumb plane: 2 x 64 bytes]   (when crumbs) two bits of u, from bit c = (nibbles ?
//                                          4 : 0): lane i, byte m of word k holds in bits
//                                          2q, 2q+1 the bits c, c+1 of u[4(4k+q)+m]
//           [bit planes: 64 bytes each]   plane p: 8 little-endian u64, bit 4i+m of word j is
//                                          bit b + p of row i's u[4j+m], b = the bits above
//           [scales: 16 int8 per sub-block] (int_scales) row i's sub-block scale, lo then hi
//           [mins: 16 int8 per sub-block]   (int_scales && has_min)
// S = d * sc (or d without int_scales); M = fp16(dm) * mn (or fp16(dm)): for the K-quants dm is
// the negated dmin. Every product is exact in f32. The value multiplied is u itself, or with a
// codebook kCodebookBytes[u] (= v[u] + zero).
struct AffineFormat {
  bool nibbles = false;     // the low 4 bits of u live in the nibble plane
  bool crumbs = false;      // the next 2 bits of u live in the crumb plane
  int bit_planes = 0;       // further single-bit planes
  bool split = false;       // two sub-blocks of 16 per block of 32
  bool has_min = false;     // w = S*u + M (else S*(u - zero))
  int zero = 0;             // the offset subtracted from u when !has_min
  int blocks_per_unit = 1;  // 8 (super-blocks of 256) for the K-quants
  bool int_scales = false;  // per-sub-block int8 scales (and mins) times the header's d (dm)
  Codebook codebook = Codebook::kNone;  // u indexes a table (nibbles only)
  bool e8m0 = false;        // the header holds E8M0 exponents, not fp16 d

  constexpr int sub_blocks() const { return split ? 2 : 1; }
  constexpr size_t header_bytes() const { return e8m0 ? 16 : has_min ? 64 : 32; }
  constexpr int crumb_bit() const { return nibbles ? 4 : 0; }
  constexpr int first_plane_bit() const { return crumb_bit() + (crumbs ? 2 : 0); }
  constexpr int bits() const { return first_plane_bit() + bit_planes; }
  constexpr size_t crumb_offset() const { return nibbles ? 256 : 0; }
  constexpr size_t plane_offset() const { return crumb_offset() + (crumbs ? 128 : 0); }
  constexpr size_t scale_offset() const { return plane_offset() + 64 * bit_planes; }
  constexpr size_t record_bytes() const {
    return scale_offset() + (int_scales ? 16 * sub_blocks() * (has_min ? 2 : 1) : 0);
  }
  constexpr size_t unit_bytes() const { return header_bytes() + blocks_per_unit * record_bytes(); }
};

// The codebooks' values plus their formats' zero (128 for IQ4's -127..113, 12 for the doubled
// E2M1 values -12..12: small enough for AVX2's vpmaddubsw pairs), as unsigned bytes.
inline constexpr uint8_t kIq4nlBytes[16] = {1,   24,  45,  63,  79,  93,  106, 118,
                                            129, 141, 153, 166, 181, 197, 217, 241};
inline constexpr uint8_t kFp4Bytes[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                          12, 11, 10, 9,  8,  6,  4,  0};
constexpr const uint8_t* codebook_bytes(Codebook c) {
  return c == Codebook::kIq4nl ? kIq4nlBytes : c == Codebook::kFp4 ? kFp4Bytes : nullptr;
}

// The formats (docs/kernels.md has the table); a default AffineFormat for other types.
constexpr AffineFormat affine_format_of(gguf::GgmlType type) {
  using gguf::GgmlType;
  switch (type) {
    case GgmlType::kQ4_1:
      return {.nibbles = true, .has_min = true};
    case GgmlType::kQ5_0:
      return {.nibbles = true, .bit_planes = 1, .zero = 16};
    case GgmlType::kQ5_1:
      return {.nibbles = true, .bit_planes = 1, .has_min = true};
    case GgmlType::kQ2_K:
      return {.crumbs = true, .split = true, .has_min = true, .blocks_per_unit = 8,
              .int_scales = true};
    case GgmlType::kQ3_K:
      return {.crumbs = true, .bit_planes = 1, .split = true, .zero = 4, .blocks_per_unit = 8,
              .int_scales = true};
    case GgmlType::kQ4_K:
      return {.nibbles = true, .has_min = true, .blocks_per_unit = 8, .int_scales = true};
    case GgmlType::kQ5_K:
      return {.nibbles = true, .bit_planes = 1, .has_min = true, .blocks_per_unit = 8,
              .int_scales = true};
    case GgmlType::kQ6_K:
      return {.nibbles = true, .crumbs = true, .split = true, .zero = 32, .blocks_per_unit = 8,
              .int_scales = true};
    case GgmlType::kIQ4_NL:
      return {.nibbles = true, .zero = 128, .codebook = Codebook::kIq4nl};
    case GgmlType::kIQ4_XS:
      return {.nibbles = true, .zero = 128, .blocks_per_unit = 8, .int_scales = true,
              .codebook = Codebook::kIq4nl};
    case GgmlType::kMXFP4:
      return {.nibbles = true, .zero = 12, .codebook = Codebook::kFp4, .e8m0 = true};
    default:
      return {};
  }
}

// The unsigned value the kernels multiply for the stored u (u itself without a codebook).
constexpr int affine_value(const AffineFormat& f, uint8_t u) {
  return f.codebook == Codebook::kNone ? u : codebook_bytes(f.codebook)[u & 15];
}

// True for the eleven types above.
bool is_affine_type(gguf::GgmlType type);
// affine_format_of, CHECKing is_affine_type.
AffineFormat affine_format(gguf::GgmlType type);

// Block b (columns 32b .. 32b+31) of one row, decoded from the ggml encoding: the values of
// u and the raw scale fields (sc, mn: per sub-block; d, dm: fp16 bits, or d the E8M0 byte with
// e8m0). For the legacy types sc = mn = 1 and d, dm are the block's d and m; for IQ4_XS sc is
// the 6-bit scale minus 32.
struct AffineBlock {
  uint8_t u[32];
  int8_t sc[2];
  int8_t mn[2];
  uint16_t d;
  uint16_t dm;
};
// row: the row's ggml bytes; b < cols / 32.
void decode_affine_block(gguf::GgmlType type, const uint8_t* row, int64_t b, AffineBlock* out);
// S and M of sub-block h, in f32 exactly as the kernels form them.
float affine_scale(const AffineFormat& f, const AffineBlock& blk, int h);
float affine_offset(const AffineFormat& f, const AffineBlock& blk, int h);

// Packed bytes of a whole matrix (groups * units * unit_bytes).
size_t affine_packed_bytes(const WeightView& w);
// Writes the packed layout of w into dst (affine_packed_bytes(w) bytes).
void pack_affine(const WeightView& w, uint8_t* dst);

// One activation block: the int8 values (quantised like quantize_act_row_avx2, with one scale
// per act_scale_blocks(f) blocks), their scale d (the unit's, repeated in each of its blocks),
// the sums of the two halves (elements 0..15, 16..31), what a weight offset M multiplies for the
// whole block and for each half (msum, msum_half: d * float(sum) for the types scaled per
// block; float(sum) for the per-unit ones, whose d comes in at the unit's end) and the halves'
// initial integer dots for the weight type's zero (-zero * sum[h]; 0 for types with mins).
// 64 bytes, a cache line's size.
struct ActBlockAffine {
  int8_t qs[32];
  float d;
  int32_t sum[2];
  float msum;
  int32_t init[2];
  float msum_half[2];
};
static_assert(sizeof(ActBlockAffine) == 64);

// An activation block's fields after its qs, from its scale d and the sums of its halves
// (s0: qs[0..15], s1: qs[16..31]); both pack_act_row_affine paths end each block here.
inline void finish_act_block(const AffineFormat& f, float d, int32_t s0, int32_t s1,
                             ActBlockAffine& a) {
  a.d = d;
  a.sum[0] = s0;
  a.sum[1] = s1;
  // What an offset M multiplies: with the activation scale, or without it (per unit: d
  // multiplies the unit's sum at its end).
  const float scale = f.blocks_per_unit > 1 ? 1.0f : d;
  a.msum = scale * static_cast<float>(s0 + s1);
  a.init[0] = -f.zero * s0;
  a.init[1] = -f.zero * s1;
  a.msum_half[0] = scale * static_cast<float>(s0);
  a.msum_half[1] = scale * static_cast<float>(s1);
}

// Blocks of 32 activations sharing one scale for weights of format f: blocks_per_unit (8 for
// the super-block types, 1 for the others).
constexpr int act_scale_blocks(const AffineFormat& f) { return f.blocks_per_unit; }
// True when the kernels sum a unit's blocks before its activation scale (act_scale_blocks > 1).
constexpr bool scales_per_unit(const AffineFormat& f) { return f.blocks_per_unit > 1; }

// The loop of pack_act_row_affine over one ISA's pieces (the scalar twin and the AVX2 path
// give the same bytes): Pieces::absmax(x, n) = max|x|, Pieces::quantize(x, id, qs) one block's
// int8 values, Pieces::half_sums(qs, s0, s1) their halves' sums. Inlined where it is called, so
// the AVX2 instance inlines its pieces too.
template <class Pieces>
__attribute__((always_inline)) inline void pack_act_units(const float* x, int64_t cols,
                                                          const AffineFormat& f,
                                                          ActBlockAffine* out,
                                                          int64_t out_stride) {
  constexpr int64_t kBlock = sizeof(ActBlockAffine::qs);  // 32 activations a block
  const int64_t group = act_scale_blocks(f);
  for (int64_t g0 = 0; g0 < cols / kBlock; g0 += group) {
    const float* xg = x + g0 * kBlock;
    const float d = Pieces::absmax(xg, kBlock * group) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int64_t j = 0; j < group; ++j) {
      ActBlockAffine& a = out[(g0 + j) * out_stride];
      Pieces::quantize(xg + j * kBlock, id, a.qs);
      int32_t s0, s1;
      Pieces::half_sums(a.qs, s0, s1);
      finish_act_block(f, d, s0, s1, a);
    }
  }
}

// x: [cols] -> out[b * out_stride] for b in [0, cols / 32) (block-major like the Q4_0 packed
// path), for weights of format f (cols a multiple of 32 * act_scale_blocks(f)). `avx2`: quantise
// with quantize_act_group_avx2 (else the scalar twin; both give the same bytes).
void pack_act_row_affine(const float* x, int64_t cols, const AffineFormat& f, ActBlockAffine* out,
                         int64_t out_stride, bool avx2);
// Its AVX2 path (matmul_avx2.cc: the quantising pieces inlined into one loop).
void pack_act_row_affine_avx2(const float* x, int64_t cols, const AffineFormat& f,
                              ActBlockAffine* out, int64_t out_stride);

// The contribution of one (row, block) to one token's partial sum, added to acc in the kernels'
// order (every kernel, scalar or SIMD, does exactly these f32 operations per block), where lo /
// hi are the integer dots of u - zero with the halves of qs:
// Per-block scales (scales_per_unit false; acc is the output's running sum):
//   split:   t = hi * S1; t = fma(lo, S0, t); acc = fma(t, d, acc);
//            with mins: acc = fma(M0, msum0, acc); acc = fma(M1, msum1, acc)
//   else:    acc = fma(lo + hi, S*d, acc); with a min: acc = fma(M, msum, acc)
// Per-unit scales (acc is the unit's partial sum, started at 0; affine_unit_end adds it):
//   split:   acc = fma(lo, S0, acc); acc = fma(hi, S1, acc);
//            with mins: acc = fma(M0, msum0, acc); acc = fma(M1, msum1, acc)
//   else:    acc = fma(lo + hi, S, acc); with a min: acc = fma(M, msum, acc)
float affine_block_step(const AffineFormat& f, const AffineBlock& blk, const ActBlockAffine& a,
                        float acc);
// Per-unit scales: the output's running sum after a unit whose blocks summed to `unit`
// (fma(unit, a.d, acc); a: any of the unit's activation blocks).
inline float affine_unit_end(const ActBlockAffine& a, float unit, float acc) {
  return std::fma(unit, a.d, acc);
}

// affine_block_step's contribution to the output (with the activation scale) summed in double
// (the naive twin of matmul_ref_quantized_act: the same integer dots and f32 scale products,
// exact sums).
double affine_block_ref(const AffineFormat& f, const AffineBlock& blk, const ActBlockAffine& a);

// The scalar kernel (ISA scalar): y for rows [row_begin, row_end) from the ggml bytes,
// bit-identical to the AVX-512 kernel on the packed layout. acts: [cols / 32, num_tokens].
void affine_rows_scalar(const WeightView& w, const ActBlockAffine* acts, int64_t num_tokens,
                        float* y, int64_t row_begin, int64_t row_end);

// The AVX-512 VNNI kernel over w.packed: y for row groups [group_begin, group_end).
void affine_rows_avx512(const WeightView& w, const ActBlockAffine* acts, int64_t num_tokens,
                        float* y, int64_t group_begin, int64_t group_end);
// The AVX2 kernels over the same layout, bit-identical to the AVX-512 one: vpmaddubsw dots (any
// AVX2 CPU), and AVX-VNNI's 256-bit vpdpbusd (only where cpu_features().avxvnni).
void affine_rows_avx2(const WeightView& w, const ActBlockAffine* acts, int64_t num_tokens,
                      float* y, int64_t group_begin, int64_t group_end);
void affine_rows_avxvnni(const WeightView& w, const ActBlockAffine* acts, int64_t num_tokens,
                         float* y, int64_t group_begin, int64_t group_end);

}  // namespace arbor::kernels::internal
