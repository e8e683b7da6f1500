// ModelConfig, LlamaModel binding, PagedKvCache, ForwardBatch validation, BatchBuilder, and
// forward-pass metamorphic checks on stories260K (token tree == linear branches, copy-on-write
// fork == independent runs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "golden_util.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "model/batch_builder.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/synth_model.h"
#include "support/mask_bits.h"

namespace arbor::model::testing {
namespace {

gguf::GgufFile open_stories() {
  EXPECT_TRUE(require_shared_file(kStories260K));
  auto f = gguf::GgufFile::open(shared_path(kStories260K));
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return std::move(f).value();
}

TEST(ModelConfigTest, Stories260K) {
  const gguf::GgufFile f = open_stories();
  auto c = ModelConfig::from_gguf(f);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->arch, Arch::kLlama);
  EXPECT_EQ(c->dim, 64);
  EXPECT_EQ(c->ffn_dim, 172);
  EXPECT_EQ(c->num_layers, 5);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->context_length, 2048);
  EXPECT_EQ(c->rope_dim, 8);
  EXPECT_FALSE(c->rope_neox);
  EXPECT_FLOAT_EQ(c->ropes.at(0).theta, 10000.0f);  // key absent: default
  EXPECT_NEAR(c->rms_eps, 1e-5f, 1e-9f);
}

TEST(ModelConfigTest, TinyStoriesQ8IsTied) {
  ASSERT_TRUE(require_shared_file("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"));
  auto m = LlamaModel::load(shared_path("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.dim, 128);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.vocab_size, 2048);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_NEAR(c.rms_eps, 1e-6f, 1e-10f);
  EXPECT_TRUE((*m)->weights().tied_output);
  EXPECT_EQ((*m)->weights().output.w.data, (*m)->weights().token_embd.data);
  EXPECT_EQ((*m)->weights().token_embd.type, gguf::GgmlType::kQ8_0);
}

// Rewrites stories260K's metadata/tensors and expects from_file() to fail naming `needle`.
void expect_load_error(const std::function<void(gguf::GgufWriter&)>& edit,
                       const std::string& needle) {
  const gguf::GgufFile f = open_stories();
  gguf::GgufWriter w = gguf::GgufWriter::from_file(f);
  edit(w);
  const std::string bytes = w.serialize();
  auto parsed = gguf::GgufFile::parse(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
      "edited.gguf");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  auto m = LlamaModel::from_file(std::move(parsed).value());
  ASSERT_FALSE(m.ok()) << "expected an error naming " << needle;
  EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().to_string();
}

// Edits that set one key.
std::function<void(gguf::GgufWriter&)> set_key(const std::string& key, gguf::Value value) {
  return [=](gguf::GgufWriter& w) { w.set(key, value); };
}

std::function<void(gguf::GgufWriter&)> remove_key(const std::string& key) {
  return [=](gguf::GgufWriter& w) { w.remove(key); };
}

TEST(ModelConfigTest, ErrorsNameTheKeyOrTensor) {
  expect_load_error(remove_key("llama.block_count"), "llama.block_count");
  expect_load_error(remove_key("llama.attention.layer_norm_rms_epsilon"),
                    "llama.attention.layer_norm_rms_epsilon");
  expect_load_error(set_key("general.architecture", gguf::Value::str("gpt2")),
                    "general.architecture");
  expect_load_error(set_key("llama.attention.head_count_kv", gguf::Value::u32(3)),
                    "llama.attention.head_count_kv");
  expect_load_error(set_key("llama.rope.scaling.type", gguf::Value::str("dynamic")),
                    "llama.rope.scaling.type");
  // A config that disagrees with the tensors: the tensor is named with both shapes.
  expect_load_error(set_key("llama.feed_forward_length", gguf::Value::u32(128)),
                    "blk.0.ffn_gate.weight has dims [64, 172], expected [64, 128]");
}

// Nothing in a file is silently ignored: a tensor the architecture does not use, a key that
// would change the function, an architecture arbor does not run (with the supported list).
TEST(ModelConfigTest, RefusesWhatItWouldIgnore) {
  expect_load_error(
      [](gguf::GgufWriter& w) {
        w.add_tensor_owned("blk.2.attn_q_norm.weight", gguf::GgmlType::kF32, {8},
                           std::vector<uint8_t>(8 * sizeof(float), 0));
      },
      "tensor blk.2.attn_q_norm.weight is not used by architecture llama");
  expect_load_error(set_key("llama.expert_count", gguf::Value::u32(8)),
                    "llama.expert_used_count is missing (llama.expert_count = 8)");
  expect_load_error(set_key("general.architecture", gguf::Value::str("deepseek2")),
                    "(supported: llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, mistral3, phi3, "
                    "smollm3, olmo2, granite, gpt-oss, qwen2moe, qwen35, qwen35moe)");
  expect_load_error(set_key("llama.attention.head_count",
                            gguf::Value::i32_array({8, 8, 4, 8, 8})),
                    "llama.attention.head_count differs between layers (8 and 4)");
  expect_load_error(set_key("llama.attention.key_length_swa", gguf::Value::u32(16)),
                    "llama.attention.key_length_swa = 16 differs");
  expect_load_error(set_key("llama.rope.dimension_count", gguf::Value::u32(4)),
                    "must equal head_dim 8 for llama");
  // A rank head where the architecture has none (llama.cpp reads cls.output for qwen3 only).
  expect_load_error(
      [](gguf::GgufWriter& w) {
        w.add_tensor_owned("cls.output.weight", gguf::GgmlType::kF32, {64, 2},
                           std::vector<uint8_t>(64 * 2 * sizeof(float), 0));
      },
      "tensor cls.output.weight is not used by architecture llama");
  expect_load_error(set_key("llama.pooling_type", gguf::Value::u32(5)),
                    "llama.pooling_type = 5 (llama.cpp's values: -1 unspecified, 0 none");
}

// An embedding or reranking file's keys and rank head: pooling_type, the labels, and
// cls.output.weight bound with one row per label.
TEST(ModelConfigTest, PoolingAndRankHead) {
  SynthShape s{.name = "rank", .arch = "qwen3", .dim = 64, .ffn = 128, .layers = 1, .heads = 2,
               .kv_heads = 1, .context = 256, .vocab = 128, .tied = true};
  s.pooling_type = 4;
  s.rank_classes = 2;
  kernels::ThreadPool pool(1);
  auto w = synth_model(s, gguf::GgmlType::kF32, 1, 128, {}, pool);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const std::string bytes = w->serialize();
  auto parsed = gguf::GgufFile::parse(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
      "rank.gguf");
  ASSERT_TRUE(parsed.ok());
  auto m = LlamaModel::from_file(std::move(parsed).value(), {.pack_for_cpu = false});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->config().pooling_type, 4);
  EXPECT_EQ((*m)->config().classifier_labels, (std::vector<std::string>{"yes", "no"}));
  EXPECT_EQ((*m)->weights().cls_out.rows, 2);
  EXPECT_EQ((*m)->weights().cls_out.cols, 64);
  s.rank_classes = 0;
  s.pooling_type = 3;
  auto plain = synth_model(s, gguf::GgmlType::kF32, 1, 128, {}, pool);
  ASSERT_TRUE(plain.ok());
  const std::string plain_bytes = plain->serialize();
  auto plain_file = gguf::GgufFile::parse(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(plain_bytes.data()),
                               plain_bytes.size()),
      "embed.gguf");
  ASSERT_TRUE(plain_file.ok());
  auto c = ModelConfig::from_gguf(*plain_file);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pooling_type, 3);
  EXPECT_TRUE(c->classifier_labels.empty());
  s.arch = "llama";
  s.rank_classes = 2;
  EXPECT_FALSE(validate_synth_shape(s, gguf::GgmlType::kF32).ok());
}

// Per-layer arrays holding one value load like the scalar key.
TEST(ModelConfigTest, UniformPerLayerArraysLoad) {
  const gguf::GgufFile f = open_stories();
  gguf::GgufWriter w = gguf::GgufWriter::from_file(f);
  w.set("llama.attention.head_count", gguf::Value::i32_array({8, 8, 8, 8, 8}));
  w.set("llama.rope.scaling.type", gguf::Value::str("linear"));
  w.set("llama.rope.scaling.factor", gguf::Value::f32(4.0f));
  const std::string bytes = w.serialize();
  auto parsed = gguf::GgufFile::parse(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
      "arrays.gguf");
  ASSERT_TRUE(parsed.ok());
  auto c = ModelConfig::from_gguf(*parsed);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->num_heads, 8);
  ASSERT_EQ(c->ropes.size(), 1u);
  EXPECT_EQ(c->ropes[0].scaling, RopeScaling::kLinear);
  EXPECT_FLOAT_EQ(c->ropes[0].freq_scale, 0.25f);
}

// The one KV sizing rule: floor(budget / block bytes), at least 2 blocks (the KV manager's null
// block and one usable block), at most INT32_MAX (int32 block ids).
TEST(KvCacheTest, BlocksForBudget) {
  KvCacheShape s{.num_layers = 2, .num_kv_heads = 3, .head_dim = 4, .block_size = 5,
                 .dtype = kernels::KvDtype::kF16};
  ASSERT_EQ(PagedKvCache::bytes_per_block(s), 480u);  // 2 layers x K/V x 3 x 5 x 4 x 2 bytes
  EXPECT_EQ(*PagedKvCache::blocks_for_budget(s, 1 << 20), 1048576 / 480);
  EXPECT_EQ(*PagedKvCache::blocks_for_budget(s, 480 * 7 + 479), 7);  // floor
  EXPECT_EQ(*PagedKvCache::blocks_for_budget(s, 480 * 2), 2);
  const Result<int32_t> too_small = PagedKvCache::blocks_for_budget(s, 480 * 2 - 1);
  ASSERT_FALSE(too_small.ok());
  EXPECT_EQ(too_small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_small.status().message().find("KV budget of 959 bytes holds 1 blocks of 480 bytes"),
            std::string::npos)
      << too_small.status().to_string();
  EXPECT_FALSE(PagedKvCache::blocks_for_budget(s, -1).ok());
  EXPECT_EQ(*PagedKvCache::blocks_for_budget(s, std::numeric_limits<int64_t>::max()),
            std::numeric_limits<int32_t>::max());
  s.dtype = kernels::KvDtype::kF32;
  EXPECT_EQ(*PagedKvCache::blocks_for_budget(s, 1 << 20), 1048576 / 960);
  s.num_layers = 0;
  EXPECT_EQ(PagedKvCache::blocks_for_budget(s, 1 << 20).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(KvCacheTest, SizesRoundTripAndCopyBlock) {
  KvCacheShape s{.num_layers = 2, .num_kv_heads = 3, .head_dim = 4, .block_size = 5,
                 .dtype = kernels::KvDtype::kF16};
  EXPECT_EQ(PagedKvCache::bytes_per_block(s), 2u * 2 * 3 * 5 * 4 * 2);
  for (kernels::KvDtype dtype : {kernels::KvDtype::kF32, kernels::KvDtype::kF16}) {
    s.dtype = dtype;
    auto cache = PagedKvCache::create(s, 4);
    ASSERT_TRUE(cache.ok());
    PagedKvCache& kv = **cache;
    std::vector<float> k(12), v(12), out(4);
    for (int i = 0; i < 12; ++i) k[i] = 0.5f * i, v[i] = -0.25f * i;  // exact in F16
    kv.write_token(1, /*slot=*/7, k.data(), v.data());  // block 1, offset 2
    kv.read_token(1, 7, 2, /*value=*/false, out.data());
    EXPECT_EQ(out, std::vector<float>(k.begin() + 8, k.end()));
    // Layout: layer 1's K pool, block 1, head 2, offset 2.
    const size_t elem = ((1 * 3 + 2) * 5 + 2) * 4;
    if (dtype == kernels::KvDtype::kF32) {
      EXPECT_EQ(static_cast<const float*>(kv.k_pool(1))[elem], 4.0f);
    }
    kv.copy_block(1, 3);
    kv.read_token(1, 3 * 5 + 2, 2, /*value=*/true, out.data());
    EXPECT_EQ(out, std::vector<float>(v.begin() + 8, v.end()));
    kv.read_token(0, 3 * 5 + 2, 2, /*value=*/true, out.data());  // layer 0 untouched
    EXPECT_EQ(out, std::vector<float>(4, 0.0f));
  }
  EXPECT_FALSE(PagedKvCache::create(s, 0).ok());
}

// The example of docs/batch_layout.md, built with BatchBuilder.
TEST(BatchBuilderTest, DocExample) {
  BatchBuilder b(4);
  const std::vector<int32_t> t0 = {10, 11, 12}, t1 = {20}, t2 = {30, 31, 32, 33};
  const std::vector<int32_t> bt0 = {7, 3}, bt1 = {4, 0, 9}, bt2 = {2, 5};
  const std::vector<int32_t> pos2 = {2, 3, 3, 4};
  const std::vector<uint8_t> tree =
      test::pack_mask_bits({1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1});
  EXPECT_EQ(b.add({.block_table = bt0, .num_committed = 5, .tokens = t0}), 0);
  EXPECT_EQ(b.add({.block_table = bt1, .num_committed = 9, .tokens = t1}), 1);
  EXPECT_EQ(b.add({.block_table = bt2, .num_committed = 2, .tokens = t2, .positions = pos2,
                   .mask_bits = tree, .logits = LogitsMode::kAll}),
            2);
  const ForwardBatch fb = b.batch();
  using V = std::vector<int32_t>;
  EXPECT_EQ(V(fb.positions.begin(), fb.positions.end()), (V{5, 6, 7, 9, 2, 3, 3, 4}));
  EXPECT_EQ(V(fb.qo_indptr.begin(), fb.qo_indptr.end()), (V{0, 3, 4, 8}));
  EXPECT_EQ(V(fb.kv_len.begin(), fb.kv_len.end()), (V{8, 10, 6}));
  EXPECT_EQ(V(fb.kv_indptr.begin(), fb.kv_indptr.end()), (V{0, 2, 5, 7}));
  EXPECT_EQ(V(fb.kv_page_indices.begin(), fb.kv_page_indices.end()), (V{7, 3, 4, 0, 9, 2, 5}));
  EXPECT_EQ(V(fb.slot_mapping.begin(), fb.slot_mapping.end()),
            (V{13, 14, 15, 37, 10, 11, 20, 21}));
  EXPECT_EQ(V(fb.logits_indices.begin(), fb.logits_indices.end()), (V{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(V(fb.mask_indptr.begin(), fb.mask_indptr.end()), (V{0, 0, 0, 16}));
  // Rows 0b0001, 0b0011, 0b0101, 0b1011, little-endian bit order: bytes 0x31, 0xB5.
  ASSERT_EQ(fb.mask_bits.size(), 2u);
  EXPECT_EQ(fb.mask_bits[0], 0x31);
  EXPECT_EQ(fb.mask_bits[1], 0xB5);
  EXPECT_TRUE(validate_batch(fb, {.vocab_size = 64, .block_size = 4, .num_blocks = 10}).ok());
}

// Mask segments land at any bit offset: each sequence's packed bits are copied once into the
// batch's array, shifted across bytes, and the padding bits of an input's last byte (set here)
// never reach the next segment.
TEST(BatchBuilderTest, MaskSegmentsAtUnalignedBitOffsets) {
  BatchBuilder b(4);
  const std::vector<int32_t> table = {1, 2, 3, 4};
  std::mt19937 rng(7);
  const int32_t sizes[] = {3, 2, 2, 5, 1, 4};  // the 2-token one at index 1 is causal
  std::vector<std::vector<uint8_t>> visible, packed;
  std::vector<std::vector<int32_t>> tokens;
  for (int32_t n : sizes) {
    std::vector<uint8_t> v((size_t)n * n);
    for (uint8_t& x : v) x = (uint8_t)(rng() & 1);
    visible.push_back(v);
    packed.push_back(test::pack_mask_bits(v));
    if (v.size() % 8 != 0) packed.back().back() |= (uint8_t)(0xFF << (v.size() % 8));
    tokens.emplace_back((size_t)n, 5);
  }
  for (size_t s = 0; s < tokens.size(); ++s) {
    b.add({.block_table = table, .num_committed = 3, .tokens = tokens[s],
           .mask_bits = s == 1 ? std::span<const uint8_t>() : std::span<const uint8_t>(packed[s])});
  }
  const ForwardBatch fb = b.batch();
  using V = std::vector<int32_t>;
  EXPECT_EQ(V(fb.mask_indptr.begin(), fb.mask_indptr.end()), (V{0, 9, 9, 13, 38, 39, 55}));
  ASSERT_EQ(fb.mask_bits.size(), 7u);  // ceil(55 / 8)
  for (size_t s = 0; s < tokens.size(); ++s) {
    if (s == 1) continue;
    const int n = sizes[s];
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(kernels::mask_bit(fb.mask_bits.data(), fb.mask_indptr[s], n, i, j),
                  visible[s][(size_t)i * n + j] != 0)
            << "sequence " << s << " bit (" << i << ", " << j << ")";
      }
    }
  }
  EXPECT_EQ(fb.mask_bits[6] >> 7, 0) << "bit 55, after the last segment";
}

TEST(ForwardBatchTest, ValidateRejectsBadGeometry) {
  BatchBuilder b(4);
  const std::vector<int32_t> toks = {1, 2, 3}, table = {3, 1};
  const std::vector<uint8_t> mask = test::pack_mask_bits({1, 0, 0, 1, 1, 0, 1, 0, 1});
  b.add({.block_table = table, .num_committed = 2, .tokens = toks, .mask_bits = mask});
  const BatchLimits lim{.vocab_size = 16, .block_size = 4, .num_blocks = 4};
  ForwardBatch ok = b.batch();
  ASSERT_TRUE(validate_batch(ok, lim).ok());
  auto expect_bad = [&](ForwardBatch fb, const std::string& needle) {
    const Status s = validate_batch(fb, lim);
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.to_string();
  };
  const std::vector<int32_t> bad_slots = {14, 15, 5};  // last should be 4 (block 1, offset 0)
  ForwardBatch fb = ok;
  fb.slot_mapping = bad_slots;
  expect_bad(fb, "slot_mapping[2] = 5");
  const std::vector<int32_t> big_token = {1, 2, 16};
  fb = ok;
  fb.tokens = big_token;
  expect_bad(fb, "tokens[2] = 16");
  EXPECT_FALSE(validate_batch(ok, {.vocab_size = 16, .block_size = 4, .num_blocks = 3}).ok());
  const std::vector<int32_t> short_len = {2};
  fb = ok;
  fb.kv_len = short_len;
  expect_bad(fb, "kv_len 2 < 3 new tokens");
  const std::vector<uint8_t> no_diag = {0x00, 0x00};
  fb = ok;
  fb.mask_bits = no_diag;
  expect_bad(fb, "mask bit (0, 0) is clear");
  const std::vector<int32_t> bad_logits = {3};
  fb = ok;
  fb.logits_indices = bad_logits;
  expect_bad(fb, "logits_indices[0] = 3");
}

std::unique_ptr<ModelRunner> stories_runner(int32_t block_size, int64_t num_blocks) {
  RunnerOptions opt{.block_size = block_size, .num_blocks = num_blocks,
                    .kv_dtype = kernels::KvDtype::kF32, .num_threads = 2};
  EXPECT_TRUE(require_shared_file(kStories260K));
  auto r = ModelRunner::load(shared_path(kStories260K), opt);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Logits of `tokens` run linearly after `prefix` on a fresh sequence, all rows.
std::vector<float> linear_logits(ModelRunner& runner, const std::vector<int32_t>& blocks,
                                 const std::vector<int32_t>& prefix,
                                 const std::vector<int32_t>& tokens) {
  SingleSequence seq(runner, blocks);
  EXPECT_TRUE(seq.append(prefix).ok());
  auto l = seq.append_all_logits(tokens);
  EXPECT_TRUE(l.ok());
  return std::vector<float>(l->begin(), l->end());
}

TEST(ForwardTest, TokenTreeEqualsLinearBranches) {
  // Block size 4, 11 committed tokens: the tree's first token shares block 2 with the prefix.
  auto runner = stories_runner(4, 64);
  const int32_t vocab = runner->config().vocab_size;
  const std::vector<int32_t> prefix = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298};
  //   a(315) -> b(421) -> d(395);  a -> c(317)       parent: -1, 0, 0, 1
  const std::vector<int32_t> tree = {315, 421, 317, 395};
  const std::vector<int32_t> positions = {11, 12, 12, 13};
  const std::vector<uint8_t> mask =
      test::pack_mask_bits({1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1});
  const std::vector<int32_t> blocks = SingleSequence::contiguous_blocks(0, 8);
  SingleSequence seq(*runner, blocks);
  ASSERT_TRUE(seq.append(prefix).ok());
  BatchBuilder b(4);
  b.add({.block_table = blocks, .num_committed = 11, .tokens = tree, .positions = positions,
         .mask_bits = mask, .logits = LogitsMode::kAll});
  std::vector<float> tree_logits(4 * vocab);
  ASSERT_TRUE(runner->forward(b.batch(), tree_logits.data()).ok());

  const auto abd = linear_logits(*runner, SingleSequence::contiguous_blocks(8, 8), prefix,
                                 {315, 421, 395});
  const auto ac = linear_logits(*runner, SingleSequence::contiguous_blocks(16, 8), prefix,
                                {315, 317});
  const float tol = 1e-4f;
  EXPECT_LT(max_abs_diff(&tree_logits[0 * vocab], &abd[0 * vocab], vocab), tol);  // a
  EXPECT_LT(max_abs_diff(&tree_logits[1 * vocab], &abd[1 * vocab], vocab), tol);  // b
  EXPECT_LT(max_abs_diff(&tree_logits[3 * vocab], &abd[2 * vocab], vocab), tol);  // d
  EXPECT_LT(max_abs_diff(&tree_logits[2 * vocab], &ac[1 * vocab], vocab), tol);   // c
  // Under a causal mask c would see b, and its logits would differ.
  const auto abc = linear_logits(*runner, SingleSequence::contiguous_blocks(24, 8), prefix,
                                 {315, 421, 317});
  EXPECT_GT(max_abs_diff(&tree_logits[2 * vocab], &abc[2 * vocab], vocab), 1e-3f);
}

TEST(ForwardTest, CopyOnWriteForkMatchesIndependentRuns) {
  // Two sequences share a 10-token prefix: full blocks 0 and 1 are shared, the partial block 2
  // (tokens 8, 9) is copied to block 5 for the second sequence. Both then run in one batch.
  auto runner = stories_runner(4, 16);
  const int32_t vocab = runner->config().vocab_size;
  const std::vector<int32_t> prefix = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
  const std::vector<int32_t> blocks_a = {0, 1, 2, 3}, blocks_b = {0, 1, 5, 6};
  SingleSequence seq(*runner, blocks_a);
  ASSERT_TRUE(seq.append(prefix).ok());
  runner->kv_cache().copy_block(2, 5);
  const std::vector<int32_t> next_a = {298, 315, 421}, next_b = {432, 13};
  BatchBuilder b(4);
  b.add({.block_table = blocks_a, .num_committed = 10, .tokens = next_a,
         .logits = LogitsMode::kAll});
  b.add({.block_table = blocks_b, .num_committed = 10, .tokens = next_b,
         .logits = LogitsMode::kAll});
  std::vector<float> logits(5 * vocab);
  ASSERT_TRUE(runner->forward(b.batch(), logits.data()).ok());
  const auto want_a = linear_logits(*runner, {8, 9, 10, 11}, prefix, next_a);
  const auto want_b = linear_logits(*runner, {12, 13, 14, 15}, prefix, next_b);
  EXPECT_LT(max_abs_diff(logits.data(), want_a.data(), 3 * vocab), 1e-4f);
  EXPECT_LT(max_abs_diff(logits.data() + 3 * vocab, want_b.data(), 2 * vocab), 1e-4f);
}

// Hidden-state rows (embeddings) are exactly what the classifier reads: the output matmul of a
// returned row gives that row's logits bit for bit, in a batch mixing hidden-only, logits-only
// and both kinds of rows. A batch with hidden rows and no array, or a row out of range, is an
// error.
TEST(ForwardTest, HiddenRowsAreTheStateTheClassifierReads) {
  auto runner = stories_runner(4, 16);
  const int32_t vocab = runner->config().vocab_size, dim = runner->config().dim;
  const std::vector<int32_t> a = {1, 403, 407, 261, 378, 432}, b_tokens = {1, 298, 315};
  BatchBuilder b(4);
  const std::vector<int32_t> table_a = {0, 1};
  b.add({.block_table = table_a, .num_committed = 0, .tokens = a, .logits = LogitsMode::kAll,
         .hidden_begin = 0, .hidden_end = 6});
  EXPECT_EQ(b.num_hidden(), 6);
  const std::vector<int32_t> table_b = {2};
  b.add({.block_table = table_b, .num_committed = 0, .tokens = b_tokens,
         .logits = LogitsMode::kNone, .hidden_begin = 2, .hidden_end = 3});
  ASSERT_EQ(b.batch().num_hidden(), 7);
  EXPECT_EQ(b.batch().hidden_indices[6], 8);
  std::vector<float> logits(6 * vocab), hidden(7 * dim, std::nanf(""));
  LogitsOut out;
  out.logits = logits.data();
  ASSERT_EQ(runner->forward(b.batch(), out).code(), StatusCode::kInvalidArgument);
  out.hidden = hidden.data();
  ASSERT_TRUE(runner->forward(b.batch(), out).ok());
  std::vector<float> again(6 * vocab);
  kernels::matmul(runner->model().weights().output.w, hidden.data(), again.data(), 6,
                  runner->pool());
  EXPECT_EQ(0, std::memcmp(again.data(), logits.data(), again.size() * sizeof(float)));
  // Sequence b's last row alone (a decode of b's third token after its first two).
  SingleSequence seq(*runner, {3});
  ASSERT_TRUE(seq.append({b_tokens.data(), 2}).ok());
  auto last = seq.append({b_tokens.data() + 2, 1});
  ASSERT_TRUE(last.ok());
  std::vector<float> b_logits(vocab);
  kernels::matmul(runner->model().weights().output.w, hidden.data() + 6 * dim, b_logits.data(), 1,
                  runner->pool());
  EXPECT_EQ(0, std::memcmp(b_logits.data(), last->data(), vocab * sizeof(float)));
  const std::vector<int32_t> bad = {9};
  ForwardBatch fb = b.batch();
  fb.hidden_indices = bad;
  const Status s = validate_batch(fb, {.vocab_size = vocab, .block_size = 4, .num_blocks = 16});
  EXPECT_NE(s.message().find("hidden_indices[0] = 9, batch has 9 tokens"), std::string::npos)
      << s.to_string();
}

TEST(ForwardTest, InvalidBatchIsAnErrorAndSequenceLimits) {
  auto runner = stories_runner(16, 4);
  BatchBuilder b(16);
  const std::vector<int32_t> toks = {1, 600}, table = {0};
  b.add({.block_table = table, .num_committed = 0, .tokens = toks});
  std::vector<float> logits(512);
  const Status s = runner->forward(b.batch(), logits.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokens[1] = 600"), std::string::npos) << s.to_string();
  SingleSequence seq(*runner, {2});
  std::vector<int32_t> many(17, 5);
  EXPECT_EQ(seq.append(many).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(seq.num_tokens(), 0);
}

TEST(ForwardTest, KvBudgetSizesTheCache) {
  RunnerOptions opt{.block_size = 16, .kv_cache_gib = 1.0 / 1024, .num_threads = 1};
  ASSERT_TRUE(require_shared_file(kStories260K));
  auto r = ModelRunner::load(shared_path(kStories260K), opt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // F16, 5 layers x K/V x 4 kv heads x 16 tokens x 8 dims x 2 bytes = 10240 bytes per block.
  EXPECT_EQ(PagedKvCache::bytes_per_block((*r)->kv_cache().shape()), 10240u);
  EXPECT_EQ((*r)->kv_cache().num_blocks(), 1024 * 1024 / 10240);
  // 15 KiB holds one block of 10240 bytes: the null block alone is not a usable pool.
  opt.kv_cache_gib = 15.0 / (1024 * 1024);
  const Status too_small = ModelRunner::load(shared_path(kStories260K), opt).status();
  EXPECT_EQ(too_small.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_small.message().find("--kv-cache-gib 1.43051e-05: KV budget of 15360 bytes holds 1 "
                                     "blocks of 10240 bytes"),
            std::string::npos)
      << too_small.to_string();
}

// stories260K rewritten as a qwen2 file: q/k rows permuted from GGUF's interleaved-pair layout
// to Hugging Face's half-split layout (which NeoX RoPE expects), zero q/k/v biases.
std::string stories_as_qwen2(const gguf::GgufFile& f, bool with_biases) {
  gguf::GgufWriter w;
  for (const gguf::KeyValue& kv : f.metadata()) {
    std::string key = kv.key;
    if (key.starts_with("llama.")) key = "qwen2." + key.substr(6);
    w.set(key, key == "general.architecture" ? gguf::Value::str("qwen2") : kv.value);
  }
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (!t.name.ends_with("attn_q.weight") && !t.name.ends_with("attn_k.weight")) {
      w.add_tensor_ref(t.name, t.type, t.dims, t.bytes());
      continue;
    }
    const int64_t row_len = t.dims[0], rows = t.dims[1], hd = 8;
    const float* src = reinterpret_cast<const float*>(t.data);
    std::vector<uint8_t> out(t.size_bytes);
    float* dst = reinterpret_cast<float*>(out.data());
    for (int64_t r = 0; r < rows; ++r) {  // HF row h*hd + j*hd/2 + i = GGUF row h*hd + 2i + j
      const int64_t h = r / hd, j = (r % hd) / (hd / 2), i = r % (hd / 2);
      std::copy_n(src + (h * hd + 2 * i + j) * row_len, row_len, dst + r * row_len);
    }
    w.add_tensor_owned(t.name, t.type, t.dims, std::move(out));
  }
  for (int l = 0; with_biases && l < 5; ++l) {
    for (auto [name, n] : {std::pair{"attn_q", 64}, {"attn_k", 32}, {"attn_v", 32}}) {
      w.add_tensor_owned(str_cat("blk.", l, ".", name, ".bias"), gguf::GgmlType::kF32, {n},
                         std::vector<uint8_t>(n * sizeof(float), 0));
    }
  }
  return w.serialize();
}

TEST(ForwardTest, Qwen2NeoxRopeMatchesLlamaOnPermutedWeights) {
  const gguf::GgufFile f = open_stories();
  const std::string bytes = stories_as_qwen2(f, /*with_biases=*/true);
  auto parsed = gguf::GgufFile::parse(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
      "qwen2.gguf");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  auto model = LlamaModel::from_file(std::move(parsed).value());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_TRUE((*model)->config().rope_neox);
  EXPECT_NE((*model)->weights().layers[4].v.bias, nullptr);
  auto qwen = ModelRunner::create(std::move(model).value(),
                                  {.num_blocks = 4, .kv_dtype = kernels::KvDtype::kF32, .num_threads = 1});
  ASSERT_TRUE(qwen.ok());
  auto llama = stories_runner(16, 4);
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
  SingleSequence a(*llama, {0}), b(**qwen, {0});
  auto la = a.append_all_logits(ids);
  auto lb = b.append_all_logits(ids);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_LT(max_abs_diff(la->data(), lb->data(), la->size()), 1e-4f);

  const std::string no_bias = stories_as_qwen2(f, /*with_biases=*/false);
  auto parsed2 = gguf::GgufFile::parse(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(no_bias.data()), no_bias.size()),
      "qwen2_nobias.gguf");
  ASSERT_TRUE(parsed2.ok());
  auto bad = LlamaModel::from_file(std::move(parsed2).value());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("blk.0.attn_q.bias"), std::string::npos)
      << bad.status().to_string();
}

}  // namespace
}  // namespace arbor::model::testing
