// AVX-512 BF16 kernels for BF16 weights. The activations are rounded to bf16 once per call
// (round to nearest even, as llama.cpp does for its BF16 dot products) and every pair of
// columns is one vdpbf16ps lane step: twice the multiply-adds per instruction of widening the
// weights to f32 and using FMA, which is what bounds prefill. Per output the arithmetic is fixed
// (16 lanes, each summing its column pairs in column order, a masked last step, one
// reduce_add), whatever the tile: a token's result is the same in any batch.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/avx512_target.h"
#include "kernels/matmul_internal.h"

namespace arbor::kernels::internal {
namespace {

// Bytes ahead of the current column that a weight-streaming tile prefetches in each row.
constexpr int64_t kPrefetchBytes = 1024;

// y for an R x T tile: rows r0 + {0 .. R-1} * rstep, tokens t0 .. t0 + T - 1.
template <int R, int T, bool kPrefetch>
ARBOR_AVX512_BF16 void bf16_tile(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0) {
  const WeightView& w = *a.w;
  const int64_t cols = w.cols;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) {
    rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r * rstep) * w.row_stride;
  }
  const uint16_t* xs = a.xh + t0 * a.xh_stride;
  __m512 acc[R][T];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const int64_t full = cols / 32 * 32;
  for (int64_t c = 0; c < cols; c += 32) {
    const __mmask32 m = c < full ? ~__mmask32{0} : static_cast<__mmask32>((1ull << (cols - c)) - 1);
    __m512bh wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + c * 2 + kPrefetchBytes), _MM_HINT_T0);
      }
      const __m512i v = c < full ? _mm512_loadu_si512(rows[r] + c * 2)
                                 : _mm512_maskz_loadu_epi16(m, rows[r] + c * 2);
      wv[r] = reinterpret_cast<__m512bh>(v);
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xs + t * a.xh_stride + c));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
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

// Tokens [t0, t1), T at a time, then one tile for the rest.
template <int R, int T, bool kPrefetch>
ARBOR_AVX512_BF16 void token_tiles(const MatmulArgs& a, int64_t r0, int64_t rstep, int64_t t0,
                                   int64_t t1) {
  int64_t t = t0;
  for (; t + T <= t1; t += T) bf16_tile<R, T, kPrefetch>(a, r0, rstep, t);
  if constexpr (T > 1) {
    if (t < t1) token_tiles<R, T - 1, kPrefetch>(a, r0, rstep, t, t1);
  }
}

// Up to 2 * kMaxStationaryTokens tokens (decode, batched decode, verification): 4-row tiles
// whose rows come from the four quarters of the range (each read stream runs through many
// consecutive rows), the tokens in balanced tiles of up to 6; the first tile streams the rows
// from DRAM with prefetch, the others find them in L1/L2.
constexpr int kStreamRows = 4;
constexpr int kStreamTokens = 6;

template <int R>
ARBOR_AVX512_BF16 void streaming_row_tiles(const MatmulArgs& a, int64_t r, int64_t rstep) {
  const int64_t nt = a.num_tokens;
  const int64_t tiles = (nt + kStreamTokens - 1) / kStreamTokens;
  token_tiles<R, kStreamTokens, true>(a, r, rstep, 0, nt / tiles);
  for (int64_t i = 1; i < tiles; ++i) {
    token_tiles<R, kStreamTokens, false>(a, r, rstep, i * nt / tiles, (i + 1) * nt / tiles);
  }
}

// More tokens (prefill): 4 x 6 tiles over adjacent rows, in row_blocked_gemm's order.
constexpr int kGemmRows = 4;
constexpr int kGemmTokens = 6;

}  // namespace

void bf16_rows_avx512(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  if (a.num_tokens <= 2 * kMaxStationaryTokens) {
    const int64_t q = (row_end - row_begin) / kStreamRows;
    for (int64_t i = 0; i < q; ++i) streaming_row_tiles<kStreamRows>(a, row_begin + i, q);
    for (int64_t r = row_begin + kStreamRows * q; r < row_end; ++r) {
      streaming_row_tiles<1>(a, r, 1);
    }
    return;
  }
  row_blocked_gemm<kGemmRows, kGemmTokens>(
      row_begin, row_end, a.num_tokens, [&]<int R>(int64_t r, int64_t t0, int64_t t1) {
        token_tiles<R, kGemmTokens, false>(a, r, 1, t0, t1);
      });
}

ARBOR_AVX512_BF16 void round_acts_bf16_avx512(const float* x, int64_t num_tokens, int64_t cols,
                                              int64_t stride, uint16_t* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* src = x + t * cols;
    uint16_t* dst = out + t * stride;
    for (int64_t c = 0; c < stride; c += 16) {
      const int64_t n = std::clamp<int64_t>(cols - c, 0, 16);
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), reinterpret_cast<__m256i>(h));
    }
  }
}

}  // namespace arbor::kernels::internal
