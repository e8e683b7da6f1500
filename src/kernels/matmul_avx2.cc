// AVX2 + FMA + F16C matmul kernels. Compiled for baseline x86-64 with per-function target
// attributes (never a global -mavx2), so the binary still runs on older CPUs; matmul() only
// calls in here when cpu_features() reports the ISA.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/fp16.h"
#include "kernels/avx2_target.h"
#include "kernels/matmul_internal.h"
#include "kernels/packed_affine.h"


namespace arbor::kernels::internal {
namespace {

using gguf::GgmlType;

ARBOR_AVX2_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

ARBOR_AVX2_INLINE float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

// ---- float weights ---------------------------------------------------------------------------

// Eight consecutive weights of a float-typed row, widened to f32.
template <GgmlType kType>
ARBOR_AVX2_INLINE __m256 load_w8(const uint8_t* row, int64_t c) {
  if constexpr (kType == GgmlType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * 2));
    if constexpr (kType == GgmlType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <GgmlType kType>
inline float load_w1(const uint8_t* row, int64_t c) {
  if constexpr (kType == GgmlType::kF32) {
    float f;
    std::memcpy(&f, row + c * 4, sizeof(f));
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, row + c * 2, sizeof(h));
    return kType == GgmlType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
  }
}

// y[t0 + t, r0 + r] for an R x T tile; every weight vector is loaded once per tile and used for
// T tokens.
template <GgmlType kType, int R, int T>
ARBOR_AVX2 void float_tile(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0) {
  const WeightView& w = *a.w;
  const int64_t cols = w.cols;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r)
    rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r * rstep) * w.row_stride;
  const float* xs[T];
  for (int t = 0; t < T; ++t) xs[t] = a.x + (t0 + t) * cols;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load_w8<kType>(rows[r], c);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(xs[t] + c);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = hsum(acc[r][t]);
      for (int64_t k = c; k < cols; ++k) s += load_w1<kType>(rows[r], k) * xs[t][k];
      a.y[(t0 + t) * w.rows + r0 + r * rstep] = s;
    }
  }
}

// ---- Q8_0 / Q4_0 weights x int8 activations --------------------------------------------------

// The 32 weights of a block as signed int8, in element order.
template <GgmlType kType>
ARBOR_AVX2_INLINE __m256i load_qblock(const uint8_t* blk) {
  if constexpr (kType == GgmlType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  } else {
    // Low nibbles are elements 0..15 (low lane), high nibbles 16..31 (high lane).
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    const __m256i nibbles = _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
    return _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8));
  }
}

// R x T tile over all blocks. Per block: the weight bytes are unpacked once, the activation
// block loaded once, and each (row, token) pair costs sign + maddubs + madd + cvt + mul + fma.
// maddubs needs an unsigned operand, hence |w| and sign(a, w): |w| <= 128 and |a| <= 127 keep
// the pairwise int16 sums below 2 * 128 * 127 = 32512 (no saturation).
template <GgmlType kType, int R, int T>
ARBOR_AVX2 void quant_tile(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0) {
  const WeightView& w = *a.w;
  const int64_t nb = w.cols / kQBlock;
  constexpr size_t kBlockBytes = kType == GgmlType::kQ8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r)
    rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r * rstep) * w.row_stride;
  const int8_t* aq[T];
  const float* ad[T];
  for (int t = 0; t < T; ++t) {
    aq[t] = a.q.qs + (t0 + t) * w.cols;
    ad[t] = a.q.d + (t0 + t) * nb;
  }
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wq[R], wabs[R];
    __m256 wd[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = rows[r] + b * kBlockBytes;
      wq[r] = load_qblock<kType>(blk);
      wabs[r] = _mm256_sign_epi8(wq[r], wq[r]);
      wd[r] = _mm256_set1_ps(load_fp16(blk));
    }
    for (int t = 0; t < T; ++t) {
      const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq[t] + b * kQBlock));
      const __m256 dv = _mm256_broadcast_ss(ad[t] + b);
      for (int r = 0; r < R; ++r) {
        const __m256i p = _mm256_maddubs_epi16(wabs[r], _mm256_sign_epi8(av, wq[r]));
        const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        acc[r][t] = _mm256_fmadd_ps(s, _mm256_mul_ps(wd[r], dv), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) a.y[(t0 + t) * w.rows + r0 + r * rstep] = hsum(acc[r][t]);
  }
}

// Q4_0 GEMV for four rows and one token, two rows per 256-bit register: the 16 packed bytes of
// rows r and r+1 share a register, so one shift/mask unpacks both, and the activation halves are
// broadcast to both lanes. The nibbles stay unsigned (0..15) for maddubs and the "- 8" is
// subtracted afterwards with the token's precomputed pair sums (act_q4_sums_avx2):
//   sum_j (u_j - 8) a_j = sum_j u_j a_j - 8 sum_j a_j.
// int16 lanes stay below 2 * 2 * 15 * 127 + 4 * 8 * 127 = 11684 (no saturation).
// The nibbles of blocks blk0 and blk1 (two rows): lo = elements 0..15, hi = 16..31, row 0 in
// the low 128-bit lane, row 1 in the high one.
ARBOR_AVX2_INLINE void q4_pair_unpack(const uint8_t* blk0, const uint8_t* blk1, __m256i& lo,
                                      __m256i& hi) {
  const __m256i q = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk0 + 2))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk1 + 2)), 1);
  const __m256i mask = _mm256_set1_epi8(0x0F);
  lo = _mm256_and_si256(q, mask);
  hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
}

// int32 lane i of each 128-bit half: row's sum over elements 4i..4i+3 and 16+4i..16+4i+3.
ARBOR_AVX2_INLINE __m256i q4_pair_dot(__m256i lo, __m256i hi, __m256i alo, __m256i ahi,
                                      __m256i sums) {
  const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
  return _mm256_madd_epi16(_mm256_sub_epi16(p, sums), _mm256_set1_epi16(1));
}

ARBOR_AVX2_INLINE __m256i q4_pair_dot(const uint8_t* blk0, const uint8_t* blk1, __m256i alo,
                                      __m256i ahi, __m256i sums) {
  __m256i lo, hi;
  q4_pair_unpack(blk0, blk1, lo, hi);
  return q4_pair_dot(lo, hi, alo, ahi, sums);
}

// [d0 x4 | d1 x4]: the block scales of a row pair, laid out like q4_pair_dot's lanes.
ARBOR_AVX2_INLINE __m256 pair_d(const uint8_t* blk0, const uint8_t* blk1) {
  uint16_t h0, h1;
  std::memcpy(&h0, blk0, 2);
  std::memcpy(&h1, blk1, 2);
  const __m128i h = _mm_blend_epi16(_mm_set1_epi16(static_cast<short>(h0)),
                                    _mm_set1_epi16(static_cast<short>(h1)), 0xF0);
  return _mm256_cvtph_ps(h);
}

// pair_d * da: the pair's block scales times the token's.
ARBOR_AVX2_INLINE __m256 pair_scale(const uint8_t* blk0, const uint8_t* blk1, __m256 da) {
  return _mm256_mul_ps(pair_d(blk0, blk1), da);
}

// Software prefetch distance for the four row streams of the Q4_0 GEMV, a small gain on top of
// the long streams that rows_kernel / q4_0_gemv_rows set up.
constexpr int kPrefetchBytes = 1024;

// Rows r0 + {0, 1, 2, 3} * rstep.
ARBOR_AVX2 void q4_0_gemv4(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t) {
  const WeightView& w = *a.w;
  const int64_t nb = w.cols / kQBlock;
  const uint8_t* row0 = static_cast<const uint8_t*>(w.data) + r0 * w.row_stride;
  const size_t stride = w.row_stride * static_cast<size_t>(rstep);
  const int8_t* aq = a.q.qs + t * w.cols;
  const float* ad = a.q.d + t * nb;
  const int16_t* as = a.q.q4_sums + t * nb * 8;
  __m256 acc01 = _mm256_setzero_ps(), acc23 = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row0 + b * sizeof(BlockQ4_0);
    if ((b & 3) == 0) {
      for (int r = 0; r < 4; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(blk + r * stride + kPrefetchBytes), _MM_HINT_T0);
      }
    }
    const __m256i alo = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(aq + b * kQBlock)));
    const __m256i ahi = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(aq + b * kQBlock + 16)));
    const __m256i sums =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(as + b * 8)));
    const __m256 da = _mm256_broadcast_ss(ad + b);
    const __m256i p01 = q4_pair_dot(blk, blk + stride, alo, ahi, sums);
    const __m256i p23 = q4_pair_dot(blk + 2 * stride, blk + 3 * stride, alo, ahi, sums);
    acc01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p01), pair_scale(blk, blk + stride, da), acc01);
    acc23 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p23),
                            pair_scale(blk + 2 * stride, blk + 3 * stride, da), acc23);
  }
  float* y = a.y + t * w.rows + r0;
  // Lanes 0-3 belong to the first row of a pair, 4-7 to the second: one hadd tree for all four.
  const __m256 h = _mm256_hadd_ps(acc01, acc23);  // [r0 r0 r2 r2 | r1 r1 r3 r3]
  const __m256 h2 = _mm256_hadd_ps(h, h);         // [r0 r2 r0 r2 | r1 r3 r1 r3]
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, h2);
  y[0] = lanes[0];
  y[rstep] = lanes[4];
  y[2 * rstep] = lanes[1];
  y[3 * rstep] = lanes[5];
}

// Q4_0 R x T tile (GEMM and the GEMV's leftover rows) with q4_0_gemv4's arithmetic, so a
// token's bits do not depend on which kernel its batch size picks: rows go in pairs through
// q4_pair_dot (R == 1: the row paired with itself), 4 f32 lanes per row, result
// (l0 + l1) + (l2 + l3). Each pair's weights are unpacked once per block for T tokens, each
// token's activation halves and pair sums loaded once per block for all pairs: 8 instructions
// per row pair and token and block (the earlier sign-based tile needed 12).
template <int R, int T>
ARBOR_AVX2 void q4_tile(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0) {
  static_assert(R == 1 || R % 2 == 0);
  constexpr int P = (R + 1) / 2;  // row pairs
  const WeightView& w = *a.w;
  const int64_t nb = w.cols / kQBlock;
  const uint8_t* rows[2 * P];
  for (int r = 0; r < 2 * P; ++r) {
    rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + (R == 1 ? 0 : r) * rstep) * w.row_stride;
  }
  __m256 acc[P][T];
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < T; ++t) acc[p][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i lo[P], hi[P];
    __m256 wd[P];  // [d_2p x4 | d_2p+1 x4]
    for (int p = 0; p < P; ++p) {
      const uint8_t* blk0 = rows[2 * p] + b * sizeof(BlockQ4_0);
      const uint8_t* blk1 = rows[2 * p + 1] + b * sizeof(BlockQ4_0);
      q4_pair_unpack(blk0, blk1, lo[p], hi[p]);
      wd[p] = pair_d(blk0, blk1);
    }
    for (int t = 0; t < T; ++t) {
      const int64_t tok = t0 + t;
      const int8_t* aq = a.q.qs + tok * w.cols + b * kQBlock;
      const __m256i alo =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(aq)));
      const __m256i ahi =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(aq + 16)));
      const __m256i sums = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.q.q4_sums + (tok * nb + b) * 8)));
      const __m256 da = _mm256_broadcast_ss(a.q.d + tok * nb + b);
      for (int p = 0; p < P; ++p) {
        const __m256i s = q4_pair_dot(lo[p], hi[p], alo, ahi, sums);
        acc[p][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(wd[p], da), acc[p][t]);
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < T; ++t) {
      // q4_0_gemv4's reduction: hadd twice gives (l0 + l1) + (l2 + l3) per 128-bit half.
      const __m256 h = _mm256_hadd_ps(acc[p][t], acc[p][t]);
      const __m256 h2 = _mm256_hadd_ps(h, h);
      float* y = a.y + (t0 + t) * w.rows + r0;
      y[2 * p * rstep] = _mm256_cvtss_f32(h2);
      if constexpr (R > 1) y[(2 * p + 1) * rstep] = _mm_cvtss_f32(_mm256_extractf128_ps(h2, 1));
    }
  }
}

ARBOR_AVX2 void q4_0_gemv_rows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t q = (row_end - row_begin) / 4;  // rows per stream, see gemv_streams()
  for (int64_t i = 0; i < q; ++i) {
    for (int64_t t = 0; t < a.num_tokens; ++t) q4_0_gemv4(a, row_begin + i, q, t);
  }
  for (int64_t r = row_begin + 4 * q; r < row_end; ++r) {
    for (int64_t t = 0; t < a.num_tokens; ++t) q4_tile<1, 1>(a, r, 1, t);
  }
}

// ---- tiling drivers --------------------------------------------------------------------------

template <GgmlType kType, int R, int T>
ARBOR_AVX2_INLINE void tile(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0) {
  if constexpr (kType == GgmlType::kQ4_0) {
    q4_tile<R, T>(a, r0, rstep, t0);
  } else if constexpr (kType == GgmlType::kQ8_0) {
    quant_tile<kType, R, T>(a, r0, rstep, t0);
  } else {
    float_tile<kType, R, T>(a, r0, rstep, t0);
  }
}

// Runs tiles of T tokens over [t0, t1) for rows [r0, r0 + R), the last tile narrower.
template <GgmlType kType, int R, int T>
ARBOR_AVX2 void token_tiles(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0,
                            int64_t t1) {
  int64_t t = t0;
  for (; t + T <= t1; t += T) tile<kType, R, T>(a, r0, rstep, t);
  if constexpr (T > 1) {
    if (t < t1) token_tiles<kType, R, T - 1>(a, r0, rstep, t, t1);
  }
}

// Tokens are processed in blocks whose activations stay in L2 while the thread's rows stream
// past; inside a block each R-row weight tile stays in L1 across all token tiles.
//
// GEMV (one token block): the R rows of a tile come from R equal, contiguous quarters of the row
// range (rows i, i + q, i + 2q, ...), so each of the R read streams runs through q consecutive
// rows. Adjacent rows would make R streams of one row each (1152 bytes for Q4_0 at 2048 cols),
// and the hardware prefetcher would retrain at every tile: DRAM-resident matrices then read at
// about half the speed.
template <GgmlType kType, int R, int T, int64_t kTokenBlock>
ARBOR_AVX2 void rows_kernel(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  if (a.num_tokens <= T) {
    const int64_t q = (row_end - row_begin) / R;
    for (int64_t i = 0; i < q; ++i) token_tiles<kType, R, T>(a, row_begin + i, q, 0, a.num_tokens);
    for (int64_t r = row_begin + R * q; r < row_end; ++r) {
      token_tiles<kType, 1, T>(a, r, 1, 0, a.num_tokens);
    }
    return;
  }
  for (int64_t tb = 0; tb < a.num_tokens; tb += kTokenBlock) {
    const int64_t te = std::min(a.num_tokens, tb + kTokenBlock);
    int64_t r = row_begin;
    for (; r + R <= row_end; r += R) token_tiles<kType, R, T>(a, r, 1, tb, te);
    for (; r < row_end; ++r) token_tiles<kType, 1, T>(a, r, 1, tb, te);
  }
}

// GEMV (few tokens) favours more rows per tile; GEMM balances rows and tokens for registers.
template <GgmlType kType, int kGemvRows, int kGemmRows, int kGemmTokens, int64_t kTokenBlock>
ARBOR_AVX2 void type_kernel(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  if (kType == GgmlType::kQ4_0 && a.num_tokens < kGemmMinTokens) {
    q4_0_gemv_rows(a, row_begin, row_end);
  } else if (a.num_tokens < kGemmMinTokens) {
    rows_kernel<kType, kGemvRows, kGemmMinTokens - 1, kTokenBlock>(a, row_begin, row_end);
  } else {
    rows_kernel<kType, kGemmRows, kGemmTokens, kTokenBlock>(a, row_begin, row_end);
  }
}

}  // namespace

ARBOR_AVX2 float act_absmax_avx2(const float* x, int64_t n) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + i)));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

ARBOR_AVX2 void quantize_act_block_avx2(const float* x, float id, int8_t* qs) {
  const __m256 idv = _mm256_set1_ps(id);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) {
    q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), idv));  // nearest-even
  }
  // Pack 32 x int32 to int8; packs interleave 128-bit lanes, the permute restores order.
  const __m256i q01 = _mm256_packs_epi32(q[0], q[1]);
  const __m256i q23 = _mm256_packs_epi32(q[2], q[3]);
  const __m256i q0123 = _mm256_packs_epi16(q01, q23);
  const __m256i ordered =
      _mm256_permutevar8x32_epi32(q0123, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), ordered);
}

ARBOR_AVX2 void quantize_act_row_avx2(const float* x, int64_t cols, int8_t* qs, float* d) {
  for (int64_t b = 0; b < cols / kQBlock; ++b) {
    // Same scalar arithmetic as quantize_act_row_scalar, so both paths give identical bytes.
    const float db = act_absmax_avx2(x + b * kQBlock, kQBlock) / 127.0f;
    d[b] = db;
    quantize_act_block_avx2(x + b * kQBlock, db != 0.0f ? 1.0f / db : 0.0f, qs + b * kQBlock);
  }
}

ARBOR_AVX2 void act_q4_sums_avx2(const int8_t* qs, int64_t cols, int16_t* out) {
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < cols / kQBlock; ++b) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * kQBlock));
    const __m256i pairs = _mm256_maddubs_epi16(eight, q);  // 8 * (q[2j] + q[2j+1])
    const __m128i s =
        _mm_add_epi16(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + b * 8), s);
  }
}

ARBOR_AVX2 void act_half_sums_avx2(const int8_t* qs, int32_t* sums) {
  // A sum of absolute differences against zero adds unsigned bytes; flipping the sign bit maps
  // q to q + 128. s: four u64 sums of bytes 0-7, 8-15, 16-23, 24-31.
  const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)),
                                     _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i s = _mm256_sad_epu8(u, _mm256_setzero_si256());
  const int64_t lo = _mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1);
  const int64_t hi = _mm256_extract_epi64(s, 2) + _mm256_extract_epi64(s, 3);
  sums[0] = static_cast<int32_t>(lo) - 16 * 128;
  sums[1] = static_cast<int32_t>(hi) - 16 * 128;
}

namespace {

struct Avx2ActPieces {
  static float absmax(const float* x, int64_t n) {
    return act_absmax_avx2(x, n);
  }
  static void quantize(const float* x, float id, int8_t* qs) {
    quantize_act_block_avx2(x, id, qs);
  }
  static void half_sums(const int8_t* qs, int32_t& s0, int32_t& s1) {
    int32_t sums[2];
    act_half_sums_avx2(qs, sums);
    s0 = sums[0];
    s1 = sums[1];
  }
};

}  // namespace

ARBOR_AVX2 void pack_act_row_affine_avx2(const float* x, int64_t cols, const AffineFormat& f,
                                         ActBlockAffine* out, int64_t out_stride) {
  pack_act_units<Avx2ActPieces>(x, cols, f, out, out_stride);
}

RowKernel avx2_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return type_kernel<GgmlType::kF32, 4, 4, 3, 32>;
    case GgmlType::kF16:
      return type_kernel<GgmlType::kF16, 4, 4, 3, 32>;
    case GgmlType::kBF16:
      return type_kernel<GgmlType::kBF16, 4, 4, 3, 32>;
    case GgmlType::kQ8_0:
      return type_kernel<GgmlType::kQ8_0, 4, 2, 4, 64>;
    case GgmlType::kQ4_0:
      return type_kernel<GgmlType::kQ4_0, 4, 2, 4, 64>;
    default:
      ARBOR_CHECK(false) << "no AVX2 kernel for " << gguf::ggml_type_name(type);
      return nullptr;
  }
}

}  // namespace arbor::kernels::internal
