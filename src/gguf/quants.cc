// Reference codecs for the 32-element block types and the row-level dispatch. K-quants are in
// quants_k.cc. Expressions keep ggml-quants.c's evaluation order on purpose: the results must
// match bit for bit.
#include "gguf/quants.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "base/fp16.h"

namespace arbor::gguf {

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

namespace {

// The value with the largest magnitude (the first one on ties), as ggml's "max" for symmetric
// types: its sign decides the sign of d.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, int n, float* min, float* max) {
  *min = FLT_MAX;
  *max = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    if (x[j] < *min) *min = x[j];
    if (x[j] > *max) *max = x[j];
  }
}

}  // namespace

void quantize_block_q4_0(const float* x, BlockQ4_0* y) {
  const float max = signed_absmax(x, kQK4_0);
  const float d = max / -8;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = fp32_to_fp16(d);
  for (int j = 0; j < kQK4_0 / 2; ++j) {
    const float x0 = x[j] * id;
    const float x1 = x[kQK4_0 / 2 + j] * id;
    // ggml truncates through int8_t; the sums are in [0, 17) so int truncation is the same.
    const int xi0 = std::min(15, static_cast<int>(x0 + 8.5f));
    const int xi1 = std::min(15, static_cast<int>(x1 + 8.5f));
    y->qs[j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
  }
}

void quantize_block_q4_1(const float* x, BlockQ4_1* y) {
  float min, max;
  min_max(x, kQK4_1, &min, &max);
  const float d = (max - min) / ((1 << 4) - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = fp32_to_fp16(d);
  y->m = fp32_to_fp16(min);
  for (int j = 0; j < kQK4_1 / 2; ++j) {
    const float x0 = (x[j] - min) * id;
    const float x1 = (x[kQK4_1 / 2 + j] - min) * id;
    const int xi0 = std::min(15, static_cast<int>(x0 + 0.5f));
    const int xi1 = std::min(15, static_cast<int>(x1 + 0.5f));
    y->qs[j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
  }
}

void quantize_block_q5_0(const float* x, BlockQ5_0* y) {
  const float max = signed_absmax(x, kQK5_0);
  const float d = max / -16;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = fp32_to_fp16(d);
  uint32_t qh = 0;
  for (int j = 0; j < kQK5_0 / 2; ++j) {
    const float x0 = x[j] * id;
    const float x1 = x[kQK5_0 / 2 + j] * id;
    const uint32_t xi0 = static_cast<uint32_t>(std::min(31, static_cast<int>(x0 + 16.5f)));
    const uint32_t xi1 = static_cast<uint32_t>(std::min(31, static_cast<int>(x1 + 16.5f)));
    y->qs[j] = static_cast<uint8_t>((xi0 & 0x0f) | ((xi1 & 0x0f) << 4));
    qh |= ((xi0 & 0x10u) >> 4) << j;
    qh |= ((xi1 & 0x10u) >> 4) << (j + kQK5_0 / 2);
  }
  std::memcpy(y->qh, &qh, sizeof(qh));
}

void quantize_block_q5_1(const float* x, BlockQ5_1* y) {
  float min, max;
  min_max(x, kQK5_1, &min, &max);
  const float d = (max - min) / ((1 << 5) - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = fp32_to_fp16(d);
  y->m = fp32_to_fp16(min);
  uint32_t qh = 0;
  for (int j = 0; j < kQK5_1 / 2; ++j) {
    const float x0 = (x[j] - min) * id;
    const float x1 = (x[kQK5_1 / 2 + j] - min) * id;
    const uint32_t xi0 = static_cast<uint8_t>(x0 + 0.5f);
    const uint32_t xi1 = static_cast<uint8_t>(x1 + 0.5f);
    y->qs[j] = static_cast<uint8_t>((xi0 & 0x0f) | ((xi1 & 0x0f) << 4));
    qh |= ((xi0 & 0x10u) >> 4) << j;
    qh |= ((xi1 & 0x10u) >> 4) << (j + kQK5_1 / 2);
  }
  std::memcpy(y->qh, &qh, sizeof(qh));
}

void quantize_block_q8_0(const float* x, BlockQ8_0* y) {
  float amax = 0.0f;
  for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / ((1 << 7) - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = fp32_to_fp16(d);
  for (int j = 0; j < kQK8_0; ++j) y->qs[j] = static_cast<int8_t>(std::round(x[j] * id));
}

void quantize_block_q8_1(const float* x, BlockQ8_1* y) {
  float amax = 0.0f;
  for (int j = 0; j < kQK8_1; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / ((1 << 7) - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = fp32_to_fp16(d);
  int sum = 0;
  for (int j = 0; j < kQK8_1; ++j) {
    y->qs[j] = static_cast<int8_t>(std::round(x[j] * id));
    sum += y->qs[j];
  }
  y->s = fp32_to_fp16(static_cast<float>(sum) * d);
}

void dequantize_block_q4_0(const BlockQ4_0& x, float* y) {
  const float d = fp16_to_fp32(x.d);
  for (int j = 0; j < kQK4_0 / 2; ++j) {
    y[j] = static_cast<float>((x.qs[j] & 0x0f) - 8) * d;
    y[j + kQK4_0 / 2] = static_cast<float>((x.qs[j] >> 4) - 8) * d;
  }
}

void dequantize_block_q4_1(const BlockQ4_1& x, float* y) {
  const float d = fp16_to_fp32(x.d);
  const float m = fp16_to_fp32(x.m);
  for (int j = 0; j < kQK4_1 / 2; ++j) {
    y[j] = static_cast<float>(x.qs[j] & 0x0f) * d + m;
    y[j + kQK4_1 / 2] = static_cast<float>(x.qs[j] >> 4) * d + m;
  }
}

void dequantize_block_q5_0(const BlockQ5_0& x, float* y) {
  const float d = fp16_to_fp32(x.d);
  uint32_t qh;
  std::memcpy(&qh, x.qh, sizeof(qh));
  for (int j = 0; j < kQK5_0 / 2; ++j) {
    const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
    const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    y[j] = static_cast<float>(((x.qs[j] & 0x0f) | xh0) - 16) * d;
    y[j + kQK5_0 / 2] = static_cast<float>(((x.qs[j] >> 4) | xh1) - 16) * d;
  }
}

void dequantize_block_q5_1(const BlockQ5_1& x, float* y) {
  const float d = fp16_to_fp32(x.d);
  const float m = fp16_to_fp32(x.m);
  uint32_t qh;
  std::memcpy(&qh, x.qh, sizeof(qh));
  for (int j = 0; j < kQK5_1 / 2; ++j) {
    const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
    const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    y[j] = static_cast<float>((x.qs[j] & 0x0f) | xh0) * d + m;
    y[j + kQK5_1 / 2] = static_cast<float>((x.qs[j] >> 4) | xh1) * d + m;
  }
}

void dequantize_block_q8_0(const BlockQ8_0& x, float* y) {
  const float d = fp16_to_fp32(x.d);
  for (int j = 0; j < kQK8_0; ++j) y[j] = static_cast<float>(x.qs[j]) * d;
}

void dequantize_block_q8_1(const BlockQ8_1& x, float* y) {
  const float d = fp16_to_fp32(x.d);
  for (int j = 0; j < kQK8_1; ++j) y[j] = static_cast<float>(x.qs[j]) * d;
}

// ---------------------------------------------------------------------------------------------
// Row dispatch. Blocks are copied through a local so src/dst may have any alignment.

namespace {

template <typename Block, int kElems, void (*kQuantize)(const float*, Block*)>
void quantize_blocks(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kElems; ++i) {
    Block b;
    kQuantize(src + i * kElems, &b);
    std::memcpy(out + i * sizeof(Block), &b, sizeof(Block));
  }
}

template <typename Block, int kElems, void (*kDequantize)(const Block&, float*)>
void dequantize_blocks(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / kElems; ++i) {
    Block b;
    std::memcpy(&b, in + i * sizeof(Block), sizeof(Block));
    kDequantize(b, dst + i * kElems);
  }
}

void quantize_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void dequantize_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

template <uint16_t (*kConvert)(float)>
void quantize_half(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = kConvert(src[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

template <float (*kConvert)(uint16_t)>
void dequantize_half(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    dst[i] = kConvert(h);
  }
}

struct Codec {
  GgmlType type;
  void (*quantize)(const float*, void*, int64_t);
  void (*dequantize)(const void*, float*, int64_t);
};

#define ARBOR_BLOCK_CODEC_(kind, Block, elems, q, dq)                   \
  Codec {                                                               \
    GgmlType::kind, &quantize_blocks<Block, elems, q>,                  \
        &dequantize_blocks<Block, elems, dq>                            \
  }

const Codec* find_codec(GgmlType type) {
  static const Codec kCodecs[] = {
      {GgmlType::kF32, &quantize_f32, &dequantize_f32},
      {GgmlType::kF16, &quantize_half<fp32_to_fp16>, &dequantize_half<fp16_to_fp32>},
      {GgmlType::kBF16, &quantize_half<fp32_to_bf16>, &dequantize_half<bf16_to_fp32>},
      ARBOR_BLOCK_CODEC_(kQ4_0, BlockQ4_0, kQK4_0, quantize_block_q4_0, dequantize_block_q4_0),
      ARBOR_BLOCK_CODEC_(kQ4_1, BlockQ4_1, kQK4_1, quantize_block_q4_1, dequantize_block_q4_1),
      ARBOR_BLOCK_CODEC_(kQ5_0, BlockQ5_0, kQK5_0, quantize_block_q5_0, dequantize_block_q5_0),
      ARBOR_BLOCK_CODEC_(kQ5_1, BlockQ5_1, kQK5_1, quantize_block_q5_1, dequantize_block_q5_1),
      ARBOR_BLOCK_CODEC_(kQ8_0, BlockQ8_0, kQK8_0, quantize_block_q8_0, dequantize_block_q8_0),
      ARBOR_BLOCK_CODEC_(kQ8_1, BlockQ8_1, kQK8_1, quantize_block_q8_1, dequantize_block_q8_1),
      ARBOR_BLOCK_CODEC_(kQ2_K, BlockQ2_K, kQK_K, quantize_block_q2_K, dequantize_block_q2_K),
      ARBOR_BLOCK_CODEC_(kQ3_K, BlockQ3_K, kQK_K, quantize_block_q3_K, dequantize_block_q3_K),
      ARBOR_BLOCK_CODEC_(kQ4_K, BlockQ4_K, kQK_K, quantize_block_q4_K, dequantize_block_q4_K),
      ARBOR_BLOCK_CODEC_(kQ5_K, BlockQ5_K, kQK_K, quantize_block_q5_K, dequantize_block_q5_K),
      ARBOR_BLOCK_CODEC_(kQ6_K, BlockQ6_K, kQK_K, quantize_block_q6_K, dequantize_block_q6_K),
      ARBOR_BLOCK_CODEC_(kQ8_K, BlockQ8_K, kQK_K, quantize_block_q8_K, dequantize_block_q8_K),
      ARBOR_BLOCK_CODEC_(kMXFP4, BlockMxfp4, kQKMxfp4, quantize_block_mxfp4,
                         dequantize_block_mxfp4),
      ARBOR_BLOCK_CODEC_(kIQ4_NL, BlockIq4Nl, kQK4_NL, quantize_block_iq4_nl,
                         dequantize_block_iq4_nl),
      ARBOR_BLOCK_CODEC_(kIQ4_XS, BlockIq4Xs, kQK_K, quantize_block_iq4_xs,
                         dequantize_block_iq4_xs),
  };
  for (const Codec& c : kCodecs) {
    if (c.type == type) return &c;
  }
  return nullptr;
}
#undef ARBOR_BLOCK_CODEC_

Status check_row(GgmlType type, int64_t n, std::string_view what) {
  const auto traits = ggml_type_traits(static_cast<uint32_t>(type));
  if (!traits) return invalid_argument(what, ": unknown ggml type ", static_cast<uint32_t>(type));
  if (find_codec(type) == nullptr) {
    return unimplemented(what, " of ", traits->name, " is not implemented");
  }
  if (n < 0 || n % traits->block_size != 0) {
    return invalid_argument(what, " of ", traits->name, ": row length ", n,
                            " is not a non-negative multiple of the block size ",
                            traits->block_size);
  }
  return ok_status();
}

}  // namespace

bool can_quantize(GgmlType type) { return find_codec(type) != nullptr; }
bool can_dequantize(GgmlType type) { return find_codec(type) != nullptr; }

Status quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  if (Status s = check_row(type, n, "quantize"); !s.ok()) return s;
  find_codec(type)->quantize(src, dst, n);
  return ok_status();
}

Status dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  if (Status s = check_row(type, n, "dequantize"); !s.ok()) return s;
  find_codec(type)->dequantize(src, dst, n);
  return ok_status();
}

}  // namespace arbor::gguf
