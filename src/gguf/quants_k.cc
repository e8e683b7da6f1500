// Reference codecs for the 256-element "K" super-block types (Q2_K..Q8_K), bit-exact with
// ggml-quants.c's quantize_row_*_ref / dequantize_row_*. The scale searches below keep ggml's
// evaluation order and float types on purpose; do not "simplify" them.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "base/fp16.h"
#include "gguf/quants.h"

namespace arbor::gguf {

namespace {

constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest (ties to even) by adding 1.5 * 2^23, as ggml's nearest_int does. Exact for
// |x| <= 4194303; beyond that the result is garbage, but deterministic (as in ggml).
int nearest_int(float x) {
  const float v = x + 12582912.f;
  const int32_t i = std::bit_cast<int32_t>(v);
  return (i & 0x007fffff) - 0x00400000;
}

// The value of largest magnitude among x[0..n) (the first one on ties) and that magnitude.
struct SignedAbsMax {
  float max;   // signed
  float amax;  // |max|
};
SignedAbsMax signed_absmax(const float* x, int n) {
  SignedAbsMax r{0.f, 0.f};
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > r.amax) {
      r.amax = ax;
      r.max = x[i];
    }
  }
  return r;
}

// Symmetric quantisation of n values to [-nmax, nmax-1] with an RMSE-weighted scale search
// (ggml's make_qx_quants with rmse_type 1 and no importance weights: w = x^2).
// L receives quants offset by nmax, in [0, 2*nmax-1].
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  const auto [max, amax] = signed_absmax(x, n);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// ggml's make_q3_quants with do_rmse = true: an initial symmetric fit, then up to five passes
// that move single quants while that lowers the weighted error. L receives quants + nmax.
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  const auto [max, amax] = signed_absmax(x, n);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

struct QkxParams {
  float rmin;
  float rdelta;
  int nstep;
  bool use_mad;
};

// Weighted error of quants L with the given scale and min (ggml's inner loops).
float qkx_error(int n, const float* x, const float* weights, const uint8_t* L, float scale,
                float min, bool use_mad) {
  float error = 0;
  for (int i = 0; i < n; ++i) {
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    error += weights[i] * diff;
  }
  return error;
}

// Asymmetric quantisation of n values to [0, nmax] with a searched scale and min (ggml's
// make_qkx2_quants). Returns the scale; *the_min receives -min (a non-negative offset).
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, QkxParams p) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
  }
  float best_error = qkx_error(n, x, weights, L, scale, min, p.use_mad);
  for (int is = 0; is <= p.nstep; ++is) {
    iscale = (p.rmin + p.rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      const float cur_error = qkx_error(n, x, weights, Laux, this_scale, this_min, p.use_mad);
      if (cur_error < best_error) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

}  // namespace

void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

namespace {

// Packs 8 six-bit scales and mins into Q4_K/Q5_K's 12 bytes.
void pack_scales_k4(const float* scales, const float* mins, float max_scale, float max_min,
                    uint8_t* out) {
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < kQK_K / 32; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    ls = std::min<uint8_t>(63, ls);
    lm = std::min<uint8_t>(63, lm);
    if (j < 4) {
      out[j] = ls;
      out[j + 4] = lm;
    } else {
      out[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      out[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      out[j - 0] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
}

// Fits 8 sub-blocks of 32 with make_qkx2_quants (Q4_K: nmax 15; Q5_K: nmax 31), packs scales
// and mins, then requantises every value against the rounded scales. L: [256].
void quantize_k4_common(const float* x, int nmax, QkxParams params, uint16_t* d, uint16_t* dmin,
                        uint8_t* packed_scales, uint8_t* L) {
  uint8_t Laux[32];
  float weights[32];
  float mins[kQK_K / 32];
  float scales[kQK_K / 32];
  float max_scale = 0;  // as the min is deducted, scales are never negative
  float max_min = 0;
  for (int j = 0; j < kQK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                 params);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  std::memset(packed_scales, 0, kKScaleSize);
  pack_scales_k4(scales, mins, max_scale, max_min, packed_scales);
  *d = fp32_to_fp16(max_scale / 63.f);
  *dmin = fp32_to_fp16(max_min / 63.f);
  for (int j = 0; j < kQK_K / 32; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, packed_scales, &sc, &m);
    const float dj = fp16_to_fp32(*d) * sc;
    if (dj == 0) continue;
    const float dm = fp16_to_fp32(*dmin) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / dj);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

}  // namespace

// Decodes Q3_K's 16 six-bit scales (minus 32).
void unpack_scales_q3(const uint8_t* packed, int* out) {
  for (int j = 0; j < kQK_K / 16; ++j) {
    const int low = j < 8 ? (packed[j] & 0xF) : (packed[j - 8] >> 4);
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (low | (high << 4)) - 32;
  }
}

namespace {

}  // namespace

// ------------------------------------------------------------------------------------- Q2_K

void quantize_block_q2_K(const float* x, BlockQ2_K* y) {
  uint8_t L[kQK_K];
  uint8_t Laux[16];
  float weights[16];
  float mins[kQK_K / 16];
  float scales[kQK_K / 16];
  const float q4scale = 15.f;
  float max_scale = 0;
  float max_min = 0;
  for (int j = 0; j < kQK_K / 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                 {-0.5f, 0.1f, 15, true});
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  if (max_scale > 0) {
    const float iscale = q4scale / max_scale;
    for (int j = 0; j < kQK_K / 16; ++j) {
      y->scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
    }
    y->d = fp32_to_fp16(max_scale / q4scale);
  } else {
    for (int j = 0; j < kQK_K / 16; ++j) y->scales[j] = 0;
    y->d = fp32_to_fp16(0.f);
  }
  if (max_min > 0) {
    const float iscale = q4scale / max_min;
    for (int j = 0; j < kQK_K / 16; ++j) {
      y->scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
    }
    y->dmin = fp32_to_fp16(max_min / q4scale);
  } else {
    y->dmin = fp32_to_fp16(0.f);
  }
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = fp16_to_fp32(y->d) * (y->scales[j] & 0xF);
    if (d == 0) continue;
    const float dm = fp16_to_fp32(y->dmin) * (y->scales[j] >> 4);
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int((x[16 * j + ii] + dm) / d);
      L[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
    }
  }
  for (int j = 0; j < kQK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      y->qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                              (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
  }
}

void dequantize_block_q2_K(const BlockQ2_K& x, float* y) {
  const float d = fp16_to_fp32(x.d);
  const float min = fp16_to_fp32(x.dmin);
  const uint8_t* q = x.qs;
  int is = 0;
  for (int n = 0; n < kQK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = x.scales[is++];
        const float dl = d * (sc & 0xF);
        const float ml = min * (sc >> 4);
        for (int l = 0; l < 16; ++l) {
          *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
        }
      }
    }
    q += 32;
  }
}

// ------------------------------------------------------------------------------------- Q3_K

void quantize_block_q3_K(const float* x, BlockQ3_K* y) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  float max_scale = 0;
  float amax = 0;
  for (int j = 0; j < kQK_K / 16; ++j) {
    scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
    const float scale = std::fabs(scales[j]);
    if (scale > amax) {
      amax = scale;
      max_scale = scales[j];
    }
  }
  std::memset(y->scales, 0, 12);
  if (max_scale != 0) {
    const float iscale = -32.f / max_scale;
    for (int j = 0; j < kQK_K / 16; ++j) {
      int l = std::max(-32, std::min(31, static_cast<int>(static_cast<int8_t>(
                                             nearest_int(iscale * scales[j]))))) + 32;
      if (j < 8) {
        y->scales[j] = static_cast<uint8_t>(l & 0xF);
      } else {
        y->scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
      }
      l >>= 4;
      y->scales[j % 4 + 8] |= static_cast<uint8_t>(l << (2 * (j / 4)));
    }
    y->d = fp32_to_fp16(1 / iscale);
  } else {
    y->d = fp32_to_fp16(0.f);
  }
  int sc[kQK_K / 16];
  unpack_scales_q3(y->scales, sc);
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = fp16_to_fp32(y->d) * sc[j];
    if (d == 0) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int(x[16 * j + ii] / d);
      L[16 * j + ii] = static_cast<int8_t>(std::max(-4, std::min(3, l)) + 4);
    }
  }
  // The high bit of the first 32 quants goes to bit 0 of hmask[0..31], the next 32 to bit 1...
  std::memset(y->hmask, 0, kQK_K / 8);
  for (int j = 0; j < kQK_K; ++j) {
    if (L[j] > 3) {
      y->hmask[j % 32] |= static_cast<uint8_t>(1u << (j / 32));
      L[j] = static_cast<int8_t>(L[j] - 4);
    }
  }
  for (int j = 0; j < kQK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      y->qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                              (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
  }
}

void dequantize_block_q3_K(const BlockQ3_K& x, float* y) {
  const float d_all = fp16_to_fp32(x.d);
  int scales[kQK_K / 16];
  unpack_scales_q3(x.scales, scales);
  const uint8_t* q = x.qs;
  const uint8_t* hm = x.hmask;
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < kQK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * static_cast<float>(scales[is++]);
        for (int l = 0; l < 16; ++l) {
          const int k = l + 16 * half;
          *y++ = dl * static_cast<float>(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
        }
      }
      m = static_cast<uint8_t>(m << 1);
    }
    q += 32;
  }
}

// ------------------------------------------------------------------------------------- Q4_K

void quantize_block_q4_K(const float* x, BlockQ4_K* y) {
  uint8_t L[kQK_K];
  quantize_k4_common(x, 15, {-1.f, 0.1f, 20, false}, &y->d, &y->dmin, y->scales, L);
  uint8_t* q = y->qs;
  for (int j = 0; j < kQK_K; j += 64) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    q += 32;
  }
}

void dequantize_block_q4_K(const BlockQ4_K& x, float* y) {
  const uint8_t* q = x.qs;
  const float d = fp16_to_fp32(x.d);
  const float min = fp16_to_fp32(x.dmin);
  int is = 0;
  for (int j = 0; j < kQK_K; j += 64) {
    uint8_t sc, m;
    get_scale_min_k4(is + 0, x.scales, &sc, &m);
    const float d1 = d * sc;
    const float m1 = min * m;
    get_scale_min_k4(is + 1, x.scales, &sc, &m);
    const float d2 = d * sc;
    const float m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

// ------------------------------------------------------------------------------------- Q5_K

void quantize_block_q5_K(const float* x, BlockQ5_K* y) {
  uint8_t L[kQK_K];
  quantize_k4_common(x, 31, {-0.5f, 0.1f, 15, false}, &y->d, &y->dmin, y->scales, L);
  uint8_t* qh = y->qh;
  uint8_t* ql = y->qs;
  std::memset(qh, 0, kQK_K / 8);
  uint8_t m1 = 1, m2 = 2;
  for (int n = 0; n < kQK_K; n += 64) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j];
      if (l1 > 15) {
        l1 -= 16;
        qh[j] |= m1;
      }
      int l2 = L[n + j + 32];
      if (l2 > 15) {
        l2 -= 16;
        qh[j] |= m2;
      }
      ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
    }
    m1 = static_cast<uint8_t>(m1 << 2);
    m2 = static_cast<uint8_t>(m2 << 2);
    ql += 32;
  }
}

void dequantize_block_q5_K(const BlockQ5_K& x, float* y) {
  const uint8_t* ql = x.qs;
  const uint8_t* qh = x.qh;
  const float d = fp16_to_fp32(x.d);
  const float min = fp16_to_fp32(x.dmin);
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < kQK_K; j += 64) {
    uint8_t sc, m;
    get_scale_min_k4(is + 0, x.scales, &sc, &m);
    const float d1 = d * sc;
    const float m1 = min * m;
    get_scale_min_k4(is + 1, x.scales, &sc, &m);
    const float d2 = d * sc;
    const float m2 = min * m;
    for (int l = 0; l < 32; ++l) {
      *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
    ql += 32;
    is += 2;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

// ------------------------------------------------------------------------------------- Q6_K

void quantize_block_q6_K(const float* x, BlockQ6_K* y) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  float max_scale = 0;
  float max_abs_scale = 0;
  for (int ib = 0; ib < kQK_K / 16; ++ib) {
    scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
    const float abs_scale = std::fabs(scales[ib]);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scales[ib];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(y, 0, sizeof(*y));
    y->d = fp32_to_fp16(0.f);
    return;
  }
  const float iscale = -128.f / max_scale;
  y->d = fp32_to_fp16(1 / iscale);
  for (int ib = 0; ib < kQK_K / 16; ++ib) {
    y->scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
  }
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = fp16_to_fp32(y->d) * y->scales[j];
    if (d == 0) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int(x[16 * j + ii] / d);
      L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
    }
  }
  uint8_t* ql = y->ql;
  uint8_t* qh = y->qh;
  for (int j = 0; j < kQK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l + 0] & 0xF;
      const int q2 = L[j + l + 32] & 0xF;
      const int q3 = L[j + l + 64] & 0xF;
      const int q4 = L[j + l + 96] & 0xF;
      ql[l + 0] = static_cast<uint8_t>(q1 | (q3 << 4));
      ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
      qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                   ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

void dequantize_block_q6_K(const BlockQ6_K& x, float* y) {
  const float d = fp16_to_fp32(x.d);
  const uint8_t* ql = x.ql;
  const uint8_t* qh = x.qh;
  const int8_t* sc = x.scales;
  for (int n = 0; n < kQK_K; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l + 0] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// ------------------------------------------------------------------------------------- Q8_K

void quantize_block_q8_K(const float* x, BlockQ8_K* y) {
  const auto [max, amax] = signed_absmax(x, kQK_K);
  if (amax == 0) {
    y->d = 0;
    std::memset(y->qs, 0, sizeof(y->qs));
    std::memset(y->bsums, 0, sizeof(y->bsums));
    return;
  }
  // -127 rather than -128, as in ggml (its IQ2_XXS dot products rely on it).
  const float iscale = -127.f / max;
  for (int j = 0; j < kQK_K; ++j) {
    y->qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
  }
  for (int j = 0; j < kQK_K / 16; ++j) {
    int sum = 0;
    for (int ii = 0; ii < 16; ++ii) sum += y->qs[j * 16 + ii];
    y->bsums[j] = static_cast<int16_t>(sum);
  }
  y->d = 1 / iscale;
}

void dequantize_block_q8_K(const BlockQ8_K& x, float* y) {
  for (int j = 0; j < kQK_K; ++j) y[j] = x.d * x.qs[j];
}

}  // namespace arbor::gguf
