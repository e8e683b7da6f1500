// AVX-512 F32/F16/BF16 kernels, GEMV and GEMM. Compiled with per-function target attributes;
// matmul() calls in here only when active_isa() is kAvx512. Both use the same R x T tile, whose
// per-output accumulation (16 lanes over the columns, masked last step, one reduce_add) does not
// depend on R, T or the row's place in the tile: a token's result is the same in any batch.
// Q8_0/Q4_0 on AVX-512 use the packed-weight kernels (matmul_packed_avx512.cc); an unpacked view
// falls back to the AVX2 int8 kernels.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/avx512_target.h"
#include "kernels/matmul_internal.h"

namespace arbor::kernels::internal {
namespace {

using gguf::GgmlType;

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

// y for an R x T tile, rows r0 + {0 .. R-1} * rstep: each 16-column weight vector is widened
// once and used for T tokens.
template <GgmlType kType, int R, int T>
ARBOR_AVX512 void float_tile(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0) {
  const WeightView& w = *a.w;
  const int64_t cols = w.cols;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r)
    rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r * rstep) * w.row_stride;
  const float* xs[T];
  for (int t = 0; t < T; ++t) xs[t] = a.x + (t0 + t) * cols;
  __m512 acc[R][T];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  // Full 16-column steps unmasked, then one masked step for cols % 16.
  const int64_t full = cols / 16 * 16;
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 m = c < full ? 0xFFFF : static_cast<__mmask16>((1u << (cols - c)) - 1);
    __m512 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = load_w16<kType>(rows[r], c, m);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 xv = c < full ? _mm512_loadu_ps(xs[t] + c) : _mm512_maskz_loadu_ps(m, xs[t] + c);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      a.y[(t0 + t) * w.rows + r0 + r * rstep] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
}

template <GgmlType kType, int R, int T>
ARBOR_AVX512 void float_token_tiles(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0,
                                    int64_t t1) {
  int64_t t = t0;
  for (; t + T <= t1; t += T) float_tile<kType, R, T>(a, r0, rstep, t);
  if constexpr (T > 1) {
    if (t < t1) float_token_tiles<kType, R, T - 1>(a, r0, rstep, t, t1);
  }
}

// Bytes ahead of the current column that a stationary tile prefetches in each of its rows: each
// row is streamed from DRAM once, and the tile spends long enough per column step that the
// hardware prefetcher alone leaves the core waiting.
constexpr int64_t kFloatPrefetchBytes = 1024;

// The same tile over blocked activations (MatmulArgs::xb): tokens t0 .. t0 + T - 1 of the
// call's num_tokens. Per output the arithmetic equals float_tile's: 16 lanes over the columns
// in order, the last step's weights masked (its activations are zero-padded), one reduce_add.
template <GgmlType kType, int R, int T, bool kPrefetch>
ARBOR_AVX512 void float_tile_blocked(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0) {
  const WeightView& w = *a.w;
  const int64_t cols = w.cols, n = a.num_tokens;
  constexpr int64_t kElem = kType == GgmlType::kF32 ? 4 : 2;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) {
    rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r * rstep) * w.row_stride;
  }
  __m512 acc[R][T];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const float* xp = a.xb + t0 * 16;
  const int64_t full = cols / 16 * 16;
  for (int64_t c = 0; c < cols; c += 16, xp += n * 16) {
    const __mmask16 m = c < full ? 0xFFFF : static_cast<__mmask16>((1u << (cols - c)) - 1);
    __m512 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + c * kElem + kFloatPrefetchBytes),
                     _MM_HINT_T0);
      }
      wv[r] = load_w16<kType>(rows[r], c, m);
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(xp + t * 16);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      a.y[(t0 + t) * w.rows + r0 + r * rstep] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
}

template <GgmlType kType, int R, int T, bool kPrefetch>
ARBOR_AVX512 void blocked_token_tiles(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0,
                                      int64_t t1) {
  int64_t t = t0;
  for (; t + T <= t1; t += T) float_tile_blocked<kType, R, T, kPrefetch>(a, r0, rstep, t);
  if constexpr (T > 1) {
    if (t < t1) blocked_token_tiles<kType, R, T - 1, kPrefetch>(a, r0, rstep, t, t1);
  }
}

// A verification-sized call: kStatRows rows x up to kStatTokens tokens per tile (24
// accumulators), the tokens cut into balanced tiles per row group; the first tile streams the
// rows from DRAM (prefetching), the others find them in L1/L2. As in the GEMV, the rows of a
// tile come from the four quarters of the range, so each read stream runs through many
// consecutive rows instead of restarting every tile.
constexpr int kStatRows = 4;
constexpr int kStatTokens = 6;

template <GgmlType kType, int R>
ARBOR_AVX512 void stationary_row_tiles(const MatmulArgs& a, int64_t r, int64_t rstep) {
  const int64_t nt = a.num_tokens;
  const int64_t tiles = (nt + kStatTokens - 1) / kStatTokens;
  blocked_token_tiles<kType, R, kStatTokens, true>(a, r, rstep, 0, nt / tiles);
  for (int64_t i = 1; i < tiles; ++i) {
    blocked_token_tiles<kType, R, kStatTokens, false>(a, r, rstep, i * nt / tiles,
                                                      (i + 1) * nt / tiles);
  }
}

template <GgmlType kType>
ARBOR_AVX512 void stationary_rows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t q = (row_end - row_begin) / kStatRows;
  for (int64_t i = 0; i < q; ++i) stationary_row_tiles<kType, kStatRows>(a, row_begin + i, q);
  for (int64_t r = row_begin + kStatRows * q; r < row_end; ++r) {
    stationary_row_tiles<kType, 1>(a, r, 1);
  }
}

// GEMV (fewer than kGemmMinTokens tokens): 4-row tiles whose rows come from the four quarters of
// the range (rows i, i + q, i + 2q, i + 3q), so each read stream runs through q consecutive rows
// (see rows_kernel in matmul_avx2.cc), all tokens per tile.
// GEMM: 6-row x 4-token tiles in row_blocked_gemm's order (48-row blocks in L2, each 4-token
// tile's activations in L1 across the block's row tiles): 24 accumulators, 6 weight vectors and
// one activation vector in the 32 registers, each activation load feeding 6 FMAs (4 x 4 tiles:
// 4, and 15 % slower on F16 at 2048 x 2048 x 64, one thread; widening F16 is not the limit:
// dropping the conversion gained nothing). The tile shape never changes a result: every output
// sums its 16 lanes over the columns in order and reduces once.
template <GgmlType kType>
ARBOR_AVX512 void float_rows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  constexpr int kGemvRows = 4, kGemmRows = 6, kGemmTokens = 4;
  if (a.xb != nullptr) {  // 2..2 * kMaxStationaryTokens tokens
    stationary_rows<kType>(a, row_begin, row_end);
    return;
  }
  if (a.num_tokens < kGemmMinTokens) {
    const int64_t q = (row_end - row_begin) / kGemvRows;
    for (int64_t i = 0; i < q; ++i) {
      float_token_tiles<kType, kGemvRows, kGemmMinTokens - 1>(a, row_begin + i, q, 0,
                                                              a.num_tokens);
    }
    for (int64_t r = row_begin + kGemvRows * q; r < row_end; ++r) {
      float_token_tiles<kType, 1, kGemmMinTokens - 1>(a, r, 1, 0, a.num_tokens);
    }
    return;
  }
  row_blocked_gemm<kGemmRows, kGemmTokens>(
      row_begin, row_end, a.num_tokens, [&]<int R>(int64_t r, int64_t t0, int64_t t1) {
        float_token_tiles<kType, R, kGemmTokens>(a, r, 1, t0, t1);
      });
}

}  // namespace

RowKernel avx512_float_kernel(GgmlType type) {
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

}  // namespace arbor::kernels::internal
