// Mixture-of-experts models (qwen3moe; gpt-oss; llama with experts, as Mixtral): the expert keys,
// gpt-oss's keys and tensors, their refusals, and three identities that hold bit for bit —
//   * one expert routed top-1 is the dense FFN: a dense llama / qwen3 file rewritten as a
//     one-expert llama-with-experts / qwen3moe file (its FFN tensors as the expert's, any
//     router) gives the dense file's logits exactly;
//   * permuting the experts together with the router's rows changes nothing;
//   * batch invariance: a verify step of 6 tokens (logits for every row), alone or beside
//     another sequence's prefill chunk and a decode, equals 6 decode steps, for F32, Q8_0 and
//     Q4_0 experts, 1 and 2 threads, every ISA this CPU runs.
// The agreement with llama.cpp is tests/model/arch_reference_test.cc's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "model/batch_builder.h"
#include "model/model_config.h"
#include "model/runner.h"
#include "model/synth_model.h"
#include "support/temp_dir.h"

namespace arbor::model::moe_testing {
namespace {

using gguf::GgmlType;
using gguf::Value;

constexpr int64_t kVocab = 512;

SynthShape moe_shape(const std::string& arch, int64_t experts, int64_t used) {
  SynthShape s = with_arch({.name = "moe-" + arch, .dim = 128, .ffn = 256, .layers = 2,
                            .heads = 4, .kv_heads = 2, .context = 512},
                           arch);
  s.vocab = 0;
  s.experts = experts;
  s.experts_used = used;
  s.expert_ffn = arch == "qwen3moe" || arch == "gpt-oss" ? 96 : 0;
  if (arch == "gpt-oss") {  // windows and YaRN that a 40-token prompt runs through
    s.window = 8;
    s.rope_factor = 4.0f;
    s.rope_original_context = 16;
  }
  return s;
}

gguf::GgufWriter synth(const SynthShape& s, GgmlType type, uint64_t seed) {
  kernels::ThreadPool pool(2);
  auto w = synth_model(s, type, seed, kVocab, {}, pool);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return w.ok() ? std::move(w).value() : gguf::GgufWriter();
}

std::string write(const gguf::GgufWriter& w, const std::string& path) {
  const Status st = w.write(path);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return path;
}

std::vector<int32_t> prompt(int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = 1 + static_cast<int32_t>(rng() % (kVocab - 1));
  return ids;
}

// Logits at every position of `ids` in one step.
std::vector<float> all_logits(const std::string& path, const std::vector<int32_t>& ids,
                              int threads = 2, int max_segments = kMaxSegments) {
  RunnerOptions o{.block_size = 16, .num_blocks = 8, .kv_dtype = kernels::KvDtype::kF32,
                  .num_threads = threads};
  o.max_segments = max_segments;
  auto runner = ModelRunner::load(path, o);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  if (!runner.ok()) return {};
  SingleSequence seq(**runner, SingleSequence::contiguous_blocks(0, 8));
  auto logits = seq.append_all_logits(ids);
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  if (!logits.ok()) return {};
  return {logits->begin(), logits->end()};
}

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b,
                       const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      FAIL() << what << ": position " << i / kVocab << " logit " << i % kVocab << ": " << a[i]
             << " vs " << b[i];
    }
  }
}

Result<ModelConfig> config_of(const gguf::GgufWriter& w, const test::TempDir& dir) {
  const std::string path = write(w, dir / "config.gguf");
  ARBOR_ASSIGN_OR_RETURN(gguf::GgufFile f, gguf::GgufFile::open(path));
  return ModelConfig::from_gguf(f);
}

TEST(MoeConfig, ReadsTheExpertKeys) {
  test::TempDir dir("moe_config");
  auto qwen = config_of(synth(moe_shape("qwen3moe", 8, 2), GgmlType::kF32, 1), dir);
  ASSERT_TRUE(qwen.ok()) << qwen.status().to_string();
  EXPECT_EQ(qwen->arch, Arch::kQwen3Moe);
  EXPECT_EQ(qwen->num_experts, 8);
  EXPECT_EQ(qwen->num_experts_used, 2);
  EXPECT_EQ(qwen->expert_ffn_dim, 96);
  EXPECT_NE(qwen->summary().find("8 experts (2 per token, ffn 96)"), std::string::npos)
      << qwen->summary();
  auto mixtral = config_of(synth(moe_shape("llama", 4, 2), GgmlType::kF32, 1), dir);
  ASSERT_TRUE(mixtral.ok()) << mixtral.status().to_string();
  EXPECT_EQ(mixtral->num_experts, 4);
  EXPECT_EQ(mixtral->expert_ffn_dim, 256);  // feed_forward_length
  gguf::GgufWriter no_ffn_key = synth(moe_shape("qwen3moe", 8, 2), GgmlType::kF32, 1);
  no_ffn_key.remove("qwen3moe.expert_feed_forward_length");
  auto fallback = config_of(no_ffn_key, dir);
  ASSERT_TRUE(fallback.ok()) << fallback.status().to_string();
  EXPECT_EQ(fallback->expert_ffn_dim, 256 / 2);  // llama.cpp's n_ff / n_expert_used
  auto dense = config_of(synth(moe_shape("llama", 0, 0), GgmlType::kF32, 1), dir);
  ASSERT_TRUE(dense.ok());
  EXPECT_FALSE(dense->is_moe());
}

// gpt-oss: the expert keys, sliding windows on the even layers with the full layers' RoPE (YaRN
// included, llama.cpp's rope_freq_scale_train_swa), and rope.freq_base_swa giving the sliding
// layers a variant of their own; the window key is required.
TEST(MoeConfig, ReadsGptOss) {
  test::TempDir dir("moe_config");
  gguf::GgufWriter w = synth(moe_shape("gpt-oss", 8, 2), GgmlType::kF32, 1);
  auto c = config_of(w, dir);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->arch, Arch::kGptOss);
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->num_experts_used, 2);
  EXPECT_EQ(c->expert_ffn_dim, 96);
  ASSERT_EQ(c->ropes.size(), 1u);
  EXPECT_EQ(c->ropes[0].scaling, RopeScaling::kYarn);
  EXPECT_FLOAT_EQ(c->ropes[0].freq_scale, 0.25f);
  EXPECT_FLOAT_EQ(c->ropes[0].mscale, 0.1f * std::log(4.0f) + 1.0f);  // YaRN's attention factor
  ASSERT_EQ(c->layers.size(), 2u);
  EXPECT_EQ(c->layers[0].window, 8);  // even layers slide (llama.cpp's pattern 2)
  EXPECT_EQ(c->layers[1].window, 0);
  EXPECT_EQ(c->layers[0].rope, 0);
  EXPECT_TRUE(c->rope_neox);
  w.set("gpt-oss.rope.freq_base_swa", Value::f32(5000.0f));
  auto own_base = config_of(w, dir);
  ASSERT_TRUE(own_base.ok()) << own_base.status().to_string();
  ASSERT_EQ(own_base->ropes.size(), 2u);
  EXPECT_EQ(own_base->layers[0].rope, 1);
  EXPECT_EQ(own_base->ropes[1].theta, 5000.0f);
  EXPECT_EQ(own_base->ropes[1].scaling, RopeScaling::kYarn);
  w.remove("gpt-oss.attention.sliding_window");
  auto no_window = config_of(w, dir);
  ASSERT_FALSE(no_window.ok());
  EXPECT_NE(no_window.status().message().find("gpt-oss.attention.sliding_window is missing"),
            std::string::npos)
      << no_window.status().message();
}

// gpt-oss's tensors: the sinks, the router's and experts' biases and the FFN norm under its
// post_attention_norm name are required; an MXFP4 expert tensor (every released gpt-oss file)
// is refused naming the tensor and its type until the matmul kernels take it.
TEST(MoeConfig, GptOssTensorsAreRequiredAndMxfp4IsNamed) {
  test::TempDir dir("moe_gptoss_tensors");
  const gguf::GgufWriter base = synth(moe_shape("gpt-oss", 8, 2), GgmlType::kF32, 1);
  const std::string ok_path = write(base, dir / "ok.gguf");
  auto loaded = LlamaModel::load(ok_path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const LayerWeights& l0 = (*loaded)->weights().layers[0];
  EXPECT_NE(l0.attn_sinks, nullptr);
  EXPECT_NE(l0.router_bias, nullptr);
  EXPECT_NE(l0.gate_exps_bias, nullptr);
  EXPECT_NE(l0.up_exps_bias, nullptr);
  EXPECT_NE(l0.down_exps_bias, nullptr);
  EXPECT_NE(l0.ffn_norm, nullptr);
  auto f = gguf::GgufFile::open(ok_path);
  ASSERT_TRUE(f.ok());
  // Rewrites the file with `name` dropped, or (mxfp4) stored as MXFP4 bytes of its shape.
  auto rewrite = [&](const std::string& name, bool mxfp4) {
    gguf::GgufWriter w;
    for (const gguf::KeyValue& kv : f->metadata()) w.set(kv.key, kv.value);
    for (const gguf::TensorInfo& t : f->tensors()) {
      if (t.name != name) {
        w.add_tensor_ref(t.name, t.type, t.dims, t.bytes());
      } else if (mxfp4) {
        const int64_t n = t.dims[0] * t.dims[1] * t.dims[2];
        w.add_tensor_owned(t.name, GgmlType::kMXFP4, t.dims,
                           std::vector<uint8_t>(n / 32 * 17, 0));
      }
    }
    const std::string path = dir / "edited.gguf";
    EXPECT_TRUE(w.write(path).ok());
    return LlamaModel::load(path);
  };
  for (const char* name : {"blk.1.attn_sinks.weight", "blk.0.ffn_gate_inp.bias",
                           "blk.0.ffn_up_exps.bias", "blk.1.ffn_down_exps.bias",
                           "blk.0.post_attention_norm.weight"}) {
    auto m = rewrite(name, false);
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_NE(m.status().message().find(std::string("tensor ") + name + " is missing"),
              std::string::npos)
        << m.status().message();
  }
  auto m = rewrite("blk.0.ffn_down_exps.weight", true);
  if (kernels::matmul_supported(GgmlType::kMXFP4)) {  // the MXFP4 kernels have landed
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return;
  }
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor blk.0.ffn_down_exps.weight has type mxfp4"),
            std::string::npos)
      << m.status().message();
}

TEST(MoeConfig, RefusesWhatItCannotRunNamingTheKey) {
  test::TempDir dir("moe_config");
  struct Case {
    std::string arch, key;
    std::optional<Value> value;  // nullopt: remove the key
    StatusCode code;
    std::string says;
  };
  const Case cases[] = {
      {"qwen3moe", "qwen3moe.expert_count", std::nullopt, StatusCode::kInvalidArgument,
       "qwen3moe.expert_count is missing"},
      {"qwen3moe", "qwen3moe.expert_used_count", Value::u32(9), StatusCode::kInvalidArgument,
       "qwen3moe.expert_used_count = 9 exceeds"},
      {"llama", "llama.expert_used_count", std::nullopt, StatusCode::kNotFound,
       "llama.expert_used_count is missing"},
      {"qwen3moe", "qwen3moe.expert_group_count", Value::u32(2), StatusCode::kUnimplemented,
       "grouped expert selection"},
      {"qwen3", "qwen3.expert_count", Value::u32(4), StatusCode::kUnimplemented,
       "not on qwen3"},
  };
  for (const Case& c : cases) {
    SynthShape s = c.arch == "qwen3" ? moe_shape("qwen3moe", 8, 2) : moe_shape(c.arch, 8, 2);
    if (c.arch == "qwen3") {
      s = with_arch(moe_shape("llama", 0, 0), "qwen3");
      s.vocab = 0;
    }
    gguf::GgufWriter w = synth(s, GgmlType::kF32, 1);
    if (c.value) {
      w.set(c.key, *c.value);
    } else {
      w.remove(c.key);
    }
    auto cfg = config_of(w, dir);
    ASSERT_FALSE(cfg.ok()) << c.key;
    EXPECT_EQ(cfg.status().code(), c.code) << cfg.status().to_string();
    EXPECT_NE(cfg.status().message().find(c.says), std::string::npos) << cfg.status().message();
  }
}

// ---- one expert, top-1 = the dense FFN ------------------------------------------------------

// The dense file at `dense` rewritten as a one-expert mixture of architecture `moe_arch`:
// ffn_{gate,up,down}.weight become the expert's 3-D tensors, plus a random router.
void write_one_expert(const std::string& dense, const std::string& moe_arch,
                      const std::string& out) {
  auto f = gguf::GgufFile::open(dense);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto arch = f->get_string("general.architecture");
  ASSERT_TRUE(arch.ok());
  gguf::GgufWriter w;
  for (const gguf::KeyValue& kv : f->metadata()) {
    std::string key = kv.key;
    if (key.starts_with(*arch + ".")) key = moe_arch + key.substr(arch->size());
    w.set(key, kv.value);
  }
  w.set("general.architecture", Value::str(moe_arch));
  w.set(moe_arch + ".expert_count", Value::u32(1));
  w.set(moe_arch + ".expert_used_count", Value::u32(1));
  std::vector<std::vector<uint8_t>> routers;
  for (const gguf::TensorInfo& t : f->tensors()) {
    std::string name = t.name;
    std::vector<int64_t> dims = t.dims;
    for (const char* m : {"ffn_gate", "ffn_up", "ffn_down"}) {
      const std::string from = std::string(".") + m + ".weight";
      if (!name.ends_with(from)) continue;
      const std::string p = name.substr(0, name.size() - from.size());
      name = p + "." + m + "_exps.weight";
      dims.push_back(1);
      if (std::string(m) == "ffn_gate") {
        if (moe_arch == "qwen3moe") {
          w.set(moe_arch + ".expert_feed_forward_length", Value::u32(uint32_t(t.dims[1])));
        }
        std::vector<float> router(t.dims[0]);
        std::mt19937 rng(routers.size() + 3);
        for (float& v : router) v = std::uniform_real_distribution<float>(-1, 1)(rng);
        auto& bytes = routers.emplace_back(router.size() * sizeof(float));
        std::memcpy(bytes.data(), router.data(), bytes.size());
        w.add_tensor_ref(p + ".ffn_gate_inp.weight", GgmlType::kF32, {t.dims[0], 1}, bytes);
      }
    }
    w.add_tensor_ref(name, t.type, dims, t.bytes());
  }
  const Status st = w.write(out);
  ASSERT_TRUE(st.ok()) << st.to_string();
}

TEST(MoeIdentity, OneExpertTopOneEqualsTheDenseFfnBitForBit) {
  test::TempDir dir("moe_one_expert");
  const std::vector<int32_t> ids = prompt(40, 3);
  for (const auto& [dense_arch, moe_arch] : {std::pair{"llama", "llama"}, {"qwen3", "qwen3moe"}}) {
    SynthShape s = with_arch(moe_shape("llama", 0, 0), dense_arch);
    s.vocab = 0;
    for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
      const std::string name = str_cat(dense_arch, "-", gguf::ggml_type_name(type));
      const std::string dense = write(synth(s, type, 21), dir / (name + "-dense.gguf"));
      write_one_expert(dense, moe_arch, dir / (name + "-moe.gguf"));
      auto cfg = gguf::GgufFile::open(dir / (name + "-moe.gguf"));
      ASSERT_TRUE(cfg.ok());
      auto c = ModelConfig::from_gguf(*cfg);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      ASSERT_EQ(c->num_experts, 1);
      // The dense file without canonical segments (tp.h): the expert path multiplies ffn_down
      // (and a mixture's attn_output) in one matmul over K.
      expect_bits_equal(all_logits(dir / (name + "-moe.gguf"), ids),
                        all_logits(dense, ids, 2, /*max_segments=*/1),
                        name + ": one expert vs dense");
    }
  }
}

// ---- permuting the experts --------------------------------------------------------------------

// The file at `in` with every layer's experts permuted by perm (expert e -> perm[e]): the 3-D
// tensors' slices and, with `router`, the router's rows alike.
void write_permuted(const std::string& in, const std::vector<int>& perm, const std::string& out,
                    bool router_too = true) {
  auto f = gguf::GgufFile::open(in);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  gguf::GgufWriter w;
  for (const gguf::KeyValue& kv : f->metadata()) w.set(kv.key, kv.value);
  const int n = static_cast<int>(perm.size());
  for (const gguf::TensorInfo& t : f->tensors()) {
    // gpt-oss's biases go with their experts and the router's rows alike.
    const bool exps = t.name.ends_with("_exps.weight") || t.name.ends_with("_exps.bias");
    const bool router = router_too && (t.name.ends_with("ffn_gate_inp.weight") ||
                                       t.name.ends_with("ffn_gate_inp.bias"));
    if (!exps && !router) {
      w.add_tensor_ref(t.name, t.type, t.dims, t.bytes());
      continue;
    }
    // Slices of equal bytes: an expert's matrix (3-D) or one router row (2-D, [dim, n]).
    ASSERT_EQ(t.dims.back(), n) << t.name;
    const size_t slice = t.size_bytes / n;
    std::vector<uint8_t> bytes(t.size_bytes);
    for (int e = 0; e < n; ++e) {
      std::memcpy(bytes.data() + perm[e] * slice, t.data + e * slice, slice);
    }
    w.add_tensor_owned(t.name, t.type, t.dims, std::move(bytes));
  }
  const Status st = w.write(out);
  ASSERT_TRUE(st.ok()) << st.to_string();
}

TEST(MoeIdentity, PermutingExpertsWithTheRouterLeavesLogitsUnchanged) {
  test::TempDir dir("moe_permute");
  const std::vector<int32_t> ids = prompt(40, 4);
  const std::vector<int> perm = {5, 2, 7, 0, 6, 1, 4, 3};
  for (const auto& [arch, type] :
       {std::pair{"qwen3moe", GgmlType::kQ8_0}, {"qwen3moe", GgmlType::kF32},
        {"llama", GgmlType::kQ4_0}, {"gpt-oss", GgmlType::kQ8_0}}) {
    const std::string name = str_cat(arch, "-", gguf::ggml_type_name(type));
    const std::string a = write(synth(moe_shape(arch, 8, 3), type, 31), dir / (name + ".gguf"));
    write_permuted(a, perm, dir / (name + "-permuted.gguf"));
    const std::vector<float> base = all_logits(a, ids);
    expect_bits_equal(all_logits(dir / (name + "-permuted.gguf"), ids), base,
                      name + ": permuted vs original");
    // Not vacuous: permuting the experts alone (router kept) changes the function.
    write_permuted(a, perm, dir / (name + "-experts-only.gguf"), /*router_too=*/false);
    const std::vector<float> other = all_logits(dir / (name + "-experts-only.gguf"), ids);
    ASSERT_EQ(other.size(), base.size());
    EXPECT_NE(std::memcmp(other.data(), base.data(), base.size() * sizeof(float)), 0) << name;
  }
}

// ---- batch invariance -------------------------------------------------------------------------

constexpr int32_t kPrompt = 40, kDraft = 6, kOtherCommitted = 20, kOtherChunk = 13;

std::vector<float> step(ModelRunner& runner, const std::vector<SequenceInput>& seqs) {
  BatchBuilder b(runner.kv_cache().block_size());
  for (const SequenceInput& s : seqs) b.add(s);
  std::vector<float> logits((size_t)b.num_logits() * runner.config().vocab_size);
  const Status st = runner.forward(b.batch(), logits.data());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return logits;
}

int32_t argmax_of(const std::vector<float>& x) {
  return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

// (a) kDraft greedy decode steps, (b) those tokens in one step with logits for every row, (c)
// that step beside another sequence's prefill chunk and a third's decode: (b) and (c) equal (a)
// bit for bit.
void check_verify_step(ModelRunner& runner, const std::string& what) {
  const std::vector<int32_t> a = prompt(kPrompt, 5), b = prompt(kOtherCommitted + kOtherChunk, 6),
                             c = prompt(10, 7);
  const std::vector<int32_t> ta = SingleSequence::contiguous_blocks(0, 4),
                             tb = SingleSequence::contiguous_blocks(4, 3),
                             tc = SingleSequence::contiguous_blocks(7, 1);
  std::vector<float> last = step(runner, {{.block_table = ta, .tokens = a}});
  step(runner, {{.block_table = tb, .tokens = std::span(b).first(kOtherCommitted),
                 .logits = LogitsMode::kNone},
                {.block_table = tc, .tokens = std::span(c).first(9),
                 .logits = LogitsMode::kNone}});
  std::vector<int32_t> draft;
  std::vector<float> decoded;
  for (int32_t k = 0; k < kDraft; ++k) {
    draft.push_back(argmax_of(last));
    last = step(runner, {{.block_table = ta, .num_committed = kPrompt + k,
                          .tokens = std::span(draft).last(1)}});
    decoded.insert(decoded.end(), last.begin(), last.end());
  }
  const SequenceInput verify{.block_table = ta, .num_committed = kPrompt, .tokens = draft,
                             .logits = LogitsMode::kAll};
  expect_bits_equal(step(runner, {verify}), decoded, what + ": verify alone");
  std::vector<float> mixed =
      step(runner, {{.block_table = tb, .num_committed = kOtherCommitted,
                     .tokens = std::span(b).last(kOtherChunk)},
                    verify,
                    {.block_table = tc, .num_committed = 9, .tokens = std::span(c).last(1)}});
  ASSERT_EQ(mixed.size(), (size_t)(kDraft + 2) * kVocab);
  mixed.erase(mixed.begin(), mixed.begin() + kVocab);
  mixed.resize(decoded.size());
  expect_bits_equal(mixed, decoded, what + ": verify beside a prefill and a decode");
}

// ModelRunner::experts_touched: the mean over the MoE layers of the distinct experts a step's rows
// were routed to (the speculation policy's expert term reads it).
TEST(MoeRouting, ExpertsTouchedCountsTheDistinctExpertsPerLayer) {
  test::TempDir dir("moe_touched");
  auto touched = [&](const std::string& path, const std::vector<int32_t>& ids) {
    auto runner = ModelRunner::load(path, {.block_size = 16, .num_blocks = 8, .num_threads = 2});
    EXPECT_TRUE(runner.ok()) << runner.status().to_string();
    if (!runner.ok()) return -2.0;
    SingleSequence seq(**runner, SingleSequence::contiguous_blocks(0, 8));
    EXPECT_TRUE(seq.append_all_logits(ids).ok());
    return (*runner)->experts_touched();
  };
  const std::string top2 = write(synth(moe_shape("qwen3moe", 8, 2), GgmlType::kF32, 5),
                                 dir / "top2.gguf");
  EXPECT_EQ(touched(top2, {7}), 2.0);  // one row: exactly its k experts in every layer
  const double many = touched(top2, prompt(40, 3));
  EXPECT_GT(many, 4.0) << "40 distinct rows of random weights should spread over the experts";
  EXPECT_LE(many, 8.0);
  const std::string all = write(synth(moe_shape("llama", 8, 8), GgmlType::kF32, 5),
                                dir / "all.gguf");
  EXPECT_EQ(touched(all, {3, 4}), 8.0);
  SynthShape dense = moe_shape("llama", 0, 0);
  const std::string dense_path = write(synth(dense, GgmlType::kF32, 5), dir / "dense.gguf");
  EXPECT_EQ(touched(dense_path, prompt(5, 1)), 0.0);
}

TEST(MoeBatchInvariance, VerifyStepEqualsDecodeStepsBitForBit) {
  test::TempDir dir("moe_invariance");
  const kernels::Isa saved = kernels::active_isa();
  for (const auto& [arch, type] :
       {std::pair{"qwen3moe", GgmlType::kQ8_0}, {"qwen3moe", GgmlType::kF32},
        {"llama", GgmlType::kQ4_0}, {"gpt-oss", GgmlType::kQ8_0}}) {
    const std::string name = str_cat(arch, "-", gguf::ggml_type_name(type));
    const std::string path = write(synth(moe_shape(arch, 8, 2), type, 41), dir / (name + ".gguf"));
    for (int threads : {1, 2}) {
      auto runner = ModelRunner::load(path, {.block_size = 16, .num_blocks = 8,
                                             .num_threads = threads});
      ASSERT_TRUE(runner.ok()) << runner.status().to_string();
      for (int i = 0; i <= (int)kernels::best_isa(); ++i) {
        kernels::set_active_isa((kernels::Isa)i);
        check_verify_step(**runner, str_cat(name, " threads=", threads, " isa=",
                                            kernels::isa_name((kernels::Isa)i)));
      }
    }
  }
  kernels::set_active_isa(saved);
}

}  // namespace
}  // namespace arbor::model::moe_testing
