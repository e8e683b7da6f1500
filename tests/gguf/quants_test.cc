#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "gguf/gguf.h"
#include "gguf/quants.h"
#include "test_files.h"

namespace arbor::gguf {
namespace {

std::vector<float> iota_block(int n, float start, float step) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) x[j] = start + step * static_cast<float>(j);
  return x;
}

// ------------------------------------------------------------------ hand-computed blocks

// x = -16..15: max is -16, so d = -16 / -8 = 2 and id = 0.5; q = trunc(x/2 + 8.5), capped
// at 15. Odd x lands on .5 and rounds up (x = -15 -> q 1 -> -14).
TEST(QuantsKnownAnswer, Q4_0) {
  const auto x = iota_block(32, -16, 1);
  BlockQ4_0 b;
  quantize_block_q4_0(x.data(), &b);
  EXPECT_EQ(b.d, 0x4000);  // 2.0
  const uint8_t expected[16] = {0x80, 0x91, 0x91, 0xA2, 0xA2, 0xB3, 0xB3, 0xC4,
                                0xC4, 0xD5, 0xD5, 0xE6, 0xE6, 0xF7, 0xF7, 0xF8};
  EXPECT_EQ(std::memcmp(b.qs, expected, 16), 0);
  float y[32];
  dequantize_block_q4_0(b, y);
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[1], -14.0f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[31], 14.0f);  // 15 would need q = 16
}

// amax 127 gives d = 1 exactly; q8_0 rounds half away from zero (roundf).
TEST(QuantsKnownAnswer, Q8_0) {
  std::vector<float> x(32, 0.0f);
  const float head[] = {127, -3.5f, 2.5f, 0.49f, -0.5f, 1.5f, -127};
  std::copy(std::begin(head), std::end(head), x.begin());
  BlockQ8_0 b;
  quantize_block_q8_0(x.data(), &b);
  EXPECT_EQ(b.d, 0x3C00);
  const int8_t expected[] = {127, -4, 3, 0, -1, 2, -127, 0};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(b.qs[j], expected[j]) << j;
}

// x = (j % 16) - 2.75: min -2.75, max 12.25, d = 1, q = j % 16.
TEST(QuantsKnownAnswer, Q4_1) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16) - 2.75f;
  BlockQ4_1 b;
  quantize_block_q4_1(x.data(), &b);
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_EQ(b.m, 0xC180);  // -2.75
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], 0x11 * j) << j;
  float y[32];
  dequantize_block_q4_1(b, y);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]) << j;
}

// x = -16..15: d = 1, q = j; the fifth bit is set for j >= 16.
TEST(QuantsKnownAnswer, Q5_0) {
  const auto x = iota_block(32, -16, 1);
  BlockQ5_0 b;
  quantize_block_q5_0(x.data(), &b);
  EXPECT_EQ(b.d, 0x3C00);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], 0x11 * j) << j;
  const uint8_t qh[4] = {0, 0, 0xFF, 0xFF};
  EXPECT_EQ(std::memcmp(b.qh, qh, 4), 0);
  float y[32];
  dequantize_block_q5_0(b, y);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]) << j;
}

// x = 1 + j/2: min 1, d = 15.5 / 31 = 0.5, q = j.
TEST(QuantsKnownAnswer, Q5_1) {
  const auto x = iota_block(32, 1, 0.5f);
  BlockQ5_1 b;
  quantize_block_q5_1(x.data(), &b);
  EXPECT_EQ(b.d, 0x3800);
  EXPECT_EQ(b.m, 0x3C00);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], 0x11 * j) << j;
  const uint8_t qh[4] = {0, 0, 0xFF, 0xFF};
  EXPECT_EQ(std::memcmp(b.qh, qh, 4), 0);
  float y[32];
  dequantize_block_q5_1(b, y);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]) << j;
}

// Hand-built K blocks: the decoders must find every scale, min and quant where ggml puts it.
// Q2_K: scale byte j = (j % 4) | (j % 3) << 4, d = dmin = 1; qs = 0xE4 puts quant s in the
// s-th 2-bit field, i.e. element e has q = (e % 128) / 32.
TEST(QuantsKnownAnswer, Q2_KDecode) {
  BlockQ2_K b;
  for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>((j % 4) | ((j % 3) << 4));
  std::memset(b.qs, 0xE4, sizeof(b.qs));
  b.d = 0x3C00;
  b.dmin = 0x3C00;
  float y[256];
  dequantize_block_q2_K(b, y);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 16;
    EXPECT_EQ(y[e], static_cast<float>((s % 4) * ((e % 128) / 32) - (s % 3))) << e;
  }
}

// Q3_K: every 6-bit scale is 33 (so d * (sc - 32) = 1); hmask bits 0-3 set means the first
// 128 quants keep their value and the rest get -4.
TEST(QuantsKnownAnswer, Q3_KDecode) {
  BlockQ3_K b;
  std::memset(b.scales, 0x11, 8);
  std::memset(b.scales + 8, 0xAA, 4);
  std::memset(b.qs, 0xE4, sizeof(b.qs));
  std::memset(b.hmask, 0x0F, sizeof(b.hmask));
  b.d = 0x3C00;
  float y[256];
  dequantize_block_q3_K(b, y);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], static_cast<float>((e % 128) / 32 - (e >= 128 ? 4 : 0))) << e;
  }
}

// Q4_K/Q5_K: sub-block s has scale s+1 and min s, packed into 12 bytes; d = 1, dmin = 0.5.
void fill_k4_scales(uint8_t* scales) {
  const uint8_t packed[12] = {1, 2, 3, 4, 0, 1, 2, 3, 0x45, 0x56, 0x67, 0x78};
  std::memcpy(scales, packed, 12);
}

TEST(QuantsKnownAnswer, Q4_KDecode) {
  BlockQ4_K b;
  b.d = 0x3C00;
  b.dmin = 0x3800;
  fill_k4_scales(b.scales);
  std::memset(b.qs, 0x53, sizeof(b.qs));  // even sub-blocks read 3, odd ones 5
  float y[256];
  dequantize_block_q4_K(b, y);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    EXPECT_EQ(y[e], static_cast<float>((s + 1) * (s % 2 == 0 ? 3 : 5)) - 0.5f * s) << e;
  }
}

TEST(QuantsKnownAnswer, Q5_KDecode) {
  BlockQ5_K b;
  b.d = 0x3C00;
  b.dmin = 0x3800;
  fill_k4_scales(b.scales);
  std::memset(b.qs, 0x53, sizeof(b.qs));
  std::memset(b.qh, 0x55, sizeof(b.qh));  // fifth bit only for even sub-blocks
  float y[256];
  dequantize_block_q5_K(b, y);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    EXPECT_EQ(y[e], static_cast<float>((s + 1) * (s % 2 == 0 ? 19 : 5)) - 0.5f * s) << e;
  }
}

// Q6_K: every quant is 33 (value 1), scale of sub-block s is s+1 (negative for s >= 8).
TEST(QuantsKnownAnswer, Q6_KDecode) {
  BlockQ6_K b;
  std::memset(b.ql, 0x11, sizeof(b.ql));
  std::memset(b.qh, 0xAA, sizeof(b.qh));
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s < 8 ? s + 1 : -(s + 1));
  b.d = 0x3C00;
  float y[256];
  dequantize_block_q6_K(b, y);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 16;
    EXPECT_EQ(y[e], static_cast<float>(s < 8 ? s + 1 : -(s + 1))) << e;
  }
}

TEST(QuantsKnownAnswer, Q8_KRoundTripAndBsums) {
  std::vector<float> x(256);
  for (int j = 0; j < 256; ++j) x[j] = static_cast<float>(j - 127);  // max |x| = 128 at j = 255
  BlockQ8_K b;
  quantize_block_q8_K(x.data(), &b);
  EXPECT_EQ(b.qs[255], -127);  // the largest magnitude maps to -127 (iscale = -127/max)
  int sum = 0;
  for (int j = 0; j < 16; ++j) sum += b.qs[j];
  EXPECT_EQ(b.bsums[0], sum);
  float y[256];
  dequantize_block_q8_K(b, y);
  for (int j = 0; j < 256; ++j) EXPECT_NEAR(y[j], x[j], 128.0f / 127 / 2 + 1e-4f) << j;
}

// --------------------------------------------------------------------- round-trip error

struct Tolerance {
  GgmlType type;
  double max_rel_rmse;  // sqrt(sum err^2 / sum x^2) over the whole test vector
};

// Gaussian data with a few outliers; error bounds are 1.25x what the reference codecs reach
// on this data (run with ARBOR_PRINT_QUANT_ERRORS=1 to see them), so a codec bug (a wrong
// bit, a swapped nibble) blows through them.
TEST(QuantsRoundTrip, ErrorWithinTolerance) {
  const Tolerance cases[] = {
      {GgmlType::kF32, 0.0},      {GgmlType::kF16, 0.0003},   {GgmlType::kBF16, 0.0022},
      {GgmlType::kQ8_0, 0.0072},  {GgmlType::kQ8_1, 0.0072},  {GgmlType::kQ5_0, 0.058},
      {GgmlType::kQ5_1, 0.049},   {GgmlType::kQ4_0, 0.115},   {GgmlType::kQ4_1, 0.102},
      {GgmlType::kQ8_K, 0.0115},  {GgmlType::kQ6_K, 0.0235},  {GgmlType::kQ5_K, 0.047},
      {GgmlType::kQ4_K, 0.093},   {GgmlType::kQ3_K, 0.195},   {GgmlType::kQ2_K, 0.38},
  };

  const uint32_t seed = 20240611;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 8192;
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  for (int i = 0; i < 8; ++i) x[static_cast<size_t>(rng() % n)] *= 8;  // outliers
  for (const Tolerance& c : cases) {
    SCOPED_TRACE(std::string(ggml_type_name(c.type)) + " seed " + std::to_string(seed));
    ASSERT_TRUE(can_quantize(c.type));
    std::vector<uint8_t> q(ggml_row_size(c.type, n));
    std::vector<float> y(n);
    ASSERT_TRUE(quantize_row(c.type, x.data(), q.data(), n).ok());
    ASSERT_TRUE(dequantize_row(c.type, q.data(), y.data(), n).ok());
    double err2 = 0, x2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      err2 += double(y[i] - x[i]) * (y[i] - x[i]);
      x2 += double(x[i]) * x[i];
    }
    const double rel = std::sqrt(err2 / x2);
    EXPECT_LE(rel, c.max_rel_rmse);
    if (c.max_rel_rmse > 0) {
      EXPECT_GT(rel, c.max_rel_rmse / 4) << "tolerance is too loose";
    }
    if (std::getenv("ARBOR_PRINT_QUANT_ERRORS") != nullptr) {
      std::printf("%s rel rmse %.6f\n", std::string(ggml_type_name(c.type)).c_str(), rel);
    }
    // Deterministic: quantising again gives the same bytes.
    std::vector<uint8_t> q2(q.size());
    ASSERT_TRUE(quantize_row(c.type, x.data(), q2.data(), n).ok());
    EXPECT_EQ(q, q2);
  }
}

// Zero blocks stay exactly zero, for every codec.
TEST(QuantsRoundTrip, ZerosStayZero) {
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                     GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                     GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K}) {
    std::vector<float> x(512, 0.0f), y(512, 1.0f);
    std::vector<uint8_t> q(ggml_row_size(t, 512), 0xAB);
    ASSERT_TRUE(quantize_row(t, x.data(), q.data(), 512).ok());
    ASSERT_TRUE(dequantize_row(t, q.data(), y.data(), 512).ok());
    for (float v : y) ASSERT_EQ(v, 0.0f) << ggml_type_name(t);
  }
}

// Rows may start anywhere (tensor data inside a file need not be aligned for the block).
TEST(QuantsRoundTrip, UnalignedBuffers) {
  std::vector<float> x = iota_block(256, -3, 0.03f);
  std::vector<uint8_t> q(ggml_row_size(GgmlType::kQ6_K, 256) + 1);
  ASSERT_TRUE(quantize_row(GgmlType::kQ6_K, x.data(), q.data() + 1, 256).ok());
  std::vector<float> y(256);
  ASSERT_TRUE(dequantize_row(GgmlType::kQ6_K, q.data() + 1, y.data(), 256).ok());
  // Symmetric 6-bit: the step is about max|x| / 32 per sub-block (<= 4.7 / 32 here).
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(y[i], x[i], 0.08f) << i;
}

TEST(QuantsRowApi, Errors) {
  std::vector<float> x(64);
  std::vector<uint8_t> q(64 * 4);
  const Status bad_len = quantize_row(GgmlType::kQ4_0, x.data(), q.data(), 33);
  EXPECT_EQ(bad_len.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_len.message(),
            "quantize of q4_0: row length 33 is not a non-negative multiple of the block size 32");
  const Status iq = dequantize_row(GgmlType::kIQ2_XXS, q.data(), x.data(), 256);
  EXPECT_EQ(iq.code(), StatusCode::kUnimplemented);
  EXPECT_FALSE(can_quantize(GgmlType::kIQ3_S));
  EXPECT_TRUE(can_quantize(GgmlType::kIQ4_NL));
  EXPECT_EQ(dequantize_row(static_cast<GgmlType>(77), q.data(), x.data(), 32).code(),
            StatusCode::kInvalidArgument);
}

// F16/BF16 codecs are base/fp16.h's round-to-nearest-even conversions.
TEST(QuantsRowApi, HalfConversions) {
  const float x[4] = {1.0f, -2.5f, 65504.0f, 1e-8f};
  uint16_t h[4];
  ASSERT_TRUE(quantize_row(GgmlType::kF16, x, h, 4).ok());
  EXPECT_EQ(h[0], 0x3C00);
  EXPECT_EQ(h[1], 0xC100);
  EXPECT_EQ(h[2], 0x7BFF);
  EXPECT_EQ(h[3], 0x0000);
  ASSERT_TRUE(quantize_row(GgmlType::kBF16, x, h, 4).ok());
  EXPECT_EQ(h[0], 0x3F80);
  EXPECT_EQ(h[1], 0xC020);
}

// ggml's q8_0 reference is deterministic and idempotent on its own output: dequantising every
// Q8_0 tensor of a llama.cpp-made file and quantising again gives the same bytes.
TEST(QuantsSharedFile, Q8_0RequantisesToIdenticalBytes) {
  ASSERT_TRUE(test::require_shared_file("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"));
  const std::string path = test::shared_path("models/tinystories-656K/TinyStories-656K-Q8_0.gguf");
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  int checked = 0;
  for (const TensorInfo& t : f->tensors()) {
    if (t.type != GgmlType::kQ8_0) continue;
    const int64_t n = t.num_elements();
    std::vector<float> y(static_cast<size_t>(n));
    ASSERT_TRUE(dequantize_row(t.type, t.data, y.data(), n).ok());
    std::vector<uint8_t> q(t.size_bytes);
    ASSERT_TRUE(quantize_row(t.type, y.data(), q.data(), n).ok());
    EXPECT_TRUE(std::equal(q.begin(), q.end(), t.data)) << t.name;
    ++checked;
  }
  EXPECT_EQ(checked, 15);
}

}  // namespace
}  // namespace arbor::gguf
