// AVX2 + FMA versions of the row ops; see ops_internal.h. Function target attributes keep the
// rest of the binary baseline x86-64.
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <limits>

#include "base/fp16.h"
#include "kernels/avx2_target.h"
#include "kernels/ops_internal.h"


namespace arbor::kernels::internal {
namespace {

ARBOR_AVX2_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

ARBOR_AVX2_INLINE float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for 8 floats, relative error ~2e-7 (Cephes expf: range reduction by ln 2 split in two
// constants, degree-5 polynomial, exponent built in the integer unit). Inputs below -88.38
// (including -inf) give 0; inputs near or above 88.38 may give +inf.
ARBOR_AVX2_INLINE __m256 exp256(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  const __m256 fx = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  // 2^fx with fx in [-127, 128]; fx = -127 gives a zero exponent field, i.e. exp -> 0.
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127));
  return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

}  // namespace

ARBOR_AVX2 void rms_norm_avx2(const float* x, const float* weight, float* y, int64_t n, float eps) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
    acc1 = _mm256_fmadd_ps(b, b, acc1);
  }
  float ss = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  const __m256 iv = _mm256_set1_ps(inv);
  i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), iv);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
  }
  for (; i < n; ++i) y[i] = x[i] * inv * weight[i];
}

ARBOR_AVX2_INLINE __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = exp256(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

ARBOR_AVX2 void silu_mul_avx2(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(gate + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  // The tail takes the same vector formula (masked), not std::exp: the forward calls this on
  // [tokens, ffn_dim] at once, so which elements fall into the tail depends on the token count,
  // and an element's bits must not (batch invariance, docs/kernels.md).
  if (i < n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane);
    const __m256 g = _mm256_maskload_ps(gate + i, mask), u = _mm256_maskload_ps(up + i, mask);
    _mm256_maskstore_ps(gate + i, mask, silu_mul8(g, u));
  }
}

// Applies op(x8, y8) to [n] floats of `x` (with `y`, read-only, when not null) in vectors of 8,
// the tail masked, so an element's bits never depend on where it falls (batch invariance).
template <typename Op>
ARBOR_AVX2_INLINE void map8(float* x, const float* y, int64_t n, const Op& op) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 b = y != nullptr ? _mm256_loadu_ps(y + i) : _mm256_setzero_ps();
    _mm256_storeu_ps(x + i, op(_mm256_loadu_ps(x + i), b));
  }
  if (i < n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane);
    const __m256 a = _mm256_maskload_ps(x + i, mask);
    const __m256 b = y != nullptr ? _mm256_maskload_ps(y + i, mask) : _mm256_setzero_ps();
    _mm256_maskstore_ps(x + i, mask, op(a, b));
  }
}

// gelu_tanh(g) * u = g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3))) * u.
struct GeluMul8 {
  ARBOR_AVX2_INLINE __m256 operator()(__m256 g, __m256 u) const {
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 in = _mm256_fmadd_ps(g3, _mm256_set1_ps(0.044715f), g);
    const __m256 e = exp256(_mm256_mul_ps(in, _mm256_set1_ps(-2.0f * 0.7978845608028654f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
  }
};

// cap * tanh(x / cap) = cap * (1 - 2 / (exp(2 x / cap) + 1)).
struct Softcap8 {
  float cap;
  ARBOR_AVX2_INLINE __m256 operator()(__m256 x, __m256) const {
    const __m256 e = exp256(_mm256_mul_ps(x, _mm256_set1_ps(2.0f * (1.0f / cap))));
    const __m256 t = _mm256_sub_ps(
        _mm256_set1_ps(1.0f),
        _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    return _mm256_mul_ps(_mm256_set1_ps(cap), t);
  }
};

ARBOR_AVX2 void gelu_mul_avx2(float* gate, const float* up, int64_t n) {
  map8(gate, up, n, GeluMul8{});
}

ARBOR_AVX2 void softcap_avx2(float* x, int64_t n, float cap) { map8(x, nullptr, n, Softcap8{cap}); }

// gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
// g / (1 + exp(-alpha g)) * (u + 1). The clamps are ordered compares that are false for a NaN,
// so a NaN input stays a NaN (as in the scalar reference).
struct SwigluOai8 {
  float alpha, limit;
  ARBOR_AVX2_INLINE __m256 operator()(__m256 gate, __m256 up) const {
    const __m256 hi = _mm256_set1_ps(limit), lo = _mm256_set1_ps(-limit);
    const __m256 g = _mm256_blendv_ps(gate, hi, _mm256_cmp_ps(gate, hi, _CMP_GT_OQ));
    __m256 u = _mm256_blendv_ps(up, hi, _mm256_cmp_ps(up, hi, _CMP_GT_OQ));
    u = _mm256_blendv_ps(u, lo, _mm256_cmp_ps(u, lo, _CMP_LT_OQ));
    const __m256 e = exp256(_mm256_mul_ps(g, _mm256_set1_ps(-alpha)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                         _mm256_add_ps(u, _mm256_set1_ps(1.0f)));
  }
};

ARBOR_AVX2 void swiglu_oai_avx2(float* gate, const float* up, int64_t n, float alpha,
                                float limit) {
  map8(gate, up, n, SwigluOai8{alpha, limit});
}

ARBOR_AVX2 void softmax_avx2(float* x, int64_t n) {
  __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  float m = hmax(mv);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  const __m256 mb = _mm256_set1_ps(m);
  __m256 sv = _mm256_setzero_ps();
  i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mb));
    _mm256_storeu_ps(x + i, e);
    sv = _mm256_add_ps(sv, e);
  }
  float sum = hsum(sv);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  scale_avx2(x, 1.0f / sum, n);
}

ARBOR_AVX2 void add_avx2(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  }
  for (; i < n; ++i) y[i] += x[i];
}

ARBOR_AVX2 void axpy_avx2(float* y, float a, const float* x, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

ARBOR_AVX2 void scale_avx2(float* x, float s, int64_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
  for (; i < n; ++i) x[i] *= s;
}

ARBOR_AVX2 float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// vcvtps2ph rounds to nearest even and keeps subnormals as fp32_to_fp16 does; only its NaN
// (the input's payload, quieted) differs, so NaN lanes are set to sign | 0x7e00 after it.
ARBOR_AVX2 void f32_to_f16_avx2(const float* x, uint16_t* y, int64_t n) {
  const __m256i sign_mask = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i qnan = _mm256_set1_epi32(0x7e00);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if (_mm256_movemask_ps(nan) != 0) {
      // sign | 0x7e00 as 32-bit lanes, packed to 16 bits (values < 0x10000: no saturation).
      const __m256i fix = _mm256_or_si256(
          _mm256_srli_epi32(_mm256_and_si256(_mm256_castps_si256(v), sign_mask), 16), qnan);
      const __m128i fix16 = _mm_packus_epi32(_mm256_castsi256_si128(fix),
                                             _mm256_extracti128_si256(fix, 1));
      const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(_mm256_castps_si256(nan)),
                                            _mm256_extracti128_si256(_mm256_castps_si256(nan), 1));
      h = _mm_blendv_epi8(h, fix16, nan16);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), h);
  }
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

ARBOR_AVX2 bool any_nonfinite_avx2(const float* x, int64_t n) {
  const __m256i exp = _mm256_set1_epi32(0x7F800000);
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), exp);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(v, exp));
  }
  bool any = _mm256_testz_si256(bad, bad) == 0;
  for (; i < n; ++i) any |= (std::bit_cast<uint32_t>(x[i]) & 0x7F800000u) == 0x7F800000u;
  return any;
}

}  // namespace arbor::kernels::internal
