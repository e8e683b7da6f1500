// The forward's device seam (model/forward_ops.h) without a GPU: a "shadow"
// device that is not the host. Its memory is host memory it hands out itself,
// its weights and staged batch arrays are its own copies, and every pointer an
// op receives must lie in memory it handed out — so a front end that passes a
// host pointer to a device op (which would crash on a GPU) fails here. The
// arithmetic is CpuForwardOps', so results must equal the CPU's bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "golden_util.h"
#include "kernels/ops.h"
#include "model/batch_builder.h"
#include "model/cpu_forward_ops.h"
#include "model/kv_cache.h"
#include "model/synth_model.h"
#include "sampling/sampler.h"
#include "support/mask_bits.h"
#include "support/temp_dir.h"

namespace arbor::model::testing {
namespace {

class ShadowOps final : public ForwardOps {
public:
  ShadowOps(const LlamaModel &model, kernels::ThreadPool &pool)
      : cpu_(model, pool) {
    // Every weight through the model's own walk, so a weight the walk misses shows up as host
    // memory passed to a device op.
    weights_ = model.weights();
    for_each_weight(
        weights_, model.config(),
        [&](const MatrixRef &m) { *m.w = copy_matrix(*m.w); },
        [&](const VectorRef &v) { *v.v = copy_vector(*v.v, v.n); });
    if (weights_.tied_output)
      weights_.output.w = weights_.token_embd;
  }
  ~ShadowOps() override {
    EXPECT_EQ(allocations_.size(), 0u) << "device memory leaked";
  }

  std::string_view name() const override { return "shadow"; }
  bool is_host() const override { return false; }
  Result<void *> allocate(size_t bytes) override {
    auto buf = std::make_unique<uint8_t[]>(bytes); // value-initialised: zeroed
    void *p = buf.get();
    allocations_[p] = {std::move(buf), bytes};
    return p;
  }
  void release(void *p) override {
    if (p == nullptr)
      return;
    EXPECT_EQ(allocations_.erase(p), 1u)
        << "release of memory the device did not allocate";
  }
  void copy(std::span<const Copy> copies) override {
    for (const Copy &c : copies) {
      expect_device(c.dst, c.bytes, "copy destination");
      expect_device(c.src, c.bytes, "copy source");
      std::memmove(c.dst, c.src, c.bytes);
    }
  }
  void to_device(void *dst, const void *src, size_t bytes) override {
    expect_device(dst, bytes, "to_device destination");
    std::memcpy(dst, src, bytes);
  }
  void to_host(void *dst, const void *src, size_t bytes) override {
    expect_device(src, bytes, "to_host source");
    std::memcpy(dst, src, bytes);
  }

  const LlamaWeights &weights() const override { return weights_; }
  ForwardBatch stage(const ForwardBatch &b) override {
    ++stages_;
    ForwardBatch d;
    d.tokens = stage_array(b.tokens, 0);
    d.positions = stage_array(b.positions, 1);
    d.qo_indptr = stage_array(b.qo_indptr, 2);
    d.kv_indptr = stage_array(b.kv_indptr, 3);
    d.kv_page_indices = stage_array(b.kv_page_indices, 4);
    d.kv_len = stage_array(b.kv_len, 5);
    d.slot_mapping = stage_array(b.slot_mapping, 6);
    d.logits_indices = stage_array(b.logits_indices, 7);
    d.mask_indptr = stage_array(b.mask_indptr, 8);
    staged_mask_.assign(b.mask_bits.begin(), b.mask_bits.end());
    d.mask_bits = staged_mask_;
    return d;
  }

  void embed(const kernels::WeightView &table, const int32_t *tokens, int32_t n,
             float *x) override {
    expect_matrix(table);
    expect_device(tokens, n * sizeof(int32_t), "embed tokens");
    expect_device(x, n * table.cols * sizeof(float), "embed output");
    cpu_.embed(table, tokens, n, x);
  }
  void rope_tables(const int32_t *positions, int32_t n, const float *inv_freq,
                   int half, float mscale, float *cos, float *sin) override {
    expect_device(positions, n * sizeof(int32_t), "positions");
    expect_device(inv_freq, half * sizeof(float), "inv_freq");
    expect_device(cos, (size_t)n * half * sizeof(float), "cos");
    expect_device(sin, (size_t)n * half * sizeof(float), "sin");
    cpu_.rope_tables(positions, n, inv_freq, half, mscale, cos, sin);
  }
  void rms_norm_rows(const float *x, const int32_t *rows, int32_t n,
                     const float *weight, float *y, int dim,
                     float eps) override {
    expect_device(x, dim * sizeof(float), "norm input");
    if (rows != nullptr)
      expect_device(rows, n * sizeof(int32_t), "norm rows");
    expect_device(weight, dim * sizeof(float), "norm weight");
    expect_device(y, (size_t)n * dim * sizeof(float), "norm output");
    cpu_.rms_norm_rows(x, rows, n, weight, y, dim, eps);
  }
  void matmul_multi(std::span<const kernels::WeightView *const> ws,
                    const float *x, std::span<float *const> ys,
                    int32_t num_tokens) override {
    for (size_t i = 0; i < ws.size(); ++i) {
      expect_matrix(*ws[i]);
      expect_device(x, (size_t)num_tokens * ws[i]->cols * sizeof(float),
                    "matmul input");
      expect_device(ys[i], (size_t)num_tokens * ws[i]->rows * sizeof(float),
                    "matmul output");
    }
    cpu_.matmul_multi(ws, x, ys, num_tokens);
  }
  // The CPU's segmented scheme on column slices of the device copy of `whole` (the segments of
  // weights() are the model's host views: a device cuts its own).
  void matmul_segmented(const kernels::WeightView &whole,
                        std::span<const kernels::WeightView> segs,
                        const float *x, float *y, int32_t num_tokens) override {
    expect_matrix(whole);
    expect_device(x, (size_t)num_tokens * whole.cols * sizeof(float),
                  "matmul input");
    expect_device(y, (size_t)num_tokens * whole.rows * sizeof(float),
                  "matmul output");
    std::vector<kernels::WeightView> mine;
    const int64_t n = static_cast<int64_t>(segs.size());
    for (int64_t i = 0; i < n; ++i) {
      kernels::WeightView s = whole;
      s.cols = whole.cols / n;
      s.data = static_cast<const uint8_t *>(whole.data) +
               kernels::weight_row_bytes(whole.type, i * s.cols);
      mine.push_back(s);
    }
    cpu_.matmul_segmented(whole, mine, x, y, num_tokens);
  }
  void qkv_epilogue(const QkvEpilogue &p) override {
    for (const void *ptr : {(const void *)p.q, (const void *)p.k,
                            (const void *)p.v, (const void *)p.cos,
                            (const void *)p.sin, (const void *)p.slot_mapping,
                            (const void *)p.k_cache, (const void *)p.v_cache}) {
      expect_device(ptr, 1, "qkv_epilogue array");
    }
    for (const float *b : {p.bq, p.bk, p.bv, p.q_norm, p.k_norm}) {
      if (b != nullptr)
        expect_device(b, 1, "bias or norm");
    }
    if (p.positions != nullptr)
      expect_device(p.positions, p.num_tokens * sizeof(int32_t), "positions");
    cpu_.qkv_epilogue(p);
  }
  std::unique_ptr<AttentionPlan> new_attention_plan() override {
    return cpu_.new_attention_plan();
  }
  void plan_attention(const kernels::PagedAttentionParams &p,
                      AttentionPlan &plan) override {
    expect_attention_arrays(p);
    cpu_.plan_attention(p, plan);
  }
  void attention(const kernels::PagedAttentionParams &p,
                 const AttentionPlan &plan) override {
    expect_attention_arrays(p);
    cpu_.attention(p, plan);
  }
  using ForwardOps::attention;
  int32_t route_experts(const ExpertRouting &r) override {
    const size_t slots = (size_t)r.num_tokens * r.num_used;
    expect_device(r.logits, (size_t)r.num_tokens * r.num_experts * sizeof(float),
                  "router logits");
    expect_device(r.slot_expert, slots * sizeof(int32_t), "slot experts");
    expect_device(r.slot_weight, slots * sizeof(float), "slot weights");
    expect_device(r.expert_indptr, (r.num_experts + 1) * sizeof(int32_t),
                  "expert_indptr");
    expect_device(r.pair_token, slots * sizeof(int32_t), "pair tokens");
    expect_device(r.slot_pair, slots * sizeof(int32_t), "slot pairs");
    ++route_calls_;
    return cpu_.route_experts(r);
  }
  void matmul_experts(std::span<const kernels::ExpertMatmul> mats,
                      const float *x, const kernels::ExpertRows &rows) override {
    expect_device(rows.expert_indptr, (rows.num_experts + 1) * sizeof(int32_t),
                  "expert_indptr");
    const int32_t pairs = rows.num_pairs();
    if (rows.src_rows != nullptr)
      expect_device(rows.src_rows, pairs * sizeof(int32_t), "pair rows");
    for (const kernels::ExpertMatmul &m : mats) {
      for (const kernels::WeightView &w : m.experts)
        expect_matrix(w);
      expect_device(x, m.experts[0].cols * sizeof(float), "expert input");
      expect_device(m.y, (size_t)pairs * m.experts[0].rows * sizeof(float),
                    "expert output");
    }
    cpu_.matmul_experts(mats, x, rows);
  }
  void combine_experts(const float *pairs, const int32_t *slot_pair,
                       const float *slot_weight, int32_t num_tokens, int k,
                       int dim, float *y) override {
    const size_t slots = (size_t)num_tokens * k;
    expect_device(pairs, slots * dim * sizeof(float), "expert outputs");
    expect_device(slot_pair, slots * sizeof(int32_t), "slot pairs");
    expect_device(slot_weight, slots * sizeof(float), "slot weights");
    expect_device(y, (size_t)num_tokens * dim * sizeof(float), "combined rows");
    cpu_.combine_experts(pairs, slot_pair, slot_weight, num_tokens, k, dim, y);
  }
  int route_calls() const { return route_calls_; }
  void gated_delta_net(const kernels::GatedDeltaNetParams &p) override {
    const int64_t T = p.qo_indptr[p.num_seqs];  // a host read of a device array is fine here
    expect_device(p.qkv, T * p.conv_dim() * sizeof(float), "delta net qkv");
    expect_device(p.out, T * p.num_v_heads * p.head_v_dim * sizeof(float), "delta net out");
    cpu_.gated_delta_net(p);
  }
  void split_q_gate(const float *qg, int32_t n, int heads, int head_dim, float *q,
                    float *gate) override {
    expect_device(qg, (size_t)n * heads * head_dim * 2 * sizeof(float), "q and gate");
    cpu_.split_q_gate(qg, n, heads, head_dim, q, gate);
  }
  void sigmoid_mul(float *x, const float *gate, int64_t n) override {
    expect_device(x, n * sizeof(float), "sigmoid_mul x");
    expect_device(gate, n * sizeof(float), "sigmoid_mul gate");
    cpu_.sigmoid_mul(x, gate, n);
  }
  void add(float *y, const float *x, int64_t n) override {
    expect_device(y, n * sizeof(float), "add y");
    expect_device(x, n * sizeof(float), "add x");
    cpu_.add(y, x, n);
  }
  void add_gated_rows(float *y, const float *x, const float *gate, int32_t rows,
                      int cols) override {
    expect_device(y, (size_t)rows * cols * sizeof(float), "gated y");
    expect_device(x, (size_t)rows * cols * sizeof(float), "gated x");
    expect_device(gate, (size_t)rows * sizeof(float), "gates");
    cpu_.add_gated_rows(y, x, gate, rows, cols);
  }
  void silu_mul(float *gate, const float *up, int64_t n) override {
    expect_device(gate, n * sizeof(float), "gate");
    expect_device(up, n * sizeof(float), "up");
    cpu_.silu_mul(gate, up, n);
  }
  void gelu_mul(float *gate, const float *up, int64_t n) override {
    expect_device(gate, n * sizeof(float), "gate");
    expect_device(up, n * sizeof(float), "up");
    cpu_.gelu_mul(gate, up, n);
  }
  void swiglu_oai(float *gate, const float *up, int64_t n, float alpha,
                  float limit) override {
    expect_device(gate, n * sizeof(float), "gate");
    expect_device(up, n * sizeof(float), "up");
    cpu_.swiglu_oai(gate, up, n, alpha, limit);
  }
  void add_expert_bias(float *y, const kernels::ExpertRows &rows,
                       const float *bias, int cols) override {
    expect_device(rows.expert_indptr, (rows.num_experts + 1) * sizeof(int32_t),
                  "expert_indptr");
    expect_device(y, (size_t)rows.num_pairs() * cols * sizeof(float),
                  "biased expert rows");
    expect_device(bias, (size_t)rows.num_experts * cols * sizeof(float),
                  "expert biases");
    cpu_.add_expert_bias(y, rows, bias, cols);
  }
  void scale_bias(float *y, int32_t rows, int cols, float scale,
                  const float *bias) override {
    expect_device(y, (size_t)rows * cols * sizeof(float), "scaled rows");
    if (bias != nullptr)
      expect_device(bias, cols * sizeof(float), "bias");
    cpu_.scale_bias(y, rows, cols, scale, bias);
  }
  void softcap(float *x, int64_t n, float cap) override {
    expect_device(x, n * sizeof(float), "soft-capped values");
    cpu_.softcap(x, n, cap);
  }
  void flag_nonfinite(const float *x, const int32_t *rows, int32_t n, int dim,
                      uint8_t *flags) override {
    expect_device(x, dim * sizeof(float), "checked rows");
    expect_device(rows, n * sizeof(int32_t), "checked row ids");
    expect_device(flags, n, "flags");
    cpu_.flag_nonfinite(x, rows, n, dim, flags);
  }
  void argmax_rows(const float *x, int32_t n, int32_t cols, int32_t *ids) override {
    expect_device(x, static_cast<size_t>(n) * cols * sizeof(float), "argmax rows");
    expect_device(ids, n * sizeof(int32_t), "argmax ids");
    cpu_.argmax_rows(x, n, cols, ids);
    ++argmax_calls_;
  }
  int argmax_calls() const { return argmax_calls_; }
  void top_k_rows(const float *x, int32_t n, int32_t cols, int32_t k,
                  const float *scale, int32_t *ids, float *values) override {
    expect_device(x, static_cast<size_t>(n) * cols * sizeof(float), "top-k rows");
    expect_device(scale, n * sizeof(float), "top-k scales");
    expect_device(ids, static_cast<size_t>(n) * k * sizeof(int32_t), "top-k ids");
    expect_device(values, static_cast<size_t>(n) * k * sizeof(float), "top-k values");
    cpu_.top_k_rows(x, n, cols, k, scale, ids, values);
    ++top_k_calls_;
  }
  int top_k_calls() const { return top_k_calls_; }

  int stages() const { return stages_; }

private:
  struct Allocation {
    std::unique_ptr<uint8_t[]> data;
    size_t bytes = 0;
  };

  void expect_attention_arrays(const kernels::PagedAttentionParams &p) const {
    for (const void *ptr :
         {(const void *)p.q, (const void *)p.out, p.k_cache, p.v_cache,
          (const void *)p.qo_indptr, (const void *)p.kv_indptr,
          (const void *)p.kv_page_indices, (const void *)p.kv_len}) {
      expect_device(ptr, 1, "attention array");
    }
    if (p.mask_indptr != nullptr)
      expect_device(p.mask_indptr, 1, "mask_indptr");
    if (p.sinks != nullptr)
      expect_device(p.sinks, p.num_q_heads * sizeof(float), "attention sinks");
  }
  // [p, p + bytes) must lie inside one region this device owns.
  void expect_device(const void *p, size_t bytes, const char *what) const {
    const auto *b = static_cast<const uint8_t *>(p);
    auto inside = [&](const uint8_t *base, size_t size) {
      return b >= base && b + bytes <= base + size;
    };
    for (const auto &[ptr, a] : allocations_) {
      if (inside(static_cast<const uint8_t *>(ptr), a.bytes))
        return;
    }
    for (const std::vector<uint8_t> &c : constants_) {
      if (inside(c.data(), c.size()))
        return;
    }
    for (const std::vector<int32_t> &s : staged_) {
      if (inside(reinterpret_cast<const uint8_t *>(s.data()),
                 s.size() * sizeof(int32_t)))
        return;
    }
    if (inside(staged_mask_.data(), staged_mask_.size()))
      return;
    ADD_FAILURE() << what << " (" << p << ", " << bytes
                  << " bytes) is not device memory";
  }
  void expect_matrix(const kernels::WeightView &w) const {
    expect_device(w.data, w.rows * w.row_stride, "weight matrix");
  }
  kernels::WeightView copy_matrix(const kernels::WeightView &w) {
    kernels::WeightView d = w;
    const auto *src = static_cast<const uint8_t *>(w.data);
    d.data = constants_.emplace_back(src, src + w.rows * w.row_stride).data();
    d.packed = nullptr; // the shadow device multiplies the GGUF encoding
    return d;
  }
  const float *copy_vector(const float *v, int64_t n) {
    if (v == nullptr)
      return nullptr;
    const auto *src = reinterpret_cast<const uint8_t *>(v);
    return reinterpret_cast<const float *>(
        constants_.emplace_back(src, src + n * sizeof(float)).data());
  }
  std::span<const int32_t> stage_array(std::span<const int32_t> a, int i) {
    staged_[i].assign(a.begin(), a.end());
    return staged_[i];
  }

  CpuForwardOps cpu_;
  LlamaWeights weights_;
  std::vector<std::vector<uint8_t>> constants_; // the weight copies
  std::map<void *, Allocation> allocations_;
  std::vector<int32_t> staged_[9];
  std::vector<uint8_t> staged_mask_;
  int stages_ = 0;
  int argmax_calls_ = 0;
  int top_k_calls_ = 0;
  int route_calls_ = 0;
};

std::unique_ptr<ModelRunner>
load(int32_t block_size, int64_t num_blocks, bool shadow,
     kernels::KvDtype dtype = kernels::KvDtype::kF32,
     ShadowOps **shadow_ops = nullptr, std::string path = "") {
  if (path.empty()) {
    EXPECT_TRUE(require_shared_file(kStories260K));
    path = shared_path(kStories260K);
  }
  RunnerOptions opt;
  opt.block_size = block_size;
  opt.num_blocks = num_blocks;
  opt.kv_dtype = dtype;
  opt.num_threads = 1;
  if (shadow) {
    opt.pool = std::make_shared<kernels::ThreadPool>(1);
    opt.make_ops =
        [pool = opt.pool, shadow_ops](
            const LlamaModel &m) -> Result<std::unique_ptr<ForwardOps>> {
      auto *ops = new ShadowOps(m, *pool);
      if (shadow_ops != nullptr) *shadow_ops = ops;
      return std::unique_ptr<ForwardOps>(ops);
    };
  }
  auto r = ModelRunner::load(path, opt);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(ForwardOpsTest, ShadowDeviceReproducesTheGoldens) {
  for (kernels::KvDtype dtype :
       {kernels::KvDtype::kF32, kernels::KvDtype::kF16}) {
    auto runner = load(16, 128, /*shadow=*/true, dtype);
    ASSERT_TRUE(runner);
    EXPECT_EQ(runner->device_name(), "shadow");
    const auto cases = load_stories260k_golden(runner->model().file());
    const auto got = greedy_batched(*runner, cases, {.prefill_chunk = 7});
    ASSERT_EQ(got.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(got[i], cases[i].ids)
          << "\"" << cases[i].prompt << "\" diverges at "
          << common_prefix(got[i], cases[i].ids);
    }
    for (const GoldenCase &c : cases)
      EXPECT_EQ(greedy_single(*runner, c, 0), c.ids) << c.prompt;
  }
}

TEST(ForwardOpsTest, ShadowDeviceLogitsEqualTheCpusBitForBit) {
  // A ragged batch with a token tree (custom mask) next to a prefill chunk,
  // after a fork.
  auto cpu = load(4, 32, false);
  auto dev = load(4, 32, true);
  ASSERT_TRUE(cpu && dev);
  const int32_t vocab = cpu->config().vocab_size;
  const std::vector<int32_t> prefix = {1,   403, 407, 261, 378, 432,
                                       383, 286, 261, 376, 298};
  const std::vector<int32_t> tree = {315, 421, 317, 395};
  const std::vector<int32_t> positions = {11, 12, 12, 13};
  const std::vector<uint8_t> mask = test::pack_mask_bits(
      {1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1});
  const std::vector<int32_t> blocks_a = SingleSequence::contiguous_blocks(0, 8);
  const std::vector<int32_t> blocks_b = {0, 1, 9, 10, 11, 12, 13, 14};
  const std::vector<int32_t> more = {298, 315, 421, 13, 29};
  std::vector<float> logits[2];
  for (int d = 0; d < 2; ++d) {
    ModelRunner &r = d == 0 ? *cpu : *dev;
    SingleSequence seq(r, blocks_a);
    ASSERT_TRUE(seq.append(prefix).ok());
    r.kv_cache().copy_block(
        2, 9); // b shares blocks 0, 1 and a copy of a's partial block 2
    BatchBuilder b(4);
    b.add({.block_table = blocks_a,
           .num_committed = 11,
           .tokens = tree,
           .positions = positions,
           .mask_bits = mask,
           .logits = LogitsMode::kAll});
    b.add({.block_table = blocks_b,
           .num_committed = 11,
           .tokens = more,
           .logits = LogitsMode::kAll});
    logits[d].resize((tree.size() + more.size()) * vocab);
    ASSERT_TRUE(r.forward(b.batch(), logits[d].data()).ok());
    EXPECT_TRUE(r.nonfinite_origin(0).empty());
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  EXPECT_EQ(0, std::memcmp(logits[0].data(), logits[1].data(),
                           logits[0].size() * sizeof(float)));
}

// A mixture of experts through the shadow device: the routing arrays, the
// experts' views and the pairs' rows all in device memory (each expert's matrix
// copied through for_each_weight's walk), and the logits the CPU's, bit for bit.
TEST(ForwardOpsTest, ShadowDeviceRunsAMixtureOfExpertsLikeTheCpu) {
  // qwen3moe, and gpt-oss: its sinks, router and expert biases through the device too.
  for (const char *arch : {"qwen3moe", "gpt-oss"}) {
    SCOPED_TRACE(arch);
    test::TempDir dir("shadow_moe");
    SynthShape s = with_arch({.name = "shadow-moe", .dim = 128, .ffn = 256,
                              .layers = 2, .heads = 4, .kv_heads = 2,
                              .context = 256},
                             arch);
    s.vocab = 0;
    s.experts = 8;
    s.experts_used = 2;
    s.expert_ffn = 64;
    s.window = std::string(arch) == "gpt-oss" ? 4 : 0;
    kernels::ThreadPool pool(1);
    // F32: the shadow device multiplies the GGUF encoding, the CPU a packed Q8_0
    // copy (other bits), so only float weights compare bit for bit.
    auto w = synth_model(s, gguf::GgmlType::kF32, 3, 512, {}, pool);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const std::string path = dir / "moe.gguf";
    ASSERT_TRUE(w->write(path).ok());
    ShadowOps *shadow = nullptr;
    auto cpu = load(4, 32, false, kernels::KvDtype::kF32, nullptr, path);
    auto dev = load(4, 32, true, kernels::KvDtype::kF32, &shadow, path);
    ASSERT_TRUE(cpu && dev && shadow);
    const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261};
    std::vector<float> logits[2];
    for (int d = 0; d < 2; ++d) {
      SingleSequence seq(d == 0 ? *cpu : *dev, SingleSequence::contiguous_blocks(0, 8));
      auto l = seq.append_all_logits(prompt);
      ASSERT_TRUE(l.ok()) << l.status().to_string();
      logits[d].assign(l->begin(), l->end());
      auto next = seq.append_all_logits(std::vector<int32_t>{298});
      ASSERT_TRUE(next.ok());
      logits[d].insert(logits[d].end(), next->begin(), next->end());
    }
    EXPECT_EQ(shadow->route_calls(), 2 * 2);  // two steps, two layers
    ASSERT_EQ(logits[0].size(), logits[1].size());
    EXPECT_EQ(0, std::memcmp(logits[0].data(), logits[1].data(),
                             logits[0].size() * sizeof(float)));
  }
}

// The lowest index of the row's maximum, -1 with a non-finite entry (the
// contract of ForwardOps::argmax_rows, written naively).
int32_t naive_argmax(const float *row, int32_t n) {
  int32_t best = -1;
  for (int32_t i = 0; i < n; ++i) {
    if (!std::isfinite(row[i])) return -1;
    if (best < 0 || row[i] > row[best]) best = i;
  }
  return best;
}

// The gated activations split over the pool (CpuForwardOps::split_elements)
// give every element the bits one kernel call over the whole range gives, at
// sizes around the split threshold, odd tails and a five-token step's FFN.
TEST(ForwardOpsTest, GatedActivationsSplitOverThePoolEqualOneCall) {
  auto runner = load(4, 8, false);
  ASSERT_TRUE(runner);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-12.0f, 12.0f);
  for (const int threads : {2, 3}) {
    kernels::ThreadPool pool(threads);
    CpuForwardOps ops(runner->model(), pool);
    for (const int64_t n : {int64_t{100}, int64_t{8191}, int64_t{8192},
                            int64_t{8193}, int64_t{8199}, int64_t{15360},
                            int64_t{3 * 8192 + 5}}) {
      std::vector<float> gate(n), up(n);
      for (float &v : gate) v = dist(rng);
      for (float &v : up) v = dist(rng);
      for (int op = 0; op < 3; ++op) {
        SCOPED_TRACE(::testing::Message() << "threads " << threads << " n "
                                          << n << " op " << op);
        std::vector<float> split = gate, whole = gate;
        if (op == 0) {
          ops.silu_mul(split.data(), up.data(), n);
          kernels::silu_mul(whole.data(), up.data(), n);
        } else if (op == 1) {
          ops.gelu_mul(split.data(), up.data(), n);
          kernels::gelu_mul(whole.data(), up.data(), n);
        } else {
          ops.swiglu_oai(split.data(), up.data(), n, 1.702f, 7.0f);
          kernels::swiglu_oai(whole.data(), up.data(), n, 1.702f, 7.0f);
        }
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(split[i]),
                    std::bit_cast<uint32_t>(whole[i]))
              << "element " << i;
        }
      }
    }
  }
}

TEST(ForwardOpsTest, ArgmaxRowsTiesToTheLowestIdAndFlagsNonFiniteRows) {
  auto runner = load(4, 8, false);
  ASSERT_TRUE(runner);
  kernels::ThreadPool pool(1);
  CpuForwardOps ops(runner->model(), pool);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int32_t cols = 5;
  const std::vector<float> x = {
      1, 3, 3, 2, 3,            // ties: the first 3
      -7, -7, -7, -7, -7,       // all equal: 0
      0, 0, 0, 0, 1e-30f,       // the last
      -1e30f, 2, inf, 0, 1,     // +inf: flagged
      1, 2, 3, 4, -inf,         // -inf: flagged
      nan, 9, 1, 2, 3,          // NaN first: flagged
      -0.0f, 0.0f, -1, -2, -3,  // -0 == +0: the first
  };
  const auto n = static_cast<int32_t>(x.size() / cols);
  std::vector<int32_t> ids(n, 99);
  ops.argmax_rows(x.data(), n, cols, ids.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 0, 4, -1, -1, -1, 0}));
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> level(0, 3);  // few levels: many ties
  std::vector<float> r(1000 * 37);
  for (float &v : r) v = static_cast<float>(level(rng));
  std::vector<int32_t> got(1000);
  ops.argmax_rows(r.data(), 1000, 37, got.data());
  for (int32_t i = 0; i < 1000; ++i)
    ASSERT_EQ(got[i], naive_argmax(r.data() + i * 37, 37)) << "row " << i;
}

// The CPU and the shadow device on stories260K, and one 9-token prompt in
// blocks 0..7 with logits for every row: what the row-kind tests compare.
struct RowsSetup {
  std::unique_ptr<ModelRunner> cpu, dev;
  ShadowOps *shadow = nullptr;
  std::vector<int32_t> tokens = {1, 403, 407, 261, 378, 432, 383, 286, 261};
  BatchBuilder batch{4};
  int32_t vocab = 0;
};

void make_rows_setup(RowsSetup &s) {
  s.cpu = load(4, 32, false);
  s.dev = load(4, 32, true, kernels::KvDtype::kF32, &s.shadow);
  ASSERT_TRUE(s.cpu && s.dev && s.shadow);
  s.vocab = s.cpu->config().vocab_size;
  s.batch.add({.block_table = SingleSequence::contiguous_blocks(0, 8),
               .num_committed = 0,
               .tokens = s.tokens,
               .logits = LogitsMode::kAll});
}

TEST(ForwardOpsTest, OnlyTheRowsAskedForLeaveTheDevice) {
  // Whole rows where `want` says kRow, only the argmax elsewhere: the kRow rows
  // equal the CPU's bit for bit, the kArgmax rows never reach the host buffer,
  // and their argmax is the CPU row's.
  RowsSetup setup;
  make_rows_setup(setup);
  if (HasFatalFailure()) return;
  const std::vector<int32_t> &tokens = setup.tokens;
  const int32_t vocab = setup.vocab;
  ShadowOps *shadow = setup.shadow;
  const std::vector<RowOut> want = {RowOut::kArgmax, RowOut::kArgmax, RowOut::kRow,
                                    RowOut::kArgmax, RowOut::kRow,    RowOut::kRow,
                                    RowOut::kArgmax, RowOut::kArgmax, RowOut::kArgmax};
  std::vector<float> full(tokens.size() * vocab);
  std::vector<float> part(tokens.size() * vocab,
                          std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> argmax(tokens.size(), 99), cpu_argmax(tokens.size(), 99);
  const ForwardBatch &batch = setup.batch.batch();
  ASSERT_TRUE(setup.cpu->forward(batch, full.data()).ok());
  // The CPU with the same request: the argmax it computes on the host.
  std::vector<float> again(full.size());
  ASSERT_TRUE(setup.cpu
                  ->forward(batch, LogitsOut{.logits = again.data(),
                                             .want = want,
                                             .argmax = cpu_argmax.data()})
                  .ok());
  ASSERT_TRUE(setup.dev
                  ->forward(batch, LogitsOut{.logits = part.data(),
                                             .want = want,
                                             .argmax = argmax.data()})
                  .ok());
  EXPECT_EQ(shadow->argmax_calls(), 3);  // one per run of kArgmax rows
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float *cpu_row = full.data() + i * vocab;
    const float *dev_row = part.data() + i * vocab;
    if (want[i] == RowOut::kRow) {
      EXPECT_EQ(0, std::memcmp(cpu_row, dev_row, vocab * sizeof(float))) << i;
      continue;
    }
    EXPECT_TRUE(std::all_of(dev_row, dev_row + vocab,
                            [](float v) { return std::isnan(v); }))
        << "row " << i << " was copied to the host";
    EXPECT_EQ(argmax[i], naive_argmax(cpu_row, vocab)) << i;
    EXPECT_EQ(cpu_argmax[i], argmax[i]) << i;
    EXPECT_GE(argmax[i], 0);
  }
  // A want of the wrong length is refused, not read past.
  BatchBuilder b(4);
  b.add({.block_table = SingleSequence::contiguous_blocks(8, 8),
         .num_committed = 0,
         .tokens = tokens,
         .logits = LogitsMode::kAll});
  const std::vector<RowOut> short_want(3, RowOut::kArgmax);
  EXPECT_FALSE(setup.dev->forward(b.batch(), LogitsOut{.logits = part.data(),
                                                 .want = short_want,
                                                 .argmax = argmax.data()})
                   .ok());
}

// Sampler's score of x in a row with maximum `max` at scale 1 / temperature.
float score_of(float x, float max, float scale) {
  const float s = (x - max) * scale;
  return s == 0.0f ? 0.0f : s;
}

// The contract of ForwardOps::top_k_rows, written naively: a stable sort of the
// ids by score (so equal scores stay in id order), the first k, in id order.
std::vector<int32_t> naive_top_k(const float *row, int32_t cols, int32_t k,
                                 float scale) {
  if (!std::all_of(row, row + cols, [](float v) { return std::isfinite(v); }))
    return std::vector<int32_t>(k, -1);
  const float max = *std::max_element(row, row + cols);
  std::vector<int32_t> ids(cols);
  for (int32_t c = 0; c < cols; ++c) ids[c] = c;
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return score_of(row[a], max, scale) > score_of(row[b], max, scale);
  });
  ids.resize(k);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Runs CpuForwardOps::top_k_rows on `x` ([n, cols]) with one scale for every
// row; checks values[j] == x[ids[j]] and returns the ids.
std::vector<int32_t> cpu_top_k(CpuForwardOps &ops, const std::vector<float> &x,
                               int32_t cols, int32_t k, float scale) {
  const auto n = static_cast<int32_t>(x.size() / cols);
  std::vector<float> scales(n, scale), values(static_cast<size_t>(n) * k, 0.0f);
  std::vector<int32_t> ids(static_cast<size_t>(n) * k, 99);
  ops.top_k_rows(x.data(), n, cols, k, scales.data(), ids.data(), values.data());
  for (size_t j = 0; j < ids.size(); ++j) {
    if (ids[j] >= 0) {
      EXPECT_EQ(values[j], x[j / k * cols + ids[j]]) << "entry " << j;
    }
  }
  return ids;
}

// Two logits that one score merges: max 20 minus -10 is -30 exactly, minus the
// next float below -10 rounds (to even) to -30 too.
const float kMerged = std::nextafter(-10.0f, -100.0f);

TEST(ForwardOpsTest, TopKRowsTakeSamplersOrderAndFlagNonFiniteRows) {
  auto runner = load(4, 8, false);
  ASSERT_TRUE(runner);
  kernels::ThreadPool pool(1);
  CpuForwardOps ops(runner->model(), pool);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ASSERT_EQ(score_of(-10.0f, 20.0f, 1.0f), score_of(kMerged, 20.0f, 1.0f));
  ASSERT_NE(-10.0f, kMerged);
  const int32_t cols = 6;
  const std::vector<float> x = {
      1, 3, 3, 2, 3, 0,               // ties: the three 3s
      5, 5, 5, 5, 5, 5,               // all equal: the lowest ids
      -0.0f, 0.0f, -1, 0.0f, -0.0f, 2,  // 2, then -0 == +0: ids 0, 1
      -50, kMerged, -50, -50, -10, 20,  // one score: id 1 beats id 4
      1, 2, inf, 0, 1, 1,             // +inf: flagged
      1, 2, 3, 4, -inf, 5,            // -inf: flagged
      nan, 9, 1, 2, 3, 4,             // NaN: flagged
  };
  EXPECT_EQ(cpu_top_k(ops, x, cols, 3, 1.0f),
            (std::vector<int32_t>{1, 2, 4, 0, 1, 2, 0, 1, 5, 1, 4, 5, -1, -1,
                                  -1, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(cpu_top_k(ops, x, cols, 2, 1.0f),
            (std::vector<int32_t>{1, 2, 0, 1, 0, 5, 1, 5, -1, -1, -1, -1, -1, -1}));
  // k = 1: the argmax; k = cols: every id.
  std::vector<int32_t> argmax(x.size() / cols);
  ops.argmax_rows(x.data(), static_cast<int32_t>(argmax.size()), cols, argmax.data());
  EXPECT_EQ(cpu_top_k(ops, x, cols, 1, 1.0f), argmax);
  const std::vector<int32_t> all = cpu_top_k(ops, x, cols, cols, 0.5f);
  for (size_t r = 0; r < 4; ++r) {
    for (int32_t j = 0; j < cols; ++j) EXPECT_EQ(all[r * cols + j], j) << r;
  }
  // Seeded random rows with few levels (many ties, k past the number of
  // distinct values) or with logits an ulp or two apart around a merged score.
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int round = 0; round < 200; ++round) {
    const int32_t c = std::uniform_int_distribution<int32_t>(1, 300)(rng);
    const int32_t n = std::uniform_int_distribution<int32_t>(1, 4)(rng);
    const int32_t k = std::uniform_int_distribution<int32_t>(1, c)(rng);
    const float scale = std::array<float, 4>{1.0f, 1.0f / 0.7f, 1.0f / 1.3f, 0.01f}[round % 4];
    std::vector<float> r(static_cast<size_t>(n) * c);
    std::uniform_int_distribution<int> level(0, 3), ulps(0, 3), pick(0, 99);
    for (float &v : r) {
      if (round % 2 == 0) {
        v = static_cast<float>(level(rng));
      } else {
        v = -10.0f;
        for (int u = ulps(rng); u > 0; --u) v = std::nextafter(v, -100.0f);
        if (pick(rng) == 0) v = 20.0f;
      }
    }
    if (pick(rng) < 10) r[pick(rng) % r.size()] = pick(rng) % 2 ? nan : -inf;
    const std::vector<int32_t> got = cpu_top_k(ops, r, c, k, scale);
    for (int32_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::vector<int32_t>(got.begin() + i * k, got.begin() + (i + 1) * k),
                naive_top_k(r.data() + i * c, c, k, scale))
          << "round " << round << " row " << i << " k " << k << " cols " << c;
    }
  }
}

// sampling::fill_sparse_row's claim: a row of -inf but for the top_k_rows
// candidates gives Sampler's distribution and draws of the whole row, for
// every top_k up to the number of candidates, with min_p and top_p on top.
TEST(ForwardOpsTest, SparseTopKRowsSampleLikeWholeRows) {
  auto runner = load(4, 8, false);
  ASSERT_TRUE(runner);
  kernels::ThreadPool pool(1);
  CpuForwardOps ops(runner->model(), pool);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int32_t vocab = 400;
  sampling::Sampler sampler;
  int compared = 0;
  for (int round = 0; round < 60; ++round) {
    std::vector<float> row(vocab);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float &v : row) v = normal(rng);
    if (round % 3 == 1) {  // plateaus: many equal logits
      for (float &v : row) v = std::round(v);
    } else if (round % 3 == 2) {  // logits one score merges, at the top
      for (int32_t i = 0; i < vocab; ++i) row[i] = -50.0f + 0.01f * (i % 7);
      for (int32_t i = 0; i < 40; ++i) row[(i * 37) % vocab] = i % 2 ? kMerged : -10.0f;
      row[vocab - 1] = 20.0f;
    }
    for (float temperature : {0.3f, 0.7f, 1.0f, 1.7f}) {
      for (int32_t top_k : {1, 2, 5, 17, 40}) {
        const int32_t k = top_k + (round % 2) * 9;  // candidates sent: top_k or more
        const float scale = 1.0f / temperature;
        std::vector<int32_t> ids(k);
        std::vector<float> values(k);
        ops.top_k_rows(row.data(), 1, vocab, k, &scale, ids.data(), values.data());
        std::vector<float> sparse(vocab, 7.0f);
        sampling::fill_sparse_row(ids, values, sparse);
        for (auto [min_p, top_p] : {std::pair{0.0f, 1.0f}, {0.05f, 1.0f}, {0.0f, 0.8f},
                                    {0.01f, 0.5f}}) {
          sampling::SamplingParams p;
          p.temperature = temperature;
          p.top_k = top_k;
          p.min_p = min_p;
          p.top_p = top_p;
          const auto want = sampler.distribution(row, p);
          const auto got = sampler.distribution(sparse, p);
          ASSERT_EQ(got.size(), want.size()) << "round " << round << " top_k " << top_k;
          for (size_t j = 0; j < want.size(); ++j) {
            ASSERT_EQ(got[j].token_id, want[j].token_id) << round << " " << top_k << " " << j;
            ASSERT_EQ(got[j].prob, want[j].prob) << round << " " << top_k << " " << j;
          }
          for (uint64_t draw = 0; draw < 20; ++draw) {
            sampling::Rng a = sampling::Rng::at(seed, draw, sampling::RngStream::kSample);
            sampling::Rng b = a;
            ASSERT_EQ(sampler.sample(sparse, p, {}, a).token_id,
                      sampler.sample(row, p, {}, b).token_id);
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 60 * 4 * 5 * 4);
}

// Where ranking by raw logits would go wrong: two different logits with one
// score. Sampler keeps the lower id (1, not 4), and so must the candidates.
TEST(ForwardOpsTest, SparseRowOfMergedScoresKeepsSamplersTieBreak) {
  auto runner = load(4, 8, false);
  ASSERT_TRUE(runner);
  kernels::ThreadPool pool(1);
  CpuForwardOps ops(runner->model(), pool);
  const std::vector<float> row = {-50, kMerged, -50, -50, -10, 20};
  const float scale = 1.0f;
  std::vector<int32_t> ids(2);
  std::vector<float> values(2);
  ops.top_k_rows(row.data(), 1, 6, 2, &scale, ids.data(), values.data());
  std::vector<float> sparse(6);
  sampling::fill_sparse_row(ids, values, sparse);
  sampling::SamplingParams p;
  p.top_k = 2;
  p.temperature = 1.0f;
  sampling::Sampler sampler;
  auto ids_of = [&](const std::vector<float> &r) {
    std::vector<int32_t> out;
    for (const sampling::Candidate &c :
         sampler.distribution(r, p, sampling::CandidateOrder::kById))
      out.push_back(c.token_id);
    return out;
  };
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(ids_of(row), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(ids_of(sparse), ids_of(row));
}

TEST(ForwardOpsTest, OnlyTheCandidatesOfTopKRowsLeaveTheDevice) {
  // kTopK rows next to kRow and kArgmax ones: their whole rows never reach the
  // host buffer, their candidates are the CPU row's top-k at their own scale,
  // and the CPU (host) path gives the same candidates and logits.
  RowsSetup setup;
  make_rows_setup(setup);
  if (HasFatalFailure()) return;
  const std::vector<int32_t> &tokens = setup.tokens;
  const int32_t vocab = setup.vocab;
  ShadowOps *shadow = setup.shadow;
  const std::vector<RowOut> want = {RowOut::kTopK, RowOut::kTopK, RowOut::kRow,
                                    RowOut::kArgmax, RowOut::kTopK, RowOut::kRow,
                                    RowOut::kTopK, RowOut::kTopK, RowOut::kArgmax};
  const std::vector<float> scale = {1.0f / 0.7f, 1.0f / 0.7f, 1, 1, 1.0f, 1, 0.5f, 0.5f, 1};
  const int32_t k = 40;
  const size_t n = tokens.size();
  std::vector<float> full(n * vocab);
  std::vector<float> part(n * vocab, std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> argmax(n, 99), ids(n * k, 99), cpu_ids(n * k, 99);
  std::vector<float> values(n * k), cpu_values(n * k);
  const ForwardBatch &batch = setup.batch.batch();
  ASSERT_TRUE(setup.cpu->forward(batch, full.data()).ok());
  std::vector<float> again(full.size());
  ASSERT_TRUE(setup.cpu
                  ->forward(batch, LogitsOut{.logits = again.data(),
                                             .want = want,
                                             .argmax = argmax.data(),
                                             .top_k = k,
                                             .top_k_scale = scale,
                                             .top_ids = cpu_ids.data(),
                                             .top_logits = cpu_values.data()})
                  .ok());
  ASSERT_TRUE(setup.dev
                  ->forward(batch, LogitsOut{.logits = part.data(),
                                             .want = want,
                                             .argmax = argmax.data(),
                                             .top_k = k,
                                             .top_k_scale = scale,
                                             .top_ids = ids.data(),
                                             .top_logits = values.data()})
                  .ok());
  EXPECT_EQ(shadow->top_k_calls(), 3);  // one per run of kTopK rows
  EXPECT_EQ(shadow->argmax_calls(), 2);
  for (size_t i = 0; i < n; ++i) {
    const float *cpu_row = full.data() + i * vocab;
    const float *dev_row = part.data() + i * vocab;
    if (want[i] == RowOut::kRow) {
      EXPECT_EQ(0, std::memcmp(cpu_row, dev_row, vocab * sizeof(float))) << i;
      continue;
    }
    EXPECT_TRUE(std::all_of(dev_row, dev_row + vocab, [](float v) { return std::isnan(v); }))
        << "row " << i << " was copied to the host";
    if (want[i] != RowOut::kTopK) continue;
    const std::vector<int32_t> row_ids(ids.begin() + i * k, ids.begin() + (i + 1) * k);
    EXPECT_EQ(row_ids, naive_top_k(cpu_row, vocab, k, scale[i])) << i;
    EXPECT_EQ(std::vector<int32_t>(cpu_ids.begin() + i * k, cpu_ids.begin() + (i + 1) * k),
              row_ids)
        << i;
    for (int32_t j = 0; j < k; ++j) {
      EXPECT_EQ(values[i * k + j], cpu_row[row_ids[j]]) << i << " " << j;
      EXPECT_EQ(cpu_values[i * k + j], values[i * k + j]) << i << " " << j;
    }
  }
  // A top_k outside [1, kMaxDeviceTopK], or top-k rows without their arrays,
  // are refused, not read past.
  BatchBuilder b(4);
  b.add({.block_table = SingleSequence::contiguous_blocks(8, 8),
         .num_committed = 0,
         .tokens = tokens,
         .logits = LogitsMode::kAll});
  for (int32_t bad_k : {0, kMaxDeviceTopK + 1}) {
    std::vector<int32_t> big_ids(n * (kMaxDeviceTopK + 1));
    std::vector<float> big_values(big_ids.size());
    EXPECT_FALSE(setup.dev->forward(b.batch(), LogitsOut{.logits = part.data(),
                                                   .want = want,
                                                   .argmax = argmax.data(),
                                                   .top_k = bad_k,
                                                   .top_k_scale = scale,
                                                   .top_ids = big_ids.data(),
                                                   .top_logits = big_values.data()})
                     .ok())
        << bad_k;
  }
  EXPECT_FALSE(setup.dev->forward(b.batch(), LogitsOut{.logits = part.data(),
                                                 .want = want,
                                                 .argmax = argmax.data(),
                                                 .top_k = k,
                                                 .top_k_scale = {},
                                                 .top_ids = ids.data(),
                                                 .top_logits = values.data()})
                   .ok());
  EXPECT_EQ(shadow->top_k_calls(), 3);
}

TEST(ForwardOpsTest, KvCacheOnADeviceCopiesBlocksAndSlots) {
  auto dev = load(4, 8, true, kernels::KvDtype::kF16);
  ASSERT_TRUE(dev);
  PagedKvCache &kv = dev->kv_cache();
  EXPECT_FALSE(kv.memory().is_host());
  SingleSequence seq(*dev, {1, 2});
  ASSERT_TRUE(seq.append({{1, 403, 407, 261, 378, 432}}).ok()); // slots 4..9
  const KvCacheShape &s = kv.shape();
  std::vector<float> a(s.head_dim), b(s.head_dim);
  kv.copy_block(1, 5); // slots 4..7 -> 20..23
  kv.copy_slot(9, 30);
  for (int layer = 0; layer < s.num_layers; ++layer) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      for (bool value : {false, true}) {
        for (auto [src, dst] : {std::pair{4, 20}, {7, 23}, {9, 30}}) {
          kv.read_token(layer, src, h, value, a.data());
          kv.read_token(layer, dst, h, value, b.data());
          EXPECT_EQ(a, b) << "layer " << layer << " head " << h << " slot "
                          << src;
        }
        kv.read_token(layer, 4, h, value, a.data());
        EXPECT_NE(a,
                  std::vector<float>(s.head_dim, 0.0f)); // the forward wrote it
      }
    }
  }
}

} // namespace
} // namespace arbor::model::testing
