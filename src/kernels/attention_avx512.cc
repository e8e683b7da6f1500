// AVX-512 block operations of paged attention (see attention_internal.h). Keys are read straight
// from the cache, F16 widened in registers (no scratch copy), four keys per pass so each pass
// over q (scores) or acc (accumulate) serves four K/V rows; the many-row forms tile up to five
// query rows by four keys (scores) or four 16-column chunks (accumulate) in registers, so each
// K/V load serves every row of the tile. head_dim must be a multiple of 16.
// Head dim 8 has its own keys-in-lanes kernel (lanes_chunk_row_avx512): 16 keys per register.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/attention_internal.h"
#include "kernels/avx512_target.h"

namespace arbor::kernels::internal {
namespace {

// 16 elements of row `row` starting at column d, widened to f32.
template <bool kF16>
ARBOR_AVX512_INLINE __m512 load16(const void* base, int64_t row, int hd, int d) {
  if constexpr (kF16) {
    const auto* p = static_cast<const uint16_t*>(base) + row * hd + d;
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(base) + row * hd + d);
  }
}

// Low plus high 256-bit half.
ARBOR_AVX512_INLINE __m256 fold(__m512 a) {
  return _mm256_add_ps(_mm512_castps512_ps256(a),
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

// _mm256_hadd_ps(a, b) as two shuffles and an add: the same sums (x + y in either order is one
// value), but vhaddps runs on the pipes of the FMAs (Zen 4: 8 vhaddps beside 8 FMAs take 16
// cycles; vshufps and vaddps take none of those pipes), so the scores' folds no longer stall them.
ARBOR_AVX512_INLINE __m256 hadd(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD));
}

// The four horizontal sums of a0..a3, in lanes 0..3.
ARBOR_AVX512_INLINE __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  // hadd pairs lanes within each 128-bit half: [a0 a0 a1 a1 | a0 a0 a1 a1] per half, then again.
  const __m256 h01 = hadd(fold(a0), fold(a1));
  const __m256 h23 = hadd(fold(a2), fold(a3));
  const __m256 h = hadd(h01, h23);  // [s0 s1 s2 s3 | s0' s1' s2' s3']
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

template <bool kF16>
ARBOR_AVX512 void scores_impl(const float* q, const void* k, int n, int hd, float scale,
                              float* s) {
  // Every key goes through reduce4 (the tail with zero accumulators beside it), so a key's score
  // does not depend on where the block range starts or ends.
  const __m128 vscale = _mm_set1_ps(scale);
  for (int j = 0; j < n; j += 4) {
    const int m = n - j < 4 ? n - j : 4;
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
    if (m == 4) {
      for (int d = 0; d < hd; d += 16) {
        const __m512 qv = _mm512_loadu_ps(q + d);
        a[0] = _mm512_fmadd_ps(qv, load16<kF16>(k, j, hd, d), a[0]);
        a[1] = _mm512_fmadd_ps(qv, load16<kF16>(k, j + 1, hd, d), a[1]);
        a[2] = _mm512_fmadd_ps(qv, load16<kF16>(k, j + 2, hd, d), a[2]);
        a[3] = _mm512_fmadd_ps(qv, load16<kF16>(k, j + 3, hd, d), a[3]);
      }
      _mm_storeu_ps(s + j, _mm_mul_ps(reduce4(a[0], a[1], a[2], a[3]), vscale));
      continue;
    }
    for (int t = 0; t < m; ++t) {
      for (int d = 0; d < hd; d += 16) {
        a[t] = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load16<kF16>(k, j + t, hd, d), a[t]);
      }
    }
    alignas(16) float out[4];
    _mm_store_ps(out, _mm_mul_ps(reduce4(a[0], a[1], a[2], a[3]), vscale));
    for (int t = 0; t < m; ++t) s[j + t] = out[t];
  }
}

// exp(x) for x <= 0 (scores minus their running max): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a
// degree-6 Taylor polynomial (relative error < 2e-7 on that range), times 2^n by scalef.
// Lanes below -87 (and -inf) give 0.
ARBOR_AVX512_INLINE __m512 exp_nonpositive(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(live, p, n);
}

// a + b, or max(a, b) (the second operand where equal, as vmaxps).
template <bool kMax>
ARBOR_AVX512_INLINE __m512 add_or_max(__m512 a, __m512 b) {
  return kMax ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b);
}

// Lane r of the result: v[r]'s 16 lanes summed (or their max, kMax), 16 vectors at once,
// pairing lanes 8 apart, then 4, 2 and 1 (reduce_lanes' tree for one vector, and GCC's
// _mm512_reduce_add_ps'), so a row's result has the bits reduce_lanes gives it alone: 15 ops and
// 31 shuffles for 16 rows, and lane r depends on v[r] alone.
template <bool kMax>
ARBOR_AVX512_INLINE __m512 reduce_lanes16(const __m512 (&v)[16]) {
  constexpr auto op = add_or_max<kMax>;
  __m512 b[8], c[4], d[2];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {  // b[k]: 128-bit lanes 0-1 v[2k]'s 256-bit fold, 2-3 v[2k+1]'s
    b[k] = op(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)),
              _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)));
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {  // c[k]: 128-bit lane L is v[4k + L]'s 128-bit fold
    c[k] = op(_mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)),
              _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)));
  }
#pragma GCC unroll 2
  for (int k = 0; k < 2; ++k) {  // d[k] lanes 4L, 4L+1: v[8k + L] in two; 4L+2, 4L+3: v[8k+4+L]
    d[k] = op(_mm512_shuffle_ps(c[2 * k], c[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm512_shuffle_ps(c[2 * k], c[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // e lane 4L + p holds v[4p + L]'s reduction.
  const __m512 e = op(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                      _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(idx, e);
}

// One vector's lanes summed (or their max, kMax) by reduce_lanes16's tree: 8 apart, 4, 2, 1,
// each max with reduce_lanes16's operand order (which of +0 and -0 a tie keeps).
template <bool kMax>
ARBOR_AVX512_INLINE float reduce_lanes(__m512 v) {
  const __m256 top = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 h = kMax ? _mm256_max_ps(top, _mm512_castps512_ps256(v))
                        : _mm256_add_ps(top, _mm512_castps512_ps256(v));
  const __m128 lo = _mm256_castps256_ps128(h), hi = _mm256_extractf128_ps(h, 1);
  const __m128 q = kMax ? _mm_max_ps(hi, lo) : _mm_add_ps(hi, lo);
  const __m128 q2 = _mm_movehl_ps(q, q);  // lanes 2, 3
  const __m128 p = kMax ? _mm_max_ps(q, q2) : _mm_add_ps(q, q2);
  const __m128 p1 = _mm_movehdup_ps(p);  // lane 1
  return _mm_cvtss_f32(kMax ? _mm_max_ss(p, p1) : _mm_add_ss(p, p1));
}

// Lane-wise max of a row's scores sr[0, n) over its 16-key chunks (-inf in lanes past n).
ARBOR_AVX512_INLINE __m512 chunk_max(const float* sr, int n) {
  __m512 vmax = _mm512_set1_ps(-__builtin_inff());
  for (int j = 0; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
    vmax = _mm512_mask_max_ps(vmax, k, vmax, _mm512_maskz_loadu_ps(k, sr + j));
  }
  return vmax;
}

// sr[j] = exp(sr[j] - m) for j in [0, n) (exp(-inf) = 0); returns their lane-wise sum over the
// 16-key chunks, in chunk order.
ARBOR_AVX512_INLINE __m512 chunk_exp_sum(float* sr, int n, float m) {
  const __m512 vm = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(k, sr + j);
    const __m512 e = _mm512_maskz_mov_ps(k, exp_nonpositive(_mm512_sub_ps(x, vm)));
    _mm512_mask_storeu_ps(sr + j, k, e);
    sum = _mm512_add_ps(sum, e);
  }
  return sum;
}

// softmax_group's step for one row, by reduce_lanes: the same bits, cheaper for a few rows.
ARBOR_AVX512_INLINE void softmax_row(float* sr, int n, float& m, float& l, float& corr) {
  const float neg_inf = -__builtin_inff();
  const float bmax = reduce_lanes<true>(chunk_max(sr, n));
  if (bmax == neg_inf) {
    std::memset(sr, 0, sizeof(float) * n);
    corr = 1.0f;
    return;
  }
  const float m_new = m > bmax ? m : bmax;
  const float c = _mm512_cvtss_f32(exp_nonpositive(_mm512_set1_ps(m - m_new)));
  float scaled = l * c;
  asm("" : "+v"(scaled));  // rounded before the add: never contracted into an FMA
  l = scaled + reduce_lanes<false>(chunk_exp_sum(sr, n, m_new));
  m = m_new;
  corr = c;
}

// softmax_rows for up to 16 rows, a row a lane: each row's block max (lane-wise over its 16-key
// chunks, then reduce_lanes16), m_new, corr and the rescaled l as one vector each; then per row
// s[j] = exp(s[j] - m_new) (exp(-inf) = 0) and their sum. A row whose keys are all hidden keeps
// m and l, gets corr 1 and exponentials 0.
ARBOR_AVX512_INLINE void softmax_group(float* s, int g, int s_stride, int n, float* m, float* l,
                                       float* corr) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  const __mmask16 live = static_cast<__mmask16>((1u << g) - 1);
  __m512 v[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) v[r] = r < g ? chunk_max(s + (size_t)r * s_stride, n) : neg_inf;
  const __m512 bmax = reduce_lanes16<true>(v);
  const __m512 m_old = _mm512_mask_loadu_ps(neg_inf, live, m);
  const __m512 m_new = _mm512_max_ps(m_old, bmax);  // bmax where equal, as m > bmax ? m : bmax
  const __mmask16 hidden = _mm512_cmp_ps_mask(bmax, neg_inf, _CMP_EQ_OQ);
  // exp(-inf) = 0 where m was -inf; 1 where every key is hidden.
  const __m512 c = _mm512_mask_blend_ps(hidden, exp_nonpositive(_mm512_sub_ps(m_old, m_new)),
                                        _mm512_set1_ps(1.0f));
  __m512 scaled = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, l), c);
  asm("" : "+v"(scaled));  // rounded before the add: never contracted into an FMA
  alignas(64) float mn[16];
  _mm512_store_ps(mn, m_new);
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {
    v[r] = r < g ? chunk_exp_sum(s + (size_t)r * s_stride, n, mn[r]) : _mm512_setzero_ps();
  }
  const __m512 sums = reduce_lanes16<false>(v);
  _mm512_mask_storeu_ps(l, live, _mm512_add_ps(scaled, sums));
  _mm512_mask_storeu_ps(m, live, m_new);
  _mm512_mask_storeu_ps(corr, live, c);
}

// Groups of fewer rows go row by row (softmax_row): the 16-lane reductions cost more than
// they save below about four rows (Zen 5: 2 rows 135 cycles a block row by row, 200 as a group;
// 10 rows 410 and 235).
constexpr int kLaneGroupRows = 4;

// AttnBlockOps::softmax_rows: the rows in groups of 16 (softmax_group), a last group of fewer
// than kLaneGroupRows row by row; both give a row the same bits. corr by the same exp polynomial
// as the scores.
ARBOR_AVX512 void softmax_rows_avx512(float* s, int rows, int s_stride, int n, float* m, float* l,
                                      float* corr) {
  for (int r0 = 0; r0 < rows; r0 += 16) {
    const int g = rows - r0 < 16 ? rows - r0 : 16;
    if (g >= kLaneGroupRows) {
      softmax_group(s + (size_t)r0 * s_stride, g, s_stride, n, m + r0, l + r0, corr + r0);
      continue;
    }
    for (int r = r0; r < r0 + g; ++r) {
      softmax_row(s + (size_t)r * s_stride, n, m[r], l[r], corr[r]);
    }
  }
}

// acc += sum over t < m of e[idx[t]] * v_idx[t]: one load and store of acc per m rows.
template <bool kF16>
ARBOR_AVX512_INLINE void accumulate_rows(float* acc, const float* e, const void* v,
                                         const int* idx, int m, int hd) {
  for (int d = 0; d < hd; d += 16) {
    __m512 a = _mm512_loadu_ps(acc + d);
    for (int t = 0; t < m; ++t) {
      a = _mm512_fmadd_ps(_mm512_set1_ps(e[idx[t]]), load16<kF16>(v, idx[t], hd, d), a);
    }
    _mm512_storeu_ps(acc + d, a);
  }
}

template <bool kF16>
ARBOR_AVX512 void accumulate_impl(float* acc, const float* e, const void* v, int n, int hd) {
  int idx[4];  // the next keys that contribute (e != 0), four at a time
  int cnt = 0;
  for (int j = 0; j < n; ++j) {
    if (e[j] == 0.0f) continue;
    idx[cnt++] = j;
    if (cnt == 4) {
      accumulate_rows<kF16>(acc, e, v, idx, 4, hd);
      cnt = 0;
    }
  }
  if (cnt > 0) accumulate_rows<kF16>(acc, e, v, idx, cnt, hd);
}

ARBOR_AVX512 void scores_avx512(const float* q, const void* k, bool f16, int n, int hd,
                                float scale, float* s) {
  if (f16) {
    scores_impl<true>(q, k, n, hd, scale, s);
  } else {
    scores_impl<false>(q, k, n, hd, scale, s);
  }
}

ARBOR_AVX512 void accumulate_avx512(float* acc, const float* e, const void* v, bool f16, int n,
                                    int hd) {
  if (f16) {
    accumulate_impl<true>(acc, e, v, n, hd);
  } else {
    accumulate_impl<false>(acc, e, v, n, hd);
  }
}

// ---- Many rows at once: each K/V element loaded (and widened) once per group of rows. ----

// Scores of kRows rows against keys [j, j + kKeys), kKeys <= 4: per row and key the FMA chain
// over d and the reduce4 of scores_impl (missing keys' accumulators zero), so every score has
// scores_impl's bits. Compile-time sizes keep the kRows x 4 accumulators in registers.
template <bool kF16, int kRows, int kKeys>
ARBOR_AVX512_INLINE void scores_group(const float* const* q, const void* k, int j, int hd,
                                      __m128 vscale, float* s, int s_stride,
                                      const char* prefetch) {
  __m512 a[kRows][4];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) a[r][t] = _mm512_setzero_ps();
  }
  // The prefetch hint's rows j .. j + kKeys, spread over the pass: kKeys x 16 elements each step.
  constexpr size_t kStep = kKeys * 16 * (kF16 ? 2 : 4);
  for (int d = 0; d < hd; d += 16) {
    if (prefetch != nullptr) prefetch_l2(prefetch + (size_t)d / 16 * kStep, kStep);
    __m512 kv[kKeys];
#pragma GCC unroll 4
    for (int t = 0; t < kKeys; ++t) kv[t] = load16<kF16>(k, j + t, hd, d);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 qv = _mm512_loadu_ps(q[r] + d);
#pragma GCC unroll 4
      for (int t = 0; t < kKeys; ++t) a[r][t] = _mm512_fmadd_ps(qv, kv[t], a[r][t]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const __m128 sums = _mm_mul_ps(reduce4(a[r][0], a[r][1], a[r][2], a[r][3]), vscale);
    float* out = s + (size_t)r * s_stride + j;
    if constexpr (kKeys == 4) {
      _mm_storeu_ps(out, sums);
    } else {
      _mm_mask_storeu_ps(out, static_cast<__mmask8>((1u << kKeys) - 1), sums);
    }
  }
}

// The rows [j, j + m) of `prefetch` (laid out like k) into L2; nothing when it is null.
template <bool kF16>
ARBOR_AVX512_INLINE void prefetch_rows(const void* prefetch, int j, int m, int hd) {
  constexpr size_t kElem = kF16 ? 2 : 4;
  if (prefetch != nullptr) {
    const size_t row = (size_t)hd * kElem;
    prefetch_l2(static_cast<const char*>(prefetch) + (size_t)j * row, (size_t)m * row);
  }
}

template <bool kF16, int kRows>
ARBOR_AVX512 void scores_rows_group(const float* const* q, const void* k, int n, int hd,
                                    float scale, float* s, int s_stride, const void* prefetch) {
  const __m128 vscale = _mm_set1_ps(scale);
  constexpr size_t kElem = kF16 ? 2 : 4;
  const auto* pf = static_cast<const char*>(prefetch);
  const auto rows_at = [&](int key) { return pf ? pf + (size_t)key * hd * kElem : nullptr; };
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    scores_group<kF16, kRows, 4>(q, k, j, hd, vscale, s, s_stride, rows_at(j));
  }
  switch (n - j) {
    case 3: scores_group<kF16, kRows, 3>(q, k, j, hd, vscale, s, s_stride, rows_at(j)); break;
    case 2: scores_group<kF16, kRows, 2>(q, k, j, hd, vscale, s, s_stride, rows_at(j)); break;
    case 1: scores_group<kF16, kRows, 1>(q, k, j, hd, vscale, s, s_stride, rows_at(j)); break;
    default: break;
  }
}

// Rows in groups of at most kMaxGroupRows, as even as possible (10 rows: 5 + 5, not 4 + 4 + 2),
// each group one register tile.
constexpr int kMaxGroupRows = 5;

template <typename Group>
ARBOR_AVX512_INLINE void for_row_groups(int rows, Group&& group) {
  const int groups = (rows + kMaxGroupRows - 1) / kMaxGroupRows;
  int r = 0;
  for (int gi = 0; gi < groups; ++gi) {
    const int size = rows / groups + (gi < rows % groups ? 1 : 0);
    group(r, size);
    r += size;
  }
}

// The first row group spreads the prefetch over its keys.
template <bool kF16>
ARBOR_AVX512 void scores_rows_impl(const float* const* q, int rows, const void* k, int n, int hd,
                                   float scale, float* s, int s_stride, const void* prefetch) {
  for_row_groups(rows, [&](int r, int size) {
    float* sr = s + (size_t)r * s_stride;
    const void* pf = r == 0 ? prefetch : nullptr;
    switch (size) {
      case 5: scores_rows_group<kF16, 5>(q + r, k, n, hd, scale, sr, s_stride, pf); break;
      case 4: scores_rows_group<kF16, 4>(q + r, k, n, hd, scale, sr, s_stride, pf); break;
      case 3: scores_rows_group<kF16, 3>(q + r, k, n, hd, scale, sr, s_stride, pf); break;
      case 2: scores_rows_group<kF16, 2>(q + r, k, n, hd, scale, sr, s_stride, pf); break;
      default: scores_rows_group<kF16, 1>(q + r, k, n, hd, scale, sr, s_stride, pf); break;
    }
  });
}

ARBOR_AVX512 void scores_rows_avx512(const float* const* q, int rows, const void* k, bool f16,
                                     int n, int hd, float scale, float* s, int s_stride,
                                     const void* prefetch) {
  if (f16) {
    scores_rows_impl<true>(q, rows, k, n, hd, scale, s, s_stride, prefetch);
  } else {
    scores_rows_impl<false>(q, rows, k, n, hd, scale, s, s_stride, prefetch);
  }
}

// acc columns [d0, d0 + 16 kCh) of kRows rows, times corr[r] (null: 1), += e * v over keys
// [0, n), skipping e == 0: per lane the FMA chain of accumulate_impl (keys in order), so every row
// has accumulate_impl's bits.
// Branch-free per row: each 16-key chunk's nonzero exponentials are one mask per row; where every
// row's are all nonzero (the usual case) the FMAs are plain, else each row's FMA is masked by its
// key's bit (a masked-off lane keeps its accumulator exactly, whatever v holds).
template <bool kF16, int kRows, int kCh>
ARBOR_AVX512 void accumulate_group(float* acc, const float* e, int e_stride, const void* v, int n,
                                   int hd, int d0, const void* prefetch, const float* corr) {
  __m512 a[kRows][kCh];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < kCh; ++c) a[r][c] = _mm512_loadu_ps(acc + (size_t)r * hd + d0 + 16 * c);
    if (corr != nullptr) {
      const __m512 cr = _mm512_set1_ps(corr[r]);
#pragma GCC unroll 4
      for (int c = 0; c < kCh; ++c) a[r][c] = _mm512_mul_ps(a[r][c], cr);
    }
  }
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int m = n - j0 < 16 ? n - j0 : 16;
    const __mmask16 live = m == 16 ? 0xFFFF : static_cast<__mmask16>((1u << m) - 1);
    uint32_t nz[kRows];
    uint32_t all = live, any = 0;
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 er = _mm512_maskz_loadu_ps(live, e + (size_t)r * e_stride + j0);
      nz[r] = _mm512_mask_cmp_ps_mask(live, er, _mm512_setzero_ps(), _CMP_NEQ_UQ);
      all &= nz[r];
      any |= nz[r];
    }
    if (all == live) {
      for (int j = j0; j < j0 + m; ++j) {
        prefetch_rows<kF16>(prefetch, j, 1, hd);
        __m512 vv[kCh];
#pragma GCC unroll 4
        for (int c = 0; c < kCh; ++c) vv[c] = load16<kF16>(v, j, hd, d0 + 16 * c);
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) {
          const __m512 ev = _mm512_set1_ps(e[(size_t)r * e_stride + j]);
#pragma GCC unroll 4
          for (int c = 0; c < kCh; ++c) a[r][c] = _mm512_fmadd_ps(ev, vv[c], a[r][c]);
        }
      }
      continue;
    }
    for (int j = j0; j < j0 + m; ++j) {
      prefetch_rows<kF16>(prefetch, j, 1, hd);
      if (((any >> (j - j0)) & 1) == 0) continue;
      __m512 vv[kCh];
#pragma GCC unroll 4
      for (int c = 0; c < kCh; ++c) vv[c] = load16<kF16>(v, j, hd, d0 + 16 * c);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        const __mmask16 k = static_cast<__mmask16>(-static_cast<int>((nz[r] >> (j - j0)) & 1));
        const __m512 ev = _mm512_set1_ps(e[(size_t)r * e_stride + j]);
#pragma GCC unroll 4
        for (int c = 0; c < kCh; ++c) a[r][c] = _mm512_mask3_fmadd_ps(ev, vv[c], a[r][c], k);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < kCh; ++c) _mm512_storeu_ps(acc + (size_t)r * hd + d0 + 16 * c, a[r][c]);
  }
}

// kRows rows, all of hd in passes of up to four 16-column chunks (16 accumulators); the first
// pass spreads the prefetch over its keys.
template <bool kF16, int kRows>
ARBOR_AVX512 void accumulate_rows_group(float* acc, const float* e, int e_stride, const void* v,
                                        int n, int hd, const void* prefetch, const float* corr) {
  int d0 = 0;
  for (; d0 + 64 <= hd; d0 += 64) {
    accumulate_group<kF16, kRows, 4>(acc, e, e_stride, v, n, hd, d0, d0 == 0 ? prefetch : nullptr,
                                     corr);
  }
  const void* pf = d0 == 0 ? prefetch : nullptr;
  switch ((hd - d0) / 16) {
    case 3: accumulate_group<kF16, kRows, 3>(acc, e, e_stride, v, n, hd, d0, pf, corr); break;
    case 2: accumulate_group<kF16, kRows, 2>(acc, e, e_stride, v, n, hd, d0, pf, corr); break;
    case 1: accumulate_group<kF16, kRows, 1>(acc, e, e_stride, v, n, hd, d0, pf, corr); break;
    default: break;
  }
}

template <bool kF16>
ARBOR_AVX512 void accumulate_rows_impl(float* acc, int rows, const float* e, int e_stride,
                                       const void* v, int n, int hd, const void* prefetch,
                                       const float* corr) {
  for_row_groups(rows, [&](int r, int size) {
    float* ar = acc + (size_t)r * hd;
    const float* er = e + (size_t)r * e_stride;
    const void* pf = r == 0 ? prefetch : nullptr;
    const float* cr = corr != nullptr ? corr + r : nullptr;
    switch (size) {
      case 5: accumulate_rows_group<kF16, 5>(ar, er, e_stride, v, n, hd, pf, cr); break;
      case 4: accumulate_rows_group<kF16, 4>(ar, er, e_stride, v, n, hd, pf, cr); break;
      case 3: accumulate_rows_group<kF16, 3>(ar, er, e_stride, v, n, hd, pf, cr); break;
      case 2: accumulate_rows_group<kF16, 2>(ar, er, e_stride, v, n, hd, pf, cr); break;
      default: accumulate_rows_group<kF16, 1>(ar, er, e_stride, v, n, hd, pf, cr); break;
    }
  });
}

ARBOR_AVX512 void accumulate_rows_avx512(float* acc, int rows, const float* e, int e_stride,
                                         const void* v, bool f16, int n, int hd,
                                         const void* prefetch, const float* corr) {
  if (f16) {
    accumulate_rows_impl<true>(acc, rows, e, e_stride, v, n, hd, prefetch, corr);
  } else {
    accumulate_rows_impl<false>(acc, rows, e, e_stride, v, n, hd, prefetch, corr);
  }
}

ARBOR_AVX512 void f16_to_f32_avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(
                                  reinterpret_cast<const __m256i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

}  // namespace

ARBOR_AVX512 void lanes_chunk_row_avx512(const float* q, float scale, const float* kt,
                                         const float* vt, int stride, int num_groups,
                                         const uint16_t* vis, float& m_out, float& l_out,
                                         float* acc_out) {
  constexpr int kHd = kLanesHeadDim;
  const float neg_inf = -__builtin_inff();
  __m512 qd[kHd], accv[kHd];
  for (int d = 0; d < kHd; ++d) {
    qd[d] = _mm512_set1_ps(q[d]);
    accv[d] = _mm512_setzero_ps();
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 lv = _mm512_setzero_ps();
  float m = neg_inf;
  for (int g = 0; g < num_groups; ++g) {
    const __mmask16 live = vis[g];
    if (live == 0) continue;
    const float* kg = kt + g * 16;
    __m512 s = _mm512_setzero_ps();
    for (int d = 0; d < kHd; ++d) s = _mm512_fmadd_ps(qd[d], _mm512_loadu_ps(kg + d * stride), s);
    s = _mm512_mask_mov_ps(_mm512_set1_ps(neg_inf), live, _mm512_mul_ps(s, vscale));
    const float bmax = _mm512_reduce_max_ps(s);
    if (bmax > m) {
      // A new running max: rescale what the earlier groups left (corr = 0 for the first).
      const float corr = m == neg_inf ? 0.0f : std::exp(m - bmax);
      const __m512 vc = _mm512_set1_ps(corr);
      lv = _mm512_mul_ps(lv, vc);
      for (int d = 0; d < kHd; ++d) accv[d] = _mm512_mul_ps(accv[d], vc);
      m = bmax;
    }
    const __m512 e =
        _mm512_maskz_mov_ps(live, exp_nonpositive(_mm512_sub_ps(s, _mm512_set1_ps(m))));
    lv = _mm512_add_ps(lv, e);
    const float* vg = vt + g * 16;
    for (int d = 0; d < kHd; ++d) {
      accv[d] = _mm512_fmadd_ps(e, _mm512_loadu_ps(vg + d * stride), accv[d]);
    }
  }
  m_out = m;
  l_out = m == neg_inf ? 0.0f : _mm512_reduce_add_ps(lv);
  for (int d = 0; d < kHd; ++d) acc_out[d] = m == neg_inf ? 0.0f : _mm512_reduce_add_ps(accv[d]);
}

namespace {

// The index vectors of a 16-key x 8-dim transpose in three vpermt2ps stages (label of an
// element: key * 8 + dim; each stage merges pairs of registers and halves the keys' spread):
//   stage 1: keys {0,1} + {2,3} (lane = key * 8 + dim)      -> dims 0-3 | 4-7 of keys 0-3
//   stage 2: keys 0-3 + 4-7 of one dim half                 -> dims {0,1} | {2,3} of keys 0-7
//   stage 3: keys 0-7 + 8-15 of one dim pair                -> dim 0 | dim 1 of keys 0-15
// Every pair of a stage has the same relative layout, so two vectors per stage serve all.
struct TransposeIndex {
  int32_t stage[3][2][16];
};

int find_label(const int* a, const int* b, int label) {
  for (int l = 0; l < 16; ++l) {
    if (a[l] == label) return l;
  }
  for (int l = 0; l < 16; ++l) {
    if (b[l] == label) return 16 + l;
  }
  return -1;
}

const TransposeIndex& transpose_index() {
  static const TransposeIndex t = [] {
    TransposeIndex r{};
    int a[16], b[16];
    for (int l = 0; l < 16; ++l) {  // stage 1 sources: keys 0-1 and 2-3
      a[l] = (l / 8) * 8 + l % 8;
      b[l] = (2 + l / 8) * 8 + l % 8;
    }
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 16; ++l) r.stage[0][h][l] = find_label(a, b, (l / 4) * 8 + 4 * h + l % 4);
    }
    for (int l = 0; l < 16; ++l) {  // stage 2 sources: keys 0-3 and 4-7, dims 0-3 (relative)
      a[l] = (l / 4) * 8 + l % 4;
      b[l] = (4 + l / 4) * 8 + l % 4;
    }
    for (int p = 0; p < 2; ++p) {
      for (int l = 0; l < 16; ++l) r.stage[1][p][l] = find_label(a, b, (l % 8) * 8 + 2 * p + l / 8);
    }
    for (int l = 0; l < 16; ++l) {  // stage 3 sources: keys 0-7 and 8-15, dims 0-1 (relative)
      a[l] = (l % 8) * 8 + l / 8;
      b[l] = (8 + l % 8) * 8 + l / 8;
    }
    for (int q = 0; q < 2; ++q) {
      for (int l = 0; l < 16; ++l) r.stage[2][q][l] = find_label(a, b, l * 8 + q);
    }
    return r;
  }();
  return t;
}

}  // namespace

ARBOR_AVX512 void lanes_transpose_avx512(const void* src, bool f16, int n, float* dst,
                                         int stride) {
  constexpr int kHd = kLanesHeadDim;
  const TransposeIndex& ti = transpose_index();
  __m512i idx[3][2];
  for (int st = 0; st < 3; ++st) {
    for (int h = 0; h < 2; ++h) idx[st][h] = _mm512_loadu_si512(ti.stage[st][h]);
  }
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int m = n - j0 < 16 ? n - j0 : 16;
    // z[i]: keys j0 + 2i, j0 + 2i + 1 (8 dims each); keys past n read as zero.
    __m512 z[8];
    for (int i = 0; i < 8; ++i) {
      const int valid = (m - 2 * i) * kHd;
      const __mmask16 k = valid >= 16 ? 0xFFFF
                          : valid <= 0 ? 0
                                       : static_cast<__mmask16>((1u << valid) - 1);
      if (f16) {
        const auto* h = static_cast<const uint16_t*>(src) + (j0 + 2 * i) * kHd;
        z[i] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, h));
      } else {
        z[i] = _mm512_maskz_loadu_ps(k, static_cast<const float*>(src) + (j0 + 2 * i) * kHd);
      }
    }
    __m512 b[4][2], c[2][2][2];
    for (int i = 0; i < 4; ++i) {
      for (int h = 0; h < 2; ++h) b[i][h] = _mm512_permutex2var_ps(z[2 * i], idx[0][h], z[2 * i + 1]);
    }
    for (int j = 0; j < 2; ++j) {
      for (int h = 0; h < 2; ++h) {
        for (int p = 0; p < 2; ++p) {
          c[j][h][p] = _mm512_permutex2var_ps(b[2 * j][h], idx[1][p], b[2 * j + 1][h]);
        }
      }
    }
    const __mmask16 lanes = m == 16 ? 0xFFFF : static_cast<__mmask16>((1u << m) - 1);
    for (int h = 0; h < 2; ++h) {
      for (int p = 0; p < 2; ++p) {
        for (int q = 0; q < 2; ++q) {
          const __m512 d = _mm512_permutex2var_ps(c[0][h][p], idx[2][q], c[1][h][p]);
          _mm512_mask_storeu_ps(dst + (4 * h + 2 * p + q) * stride + j0, lanes, d);
        }
      }
    }
  }
}

AttnBlockOps attn_block_ops_avx512() {
  return {scores_avx512,      accumulate_avx512,     f16_to_f32_avx512,
          softmax_rows_avx512, scores_rows_avx512,    accumulate_rows_avx512,
          /*widen_per_row=*/false};
}

}  // namespace arbor::kernels::internal
