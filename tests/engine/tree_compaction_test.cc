// KV compaction after a token tree's verification (step.h, local_executor.cc): the cache holds
// exactly what a run that only ever saw the accepted path holds, and the next step's logits
// agree. Driven through the step protocol on stories260K (F32 KV), block sizes 1, 4 and 16;
// with 10 committed tokens the tree's slots share a block with committed ones (sizes 4, 16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine_test_util.h"
#include "executor/local_executor.h"

namespace arbor::executor {
namespace {

constexpr step::RequestId kId = 7;

std::unique_ptr<LocalExecutor> load(int32_t block_size) {
  ExecutorOptions o;
  o.block_size = block_size;
  o.num_kv_blocks = 64 / block_size + 2;
  o.kv_dtype = kernels::KvDtype::kF32;
  o.num_threads = 2;
  auto exec = LocalExecutor::load(engine::testing::stories260k_path(), o);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  return exec.ok() ? std::move(exec).value() : nullptr;
}

// Proposes one given tree for every request (the executor keeps it for the next step).
class ScriptedProposer final : public spec::Proposer {
 public:
  explicit ScriptedProposer(sampling::TokenTree tree) : tree_(std::move(tree)) {}
  std::string_view name() const override { return "scripted"; }
  Status propose(std::span<const spec::DraftRequest> requests,
                 std::vector<sampling::TokenTree>& out) override {
    out.assign(requests.size(), tree_);
    return ok_status();
  }
  void forget(spec::RequestId, std::span<const int32_t>, int32_t) override {}

 private:
  sampling::TokenTree tree_;
};

// One step of request kId: num_computed cached, `fresh` committed tokens new to the executor
// (the first step sends them as the prompt), the last num_run committed tokens run, then the
// first num_drafts of the drafts the executor keeps; ask_nodes > 0 asks for a tree of that many
// nodes after it.
step::SchedulerOutput make_step(int64_t step, int64_t num_computed, std::vector<int32_t> fresh,
                                int32_t num_run, int32_t num_drafts, int32_t ask_nodes,
                                int32_t block_size, bool first) {
  const std::vector<int32_t>& run = fresh;
  step::SchedulerOutput out;
  out.step = step;
  step::ScheduledRequest s;
  s.request_id = kId;
  s.num_computed_tokens = num_computed;
  s.num_scheduled_tokens = num_run + num_drafts;
  if (first) {
    step::NewRequestData d;
    d.request_id = kId;
    d.token_ids = run;
    d.num_prompt_tokens = static_cast<int32_t>(run.size());
    d.sampling.temperature = 0.0f;
    out.new_requests.push_back(d);
  } else {
    s.new_token_ids = run;
  }
  s.num_drafts = num_drafts;
  s.max_next_draft_tokens = ask_nodes > 0 ? 3 : 0;
  s.max_next_draft_nodes = ask_nodes;
  const int32_t blocks = 64 / block_size;
  s.block_tables.resize(1);
  for (int32_t b = 0; b < blocks; ++b) s.block_tables[0].push_back(b + 1);
  s.sample = true;
  out.requests.push_back(s);
  out.total_num_scheduled_tokens = s.num_scheduled_tokens;
  return out;
}

// K and V of every layer, kv head and position in [0, n), read through the block table 1, 2, ..
std::vector<float> read_cache(LocalExecutor& e, int64_t n) {
  model::PagedKvCache& kv = e.runner().kv_cache();
  const model::KvCacheShape& sh = kv.shape();
  std::vector<float> out, row(static_cast<size_t>(sh.head_dim));
  for (int layer = 0; layer < sh.num_layers; ++layer) {
    for (int64_t pos = 0; pos < n; ++pos) {
      const int64_t slot = (pos / sh.block_size + 1) * sh.block_size + pos % sh.block_size;
      for (int h = 0; h < sh.num_kv_heads; ++h) {
        for (bool value : {false, true}) {
          kv.read_token(layer, slot, h, value, row.data());
          out.insert(out.end(), row.begin(), row.end());
        }
      }
    }
  }
  return out;
}

TEST(TreeCompaction, CacheEqualsARunThatOnlySawTheAcceptedPath) {
  const std::vector<int32_t> prompt{1, 403, 407, 261, 300, 311, 290, 267, 400, 412};
  for (int32_t bs : {1, 4, 16}) {
    SCOPED_TRACE(str_cat("block size ", bs));
    // The plain run: the prompt, then greedy decoding one token per step.
    std::unique_ptr<LocalExecutor> plain = load(bs);
    ASSERT_NE(plain, nullptr);
    std::vector<int32_t> greedy;  // t0, t1, ...
    auto r = plain->execute(make_step(0, 0, prompt, 10, 0, 0, bs, true));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    greedy.push_back(r->requests[0].tokens[0].token_id);
    for (int i = 0; i < 5; ++i) {
      r = plain->execute(make_step(i + 1, 10 + i, {greedy.back()}, 1, 0, 0, bs, false));
      ASSERT_TRUE(r.ok());
      greedy.push_back(r->requests[0].tokens[0].token_id);
    }
    // The tree run: after the prompt, one verification of [t0 + tree] where the true path is
    // each level's second child: nodes w1, t1, w2, t2, t3 with parents -1, -1, 1, 1, 3.
    std::unique_ptr<LocalExecutor> tree = load(bs);
    ASSERT_NE(tree, nullptr);
    const auto wrong = [&](int32_t t) { return t == 5 ? 6 : 5; };
    const std::vector<int32_t> drafts{wrong(greedy[1]), greedy[1], wrong(greedy[2]), greedy[2],
                                      greedy[3]};
    const std::vector<int32_t> parents{-1, -1, 1, 1, 3};
    tree->set_drafter(std::make_unique<Drafter>(
        std::make_unique<ScriptedProposer>(sampling::TokenTree::from_parents(drafts, parents)),
        DrafterOptions{.tree_budget = 8}));
    r = tree->execute(make_step(0, 0, prompt, 10, 0, 5, bs, true));
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->requests[0].tokens[0].token_id, greedy[0]);
    ASSERT_EQ(r->requests[0].next_drafts.parent_ids, parents) << "the tree the executor keeps";
    r = tree->execute(make_step(1, 10, {greedy[0]}, 1, 5, 0, bs, false));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const step::RequestResult& v = r->requests[0];
    ASSERT_EQ(v.accepted_draft_indices, (std::vector<int32_t>{1, 3, 4}));
    ASSERT_EQ(v.tokens.size(), 4u);
    EXPECT_EQ(v.tokens[3].token_id, greedy[4]) << "the bonus token";
    // The next step decodes t4 after the compacted path (positions 11..13): the plain run's
    // next token, and the cache over positions 0..14 (prompt, t0, the path, t4) equals the
    // plain run's.
    r = tree->execute(make_step(2, 14, {greedy[1], greedy[2], greedy[3], greedy[4]}, 1, 0, 0,
                                bs, false));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->requests[0].tokens[0].token_id, greedy[5]);
    const std::vector<float> a = read_cache(*plain, 15), b = read_cache(*tree, 15);
    ASSERT_EQ(a.size(), b.size());
    double worst = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(a[i] - b[i]) / (1.0 + std::abs(a[i])));
    }
    EXPECT_LT(worst, 1e-5) << "compacted K/V differs from the path-only run's";
    std::printf("block size %d: largest relative K/V difference %.2e\n", bs, worst);
  }
}

}  // namespace
}  // namespace arbor::executor
