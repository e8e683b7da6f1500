// Attention is planned once per step and layout, then every layer only runs (model/forward_ops.h,
// docs/kernels.md): a counting ForwardOps around the CPU's shows, for every forward, one
// plan_attention per distinct layer window and num_layers attention calls each with its
// window's plan of that step — on stories260K (one layout) and on a tiny sliding-window Gemma 3
// with one KV cache group and with three (two of them sharing a window, hence a plan). The logits
// equal, bit for bit, those of the same ops planning inside every layer's call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "golden_util.h"
#include "model/batch_builder.h"
#include "model/cpu_forward_ops.h"
#include "model/synth_model.h"
#include "support/mask_bits.h"
#include "support/temp_dir.h"

namespace arbor::model::testing {
namespace {

// CpuForwardOps with the attention calls recorded per step (stage() starts one). replan: ignore
// the forward's plans and plan inside every attention call, as the forward did before plans.
class CountingOps final : public ForwardOps {
 public:
  struct Planned {
    const AttentionPlan* plan;
    int32_t window;
  };
  struct Call {
    const AttentionPlan* plan;
    int32_t window;
    const int32_t* kv_page_indices;  // the layer's KV cache group's tables
  };
  struct Step {
    std::vector<Planned> plans;
    std::vector<Call> calls;
  };

  CountingOps(const LlamaModel& model, kernels::ThreadPool& pool, bool replan)
      : cpu_(model, pool), replan_(replan) {}

  const std::vector<Step>& steps() const { return steps_; }
  int plans_made() const { return plans_made_; }

  std::unique_ptr<AttentionPlan> new_attention_plan() override {
    ++plans_made_;
    return cpu_.new_attention_plan();
  }
  void plan_attention(const kernels::PagedAttentionParams& p, AttentionPlan& plan) override {
    steps_.back().plans.push_back({&plan, p.window});
    cpu_.plan_attention(p, plan);
  }
  void attention(const kernels::PagedAttentionParams& p, const AttentionPlan& plan) override {
    steps_.back().calls.push_back({&plan, p.window, p.kv_page_indices});
    if (replan_) {
      cpu_.attention(p);
    } else {
      cpu_.attention(p, plan);
    }
  }
  using ForwardOps::attention;

  ForwardBatch stage(const ForwardBatch& b) override {
    steps_.emplace_back();
    return cpu_.stage(b);
  }
  std::string_view name() const override { return "counting"; }
  bool is_host() const override { return true; }
  Result<void*> allocate(size_t bytes) override { return cpu_.allocate(bytes); }
  void release(void* p) override { cpu_.release(p); }
  void copy(std::span<const Copy> copies) override { cpu_.copy(copies); }
  void to_device(void* dst, const void* src, size_t bytes) override {
    cpu_.to_device(dst, src, bytes);
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    cpu_.to_host(dst, src, bytes);
  }
  const LlamaWeights& weights() const override { return cpu_.weights(); }
  void embed(const kernels::WeightView& table, const int32_t* tokens, int32_t n,
             float* x) override {
    cpu_.embed(table, tokens, n, x);
  }
  void rope_tables(const int32_t* positions, int32_t n, const float* inv_freq, int half,
                   float mscale, float* cos, float* sin) override {
    cpu_.rope_tables(positions, n, inv_freq, half, mscale, cos, sin);
  }
  void rms_norm_rows(const float* x, const int32_t* rows, int32_t n, const float* weight,
                     float* y, int dim, float eps) override {
    cpu_.rms_norm_rows(x, rows, n, weight, y, dim, eps);
  }
  void matmul_multi(std::span<const kernels::WeightView* const> ws, const float* x,
                    std::span<float* const> ys, int32_t num_tokens) override {
    cpu_.matmul_multi(ws, x, ys, num_tokens);
  }
  void qkv_epilogue(const QkvEpilogue& p) override { cpu_.qkv_epilogue(p); }
  int32_t route_experts(const ExpertRouting& r) override { return cpu_.route_experts(r); }
  void matmul_experts(std::span<const kernels::ExpertMatmul> mats, const float* x,
                      const kernels::ExpertRows& rows) override {
    cpu_.matmul_experts(mats, x, rows);
  }
  void combine_experts(const float* pairs, const int32_t* slot_pair, const float* slot_weight,
                       int32_t num_tokens, int k, int dim, float* y) override {
    cpu_.combine_experts(pairs, slot_pair, slot_weight, num_tokens, k, dim, y);
  }
  void gated_delta_net(const kernels::GatedDeltaNetParams& p) override {
    cpu_.gated_delta_net(p);
  }
  void split_q_gate(const float* qg, int32_t n, int heads, int head_dim, float* q,
                    float* gate) override {
    cpu_.split_q_gate(qg, n, heads, head_dim, q, gate);
  }
  void sigmoid_mul(float* x, const float* gate, int64_t n) override {
    cpu_.sigmoid_mul(x, gate, n);
  }
  void add(float* y, const float* x, int64_t n) override { cpu_.add(y, x, n); }
  void add_gated_rows(float* y, const float* x, const float* gate, int32_t rows,
                      int cols) override {
    cpu_.add_gated_rows(y, x, gate, rows, cols);
  }
  void silu_mul(float* gate, const float* up, int64_t n) override { cpu_.silu_mul(gate, up, n); }
  void gelu_mul(float* gate, const float* up, int64_t n) override { cpu_.gelu_mul(gate, up, n); }
  void swiglu_oai(float* gate, const float* up, int64_t n, float alpha, float limit) override {
    cpu_.swiglu_oai(gate, up, n, alpha, limit);
  }
  void add_expert_bias(float* y, const kernels::ExpertRows& rows, const float* bias,
                       int cols) override {
    cpu_.add_expert_bias(y, rows, bias, cols);
  }
  void scale_bias(float* y, int32_t rows, int cols, float scale, const float* bias) override {
    cpu_.scale_bias(y, rows, cols, scale, bias);
  }
  void softcap(float* x, int64_t n, float cap) override { cpu_.softcap(x, n, cap); }
  void flag_nonfinite(const float* x, const int32_t* rows, int32_t n, int dim,
                      uint8_t* flags) override {
    cpu_.flag_nonfinite(x, rows, n, dim, flags);
  }
  void argmax_rows(const float* x, int32_t n, int32_t cols, int32_t* ids) override {
    cpu_.argmax_rows(x, n, cols, ids);
  }
  void top_k_rows(const float* x, int32_t n, int32_t cols, int32_t k, const float* scale,
                  int32_t* ids, float* values) override {
    cpu_.top_k_rows(x, n, cols, k, scale, ids, values);
  }

 private:
  CpuForwardOps cpu_;
  bool replan_;
  std::vector<Step> steps_;
  int plans_made_ = 0;
};

struct Counted {
  std::unique_ptr<ModelRunner> runner;
  CountingOps* ops = nullptr;
};

Counted load_counted(const std::string& path, bool kv_reclaim, bool replan) {
  Counted c;
  RunnerOptions opt;
  opt.block_size = 4;
  opt.num_blocks = 128;
  opt.kv_dtype = kernels::KvDtype::kF16;
  opt.kv_reclaim = kv_reclaim;
  opt.pool = std::make_shared<kernels::ThreadPool>(2);
  opt.make_ops = [pool = opt.pool, &c, replan](
                     const LlamaModel& m) -> Result<std::unique_ptr<ForwardOps>> {
    c.ops = new CountingOps(m, *pool, replan);
    return std::unique_ptr<ForwardOps>(c.ops);
  };
  auto r = ModelRunner::load(path, opt);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (r.ok()) c.runner = std::move(r).value();
  return c;
}

// Three steps of two sequences: prefill chunks; a decode beside a 4-token tree (custom mask);
// a 30-token chunk beside a decode. Contexts end at 64 and 26 tokens, past an 8-token window.
// Sequence s of group g is on blocks 1 + 16 * (2 * g + s) .. (never the null block 0).
// Returns every step's logits, all rows.
std::vector<float> run_steps(ModelRunner& r) {
  const int32_t groups = r.kv_layout().num_groups();
  auto table = [](int32_t g, int32_t s) {
    std::vector<int32_t> t(16);
    for (int32_t i = 0; i < 16; ++i) t[i] = 1 + 16 * (2 * g + s) + i;
    return t;
  };
  std::vector<int32_t> tables[2];
  std::vector<std::vector<int32_t>> more[2];
  for (int32_t s = 0; s < 2; ++s) {
    tables[s] = table(0, s);
    for (int32_t g = 1; g < groups; ++g) more[s].push_back(table(g, s));
  }
  std::vector<int32_t> seq_a(33), seq_b(20);
  for (size_t i = 0; i < seq_a.size(); ++i) seq_a[i] = 3 + (int32_t)(i * 37 % 500);
  for (size_t i = 0; i < seq_b.size(); ++i) seq_b[i] = 3 + (int32_t)(i * 53 % 500);
  const std::vector<int32_t> tree = {315, 421, 317, 395}, tree_pos = {21, 22, 22, 23};
  const std::vector<uint8_t> mask =
      test::pack_mask_bits({1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1});
  std::vector<int32_t> chunk(30, 77), decode_b = {88};
  BatchBuilder b(r.kv_cache().block_size(), groups);
  std::vector<float> all;
  auto step = [&]() {
    std::vector<float> logits((size_t)b.num_logits() * r.config().vocab_size);
    EXPECT_TRUE(r.forward(b.batch(), logits.data()).ok());
    all.insert(all.end(), logits.begin(), logits.end());
    b.clear();
  };
  auto in = [&](int s, int32_t committed, std::span<const int32_t> tokens) {
    return SequenceInput{.block_table = tables[s], .num_committed = committed, .tokens = tokens,
                         .logits = LogitsMode::kAll, .more_block_tables = more[s]};
  };
  b.add(in(0, 0, std::span(seq_a).first(13)));
  b.add(in(1, 0, seq_b));
  step();
  b.add(in(0, 13, std::span(seq_a).subspan(13, 1)));
  SequenceInput t = in(1, 20, tree);
  t.positions = tree_pos;
  t.mask_bits = mask;
  b.add(t);
  step();
  b.add(in(0, 14, chunk));
  b.add(in(1, 21, decode_b));  // after the tree's root, the committed token
  step();
  return all;
}

// One plan per distinct window per forward, each layer's call with its window's plan of that
// step; plans made once (reused across steps). Returns the number of layouts.
size_t expect_one_plan_per_layout(const CountingOps& ops, const ModelConfig& cfg, int steps) {
  std::set<int32_t> windows;
  for (int l = 0; l < cfg.num_layers; ++l) windows.insert(cfg.layer_window(l));
  EXPECT_EQ(ops.plans_made(), (int)windows.size()) << "plans are reused across steps";
  EXPECT_EQ((int)ops.steps().size(), steps);
  for (size_t s = 0; s < ops.steps().size(); ++s) {
    const CountingOps::Step& st = ops.steps()[s];
    EXPECT_EQ(st.plans.size(), windows.size()) << "step " << s;
    std::set<int32_t> planned;
    for (const CountingOps::Planned& p : st.plans) planned.insert(p.window);
    EXPECT_EQ(planned, windows) << "step " << s << ": every window planned once";
    EXPECT_EQ((int)st.calls.size(), cfg.num_layers) << "step " << s;
    for (int l = 0; l < std::min(cfg.num_layers, (int)st.calls.size()); ++l) {
      const CountingOps::Call& c = st.calls[l];
      EXPECT_EQ(c.window, cfg.layer_window(l)) << "step " << s << " layer " << l;
      int matches = 0;
      for (const CountingOps::Planned& p : st.plans) {
        matches += p.plan == c.plan && p.window == c.window;
      }
      EXPECT_EQ(matches, 1) << "step " << s << " layer " << l << " runs its window's plan";
    }
  }
  return windows.size();
}

void expect_bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
      << "logits differ from planning inside every layer's call";
}

TEST(AttentionPlanTest, OnePlanPerForwardOnAPlainModel) {
  ASSERT_TRUE(require_shared_file(kStories260K));
  Counted planned = load_counted(shared_path(kStories260K), false, false);
  Counted replanned = load_counted(shared_path(kStories260K), false, true);
  ASSERT_TRUE(planned.runner && replanned.runner);
  const std::vector<float> got = run_steps(*planned.runner);
  EXPECT_EQ(expect_one_plan_per_layout(*planned.ops, planned.runner->config(), 3), 1u);
  for (const CountingOps::Step& s : planned.ops->steps()) {
    EXPECT_EQ(s.plans.size(), 1u);  // stories260K: 5 layers, full attention
    EXPECT_EQ(s.calls.size(), 5u);
  }
  expect_bitwise_equal(got, run_steps(*replanned.runner));
}

// A 6-layer Gemma 3 with a window of 8 on every layer but 2 and 5 (stories260K's vocabulary).
std::string write_gemma3(const test::TempDir& dir) {
  SynthShape base{.name = "plan-gemma3", .dim = 128, .ffn = 256, .layers = 6, .heads = 4,
                  .kv_heads = 2, .context = 4096};
  SynthShape s = with_arch(base, "gemma3");
  s.vocab = 0;
  s.head_dim = 32;
  s.window = 8;
  s.swa_pattern = 3;
  std::vector<gguf::KeyValue> keys;
  auto f = gguf::GgufFile::open(shared_path(kStories260K));
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (f.ok()) {
    for (const gguf::KeyValue& kv : f->metadata()) {
      if (kv.key.starts_with("tokenizer.")) keys.push_back(kv);
    }
  }
  kernels::ThreadPool pool(2);
  auto w = synth_model(s, gguf::GgmlType::kQ8_0, 41, 512, keys, pool);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  const std::string path = dir / "gemma3.gguf";
  if (w.ok()) {
    EXPECT_TRUE(w->write(path).ok());
  }
  return path;
}

TEST(AttentionPlanTest, OnePlanPerWindowOnASlidingWindowModel) {
  ASSERT_TRUE(require_shared_file(kStories260K));
  test::TempDir dir("attention_plan");
  const std::string path = write_gemma3(dir);
  for (bool reclaim : {false, true}) {
    Counted planned = load_counted(path, reclaim, false);
    Counted replanned = load_counted(path, reclaim, true);
    ASSERT_TRUE(planned.runner && replanned.runner);
    const ModelConfig& cfg = planned.runner->config();
    ASSERT_EQ(cfg.num_layers, 6);
    EXPECT_EQ(cfg.layer_window(0), 8);
    EXPECT_EQ(cfg.layer_window(2), 0);
    EXPECT_EQ(planned.runner->kv_layout().num_groups(), reclaim ? 3 : 1);
    const std::vector<float> got = run_steps(*planned.runner);
    EXPECT_EQ(expect_one_plan_per_layout(*planned.ops, cfg, 3), 2u) << "reclaim " << reclaim;
    if (reclaim) {
      // Two KV cache groups of window 8 (different block tables) run on one plan.
      const CountingOps::Step& s = planned.ops->steps()[0];
      std::set<const int32_t*> tables_of_window_plan;
      for (const CountingOps::Call& c : s.calls) {
        if (c.window == 8) tables_of_window_plan.insert(c.kv_page_indices);
      }
      EXPECT_EQ(tables_of_window_plan.size(), 2u);
    }
    expect_bitwise_equal(got, run_steps(*replanned.runner));
  }
}

}  // namespace
}  // namespace arbor::model::testing
