// Row ops against their scalar, double-precision twins on every ISA.
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "kernels_test_util.h"

namespace arbor::kernels {
namespace {

using testing::IsaScope;

TEST(Ops, RmsNormMatchesReference) {
  std::mt19937 rng(1);
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 7, 16, 64, 2048, 2051}) {
      const std::vector<float> x = testing::random_floats(rng, n, -4.0f, 4.0f);
      const std::vector<float> wt = testing::random_floats(rng, n, 0.5f, 1.5f);
      std::vector<float> y(n), ref(n);
      rms_norm(x.data(), wt.data(), y.data(), n, 1e-5f);
      rms_norm_ref(x.data(), wt.data(), ref.data(), n, 1e-5f);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(y[i], ref[i], 2e-6f * std::fabs(ref[i]) + 1e-7f) << isa_name(isa) << " n=" << n;
      }
      // In place (y aliases x).
      std::vector<float> inplace = x;
      rms_norm(inplace.data(), wt.data(), inplace.data(), n, 1e-5f);
      EXPECT_EQ(inplace, y);
    }
  }
}

TEST(Ops, RopeInterleavedAndNeoxByHand) {
  // head_dim 4, theta 10000: inv_freq = {1, 0.01}; pos 1 rotates pair 0 by 1 rad, pair 1 by
  // 0.01 rad. Interleaved pairs are (0,1),(2,3); NeoX pairs are (0,2),(1,3).
  const float in[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  const double inter[4] = {1 * c1 - 2 * s1, 1 * s1 + 2 * c1, 3 * c2 - 4 * s2, 3 * s2 + 4 * c2};
  const double neox[4] = {1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 1 * s1 + 3 * c1, 2 * s2 + 4 * c2};
  for (bool is_neox : {false, true}) {
    RopeParams p;
    p.theta = 10000.0f;
    p.neox = is_neox;
    float x[4] = {in[0], in[1], in[2], in[3]};
    rope(x, 1, 4, 4, 1, p);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[i], is_neox ? neox[i] : inter[i], 1e-6) << i;
  }
}

TEST(Ops, RopeMatchesReferenceWithPartialRotation) {
  std::mt19937 rng(2);
  for (bool neox : {false, true}) {
    for (float factor : {0.0f, 8.0f}) {
      RopeParams p;
      p.theta = 500000.0f;
      p.neox = neox;
      p.factor = factor;
      constexpr int kHeads = 3, kHeadDim = 128;
      for (int rot_dim : {128, 64}) {
        for (int32_t pos : {0, 1, 17, 4095, 100000}) {
          std::vector<float> x = testing::random_floats(rng, kHeads * kHeadDim);
          std::vector<float> ref = x;
          rope(x.data(), kHeads, kHeadDim, rot_dim, pos, p);
          rope_ref(ref.data(), kHeads, kHeadDim, rot_dim, pos, p);
          for (size_t i = 0; i < x.size(); ++i) {
            // Both compute angles in double; they differ only in the f32 rounding of cos/sin
            // and of the rotated values.
            ASSERT_NEAR(x[i], ref[i], 1e-6f) << "neox=" << neox << " factor=" << factor
                                             << " rot=" << rot_dim << " pos=" << pos << " i=" << i;
          }
          if (rot_dim < kHeadDim) {  // dims past rot_dim are untouched
            EXPECT_EQ(x[kHeadDim - 1], ref[kHeadDim - 1]);
          }
        }
      }
    }
  }
}

TEST(Ops, RopeLlama3FrequenciesByHand) {
  // Llama 3.1: theta 500000, factor 8, low 1, high 4, original context 8192, rot_dim 128.
  // Expected values computed independently (Python, float64) from Meta's apply_scaling.
  RopeParams p;
  p.theta = 500000.0f;
  p.factor = 8.0f;
  p.low_freq_factor = 1.0f;
  p.high_freq_factor = 4.0f;
  p.original_context = 8192;
  std::vector<float> f(64);
  rope_inv_freqs(p, 128, f.data());
  EXPECT_FLOAT_EQ(f[0], 1.0f);                     // short wavelength (6.28): kept
  EXPECT_FLOAT_EQ(f[20], 0.016560440080994446f);   // wavelength 379 < 2048: kept
  EXPECT_FLOAT_EQ(f[30], 0.0013718935677611381f);  // 2948, in the band: interpolated
  EXPECT_FLOAT_EQ(f[34], 0.0001785078127679964f);  // 6695, in the band
  EXPECT_FLOAT_EQ(f[63], 3.068925988914511e-07f);  // 2.56e6 > 8192: divided by 8
  p.factor = 0.0f;
  rope_inv_freqs(p, 128, f.data());
  EXPECT_FLOAT_EQ(f[63], 2.455140791131609e-06f);  // unscaled
}

TEST(Ops, SiluMulMatchesReference) {
  std::mt19937 rng(3);
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 8, 13, 5632}) {
      std::vector<float> g = testing::random_floats(rng, n, -20.0f, 20.0f);
      if (n > 8) {
        g[0] = -100.0f;
        g[1] = 100.0f;
        g[2] = 0.0f;
        g[3] = -87.0f;
      }
      const std::vector<float> up = testing::random_floats(rng, n, -2.0f, 2.0f);
      std::vector<float> y = g, ref = g;
      silu_mul(y.data(), up.data(), n);
      silu_mul_ref(ref.data(), up.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_FALSE(std::isnan(y[i]));
        ASSERT_NEAR(y[i], ref[i], 2e-6f * std::fabs(ref[i]) + 1e-30f)
            << isa_name(isa) << " g=" << g[i];
      }
    }
  }
}

// GELU-tanh (Gemma's FFN) and soft-capping against double-precision tanh on every ISA, with
// extremes; and element-wise batch invariance: an element's bits do not depend on where it
// falls in the array (vector body or masked tail).
TEST(Ops, GeluMulAndSoftcapMatchReference) {
  std::mt19937 rng(5);
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 8, 13, 6912}) {
      std::vector<float> g = testing::random_floats(rng, n, -12.0f, 12.0f);
      if (n > 8) {
        g[0] = -100.0f;
        g[1] = 100.0f;
        g[2] = 0.0f;
        g[3] = -1e-3f;
      }
      const std::vector<float> up = testing::random_floats(rng, n, -2.0f, 2.0f);
      std::vector<float> y = g, ref = g;
      gelu_mul(y.data(), up.data(), n);
      gelu_mul_ref(ref.data(), up.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_FALSE(std::isnan(y[i]));
        ASSERT_NEAR(y[i], ref[i], 4e-6f * std::fabs(ref[i]) + 1e-7f)
            << isa_name(isa) << " g=" << g[i];
      }
      for (float cap : {0.5f, 30.0f}) {
        std::vector<float> x = testing::random_floats(rng, n, -100.0f, 100.0f), xr = x;
        softcap(x.data(), n, cap);
        softcap_ref(xr.data(), n, cap);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_NEAR(x[i], xr[i], 2e-7f * cap + 1e-6f * std::fabs(xr[i])) << isa_name(isa);
          ASSERT_LE(std::fabs(x[i]), cap);
        }
      }
    }
    // The same value at every offset of a 13-element array gives the same bits.
    std::vector<float> one(13, 0.7f), up(13, 1.3f), caps(13, 5.0f);
    gelu_mul(one.data(), up.data(), 13);
    softcap(caps.data(), 13, 3.0f);
    for (int i = 1; i < 13; ++i) {
      ASSERT_EQ(one[i], one[0]) << isa_name(isa);
      ASSERT_EQ(caps[i], caps[0]) << isa_name(isa);
    }
  }
}

// gpt-oss's clamped SwiGLU by hand at the clamps' edges, and against a double evaluation of
// llama.cpp's formula (ggml_swiglu_oai: x = min(gate, limit), y = clamp(up, -limit, limit),
// x / (1 + exp(-alpha x)) * (y + 1)) over a range wider than the clamps.
TEST(Ops, SwigluOaiClampsGateAboveAndUpBothWays) {
  const float alpha = 1.702f, limit = 7.0f;
  for (Isa isa : testing::testable_isas()) {
    SCOPED_TRACE(isa_name(isa));
    IsaScope scope(isa);
    auto ref = [&](double g, double u) {
      const double x = std::min(g, (double)limit), y = std::clamp(u, -(double)limit, (double)limit);
      return x / (1.0 + std::exp(-alpha * x)) * (y + 1.0);
    };
    // gate 9 acts as 7; gate -9 is not clamped; up 12 acts as 7, up -12 as -7; up -1 zeroes it.
    std::vector<float> gate = {9.0f, 7.0f, -9.0f, 2.0f, 2.0f, 2.0f, 0.0f, 1.5f};
    const std::vector<float> up = {1.0f, 1.0f, 1.0f, 12.0f, 7.0f, -12.0f, 5.0f, -1.0f};
    std::vector<float> out = gate;
    swiglu_oai(out.data(), up.data(), (int64_t)out.size(), alpha, limit);
    EXPECT_EQ(out[0], out[1]);            // the gate clamped at 7
    EXPECT_EQ(out[3], out[4]);            // up clamped at 7
    EXPECT_NEAR(out[5], ref(2.0, -7.0), 1e-5);  // up clamped at -7: (−7 + 1) = −6
    EXPECT_LT(out[5], 0.0f);
    EXPECT_EQ(out[6], 0.0f);              // gate 0
    EXPECT_EQ(out[7], 0.0f);              // up -1: (u + 1) = 0
    EXPECT_NEAR(out[2], -9.0 / (1.0 + std::exp(1.702 * 9.0)) * 2.0, 1e-6);  // negative gate free
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> wide(-12.0f, 12.0f);
    std::vector<float> g(1000), u(1000);
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = wide(rng);
      u[i] = wide(rng);
    }
    std::vector<float> y = g;
    swiglu_oai(y.data(), u.data(), (int64_t)y.size(), alpha, limit);
    for (size_t i = 0; i < g.size(); ++i) {
      const double want = ref(g[i], u[i]);
      EXPECT_NEAR(y[i], want, 2e-6 * std::max(1.0, std::abs(want))) << g[i] << " " << u[i];
    }
    // A NaN stays a NaN; an element's bits do not depend on its offset (vector body or tail).
    std::vector<float> nan_gate = {std::nanf(""), 1.0f}, nan_up = {1.0f, std::nanf("")};
    swiglu_oai(nan_gate.data(), nan_up.data(), 2, alpha, limit);
    EXPECT_TRUE(std::isnan(nan_gate[0]));
    EXPECT_TRUE(std::isnan(nan_gate[1]));
    std::vector<float> same(13, 3.3f), up13(13, -0.4f);
    swiglu_oai(same.data(), up13.data(), 13, alpha, limit);
    for (int i = 1; i < 13; ++i) ASSERT_EQ(same[i], same[0]);
  }
}

TEST(Ops, SoftmaxLargeValuesNoNan) {
  std::mt19937 rng(4);
  const float inf = std::numeric_limits<float>::infinity();
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 5, 8, 100, 4099}) {
      for (float spread : {1.0f, 100.0f, 1e4f, 1e30f}) {
        std::vector<float> x = testing::random_floats(rng, n, -spread, spread);
        if (n > 4) {
          x[1] = -inf;  // masked entry
          x[3] = 3e38f;
        }
        std::vector<float> ref = x;
        softmax(x.data(), n);
        softmax_ref(ref.data(), n);
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(std::isfinite(x[i])) << isa_name(isa) << " n=" << n << " i=" << i;
          ASSERT_NEAR(x[i], ref[i], 2e-6f * ref[i] + 1e-37f) << isa_name(isa) << " i=" << i;
          sum += x[i];
        }
        EXPECT_NEAR(sum, 1.0, 1e-5);
        if (n > 4) {
          EXPECT_EQ(x[1], 0.0f);
          EXPECT_NEAR(x[3], 1.0f, 1e-6f);
        }
      }
    }
  }
}

TEST(Ops, AddAxpyScaleDot) {
  std::mt19937 rng(5);
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 9, 1000}) {
      const std::vector<float> a = testing::random_floats(rng, n);
      const std::vector<float> b = testing::random_floats(rng, n);
      std::vector<float> y = a;
      add(y.data(), b.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]);
      y = a;
      axpy(y.data(), 0.5f, b.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], a[i] + 0.5f * b[i], 1e-6f);
      y = a;
      scale(y.data(), -3.0f, n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] * -3.0f);
      double ref = 0.0, mag = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        ref += static_cast<double>(a[i]) * b[i];
        mag += std::fabs(a[i] * b[i]);
      }
      EXPECT_NEAR(dot_f32(a.data(), b.data(), n), ref, 1e-6 * mag + 1e-7) << isa_name(isa);
    }
  }
}

// f32_to_f16 equals base/fp16.h's fp32_to_fp16 bit for bit on every ISA: every half value's
// float and the floats one ulp beside it (ties and near-ties of the rounding), the midpoints
// between neighbouring halves (round half to even), the subnormal and overflow edges, signed
// zeros, Infs, NaNs with payloads (quiet and signalling, both signs), f32 subnormals and a
// million random bit patterns; in runs of every length 1..17 (vector bodies and tails).
TEST(Ops, F32ToF16EqualsTheScalarConversionBitForBit) {
  std::vector<float> x;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t b = std::bit_cast<uint32_t>(fp16_to_fp32(static_cast<uint16_t>(h)));
    for (uint32_t d : {0u, 1u, 0xFFFFFFFFu}) x.push_back(std::bit_cast<float>(b + d));
    if ((h & 0x7C00) != 0x7C00 && (h & 0x7FFF) != 0x7BFF) {
      const float next = fp16_to_fp32(static_cast<uint16_t>(h + 1));
      x.push_back(0.5f * (fp16_to_fp32(static_cast<uint16_t>(h)) + next));
    }
  }
  for (uint32_t b : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
                     0x7F800001u, 0xFF812345u, 0x7FBFFFFFu, 0x00000001u, 0x807FFFFFu, 0x477FE000u,
                     0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x33000000u, 0x33000001u, 0xB3000000u,
                     0x387FE000u, 0x387FF000u, 0x387FFFFFu, 0x38800000u}) {
    x.push_back(std::bit_cast<float>(b));
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  std::vector<uint16_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = fp32_to_fp16(x[i]);
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    std::vector<uint16_t> got(x.size(), 0xABCD);
    f32_to_f16(x.data(), got.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " x bits 0x" << std::hex
                                 << std::bit_cast<uint32_t>(x[i]);
    }
    for (int64_t n = 1; n <= 17; ++n) {
      std::vector<uint16_t> part(n + 1, 0xABCD);
      f32_to_f16(x.data() + 1000, part.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(part[i], want[1000 + i]) << isa_name(isa);
      EXPECT_EQ(part[n], 0xABCD) << "wrote past n = " << n << " (" << isa_name(isa) << ")";
    }
  }
}

// any_nonfinite: one Inf or NaN at every position of every length 1..40 is found; finite
// values (the largest, subnormals, zeros) are not flagged.
TEST(Ops, AnyNonfiniteFindsEveryPosition) {
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    for (int64_t n = 1; n <= 40; ++n) {
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) {
        x[i] = i % 3 == 0   ? std::numeric_limits<float>::max()
               : i % 3 == 1 ? -std::numeric_limits<float>::denorm_min()
                            : -0.0f;
      }
      EXPECT_FALSE(any_nonfinite(x.data(), n)) << isa_name(isa) << " n " << n;
      for (int64_t at = 0; at < n; ++at) {
        for (float bad : {std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
          std::vector<float> y = x;
          y[at] = bad;
          EXPECT_TRUE(any_nonfinite(y.data(), n)) << isa_name(isa) << " n " << n << " at " << at;
        }
      }
    }
  }
}

}  // namespace
}  // namespace arbor::kernels
