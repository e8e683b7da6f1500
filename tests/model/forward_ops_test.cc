// The forward's device seam (model/forward_ops.h) without a GPU: a "shadow"
// device that is not the host. Its memory is host memory it hands out itself,
// its weights and staged batch arrays are its own copies, and every pointer an
// op receives must lie in memory it handed out — so a front end that passes a
// host pointer to a device op (which would crash on a GPU) fails here. The
// arithmetic is CpuForwardOps', so results must equal the CPU's bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "golden_util.h"
#include "model/batch_builder.h"
#include "model/cpu_forward_ops.h"
#include "model/kv_cache.h"

namespace arbor::model::testing {
namespace {

class ShadowOps final : public ForwardOps {
public:
  ShadowOps(const LlamaModel &model, kernels::ThreadPool &pool)
      : cpu_(model, pool) {
    const LlamaWeights &w = model.weights();
    const ModelConfig &c = model.config();
    weights_ = w;
    weights_.token_embd = copy_matrix(w.token_embd);
    weights_.output =
        w.tied_output ? weights_.token_embd : copy_matrix(w.output);
    weights_.output_norm = copy_vector(w.output_norm, c.dim);
    weights_.rope_freqs = copy_vector(w.rope_freqs, c.rope_dim / 2);
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const LayerWeights &h = w.layers[l];
      LayerWeights &d = weights_.layers[l];
      for (auto [dst, src] : {std::pair{&d.wq, &h.wq},
                              {&d.wk, &h.wk},
                              {&d.wv, &h.wv},
                              {&d.wo, &h.wo},
                              {&d.w_gate, &h.w_gate},
                              {&d.w_up, &h.w_up},
                              {&d.w_down, &h.w_down}}) {
        *dst = copy_matrix(*src);
      }
      d.attn_norm = copy_vector(h.attn_norm, c.dim);
      d.ffn_norm = copy_vector(h.ffn_norm, c.dim);
      d.bq = copy_vector(h.bq, c.q_dim());
      d.bk = copy_vector(h.bk, c.kv_dim());
      d.bv = copy_vector(h.bv, c.kv_dim());
    }
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
                   int half, float *cos, float *sin) override {
    expect_device(positions, n * sizeof(int32_t), "positions");
    expect_device(inv_freq, half * sizeof(float), "inv_freq");
    expect_device(cos, (size_t)n * half * sizeof(float), "cos");
    expect_device(sin, (size_t)n * half * sizeof(float), "sin");
    cpu_.rope_tables(positions, n, inv_freq, half, cos, sin);
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
  void qkv_epilogue(const QkvEpilogue &p) override {
    for (const void *ptr : {(const void *)p.q, (const void *)p.k,
                            (const void *)p.v, (const void *)p.cos,
                            (const void *)p.sin, (const void *)p.slot_mapping,
                            (const void *)p.k_cache, (const void *)p.v_cache}) {
      expect_device(ptr, 1, "qkv_epilogue array");
    }
    for (const float *b : {p.bq, p.bk, p.bv}) {
      if (b != nullptr)
        expect_device(b, 1, "bias");
    }
    cpu_.qkv_epilogue(p);
  }
  void attention(const kernels::PagedAttentionParams &p) override {
    for (const void *ptr :
         {(const void *)p.q, (const void *)p.out, p.k_cache, p.v_cache,
          (const void *)p.qo_indptr, (const void *)p.kv_indptr,
          (const void *)p.kv_page_indices, (const void *)p.kv_len}) {
      expect_device(ptr, 1, "attention array");
    }
    if (p.mask_indptr != nullptr)
      expect_device(p.mask_indptr, 1, "mask_indptr");
    cpu_.attention(p);
  }
  void add(float *y, const float *x, int64_t n) override {
    expect_device(y, n * sizeof(float), "add y");
    expect_device(x, n * sizeof(float), "add x");
    cpu_.add(y, x, n);
  }
  void silu_mul(float *gate, const float *up, int64_t n) override {
    expect_device(gate, n * sizeof(float), "gate");
    expect_device(up, n * sizeof(float), "up");
    cpu_.silu_mul(gate, up, n);
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

  int stages() const { return stages_; }

private:
  struct Allocation {
    std::unique_ptr<uint8_t[]> data;
    size_t bytes = 0;
  };

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
};

std::unique_ptr<ModelRunner>
load(int32_t block_size, int64_t num_blocks, bool shadow,
     kernels::KvDtype dtype = kernels::KvDtype::kF32,
     ShadowOps **shadow_ops = nullptr) {
  EXPECT_TRUE(require_shared_file(kStories260K));
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
  auto r = ModelRunner::load(shared_path(kStories260K), opt);
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
  const std::vector<uint8_t> mask = {1, 0, 0, 0, 1, 1, 0, 0,
                                     1, 0, 1, 0, 1, 1, 0, 1};
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
           .mask = mask,
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

TEST(ForwardOpsTest, OnlyTheRowsAskedForLeaveTheDevice) {
  // Whole rows where `want` says kRow, only the argmax elsewhere: the kRow rows
  // equal the CPU's bit for bit, the kArgmax rows never reach the host buffer,
  // and their argmax is the CPU row's.
  ShadowOps *shadow = nullptr;
  auto cpu = load(4, 32, false);
  auto dev = load(4, 32, true, kernels::KvDtype::kF32, &shadow);
  ASSERT_TRUE(cpu && dev && shadow);
  const int32_t vocab = cpu->config().vocab_size;
  const std::vector<int32_t> tokens = {1, 403, 407, 261, 378, 432, 383, 286, 261};
  const std::vector<RowOut> want = {RowOut::kArgmax, RowOut::kArgmax, RowOut::kRow,
                                    RowOut::kArgmax, RowOut::kRow,    RowOut::kRow,
                                    RowOut::kArgmax, RowOut::kArgmax, RowOut::kArgmax};
  std::vector<float> full(tokens.size() * vocab);
  std::vector<float> part(tokens.size() * vocab,
                          std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> argmax(tokens.size(), 99), cpu_argmax(tokens.size(), 99);
  for (int d = 0; d < 2; ++d) {
    ModelRunner &r = d == 0 ? *cpu : *dev;
    BatchBuilder b(4);
    b.add({.block_table = SingleSequence::contiguous_blocks(0, 8),
           .num_committed = 0,
           .tokens = tokens,
           .logits = LogitsMode::kAll});
    if (d == 0) {
      ASSERT_TRUE(r.forward(b.batch(), full.data()).ok());
      // The CPU with the same request: the argmax it computes on the host.
      std::vector<float> again(full.size());
      ASSERT_TRUE(r.forward(b.batch(), LogitsOut{.logits = again.data(),
                                                 .want = want,
                                                 .argmax = cpu_argmax.data()})
                      .ok());
    } else {
      ASSERT_TRUE(r.forward(b.batch(), LogitsOut{.logits = part.data(),
                                                 .want = want,
                                                 .argmax = argmax.data()})
                      .ok());
    }
  }
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
  EXPECT_FALSE(dev->forward(b.batch(), LogitsOut{.logits = part.data(),
                                                 .want = short_want,
                                                 .argmax = argmax.data()})
                   .ok());
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
