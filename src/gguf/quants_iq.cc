// Reference codecs for the codebook types MXFP4, IQ4_NL and IQ4_XS, bit-exact with
// ggml-quants.c's quantize_mxfp4 / quantize_iq4_nl / quantize_iq4_xs (no importance matrix) and
// dequantize_row_*. The scale search keeps ggml's evaluation order and float types on purpose
// (this file compiles with -ffp-contract=off, like quants.cc); do not "simplify" it.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "base/fp16.h"
#include "gguf/quants.h"

namespace arbor::gguf {

static_assert(sizeof(BlockMxfp4) == 17);
static_assert(sizeof(BlockIq4Nl) == 18);
static_assert(sizeof(BlockIq4Xs) == 136);

float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  return std::bit_cast<float>(bits);
}

namespace {

constexpr float kGroupMaxEps = 1e-15f;

int nearest_int(float x) {
  const float v = x + 12582912.f;
  return (std::bit_cast<int32_t>(v) & 0x007fffff) - 0x00400000;
}

// The index of the codebook value nearest x (the first on ties), by ggml's bisection over the
// ascending kIq4nlValues (ties between neighbours go to the upper one, as in ggml).
int best_index_iq4(float x) {
  const int8_t* val = kIq4nlValues;
  if (x <= val[0]) return 0;
  if (x >= val[15]) return 15;
  int ml = 0, mu = 15;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < val[mav]) {
      mu = mav;
    } else {
      ml = mav;
    }
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

int best_index_mxfp4(float x, float e) {
  int best = 0;
  float best_err = std::fabs(kMxfp4Values[0] * e - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(kMxfp4Values[i] * e - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

// Sum of w q x and w q^2 over the block of 32 for the codes nearest id * x (codes into L when
// not null).
void fit_codes(const float* xb, const float* weight, float id, uint8_t* L, float* sumqx,
               float* sumq2) {
  *sumqx = 0;
  *sumq2 = 0;
  for (int j = 0; j < 32; ++j) {
    const float al = id * xb[j];
    const int l = best_index_iq4(al);
    if (L != nullptr) L[j] = static_cast<uint8_t>(l);
    const float q = kIq4nlValues[l];
    const float w = weight[j];
    *sumqx += w * q * xb[j];
    *sumq2 += w * q * q;
  }
}

// The least-squares scale of one block of 32 (ggml's first loop of quantize_row_iq4_nl_impl
// with ntry = 7 and weights x^2); 0 for a block below kGroupMaxEps. Codes into L.
float block_scale(const float* xb, uint8_t* L) {
  constexpr int kTries = 7;
  float weight[32];
  for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    const float ax = std::fabs(xb[j]);
    if (ax > amax) {
      amax = ax;
      max = xb[j];
    }
  }
  if (amax < kGroupMaxEps) return 0;
  float d = -max / kIq4nlValues[0];
  float sumqx, sumq2;
  fit_codes(xb, weight, 1 / d, L, &sumqx, &sumq2);
  d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
  float best = d * sumqx;
  for (int itry = -kTries; itry <= kTries; ++itry) {
    const float id = (itry + kIq4nlValues[0]) / max;
    fit_codes(xb, weight, id, nullptr, &sumqx, &sumq2);
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

void pack_nibbles(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(L[j] | L[16 + j] << 4);
}

}  // namespace

void quantize_block_mxfp4(const float* x, BlockMxfp4* y) {
  float amax = 0.0f;
  for (int j = 0; j < kQKMxfp4; ++j) amax = std::max(amax, std::fabs(x[j]));
  // ggml casts floor(log2(amax)) - 2 + 127 to uint8_t; below 2^-125 that is negative (undefined
  // behaviour in C), so it is clamped to 0 here.
  const float e_f = amax > 0.0f ? std::floor(std::log2(amax)) - 2 + 127 : 0.0f;
  const auto e = static_cast<uint8_t>(std::clamp(e_f, 0.0f, 255.0f));
  const float d = e8m0_to_fp32_half(e);
  y->e = e;
  for (int j = 0; j < kQKMxfp4 / 2; ++j) {
    const int x0 = best_index_mxfp4(x[j], d);
    const int x1 = best_index_mxfp4(x[kQKMxfp4 / 2 + j], d);
    y->qs[j] = static_cast<uint8_t>(x0 | x1 << 4);
  }
}

void quantize_block_iq4_nl(const float* x, BlockIq4Nl* y) {
  uint8_t L[32];
  const float scale = block_scale(x, L);
  y->d = fp32_to_fp16(scale);
  const float id = scale != 0.0f ? 1 / scale : 0;
  for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(best_index_iq4(id * x[j]));
  pack_nibbles(L, y->qs);
}

void quantize_block_iq4_xs(const float* x, BlockIq4Xs* y) {
  float scales[8];
  uint8_t L[32];
  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < 8; ++ib) {
    scales[ib] = block_scale(x + 32 * ib, L);
    if (std::fabs(scales[ib]) > amax_scale) {
      amax_scale = std::fabs(scales[ib]);
      max_scale = scales[ib];
    }
  }
  const float d = -max_scale / 32;
  y->d = fp32_to_fp16(d);
  y->scales_h = 0;
  const float id = d != 0.0f ? 1 / d : 0.f;
  for (int ib = 0; ib < 8; ++ib) {
    int l = nearest_int(id * scales[ib]);
    l = std::max(-32, std::min(31, l));
    const float dl = d * l;
    const float idl = dl != 0.0f ? 1 / dl : 0.f;
    const float* xb = x + 32 * ib;
    for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(best_index_iq4(idl * xb[j]));
    pack_nibbles(L, y->qs + 16 * ib);
    l += 32;
    const auto l_l = static_cast<uint8_t>(l & 0xf);
    if (ib % 2 == 0) {
      y->scales_l[ib / 2] = l_l;
    } else {
      y->scales_l[ib / 2] |= static_cast<uint8_t>(l_l << 4);
    }
    y->scales_h = static_cast<uint16_t>(y->scales_h | (l >> 4) << 2 * ib);
  }
}

void dequantize_block_mxfp4(const BlockMxfp4& x, float* y) {
  const float d = e8m0_to_fp32_half(x.e);
  for (int j = 0; j < kQKMxfp4 / 2; ++j) {
    y[j] = kMxfp4Values[x.qs[j] & 0x0F] * d;
    y[j + kQKMxfp4 / 2] = kMxfp4Values[x.qs[j] >> 4] * d;
  }
}

void dequantize_block_iq4_nl(const BlockIq4Nl& x, float* y) {
  const float d = fp16_to_fp32(x.d);
  for (int j = 0; j < kQK4_NL / 2; ++j) {
    y[j] = d * kIq4nlValues[x.qs[j] & 0xf];
    y[j + kQK4_NL / 2] = d * kIq4nlValues[x.qs[j] >> 4];
  }
}

void dequantize_block_iq4_xs(const BlockIq4Xs& x, float* y) {
  const float d = fp16_to_fp32(x.d);
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = ((x.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | ((x.scales_h >> 2 * ib) & 3) << 4;
    const float dl = d * (ls - 32);
    const uint8_t* qs = x.qs + 16 * ib;
    for (int j = 0; j < 16; ++j) {
      y[32 * ib + j] = dl * kIq4nlValues[qs[j] & 0xf];
      y[32 * ib + j + 16] = dl * kIq4nlValues[qs[j] >> 4];
    }
  }
}

}  // namespace arbor::gguf
