// AVX-512 (F/BW/VL) + VNNI int8 GEMV/GEMM tiles for Q8_0 and Q4_0 weights. Each 512-bit
// register holds two consecutive 32-element blocks; one vpdpbusd does 64 multiply-adds into 16
// int32 lanes (AVX2 needs sign + maddubs + madd for 32). Compiled with per-function target
// attributes; matmul() calls in here only when active_isa() is kAvx512. See matmul_internal.h for
// the activation layout.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/avx512_target.h"
#include "kernels/matmul_internal.h"

namespace arbor::kernels::internal {
namespace {

using gguf::GgmlType;

ARBOR_AVX512_INLINE uint16_t load_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return h;
}

// Blocks b and b+1 (b+1 absent when kTail) of one row as 64 unsigned bytes in element order.
template <GgmlType kType, bool kTail>
ARBOR_AVX512_INLINE __m512i load_pair_unsigned(const uint8_t* blk0, const uint8_t* blk1) {
  if constexpr (kType == GgmlType::kQ8_0) {
    const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk0 + 2));
    const __m256i q1 = kTail ? _mm256_set1_epi8(-128)
                             : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk1 + 2));
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
    return _mm512_xor_si512(q, _mm512_set1_epi8(static_cast<char>(0x80)));  // w + 128
  } else {
    // [qs0 | qs0 | qs1 | qs1] >> [0 | 4 | 0 | 4] & 0xF = low nibbles (elements 0..15), high
    // nibbles (16..31) of block b, then the same for b+1.
    const __m256i q0 =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk0 + 2)));
    const __m256i q1 = kTail ? _mm256_setzero_si256()
                             : _mm256_broadcastsi128_si256(
                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk1 + 2)));
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
    const __m512i shifted = _mm512_srlv_epi64(q, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F));
  }
}

// [d_b x8 | d_b+1 x8] as f32 (0 for the absent block of a tail).
template <bool kTail>
ARBOR_AVX512_INLINE __m512 load_pair_scales(const uint8_t* blk0, const uint8_t* blk1) {
  const __m128i h0 = _mm_set1_epi16(static_cast<short>(load_u16(blk0)));
  const __m128i h1 =
      kTail ? _mm_setzero_si128() : _mm_set1_epi16(static_cast<short>(load_u16(blk1)));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1));
}

// One block pair (p) of an R x T tile. Per (row, token): vpdpbusd starting from the token's
// -k * sums, convert, scale by d_w * d_a, FMA — 5 instructions per 64 multiply-adds.
template <GgmlType kType, int R, int T, bool kTail>
ARBOR_AVX512_INLINE void tile_step(const uint8_t* const (&rows)[R],
                                   const PackedActPair* const (&acts)[T], int64_t p,
                                   __m512 (&acc)[R][T]) {
  constexpr int64_t kBlockBytes = kType == GgmlType::kQ8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
  __m512i wu[R];
  __m512 wd[R];
  for (int r = 0; r < R; ++r) {
    const uint8_t* blk = rows[r] + 2 * p * kBlockBytes;
    wu[r] = load_pair_unsigned<kType, kTail>(blk, blk + kBlockBytes);
    wd[r] = load_pair_scales<kTail>(blk, blk + kBlockBytes);
  }
  for (int t = 0; t < T; ++t) {
    const PackedActPair& pa = acts[t][p];
    const __m512i av = _mm512_load_si512(pa.qs);
    const __m512i init = _mm512_load_si512(pa.neg_sums);
    const __m512 dv = _mm512_load_ps(pa.d);
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, wu[r], av));
      acc[r][t] = _mm512_fmadd_ps(s, _mm512_mul_ps(wd[r], dv), acc[r][t]);
    }
  }
}

constexpr int64_t kPrefetchBytes = 1024;

// y for an R x T tile (rows r0.., tokens t0..) over all blocks.
template <GgmlType kType, int R, int T>
ARBOR_AVX512 void tile(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0) {
  constexpr int64_t kBlockBytes = kType == GgmlType::kQ8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
  const WeightView& w = *a.w;
  const int64_t nb = w.cols / kQBlock;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r)
    rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r * rstep) * w.row_stride;
  const PackedActPair* acts[T];
  for (int t = 0; t < T; ++t) acts[t] = a.packed + (t0 + t) * a.num_pairs;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const int64_t full = nb / 2;
  for (int64_t p = 0; p < full; ++p) {
    // One prefetch per row and cache line, kPrefetchBytes ahead (see the AVX2 Q4_0 GEMV).
    if (2 * p * kBlockBytes % 64 < 2 * kBlockBytes) {
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + 2 * p * kBlockBytes + kPrefetchBytes),
                     _MM_HINT_T0);
      }
    }
    tile_step<kType, R, T, false>(rows, acts, p, acc);
  }
  if (nb % 2 != 0) tile_step<kType, R, T, true>(rows, acts, full, acc);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t)
      a.y[(t0 + t) * w.rows + r0 + r * rstep] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

template <GgmlType kType, int R, int T>
ARBOR_AVX512 void token_tiles(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0,
                              int64_t t1) {
  int64_t t = t0;
  for (; t + T <= t1; t += T) tile<kType, R, T>(a, r0, rstep, t);
  if constexpr (T > 1) {
    if (t < t1) token_tiles<kType, R, T - 1>(a, r0, rstep, t, t1);
  }
}

// Same blocking as the AVX2 kernels (see rows_kernel in matmul_avx2.cc): GEMV tiles take their
// rows from R long contiguous streams; GEMM uses token blocks whose packed activations (192 B per
// 64 values) stay in L2 and R-row weight tiles that stay in L1 across the block's token tiles.
template <GgmlType kType>
ARBOR_AVX512 void int8_rows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  constexpr int R = 4, T = 4;
  constexpr int64_t kTokenBlock = 32;
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

// ---- float weights (F32 / F16 / BF16) x f32 activations, GEMM only ----------------------------

// 16 weights of row `row` from column c (the first `n` of them, zeros after), widened to f32.
template <GgmlType kType>
ARBOR_AVX512_INLINE __m512 load_w16(const uint8_t* row, int64_t c, __mmask16 m) {
  if constexpr (kType == GgmlType::kF32) {
    const float* p = reinterpret_cast<const float*>(row) + c;
    return m == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = m == 0xFFFF ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * 2))
                                  : _mm256_maskz_loadu_epi16(m, row + c * 2);
    if constexpr (kType == GgmlType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

// y for an R x T tile: each 16-column weight vector is widened once and used for T tokens.
template <GgmlType kType, int R, int T>
ARBOR_AVX512 void float_tile(const MatmulArgs& a, int64_t r0, int64_t t0) {
  const WeightView& w = *a.w;
  const int64_t cols = w.cols;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r) * w.row_stride;
  const float* xs[T];
  for (int t = 0; t < T; ++t) xs[t] = a.x + (t0 + t) * cols;
  __m512 acc[R][T];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  // Full 16-column steps unmasked, then one masked step for cols % 16.
  const int64_t full = cols / 16 * 16;
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 m = c < full ? 0xFFFF : static_cast<__mmask16>((1u << (cols - c)) - 1);
    __m512 wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) wv[r] = load_w16<kType>(rows[r], c, m);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m512 xv = c < full ? _mm512_loadu_ps(xs[t] + c) : _mm512_maskz_loadu_ps(m, xs[t] + c);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) a.y[(t0 + t) * w.rows + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

template <GgmlType kType, int R, int T>
ARBOR_AVX512 void float_token_tiles(const MatmulArgs& a, int64_t r0, int64_t t0, int64_t t1) {
  int64_t t = t0;
  for (; t + T <= t1; t += T) float_tile<kType, R, T>(a, r0, t);
  if constexpr (T > 1) {
    if (t < t1) float_token_tiles<kType, R, T - 1>(a, r0, t, t1);
  }
}

// Token blocks of 32 (f32 activations: 256 KiB at 2048 cols, in L2) and 4-row weight tiles that
// stay in L1 across the block's 4-token tiles.
template <GgmlType kType>
ARBOR_AVX512 void float_rows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  constexpr int R = 4, T = 4;
  constexpr int64_t kTokenBlock = 32;
  for (int64_t tb = 0; tb < a.num_tokens; tb += kTokenBlock) {
    const int64_t te = std::min(a.num_tokens, tb + kTokenBlock);
    int64_t r = row_begin;
    for (; r + R <= row_end; r += R) float_token_tiles<kType, R, T>(a, r, tb, te);
    for (; r < row_end; ++r) float_token_tiles<kType, 1, T>(a, r, tb, te);
  }
}

}  // namespace

RowKernel avx512_float_gemm_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return float_rows<GgmlType::kF32>;
    case GgmlType::kF16:
      return float_rows<GgmlType::kF16>;
    case GgmlType::kBF16:
      return float_rows<GgmlType::kBF16>;
    default:
      ARBOR_CHECK(false) << "no AVX-512 float kernel for " << gguf::ggml_type_name(type);
      return nullptr;
  }
}

ARBOR_AVX512 void pack_act_row_avx512(const float* x, int64_t cols, int32_t k, PackedActPair* out) {
  const int64_t nb = cols / kQBlock;
  const __m512i kv = _mm512_set1_epi8(static_cast<char>(k));  // k = 128 reads as unsigned 0x80
  for (int64_t p = 0; p < (nb + 1) / 2; ++p) {
    PackedActPair& pa = out[p];
    const int64_t blocks = std::min<int64_t>(2, nb - 2 * p);
    float d[2] = {0.0f, 0.0f};
    std::memset(pa.qs, 0, sizeof(pa.qs));
    quantize_act_row_avx2(x + 2 * p * kQBlock, blocks * kQBlock, pa.qs, d);
    const __m512i d01 = _mm512_inserti64x4(_mm512_castps_si512(_mm512_set1_ps(d[0])),
                                           _mm256_castps_si256(_mm256_set1_ps(d[1])), 1);
    _mm512_store_ps(pa.d, _mm512_castsi512_ps(d01));
    const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), kv, _mm512_load_si512(pa.qs));
    _mm512_store_si512(pa.neg_sums, _mm512_sub_epi32(_mm512_setzero_si512(), sums));
  }
}

RowKernel avx512_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
      return int8_rows<GgmlType::kQ8_0>;
    case GgmlType::kQ4_0:
      return int8_rows<GgmlType::kQ4_0>;
    default:
      ARBOR_CHECK(false) << "no AVX-512 kernel for " << gguf::ggml_type_name(type);
      return nullptr;
  }
}

}  // namespace arbor::kernels::internal
