// The forward on a CUDA GPU against the CPU's (label gpu; every test is
// skipped, saying why, where no GPU is present):
//  * per weight type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K,
//  and llama-quantize's Q4_K_M and Q3_K_M mixtures), a stories260K-shaped
//  synthetic model
//    (stories260K inflated to dim 256 / ffn 512, convert/inflate.h, quantised
//    by gguf's quantize_model) gives the GPU's logits within a stated tolerance
//    of the CPU's, over a ragged batch of prefill chunks, decode rows and a
//    token tree;
//  * batched equals alone, bit for bit: a sequence's logits do not depend on
//  what it runs with;
//  * a tree mask shaped as a chain equals the causal mask, bit for bit.
// The goldens, chunked prefill, F16 KV and speculative decoding run on the GPU
// through the twins of the model and engine suites (model_golden_gpu_test,
// spec_golden_gpu_test).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "convert/inflate.h"
#include "cuda/runtime.h"
#include "gguf/quantize_model.h"
#include "model/batch_builder.h"
#include "model/runner.h"
#include "support/mask_bits.h"
#include "support/shared_data.h"
#include "support/test_device.h"

namespace arbor::cuda {
namespace {

using model::BatchBuilder;
using model::LogitsMode;
using model::ModelRunner;
using model::SequenceInput;

// The synthetic models, one GGUF per type, made once per test run.
class GpuModelTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() /
           str_cat("arbor_gpu_model_", getpid());
    std::filesystem::create_directories(dir_);
    ASSERT_TRUE(test::require_shared_file(test::kStories260K));
    auto src = gguf::GgufFile::open(test::shared_path(test::kStories260K));
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    convert::InflateOptions o;
    o.dim = 256;
    o.ffn = 512;
    o.layers = 5;
    o.kv_ratio = 2;
    o.seed = 3;
    o.random_std = 0.05f;
    auto inflated = convert::inflate_model(*src, o);
    ASSERT_TRUE(inflated.ok()) << inflated.status().to_string();
    ASSERT_TRUE(inflated->write(path("f32")).ok());
    auto in = gguf::GgufFile::open(path("f32"));
    ASSERT_TRUE(in.ok()) << in.status().to_string();
    for (const char *name :
         {"f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_K", "q3_K",
          "q4_K", "q5_K", "q6_K", "q4_K_M", "q3_K_M"}) {
      auto recipe = gguf::parse_quantize_recipe(name);
      ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
      auto w = gguf::quantize_model(
          *in, {.target = recipe->type, .mix = recipe->mix}, nullptr);
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      ASSERT_TRUE(w->write(path(name)).ok());
    }
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  void SetUp() override {
    if (device_count() == 0)
      GTEST_SKIP() << describe_devices();
  }

  static std::string path(const std::string &type) {
    return (dir_ / (type + ".gguf")).string();
  }

  static std::unique_ptr<ModelRunner>
  runner(const std::string &type, bool gpu,
         kernels::KvDtype dtype = kernels::KvDtype::kF16) {
    model::RunnerOptions opt;
    opt.block_size = 16;
    opt.num_blocks = 64;
    opt.kv_dtype = dtype;
    opt.num_threads = 2;
    if (gpu)
      opt.make_ops = test::test_ops();
    auto r = ModelRunner::load(path(type), opt);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  static std::filesystem::path dir_;
};

std::filesystem::path GpuModelTest::dir_;

const std::vector<int32_t> kPrefix = {1,   403, 407, 261, 378, 432, 383,
                                      286, 261, 376, 298, 315, 421, 317,
                                      395, 13,  29,  261, 44,  90};

// Runs `seqs` as one ragged batch (fresh blocks each) and returns every logits
// row.
std::vector<float> forward(ModelRunner &r,
                           const std::vector<SequenceInput> &seqs) {
  BatchBuilder b(r.kv_cache().block_size());
  for (const SequenceInput &s : seqs)
    b.add(s);
  std::vector<float> logits(static_cast<size_t>(b.num_logits()) *
                            r.config().vocab_size);
  const Status st = r.forward(b.batch(), logits.data());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return logits;
}

// The step the comparisons run: a 20-token prefill (all rows), and, after it, a
// 4-node token tree on one fork of it and a 3-token chain on another.
std::vector<float> mixed_steps(ModelRunner &r) {
  const std::vector<int32_t> a = {0, 1, 2, 3}, b = {4, 5, 6, 7},
                             c = {8, 9, 10, 11};
  std::vector<float> out = forward(
      r, {{.block_table = a, .tokens = kPrefix, .logits = LogitsMode::kAll}});
  r.kv_cache().copy_block(0, 4);
  r.kv_cache().copy_block(0, 8);
  r.kv_cache().copy_block(1, 5);
  r.kv_cache().copy_block(1, 9);
  const std::vector<int32_t> tree = {315, 421, 317, 395},
                             positions = {20, 21, 21, 22};
  const std::vector<uint8_t> mask = test::pack_mask_bits(
      {1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1});
  const std::vector<int32_t> chain = {29, 261, 44};
  const std::vector<float> more = forward(r, {{.block_table = b,
                                               .num_committed = 20,
                                               .tokens = tree,
                                               .positions = positions,
                                               .mask_bits = mask,
                                               .logits = LogitsMode::kAll},
                                              {.block_table = c,
                                               .num_committed = 20,
                                               .tokens = chain,
                                               .logits = LogitsMode::kAll}});
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

TEST_F(GpuModelTest, LogitsMatchTheCpuPerWeightType) {
  // Tolerance on max |gpu - cpu| relative to the largest |logit|: F32 weights
  // multiply in f32 on both sides (summation order differs); F16/BF16 may round
  // activations to 16 bits on the GPU (BF16 does on AVX-512 BF16 CPUs too);
  // Q8_0/Q4_0 and the affine types (Q4_1..Q6_K, the K-quant mixtures) quantise
  // activations to int8 blocks the same way on both (and the affine types take
  // the CPU's f32 step per block), so only summation order and the f16 KV cache
  // differ.
  const std::pair<const char *, float> kTypes[] = {
      {"f32", 1e-4f},   {"f16", 1e-2f},    {"bf16", 2e-2f},  {"q8_0", 1e-2f},
      {"q4_0", 1e-2f},  {"q4_1", 1e-2f},   {"q5_0", 1e-2f},  {"q5_1", 1e-2f},
      {"q2_K", 1e-2f},  {"q3_K", 1e-2f},   {"q4_K", 1e-2f},  {"q5_K", 1e-2f},
      {"q6_K", 1e-2f},  {"q4_K_M", 1e-2f}, {"q3_K_M", 1e-2f}};
  for (const auto &[type, tol] : kTypes) {
    SCOPED_TRACE(type);
    auto cpu = runner(type, false);
    auto gpu = runner(type, true);
    ASSERT_TRUE(cpu && gpu);
    const std::vector<float> want = mixed_steps(*cpu);
    const std::vector<float> got = mixed_steps(*gpu);
    ASSERT_EQ(got.size(), want.size());
    float scale = 0.0f, diff = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "logit " << i;
      scale = std::max(scale, std::abs(want[i]));
      diff = std::max(diff, std::abs(got[i] - want[i]));
    }
    EXPECT_LE(diff, tol * scale)
        << "max |diff| " << diff << ", max |logit| " << scale;
    // Greedy tokens agree on every row (the rows' top-2 gaps are far above the
    // tolerance).
    const int32_t vocab = cpu->config().vocab_size;
    for (size_t row = 0; row < want.size() / vocab; ++row) {
      const float *w = &want[row * vocab];
      const float *g = &got[row * vocab];
      EXPECT_EQ(std::max_element(g, g + vocab) - g,
                std::max_element(w, w + vocab) - w)
          << "row " << row;
    }
  }
}

TEST_F(GpuModelTest, BatchedEqualsAloneBitForBit) {
  for (const char *type : {"f32", "f16", "q4_0", "q4_K_M", "q6_K"}) {
    SCOPED_TRACE(type);
    auto gpu = runner(type, true);
    ASSERT_TRUE(gpu);
    const int32_t vocab = gpu->config().vocab_size;
    // Alone: each of three prompts in its own step.
    const std::vector<int32_t> p1(kPrefix.begin(), kPrefix.begin() + 7);
    const std::vector<int32_t> p2(kPrefix.begin() + 3, kPrefix.end());
    const std::vector<int32_t> p3 = {1, 261};
    const std::vector<int32_t> b1 = {0, 1}, b2 = {2, 3}, b3 = {4, 5};
    std::vector<float> alone;
    for (auto [p, blocks] : {std::pair{&p1, &b1}, {&p2, &b2}, {&p3, &b3}}) {
      const auto l = forward(
          *gpu,
          {{.block_table = *blocks, .tokens = *p, .logits = LogitsMode::kAll}});
      alone.insert(alone.end(), l.begin(), l.end());
    }
    // Batched: the same three in one step on other blocks.
    const std::vector<int32_t> c1 = {6, 7}, c2 = {8, 9}, c3 = {10, 11};
    const auto batched = forward(
        *gpu, {{.block_table = c1, .tokens = p1, .logits = LogitsMode::kAll},
               {.block_table = c2, .tokens = p2, .logits = LogitsMode::kAll},
               {.block_table = c3, .tokens = p3, .logits = LogitsMode::kAll}});
    ASSERT_EQ(batched.size(), alone.size());
    for (size_t row = 0; row < alone.size() / vocab; ++row) {
      EXPECT_EQ(
          0, std::memcmp(&batched[row * vocab], &alone[row * vocab], vocab * 4))
          << "row " << row;
    }
    // Decode: one token after p2, alone and next to a 9-token verification of
    // p1's sequence.
    const std::vector<int32_t> next = {13};
    const auto d_alone =
        forward(*gpu, {{.block_table = b2,
                        .num_committed = static_cast<int32_t>(p2.size()),
                        .tokens = next}});
    const std::vector<int32_t> nine = {29, 261, 44, 90, 315, 421, 317, 395, 13};
    const std::vector<int32_t> c1_long = {6, 7, 12, 13};
    const auto d_batched =
        forward(*gpu, {{.block_table = c1_long,
                        .num_committed = static_cast<int32_t>(p1.size()),
                        .tokens = nine,
                        .logits = LogitsMode::kAll},
                       {.block_table = c2,
                        .num_committed = static_cast<int32_t>(p2.size()),
                        .tokens = next}});
    EXPECT_EQ(0, std::memcmp(&d_batched[9 * vocab], d_alone.data(), vocab * 4));
  }
}

TEST_F(GpuModelTest, ChainMaskEqualsCausalBitForBit) {
  auto gpu = runner("f16", true);
  ASSERT_TRUE(gpu);
  const std::vector<int32_t> tokens(kPrefix.begin(), kPrefix.begin() + 9);
  std::vector<uint8_t> chain(tokens.size() * tokens.size(), 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (size_t j = 0; j <= i; ++j)
      chain[i * tokens.size() + j] = 1;
  }
  const std::vector<int32_t> prefix = {1, 403, 407, 261, 378};
  const std::vector<int32_t> a = {0, 1}, b = {2, 3};
  for (const std::vector<int32_t> *blocks : {&a, &b}) {
    forward(*gpu, {{.block_table = *blocks, .tokens = prefix}});
  }
  const auto causal = forward(*gpu, {{.block_table = a,
                                      .num_committed = 5,
                                      .tokens = tokens,
                                      .logits = LogitsMode::kAll}});
  const auto masked = forward(*gpu, {{.block_table = b,
                                      .num_committed = 5,
                                      .tokens = tokens,
                                      .mask_bits = test::pack_mask_bits(chain),
                                      .logits = LogitsMode::kAll}});
  ASSERT_EQ(causal.size(), masked.size());
  EXPECT_EQ(0, std::memcmp(causal.data(), masked.data(),
                           causal.size() * sizeof(float)));
}

} // namespace
} // namespace arbor::cuda
