// The codebook types (MXFP4, IQ4_NL, IQ4_XS) in the affine packed kernels: exact decoding of
// raw ggml bytes (every scale, E8M0 0..255 included), and the packed kernels on every ISA of
// this CPU (scalar, AVX2 with both dot products where the CPU has them, AVX-512 VNNI) agreeing
// bit for bit on matrices that reach the E8M0 extremes. The wider sweeps (shapes, token counts,
// threads, batch invariance, experts) run these types in matmul_test.cc, batch_invariance_test.cc
// and experts_test.cc with the other affine types.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gguf/quants.h"
#include "kernels/cpu_features.h"
#include "kernels_test_util.h"
#include "kernels/matmul.h"
#include "kernels/packed_affine.h"

namespace arbor::kernels {
namespace {

using gguf::GgmlType;
using testing::IsaScope;

constexpr GgmlType kCodebookTypes[] = {GgmlType::kMXFP4, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS};

// Random bytes for `rows` rows of `cols` elements, with finite fp16 scales; for MXFP4 block b of
// row r has the exponent e(r, b) (every value 0..255 across a 256-row matrix).
std::vector<uint8_t> raw_rows(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng,
                              int (*exponent)(int64_t r, int64_t b)) {
  const auto traits = gguf::ggml_traits(type);
  const int64_t blocks = cols / traits.block_size;
  std::vector<uint8_t> data(static_cast<size_t>(rows * blocks) * traits.type_size);
  for (uint8_t& x : data) x = static_cast<uint8_t>(rng());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* blk = data.data() + static_cast<size_t>(r * blocks + b) * traits.type_size;
      if (type == GgmlType::kMXFP4) {
        blk[0] = static_cast<uint8_t>(exponent(r, b));
      } else if ((blk[1] & 0x7C) == 0x7C) {
        blk[1] &= 0xBF;  // no fp16 inf / NaN scales
      }
    }
  }
  return data;
}

TEST(CodebookKernels, BlocksDecodeExactlyLikeTheCodecs) {
  std::mt19937 rng(360);
  for (GgmlType type : kCodebookTypes) {
    SCOPED_TRACE(gguf::ggml_type_name(type));
    const internal::AffineFormat f = internal::affine_format(type);
    const int64_t rows = 256, cols = 256;
    const std::vector<uint8_t> data =
        raw_rows(type, rows, cols, rng, [](int64_t r, int64_t) { return static_cast<int>(r); });
    const size_t stride = weight_row_bytes(type, cols);
    std::vector<float> want(cols);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = data.data() + r * stride;
      ASSERT_TRUE(gguf::dequantize_row(type, row, want.data(), cols).ok());
      for (int64_t b = 0; b < cols / 32; ++b) {
        internal::AffineBlock blk;
        internal::decode_affine_block(type, row, b, &blk);
        for (int l = 0; l < 32; ++l) {
          const float got = internal::affine_scale(f, blk, 0) *
                            static_cast<float>(internal::affine_value(f, blk.u[l]) - f.zero);
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want[b * 32 + l]))
              << "row " << r << " col " << b * 32 + l << ": " << got << " vs " << want[b * 32 + l];
        }
      }
    }
  }
}

// Every ISA path gives the scalar twin's bits on raw random bytes: MXFP4 rows with every E8M0
// exponent (the kernels' e8m0 -> f32 conversion, denormal scales and overflowing rows
// included: from e ~ 246 a block's product overflows and blocks of both signs sum to NaN, where
// only NaN-ness is compared), IQ4 rows with random fp16 scales (negative, denormal) and IQ4_XS
// scales -32..31.
TEST(CodebookKernels, EveryIsaEqualsTheScalarTwinOnRawBlocks) {
  if (best_isa() < Isa::kAvx2) GTEST_SKIP() << "the CPU lacks AVX2: no packed kernels";
  std::mt19937 rng(361);
  ThreadPool pool(2);
  for (GgmlType type : kCodebookTypes) {
    SCOPED_TRACE(gguf::ggml_type_name(type));
    const int64_t rows = 256 + 9, cols = 512;
    const std::vector<uint8_t> data = raw_rows(
        type, rows, cols, rng, [](int64_t r, int64_t) { return static_cast<int>(r % 256); });
    WeightView w = make_weight_view(type, data.data(), rows, cols);
    const PackedWeights packed = pack_weights(w);
    WeightView wp = w;
    wp.packed = packed.data();
    for (int64_t nt : {1, 2, 5, 16, 19, 40}) {
      const std::vector<float> x = testing::random_floats(rng, nt * cols);
      std::vector<float> scalar(static_cast<size_t>(nt * rows)), simd(scalar.size());
      {
        IsaScope scope(Isa::kScalar);
        matmul(w, x.data(), scalar.data(), nt, pool);
      }
      int finite = 0;
      for (float v : scalar) finite += std::isfinite(v);
      EXPECT_GT(finite, static_cast<int>(scalar.size() / 2));
      for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
        if (best_isa() < isa) continue;
        IsaScope scope(isa);
        std::fill(simd.begin(), simd.end(), 0.0f);
        matmul(wp, x.data(), simd.data(), nt, pool);
        for (size_t i = 0; i < simd.size(); ++i) {
          if (std::isnan(scalar[i]) && std::isnan(simd[i])) continue;
          ASSERT_EQ(std::bit_cast<uint32_t>(simd[i]), std::bit_cast<uint32_t>(scalar[i]))
              << isa_name(isa) << " tokens " << nt << " row " << i % rows << " token "
              << i / rows;
        }
      }
      // Both AVX2 dot products called directly (IQ4 without VNNI takes vpmaddubsw on |v|).
      std::vector<internal::ActBlockAffine> acts(static_cast<size_t>(nt * cols / 32));
      for (int64_t t = 0; t < nt; ++t) {
        internal::pack_act_row_affine(x.data() + t * cols, cols, internal::affine_format(type),
                                      acts.data() + t, nt, true);
      }
      for (const bool vnni : {false, true}) {
        if (vnni && !cpu_features().avxvnni) continue;
        std::fill(simd.begin(), simd.end(), 0.0f);
        (vnni ? internal::affine_rows_avxvnni : internal::affine_rows_avx2)(
            wp, acts.data(), nt, simd.data(), 0, (rows + 15) / 16);
        for (size_t i = 0; i < simd.size(); ++i) {
          if (std::isnan(scalar[i]) && std::isnan(simd[i])) continue;
          ASSERT_EQ(std::bit_cast<uint32_t>(simd[i]), std::bit_cast<uint32_t>(scalar[i]))
              << (vnni ? "avx-vnni" : "avx2") << " tokens " << nt << " element " << i;
        }
      }
    }
  }
}

// The packed copy is about the file's size: MXFP4 17 bytes per row and block of 32 (16 nibble
// bytes + the E8M0 byte), IQ4_NL 18 + 2 / 16 (a 32-byte fp16 header per 16 rows), IQ4_XS 17
// + 32 / (16 * 8).
TEST(CodebookKernels, PackedSizes) {
  const int64_t rows = 64, cols = 1024;
  const struct {
    GgmlType type;
    double bytes_per_row_block;
  } cases[] = {{GgmlType::kMXFP4, 17.0}, {GgmlType::kIQ4_NL, 18.0}, {GgmlType::kIQ4_XS, 17.25}};
  for (const auto& c : cases) {
    const size_t bytes = internal::affine_packed_bytes(
        WeightView{.type = c.type, .rows = rows, .cols = cols, .row_stride = 0});
    EXPECT_EQ(static_cast<double>(bytes), c.bytes_per_row_block * rows * cols / 32)
        << gguf::ggml_type_name(c.type);
  }
}

}  // namespace
}  // namespace arbor::kernels
