// matmul() against its naive twins for every weight type, token count and ISA.
//
// Tolerances, per output y[t, r], with s = sum_c |W[r, c]| * |x[t, c]| (W dequantised):
//  * float weights (F32/F16/BF16) vs matmul_ref (double accumulation): 2e-5 * s. f32 sums of
//    up to 4096 products err by ~sqrt(n) * 6e-8 * s; dropping or doubling one product errs by
//    ~s / cols >= 2.4e-4 * s, so index bugs fail.
//  * Q8_0/Q4_0 vs matmul_ref_quantized_act (same int8 activations, exact integer block dots,
//    double accumulation): 1e-5 * s — only the f32 order of the per-block products differs.
//  * Q8_0/Q4_0 vs the f32 matmul_ref: the activation-quantisation bound
//    sum_c |W[r, c]| * d_block(c) / 2 (each quantised activation is within half a step), plus
//    1e-5 * s.
#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gguf/quants.h"
#include "kernels/matmul_internal.h"
#include "kernels/ops.h"
#include "kernels/packed_affine.h"
#include "kernels_test_util.h"

namespace arbor::kernels {
namespace {

using gguf::GgmlType;
using testing::IsaScope;

struct Shape {
  int64_t rows, cols;
};

struct Case {
  GgmlType type;
  Shape shape;
  int64_t num_tokens;
  size_t pad;  // extra bytes per row (non-dense row_stride)
};

std::string describe(const Case& c, Isa isa, int threads, uint32_t seed) {
  return std::string(gguf::ggml_type_name(c.type)) + " rows=" + std::to_string(c.shape.rows) +
         " cols=" + std::to_string(c.shape.cols) + " tokens=" + std::to_string(c.num_tokens) +
         " pad=" + std::to_string(c.pad) + " isa=" + std::string(isa_name(isa)) +
         " threads=" + std::to_string(threads) + " seed=" + std::to_string(seed);
}

bool affine(GgmlType t) { return internal::is_affine_type(t); }
// Whether matmul() quantises the activations for this type, ISA and view: Q8_0/Q4_0 always;
// the affine types on their scalar kernel and their packed AVX2 / AVX-512 kernels (without a
// packed copy they take the f32 generic path); BF16 on AVX-512 BF16 CPUs (x rounded to bf16).
bool quantized_acts(GgmlType t, Isa isa, bool packed_view) {
  if (t == GgmlType::kQ8_0 || t == GgmlType::kQ4_0) return true;
  if (t == GgmlType::kBF16) return isa >= Isa::kAvx512 && cpu_features().avx512bf16;
  return affine(t) && (isa == Isa::kScalar || (packed_view && isa >= Isa::kAvx2));
}

// Runs one case on every ISA and thread count and checks all three tolerances above.
void check_case(const Case& c, uint32_t seed, const std::vector<ThreadPool*>& pools) {
  std::mt19937 rng(seed);
  const int64_t rows = c.shape.rows, cols = c.shape.cols, nt = c.num_tokens;
  const std::vector<float> wf = testing::random_floats(rng, rows * cols);
  std::vector<float> x = testing::random_floats(rng, nt * cols);
  if (nt > 1) {  // one all-zero token exercises d = 0 activation blocks
    std::fill(x.begin() + (nt - 1) * cols, x.end(), 0.0f);
  }
  const size_t stride = weight_row_bytes(c.type, cols) + c.pad;
  const std::vector<uint8_t> wdata = testing::encode_weights(c.type, wf, rows, cols, stride);
  const WeightView w{c.type, wdata.data(), rows, cols, stride};

  std::vector<float> ref(static_cast<size_t>(nt * rows)), ref_q(ref.size());
  matmul_ref(w, x.data(), ref.data(), nt);
  {
    IsaScope scope(best_isa());  // the quantisation of the best ISA (BF16: rounded or not)
    matmul_ref_quantized_act(w, x.data(), ref_q.data(), nt);
  }
  // Per-output magnitude s and activation-quantisation bound.
  std::vector<double> mag(ref.size()), qbound(ref.size());
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    get_row(w, r, row.data());
    for (int64_t t = 0; t < nt; ++t) {
      double s = 0.0, qb = 0.0;
      for (int64_t k = 0; k < cols; ++k) s += std::fabs(row[k]) * std::fabs(x[t * cols + k]);
      for (int64_t b = 0; b < cols / 32; ++b) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[t * cols + b * 32 + j]));
        for (int j = 0; j < 32; ++j) qb += std::fabs(row[b * 32 + j]) * (amax / 127.0) / 2.0;
      }
      mag[t * rows + r] = s;
      // bf16 rounding moves each x by at most |x| / 2^9.
      qbound[t * rows + r] = c.type == GgmlType::kBF16 ? s / 512 * 1.001 : qb * 1.001;
    }
  }
  std::vector<float> y(ref.size());
  // Every ISA on the plain view and, where this CPU has a packed kernel, on the packed view too
  // (the AVX-512 run reads the packed layout, the others fall back to `data`).
  PackedWeights packed;
  WeightView wp = w;
  if (packing_available(c.type)) {
    packed = pack_weights(w);
    wp.packed = packed.data();
  }
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    for (ThreadPool* pool : pools) {
     for (const WeightView* view : {&w, static_cast<const WeightView*>(&wp)}) {
      if (view == &wp && wp.packed == nullptr) continue;
      SCOPED_TRACE(describe(c, isa, pool->num_threads(), seed) +
                   (view == &wp ? " packed" : ""));
      std::fill(y.begin(), y.end(), NAN);
      matmul(*view, x.data(), y.data(), nt, *pool);
      const bool quant = quantized_acts(c.type, isa, view == &wp);
      for (size_t i = 0; i < y.size(); ++i) {
        const double s = mag[i];
        if (quant) {
          ASSERT_NEAR(y[i], ref_q[i], 1e-5 * s + 1e-30) << "vs quantised-activation ref, i=" << i;
          ASSERT_NEAR(y[i], ref[i], qbound[i] + 1e-5 * s + 1e-30) << "vs f32 ref, i=" << i;
        } else {
          ASSERT_NEAR(y[i], ref[i], 2e-5 * s + 1e-30) << "vs f32 ref, i=" << i;
        }
      }
     }
    }
  }
}

class MatmulTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulTest, MatchesReferenceAcrossShapesTokensIsas) {
  ThreadPool p1(1), p2(2), p3(3);
  const std::vector<ThreadPool*> pools{&p1, &p2, &p3};
  const GgmlType type = GetParam();
  uint32_t seed = 1000 + static_cast<uint32_t>(type) * 100;
  // Columns: 1, 2 and 8 blocks of 32 (the K-quants: 1 and 2 super-blocks of 256).
  const bool k_quant = gguf::ggml_traits(type).block_size == 256;
  const std::vector<int64_t> col_counts =
      k_quant ? std::vector<int64_t>{256, 512} : std::vector<int64_t>{32, 64, 256};
  for (int64_t nt : {1, 2, 3, 5, 8, 17, 64}) {
    for (int64_t rows : {1, 7, 33, 250}) {
      for (int64_t cols : col_counts) {
        check_case({type, {rows, cols}, nt, 0}, ++seed, pools);
        if (HasFatalFailure()) return;
      }
    }
  }
  // One long row (GEMV and GEMM), and a padded row stride.
  check_case({type, {33, 4096}, 1, 0}, ++seed, pools);
  check_case({type, {9, 4096}, 6, 0}, ++seed, pools);
  check_case({type, {13, k_quant ? 768 : 96}, 5, 64}, ++seed, pools);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                           GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                           GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ2_K,
                                           GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                                           GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS,
                                           GgmlType::kMXFP4),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(gguf::ggml_type_name(info.param));
                         });

// Types without their own kernels take the generic dequantise-and-dot path.
// Random rows x cols weights of `type` (packed when `pack`) times nt random tokens: each token
// multiplied alone must equal its row of the batched call, bit for bit (the engine's "batched
// equals alone" guarantee).
void expect_batch_invariant(GgmlType type, int64_t rows, int64_t cols, int64_t nt, bool pack,
                            uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<float> wf = testing::random_floats(rng, rows * cols);
  const std::vector<float> x = testing::random_floats(rng, nt * cols);
  const std::vector<uint8_t> data =
      testing::encode_weights(type, wf, rows, cols, weight_row_bytes(type, cols));
  WeightView w = make_weight_view(type, data.data(), rows, cols);
  PackedWeights packed;
  if (pack) {
    packed = pack_weights(w);
    w.packed = packed.data();
  }
  ThreadPool pool(2);
  std::vector<float> all(static_cast<size_t>(nt * rows)), one(static_cast<size_t>(rows));
  matmul(w, x.data(), all.data(), nt, pool);
  for (int64_t t = 0; t < nt; ++t) {
    matmul(w, x.data() + t * cols, one.data(), 1, pool);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(one[r], all[t * rows + r])
          << gguf::ggml_type_name(type) << " cols=" << cols << " t=" << t << " r=" << r;
    }
  }
}

TEST(Matmul, PackedKernelsAreBatchInvariant) {
  // 19 tokens; 70 rows leave partial 16-row groups.
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K,
                        GgmlType::kQ5_0, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kMXFP4}) {
    if (!packing_available(type)) {
      GTEST_SKIP() << "the CPU lacks the ISA of the packed " << gguf::ggml_type_name(type)
                   << " kernel (best ISA here: " << isa_name(best_isa()) << ")";
    }
    expect_batch_invariant(type, 70, affine(type) ? 512 : 320, 19, /*pack=*/true, 77);
    if (HasFatalFailure()) return;
  }
}

TEST(Matmul, FloatKernelsAreBatchInvariant) {
  // F32/F16/BF16: the GEMV (1-3 tokens), the stationary tiles (verification sizes) and the GEMM
  // (6-row x 4-token tiles over 32-token blocks, then narrower tails) must give every token the
  // same bits. 70 rows leave partial 6-row and 4-row tiles; 45 columns a masked step; 40 tokens
  // two token blocks.
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    for (const int64_t cols : {320, 45}) {
      expect_batch_invariant(type, 70, cols, 40, /*pack=*/false, 78);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Matmul, MultiEqualsOneCallPerMatrix) {
  // Q/K/V-like shapes (rows 70, 16, 33 leave partial groups), packed and plain, every token
  // count regime and thread count: matmul_multi must give matmul()'s bits.
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kF16, GgmlType::kQ4_K,
                        GgmlType::kQ6_K}) {
    std::mt19937 rng(5);
    const int64_t cols = 256;
    const int64_t rows[] = {70, 16, 33};
    std::vector<std::vector<uint8_t>> data;
    std::vector<PackedWeights> packed;
    std::vector<WeightView> views;
    for (int64_t r : rows) {
      const std::vector<float> wf = testing::random_floats(rng, r * cols);
      data.push_back(testing::encode_weights(type, wf, r, cols, weight_row_bytes(type, cols)));
      views.push_back(make_weight_view(type, data.back().data(), r, cols));
      if (packing_available(type)) {
        packed.push_back(pack_weights(views.back()));
        views.back().packed = packed.back().data();
      }
    }
    const WeightView* ws[] = {&views[0], &views[1], &views[2]};
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (int64_t nt : {1, 2, 5, 17}) {
        const std::vector<float> x = testing::random_floats(rng, nt * cols);
        std::vector<std::vector<float>> want(3), got(3);
        float* outs[3];
        for (int i = 0; i < 3; ++i) {
          want[i].resize(static_cast<size_t>(nt * rows[i]));
          got[i].assign(want[i].size(), NAN);
          matmul(views[i], x.data(), want[i].data(), nt, pool);
          outs[i] = got[i].data();
        }
        matmul_multi(ws, x.data(), outs, nt, pool);
        for (int i = 0; i < 3; ++i) {
          EXPECT_EQ(got[i], want[i]) << gguf::ggml_type_name(type) << " matrix " << i
                                     << " tokens " << nt << " threads " << threads;
        }
      }
    }
  }
}

TEST(Matmul, SegmentsEqualOneMatmulPerColumnSlice) {
  // matmul_segments over 4 column slices of one matrix (each packed on its own where the CPU
  // packs the type) must give, per segment, the bits of matmul() on that slice with its columns
  // of x copied out, on every ISA, token count and thread count: what makes TP ranks agree.
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0,
                        GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    std::mt19937 rng(11);
    const int64_t rows = 37, seg_cols = 256, cols = 4 * seg_cols;
    const std::vector<float> wf = testing::random_floats(rng, rows * cols);
    const std::vector<uint8_t> data =
        testing::encode_weights(type, wf, rows, cols, weight_row_bytes(type, cols));
    const WeightView whole = make_weight_view(type, data.data(), rows, cols);
    std::vector<WeightView> segs;
    std::vector<PackedWeights> packed;
    for (int i = 0; i < 4; ++i) {
      WeightView s = whole;
      s.data = data.data() + weight_row_bytes(type, i * seg_cols);
      s.cols = seg_cols;
      segs.push_back(s);
    }
    for (WeightView& s : segs) {
      if (!packing_available(type)) break;
      packed.push_back(pack_weights(s));
      s.packed = packed.back().data();
    }
    const WeightView* ws[] = {&segs[0], &segs[1], &segs[2], &segs[3]};
    for (Isa isa : testing::testable_isas()) {
      set_active_isa(isa);
      for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        for (int64_t nt : {1, 3, 20}) {
          const std::vector<float> x = testing::random_floats(rng, nt * cols);
          std::vector<std::vector<float>> got(4, std::vector<float>(rows * nt, NAN));
          float* outs[] = {got[0].data(), got[1].data(), got[2].data(), got[3].data()};
          matmul_segments(ws, x.data(), outs, nt, pool);
          for (int i = 0; i < 4; ++i) {
            std::vector<float> xs(static_cast<size_t>(nt * seg_cols)), want(rows * nt);
            for (int64_t t = 0; t < nt; ++t) {
              std::copy_n(x.data() + t * cols + i * seg_cols, seg_cols, xs.data() + t * seg_cols);
            }
            matmul(segs[i], xs.data(), want.data(), nt, pool);
            ASSERT_EQ(got[i], want) << gguf::ggml_type_name(type) << " segment " << i << " isa "
                                    << isa_name(isa) << " tokens " << nt << " threads " << threads;
          }
        }
      }
    }
    set_active_isa(best_isa());
  }
}

TEST(Matmul, ThreadsQuantiseTheirOwnActivationsToTheSameBits) {
  // Steps of up to 16 tokens have every thread quantise the activations into its own records
  // (matmul.cc, kLocalActsTokens); longer ones share one copy. Either way the bits must be one
  // thread's, on every ISA, and a call must read its own x, not the records of the call before
  // (two calls in a row with different x on the same pool).
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    std::mt19937 rng(17);
    const int64_t rows = 512, cols = 1024;
    const std::vector<float> wf = testing::random_floats(rng, rows * cols);
    const std::vector<uint8_t> data =
        testing::encode_weights(type, wf, rows, cols, weight_row_bytes(type, cols));
    WeightView w = make_weight_view(type, data.data(), rows, cols);
    const PackedWeights packed = pack_weights(w);
    w.packed = packed.data();
    for (Isa isa : testing::testable_isas()) {
      set_active_isa(isa);
      ThreadPool one(1);
      for (int threads : {2, 3}) {
        ThreadPool pool(threads);
        for (int64_t nt : {1, 2, 5, 16, 17}) {
          for (int call = 0; call < 2; ++call) {
            const std::vector<float> x = testing::random_floats(rng, nt * cols);
            std::vector<float> want(static_cast<size_t>(rows * nt)), got(want.size(), NAN);
            matmul(w, x.data(), want.data(), nt, one);
            matmul(w, x.data(), got.data(), nt, pool);
            ASSERT_EQ(got, want) << gguf::ggml_type_name(type) << " isa " << isa_name(isa)
                                 << " tokens " << nt << " threads " << threads << " call "
                                 << call;
          }
        }
      }
    }
    set_active_isa(best_isa());
  }
}

TEST(Matmul, GenericPathForOtherTypes) {
  // Types without their own kernels dequantise each row and dot it in f32.
  ThreadPool pool(2);
  for (int64_t nt : {1, 5}) check_case({GgmlType::kQ8_1, {33, 512}, nt, 0}, 77 + nt, {&pool});
}

// The affine types' scalar kernel is the packed AVX2 and AVX-512 kernels' twin bit for bit
// (same f32 operations per block, in the same order), for every token-tile regime and partial
// groups.
TEST(Matmul, AffineScalarKernelEqualsPackedBitForBit) {
  if (best_isa() < Isa::kAvx2) GTEST_SKIP() << "the CPU lacks AVX2";
  ThreadPool pool(2);
  uint32_t seed = 300;
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ2_K,
                        GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                        GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kMXFP4}) {
    std::mt19937 rng(++seed);
    const int64_t rows = 37, cols = 512;
    const std::vector<float> wf = testing::random_floats(rng, rows * cols);
    const std::vector<uint8_t> data = testing::encode_weights(type, wf, rows, cols);
    WeightView w = make_weight_view(type, data.data(), rows, cols);
    const PackedWeights packed = pack_weights(w);
    WeightView wp = w;
    wp.packed = packed.data();
    for (int64_t nt : {1, 2, 3, 4, 16, 17, 33, 70}) {
      const std::vector<float> x = testing::random_floats(rng, nt * cols);
      std::vector<float> simd(static_cast<size_t>(nt * rows)), scalar(simd.size());
      {
        IsaScope scope(Isa::kScalar);
        matmul(w, x.data(), scalar.data(), nt, pool);
      }
      for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
        if (best_isa() < isa) continue;
        IsaScope scope(isa);
        std::fill(simd.begin(), simd.end(), NAN);
        matmul(wp, x.data(), simd.data(), nt, pool);
        ASSERT_EQ(simd, scalar) << gguf::ggml_type_name(type) << " " << isa_name(isa)
                                << " tokens " << nt;
      }
      // Both AVX2 dot products, called directly (matmul() picks one by the CPU's AVX-VNNI).
      std::vector<internal::ActBlockAffine> acts(static_cast<size_t>(nt * cols / 32));
      for (int64_t t = 0; t < nt; ++t) {
        internal::pack_act_row_affine(x.data() + t * cols, cols, internal::affine_format(type),
                                      acts.data() + t, nt, true);
      }
      const int64_t groups = (rows + 15) / 16;
      for (const bool vnni : {false, true}) {
        if (vnni && !cpu_features().avxvnni) continue;
        std::fill(simd.begin(), simd.end(), NAN);
        (vnni ? internal::affine_rows_avxvnni : internal::affine_rows_avx2)(
            wp, acts.data(), nt, simd.data(), 0, groups);
        ASSERT_EQ(simd, scalar) << gguf::ggml_type_name(type) << (vnni ? " avx-vnni" : " avx2")
                                << " tokens " << nt;
      }
    }
  }
}

// The super-block types (the K-quants, IQ4_XS) quantise activations with one scale per 256
// columns, as llama.cpp's Q8_K; the others per 32. Each record's d, int8 values, sums, initial
// dots and what an offset multiplies (bare sums per 256, d * sum per 32), exactly, from both
// quantisers: an outlier in one block sets the scale of its whole super-block, an all-zero
// super-block gets d = 0, and halves round to even (super-block 3: max |x| 127, so id = 1 and
// x = +-k.5 exactly).
TEST(Matmul, AffineActivationsShareAScalePerSuperBlock) {
  std::mt19937 rng(77);
  constexpr int64_t kCols = 1024;
  std::vector<float> x = testing::random_floats(rng, kCols);
  x[300] = 40.0f;                                       // super-block 1, block 9
  std::fill(x.begin() + 512, x.begin() + 768, 0.0f);    // super-block 2: all zero
  for (int64_t c = 768; c < kCols; ++c) {               // super-block 3: ties
    x[c] = static_cast<float>((c % 2 == 0 ? 1 : -1) * ((c % 9) + 0.5));
  }
  x[1000] = 127.0f;
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ2_K,
                        GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                        GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kMXFP4}) {
    const internal::AffineFormat f = internal::affine_format(type);
    const bool per_unit = internal::scales_per_unit(f);
    const bool k_quant = f.blocks_per_unit == 8;
    ASSERT_EQ(per_unit, k_quant) << gguf::ggml_type_name(type);
    const int64_t group = per_unit ? 256 : 32;
    for (const bool avx2 : {false, true}) {
      if (avx2 && best_isa() < Isa::kAvx2) continue;
      SCOPED_TRACE(::testing::Message() << gguf::ggml_type_name(type) << (avx2 ? " avx2" : ""));
      std::vector<internal::ActBlockAffine> acts(kCols / 32);
      internal::pack_act_row_affine(x.data(), kCols, f, acts.data(), 1, avx2);
      for (int64_t b = 0; b < kCols / 32; ++b) {
        const int64_t g0 = b * 32 / group * group;
        float amax = 0.0f;
        for (int64_t c = g0; c < g0 + group; ++c) amax = std::max(amax, std::fabs(x[c]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const internal::ActBlockAffine& a = acts[static_cast<size_t>(b)];
        ASSERT_EQ(std::bit_cast<uint32_t>(a.d), std::bit_cast<uint32_t>(d)) << "block " << b;
        int32_t sum[2] = {0, 0};
        for (int l = 0; l < 32; ++l) {
          const int q = static_cast<int>(std::nearbyint(x[b * 32 + l] * id));
          ASSERT_EQ(a.qs[l], q) << "block " << b << " element " << l;
          sum[l / 16] += q;
        }
        const float m = per_unit ? 1.0f : d;
        for (int h = 0; h < 2; ++h) {
          ASSERT_EQ(a.sum[h], sum[h]);
          ASSERT_EQ(a.init[h], -f.zero * sum[h]);
          ASSERT_EQ(a.msum_half[h], m * static_cast<float>(sum[h]));
        }
        ASSERT_EQ(a.msum, m * static_cast<float>(sum[0] + sum[1]));
      }
      // The outlier: per 256 it scales all of super-block 1, per 32 only its own block.
      EXPECT_EQ(acts[8].d == acts[9].d, per_unit);
      EXPECT_EQ(acts[16].d, 0.0f);
      if (per_unit) {
        EXPECT_EQ(acts[24].d, 1.0f);  // the ties really are ties
      }
    }
  }
}

// The AVX2 half sums of an activation block equal plain sums, on random blocks and on the
// extremes (all -128, all 127, one half each).
TEST(Matmul, ActHalfSumsEqualPlainSums) {
  if (best_isa() < Isa::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(5);
  std::vector<std::array<int8_t, 32>> blocks(2000);
  for (auto& b : blocks) {
    for (int8_t& q : b) q = static_cast<int8_t>(rng());
  }
  blocks[0].fill(-128);
  blocks[1].fill(127);
  std::fill(blocks[2].begin(), blocks[2].begin() + 16, static_cast<int8_t>(-128));
  std::fill(blocks[2].begin() + 16, blocks[2].end(), static_cast<int8_t>(127));
  for (const auto& b : blocks) {
    int32_t want[2] = {0, 0};
    for (int l = 0; l < 32; ++l) want[l / 16] += b[static_cast<size_t>(l)];
    int32_t got[2] = {-1, -1};
    internal::act_half_sums_avx2(b.data(), got);
    ASSERT_EQ(got[0], want[0]);
    ASSERT_EQ(got[1], want[1]);
  }
}

// decode_affine_block reads every type's ggml bits right: S * (u - zero) + M reproduces the
// gguf codec's dequantised value (to f32 rounding of ggml's own two-step formula), for every
// block of rows whose values cover each type's whole range.
TEST(Matmul, AffineBlocksDecodeLikeTheCodecs) {
  std::mt19937 rng(11);
  constexpr int64_t kRows = 6, kCols = 512;
  const std::vector<float> wf = testing::random_floats(rng, kRows * kCols, -2.0f, 2.0f);
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ2_K,
                        GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                        GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kMXFP4}) {
    const internal::AffineFormat f = internal::affine_format(type);
    const std::vector<uint8_t> data = testing::encode_weights(type, wf, kRows, kCols);
    const size_t stride = weight_row_bytes(type, kCols);
    std::vector<float> want(kCols);
    int max_u = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      const uint8_t* row = data.data() + r * stride;
      ASSERT_TRUE(gguf::dequantize_row(type, row, want.data(), kCols).ok());
      for (int64_t b = 0; b < kCols / 32; ++b) {
        internal::AffineBlock blk;
        internal::decode_affine_block(type, row, b, &blk);
        for (int l = 0; l < 32; ++l) {
          const float s = internal::affine_scale(f, blk, f.split ? l / 16 : 0);
          const float m = internal::affine_offset(f, blk, f.split ? l / 16 : 0);
          const int v = internal::affine_value(f, blk.u[l]);
          const float got = s * static_cast<float>(v - f.zero) + m;
          const float tol = 4e-7f * (std::fabs(s * v) + std::fabs(m)) + 1e-30f;
          ASSERT_NEAR(got, want[b * 32 + l], tol)
              << gguf::ggml_type_name(type) << " row " << r << " col " << b * 32 + l;
          max_u = std::max<int>(max_u, blk.u[l]);
        }
      }
    }
    // Every bit of u is exercised (the top value of a 2..6-bit range occurs).
    const int bits = f.bits();
    EXPECT_EQ(max_u, (1 << bits) - 1) << gguf::ggml_type_name(type);
  }
}

TEST(Matmul, FloatTypesAcceptColsNotMultipleOfEight) {
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    check_case({t, {11, 45}, 1, 0}, 7, {&pool});
    check_case({t, {11, 13}, 9, 0}, 8, {&pool});
  }
}

TEST(Matmul, ActivationQuantisationIsIdenticalOnAllIsas) {
  std::mt19937 rng(42);
  constexpr int64_t kCols = 256;
  std::vector<float> x = testing::random_floats(rng, kCols, -3.0f, 3.0f);
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);           // a zero block: d = 0, q = 0
  for (int j = 0; j < 32; ++j) x[64 + j] = (j - 16) * 0.5f;  // exact .5 ties after scaling
  x[96] = 1e-30f;                                            // tiny block
  std::vector<int8_t> q_scalar(kCols), q_avx2(kCols);
  std::vector<float> d_scalar(kCols / 32), d_avx2(kCols / 32);
  internal::quantize_act_row_scalar(x.data(), kCols, q_scalar.data(), d_scalar.data());
  for (int64_t i = 0; i < kCols; ++i) {
    ASSERT_LE(std::abs(q_scalar[i]), 127);
    const float d = d_scalar[i / 32];
    ASSERT_LE(std::fabs(q_scalar[i] * d - x[i]), d / 2 * 1.0001f + 1e-38f) << i;
  }
  EXPECT_EQ(d_scalar[1], 0.0f);
  if (best_isa() < Isa::kAvx2) {
    GTEST_SKIP() << "the CPU lacks AVX2 (best ISA here: " << isa_name(best_isa()) << ")";
  }
  internal::quantize_act_row_avx2(x.data(), kCols, q_avx2.data(), d_avx2.data());
  EXPECT_EQ(q_scalar, q_avx2);
  EXPECT_EQ(d_scalar, d_avx2);
  if (best_isa() < Isa::kAvx512) return;
  // The packed kernels' activation records: same bytes and scales, one record per block,
  // neg_sum = -k * sum of the block's 32 values.
  constexpr int64_t kOddCols = kCols - 32;  // 7 blocks
  for (int32_t k : {8, 128}) {
    std::vector<internal::ActBlockVnni> acts(kOddCols / 32);
    internal::pack_act_row_vnni(x.data(), kOddCols, k, acts.data());
    for (int64_t b = 0; b < kOddCols / 32; ++b) {
      const internal::ActBlockVnni& ab = acts[static_cast<size_t>(b)];
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) {
        ASSERT_EQ(ab.qs[j], q_scalar[b * 32 + j]) << b << " " << j;
        sum += ab.qs[j];
      }
      ASSERT_EQ(ab.d, d_scalar[b]) << b;
      ASSERT_EQ(ab.neg_sum, -k * sum) << b;
    }
  }
}

// round_to_bf16 (the reference's rounding) equals vcvtneps2bf16 (the kernels') on ties in both
// directions, carries into the exponent, overflow to infinity, denormals, zeros, infinities
// and 2^20 random bit patterns.
TEST(Matmul, Bf16RoundingMatchesTheInstruction) {
  if (!cpu_features().avx512bf16) GTEST_SKIP() << "the CPU lacks AVX-512 BF16";
  std::vector<uint32_t> bits = {0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x3F7FFFFFu, 0x7F7FFFFFu,
                                0xFF7FFFFFu, 0x00000001u, 0x807FFFFFu, 0x00800000u, 0x00000000u,
                                0x80000000u, 0x7F800000u, 0xFF800000u, 0x40490FDBu, 0xC0490FDBu};
  std::mt19937 rng(3);
  while (bits.size() < (1u << 20)) {
    const uint32_t b = rng();
    if ((b & 0x7F800000u) != 0x7F800000u) bits.push_back(b);  // NaN payloads aside
  }
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), bits.size() * sizeof(float));
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> h(static_cast<size_t>(n));
  internal::round_acts_bf16_avx512(x.data(), 1, n, n, h.data());
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t want = static_cast<uint32_t>(h[i]) << 16;
    const float got = round_to_bf16(x[i]);
    uint32_t got_bits;
    std::memcpy(&got_bits, &got, sizeof(got_bits));
    ASSERT_EQ(got_bits, want) << std::hex << "input 0x" << bits[i];
  }
}

TEST(Matmul, GetRowDequantises) {
  std::mt19937 rng(5);
  const std::vector<float> wf = testing::random_floats(rng, 3 * 64);
  const std::vector<uint8_t> q4 = testing::encode_weights(GgmlType::kQ4_0, wf, 3, 64);
  const WeightView w = make_weight_view(GgmlType::kQ4_0, q4.data(), 3, 64);
  std::vector<float> out(64);
  get_row(w, 2, out.data());
  // Q4_0 has 16 levels over [-amax, amax]: every value within one step (amax / 8) of the input.
  for (int c = 0; c < 64; ++c) EXPECT_NEAR(out[c], wf[2 * 64 + c], 1.0f / 8 + 1e-3f) << c;
  const std::vector<uint8_t> f32 = testing::encode_weights(GgmlType::kF32, wf, 3, 64);
  get_row(make_weight_view(GgmlType::kF32, f32.data(), 3, 64), 1, out.data());
  for (int c = 0; c < 64; ++c) EXPECT_EQ(out[c], wf[64 + c]);
}

// get_row (and so matmul_ref, which shares its dequantiser) agrees bit for bit with the gguf
// module's independent ggml-exact codecs.
TEST(Matmul, DequantisationMatchesGgufCodecs) {
  std::mt19937 rng(9);
  constexpr int64_t kRows = 5, kCols = 256;
  const std::vector<float> wf = testing::random_floats(rng, kRows * kCols, -2.0f, 2.0f);
  for (GgmlType t : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const std::vector<uint8_t> data = testing::encode_weights(t, wf, kRows, kCols);
    const WeightView w = make_weight_view(t, data.data(), kRows, kCols);
    std::vector<float> ours(kCols), theirs(kCols);
    for (int64_t r = 0; r < kRows; ++r) {
      get_row(w, r, ours.data());
      const Status st =
          gguf::dequantize_row(t, data.data() + r * w.row_stride, theirs.data(), kCols);
      ASSERT_TRUE(st.ok()) << st.to_string();
      ASSERT_EQ(ours, theirs) << gguf::ggml_type_name(t) << " row " << r;
    }
  }
}

TEST(Matmul, SupportedTypesAndRowBytes) {
  EXPECT_TRUE(matmul_supported(GgmlType::kQ4_0));
  EXPECT_TRUE(matmul_supported(GgmlType::kBF16));
  EXPECT_TRUE(matmul_supported(GgmlType::kQ6_K));
  EXPECT_FALSE(matmul_supported(GgmlType::kIQ2_XXS));
  EXPECT_EQ(weight_row_bytes(GgmlType::kQ4_0, 2048), 2048u / 32 * 18);
  EXPECT_EQ(weight_row_bytes(GgmlType::kQ8_0, 64), 68u);
  EXPECT_EQ(weight_row_bytes(GgmlType::kF16, 7), 14u);
  EXPECT_EQ(weight_row_bytes(GgmlType::kQ4_0, 2048), gguf::ggml_row_size(GgmlType::kQ4_0, 2048));
}

}  // namespace
}  // namespace arbor::kernels
