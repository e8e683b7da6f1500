// Greedy speculative decoding is lossless: every case of stories260K_greedy.json comes out token
// for token with speculation on — draft models (stories260K's first 3 and 4 layers), k = 1..8,
// alone, batched with plain requests, under preemption (a small KV pool), block sizes 1 and 16.
// On the CPU; its twin spec_golden_gpu_test on a CUDA GPU (support/test_device.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "executor_under_test.h"
#include "convert/llama2c.h"
#include "convert/model_plan.h"
#include "engine/engine_core.h"
#include "draft_models.h"
#include "engine_test_util.h"
#include "executor/draft_proposer.h"
#include "executor/local_executor.h"
#include "gguf/gguf.h"
#include "model/runner.h"
#include "../model/golden_util.h"
#include "support/test_device.h"

namespace arbor::engine {
namespace {

using testing::draft_gguf;
using testing::shared;

struct SpecRun {
  executor::SpecProposer proposer = executor::SpecProposer::kDraft;
  int draft_layers = 3;       // with kDraft
  int32_t k = 4;
  int32_t block_size = 16;
  int64_t num_kv_blocks = 0;  // 0: plenty
  bool with_plain = false;    // plain (speculation off) requests in the same batches
  int32_t tree_budget = 0;    // > 0: token trees of at most this many nodes (k levels)
  int32_t tree_width = 4;
  bool with_chains = false;   // chain-speculating requests (tree_nodes 0) in the same batches
  std::vector<int32_t> tree_shape;  // static trees (empty: dynamic)
};

std::vector<model::testing::GoldenCase> goldens() {
  auto vocab = gguf::GgufFile::open(shared(model::testing::kStories260K));
  EXPECT_TRUE(vocab.ok()) << vocab.status().to_string();
  return model::testing::load_stories260k_golden(*vocab);
}

// Runs every golden case through an engine with a draft-model proposer; returns the generated
// ids per case and the engine's accepted-draft count.
std::vector<std::vector<int32_t>> run_spec(const SpecRun& r, int64_t* accepted,
                                           int64_t* preemptions) {
  executor::ExecutorOptions cpu;
  cpu.block_size = r.block_size;
  cpu.num_kv_blocks = r.num_kv_blocks > 0 ? r.num_kv_blocks : 4096 / r.block_size + 2;
  cpu.num_threads = 2;
  cpu.device = test::kTestDevice;
  cpu.proposer = r.proposer;
  if (r.proposer == executor::SpecProposer::kDraft) cpu.draft_model = draft_gguf(r.draft_layers);
  cpu.tree_budget = r.tree_budget;
  cpu.tree_width = r.tree_width;
  cpu.tree_static_widths = r.tree_shape;
  auto exec = ::arbor::engine::testing::load_executor(shared(model::testing::kStories260K), cpu);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return {};
  EngineCoreConfig cfg;
  cfg.options.max_spec_tokens = r.k;
  cfg.options.max_num_batched_tokens = 256;
  cfg.eos_token_ids = std::vector<int32_t>{1, 2};
  EngineCore engine(std::move(exec).value(), cfg);
  const std::vector<model::testing::GoldenCase> cases = goldens();
  std::vector<std::shared_ptr<RequestStream>> streams, plain, chains;
  for (const auto& c : cases) {
    GenerateRequest g;
    g.prompt_token_ids.assign(c.ids.begin(), c.ids.begin() + c.prompt_len);
    g.sampling.temperature = 0.0f;
    g.max_tokens = c.max_len - c.prompt_len;
    g.speculation = {.mode = sched::SpecMode::kFixed, .k = r.k};
    if (r.with_plain) {
      GenerateRequest p = g;
      p.speculation = {.mode = sched::SpecMode::kOff};
      plain.push_back(*engine.submit(std::move(p)));
    }
    if (r.with_chains) {
      GenerateRequest p = g;
      p.speculation.tree_nodes = 0;
      chains.push_back(*engine.submit(std::move(p)));
    }
    streams.push_back(*engine.submit(std::move(g)));
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) out.push_back(testing::drain(*s, 1).token_ids[0]);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(testing::drain(*plain[i], 1).token_ids[0], out[i]) << "plain request " << i;
  }
  for (size_t i = 0; i < chains.size(); ++i) {
    EXPECT_EQ(testing::drain(*chains[i], 1).token_ids[0], out[i]) << "chain request " << i;
  }
  engine.wait_idle();
  const EngineMetricsSnapshot m = engine.metrics();
  *accepted = m.num_accepted_draft_tokens;
  *preemptions = m.num_preemptions;
  if (r.tree_budget > 0) {
    // Width 1 trees are chains, sent as chains; model-free proposers branch only where their
    // matches disagree.
    if (r.tree_width > 1 && r.proposer == executor::SpecProposer::kDraft) {
      EXPECT_GT(m.num_tree_verify_steps, 0) << "no token tree was verified";
    }
    std::printf("trees: %lld verifications, %.2f nodes and %.2f accepted per verification\n",
                static_cast<long long>(m.num_tree_verify_steps),
                static_cast<double>(m.num_tree_nodes) / std::max<int64_t>(m.num_tree_verify_steps, 1),
                static_cast<double>(m.num_tree_accepted_tokens) /
                    std::max<int64_t>(m.num_tree_verify_steps, 1));
  }
  return out;
}

void expect_goldens(const SpecRun& r) {
  SCOPED_TRACE(str_cat(executor::spec_proposer_name(r.proposer), ", draft layers ",
                       r.draft_layers, ", k ", r.k, ", block size ", r.block_size, ", kv blocks ",
                       r.num_kv_blocks, r.with_plain ? ", batched" : "", ", tree budget ",
                       r.tree_budget, " width ", r.tree_width,
                       r.with_chains ? ", with chains" : ""));
  int64_t accepted = 0, preemptions = 0;
  const std::vector<std::vector<int32_t>> got = run_spec(r, &accepted, &preemptions);
  if (r.num_kv_blocks > 0) {
    EXPECT_GT(preemptions, 0) << "the small pool must force preemption";
  }
  const std::vector<model::testing::GoldenCase> cases = goldens();
  ASSERT_EQ(got.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> want(cases[i].ids.begin() + cases[i].prompt_len, cases[i].ids.end());
    std::vector<int32_t> have = got[i];
    // The golden stops *at* BOS without listing it; the engine reports the stop token.
    if (!have.empty() && have.back() == cases[i].stop_id &&
        static_cast<int32_t>(want.size()) < cases[i].max_len - cases[i].prompt_len) {
      have.pop_back();
    }
    EXPECT_EQ(have, want) << "case " << i << " '" << cases[i].prompt << "'";
  }
  EXPECT_GT(accepted, 0) << "the drafts were never accepted: nothing was verified";
}

TEST(SpecGolden, DraftModelsEveryKBlockSize16) {
  for (int layers : {3, 4}) {
    for (int32_t k = 1; k <= 8; ++k) expect_goldens({.draft_layers = layers, .k = k});
  }
}

TEST(SpecGolden, DraftModelsBlockSize1) {
  for (int layers : {3, 4}) {
    for (int32_t k : {1, 3, 8}) expect_goldens({.draft_layers = layers, .k = k, .block_size = 1});
  }
}

TEST(SpecGolden, BatchedWithPlainRequests) {
  for (int32_t k : {2, 5}) {
    expect_goldens({.draft_layers = 3, .k = k, .with_plain = true});
    expect_goldens({.draft_layers = 4, .k = k, .block_size = 1, .with_plain = true});
  }
}

TEST(SpecGolden, ModelFreeProposersEveryKBothBlockSizes) {
  for (auto proposer : {executor::SpecProposer::kNgram, executor::SpecProposer::kSuffix}) {
    for (int32_t k = 1; k <= 8; ++k) {
      expect_goldens({.proposer = proposer, .k = k});
      expect_goldens({.proposer = proposer, .k = k, .block_size = 1});
    }
    expect_goldens({.proposer = proposer, .k = 3, .with_plain = true});
    expect_goldens({.proposer = proposer, .k = 6, .num_kv_blocks = 40});
    expect_goldens({.proposer = proposer, .k = 2, .block_size = 1, .num_kv_blocks = 600});
  }
}

// Token trees: width 1 (a chain sent as a tree's prefix), widths 2-4, budgets 4-32; the draft
// model's dynamic trees and the model-free proposers' merged candidates.
void expect_draft_model_tree(int layers, int32_t width, int32_t budget) {
  const int32_t k = width == 1 ? budget / 2 : 6;
  expect_goldens({.draft_layers = layers, .k = std::min(k, 8), .tree_budget = budget,
                  .tree_width = width});
}

// Every (width, budget) pair once, the draft model alternating between 3 and 4 layers so that
// each layer count meets every width and every budget; block size 1 with both drafts.
TEST(SpecGoldenTree, DraftModelTreesEveryWidthAndBudget) {
  const int32_t budgets[] = {4, 8, 16, 32};
  for (int32_t width : {1, 2, 3, 4}) {
    for (int b = 0; b < 4; ++b) expect_draft_model_tree(3 + (width + b) % 2, width, budgets[b]);
  }
  expect_goldens({.draft_layers = 3, .k = 5, .block_size = 1, .tree_budget = 16,
                  .tree_width = 3});
  expect_goldens({.draft_layers = 4, .k = 3, .block_size = 1, .tree_budget = 4,
                  .tree_width = 2});
}

// The whole product (label `slow`, `make test-slow`): both draft models at every width, budget
// and block size.
TEST(SpecGoldenTreeExhaustive, DraftModelTreesEveryShapeBothBlockSizes) {
  for (int layers : {3, 4}) {
    for (int32_t width : {1, 2, 3, 4}) {
      for (int32_t budget : {4, 8, 16, 32}) expect_draft_model_tree(layers, width, budget);
    }
    expect_goldens({.draft_layers = layers, .k = 5, .block_size = 1, .tree_budget = 16,
                    .tree_width = 3});
    expect_goldens({.draft_layers = layers, .k = 3, .block_size = 1, .tree_budget = 4,
                    .tree_width = 2});
  }
}

TEST(SpecGoldenTree, StaticTreeShapes) {
  for (const std::vector<int32_t>& shape :
       {std::vector<int32_t>{4, 2, 2, 1}, {2, 2, 2, 2, 2}, {3, 1, 1, 1, 1, 1}, {1, 4}}) {
    for (int32_t budget : {8, 32}) {
      expect_goldens({.draft_layers = 4, .k = 6, .tree_budget = budget, .tree_shape = shape});
    }
    expect_goldens({.draft_layers = 3, .k = 6, .block_size = 1, .num_kv_blocks = 600,
                    .tree_budget = 16, .tree_shape = shape});
  }
}

TEST(SpecGoldenTree, BatchedWithPlainAndChainRequestsAndUnderPreemption) {
  expect_goldens({.draft_layers = 4, .k = 4, .with_plain = true, .tree_budget = 16,
                  .with_chains = true});
  expect_goldens({.draft_layers = 3, .k = 6, .block_size = 1, .with_plain = true,
                  .tree_budget = 8, .tree_width = 2, .with_chains = true});
  expect_goldens({.draft_layers = 4, .k = 4, .num_kv_blocks = 40, .tree_budget = 16});
  expect_goldens({.draft_layers = 3, .k = 8, .block_size = 1, .num_kv_blocks = 600,
                  .tree_budget = 32, .tree_width = 4});
}

TEST(SpecGoldenTree, ModelFreeTrees) {
  for (auto proposer : {executor::SpecProposer::kNgram, executor::SpecProposer::kSuffix}) {
    for (int32_t budget : {4, 16, 32}) {
      expect_goldens({.proposer = proposer, .k = 6, .tree_budget = budget, .tree_width = 3});
      expect_goldens({.proposer = proposer, .k = 4, .block_size = 1, .tree_budget = budget});
    }
    expect_goldens({.proposer = proposer, .k = 4, .with_plain = true, .tree_budget = 16,
                    .with_chains = true});
    expect_goldens({.proposer = proposer, .k = 6, .num_kv_blocks = 40, .tree_budget = 16});
  }
}

TEST(SpecGolden, UnderPreemption) {
  // 6 cases of up to 256 tokens in a pool of 40 blocks of 16 (or 600 of 1): they cannot all
  // run at once, so requests are preempted and recompute, drafts and all.
  for (int32_t k : {1, 4, 8}) {
    expect_goldens({.draft_layers = 3, .k = k, .num_kv_blocks = 40});
    expect_goldens({.draft_layers = 4, .k = k, .block_size = 1, .num_kv_blocks = 600});
  }
}

}  // namespace
}  // namespace arbor::engine

namespace arbor::engine {
namespace {

GenerateRequest seeded_request(int i) {
  GenerateRequest g;
  g.prompt_token_ids = {1, 403 + i, 407, 261};
  g.sampling.temperature = 1.0f;
  g.sampling.top_p = i % 2 == 0 ? 1.0f : 0.9f;
  g.sampling.repetition_penalty = i % 3 == 0 ? 1.3f : 1.0f;
  g.sampling.seed = 1000 + i;
  g.max_tokens = 80;
  return g;
}

std::unique_ptr<EngineCore> seeded_engine(int layers, int32_t k, int64_t num_kv_blocks,
                                          int32_t tree_budget = 0) {
  executor::ExecutorOptions cpu;
  cpu.num_kv_blocks = num_kv_blocks;
  cpu.num_threads = 2;
  cpu.tree_budget = tree_budget;
  if (k > 0) {
    cpu.proposer = executor::SpecProposer::kDraft;
    cpu.draft_model = draft_gguf(layers);
  }
  auto exec = ::arbor::engine::testing::load_executor(shared(model::testing::kStories260K), cpu);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return nullptr;
  EngineCoreConfig cfg;
  cfg.options.max_spec_tokens = k;
  cfg.eos_token_ids = std::vector<int32_t>{};
  return std::make_unique<EngineCore>(std::move(exec).value(), cfg);
}

// Tokens of 8 seeded temperature-1 requests, each alone without speculation.
std::vector<std::vector<int32_t>> run_seeded_alone() {
  std::unique_ptr<EngineCore> engine = seeded_engine(0, 0, 0);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 8 && engine; ++i) {
    out.push_back(testing::drain(**engine->submit(seeded_request(i)), 1).token_ids[0]);
  }
  return out;
}

// The same 8 requests at once with speculation (a draft model, fixed k).
std::vector<std::vector<int32_t>> run_seeded_batched(int layers, int32_t k,
                                                     int64_t num_kv_blocks,
                                                     int32_t tree_budget = 0) {
  std::unique_ptr<EngineCore> engine = seeded_engine(layers, k, num_kv_blocks, tree_budget);
  if (!engine) return {};
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest g = seeded_request(i);
    g.speculation = {.mode = sched::SpecMode::kFixed, .k = k};
    streams.push_back(*engine->submit(std::move(g)));
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) out.push_back(testing::drain(*s, 1).token_ids[0]);
  return out;
}

TEST(SpecSampled, SeededRequestsAreReproducibleWhateverTheBatch) {
  const std::vector<std::vector<int32_t>> alone = run_seeded_alone();
  ASSERT_EQ(alone.size(), 8u);
  for (int layers : {3, 4}) {
    for (int32_t k : {1, 4, 8}) {
      SCOPED_TRACE(str_cat("draft layers ", layers, ", k ", k));
      EXPECT_EQ(run_seeded_batched(layers, k, 0), alone);
      // 8 x 84 tokens in 20 blocks of 16: requests are preempted and recomputed.
      EXPECT_EQ(run_seeded_batched(layers, k, 20), alone) << "under preemption";
    }
  }
}

// Token trees verify by sample-and-compare: a seeded request's tokens are its plain ones.
TEST(SpecSampled, SeededRequestsWithTokenTreesAreReproducible) {
  const std::vector<std::vector<int32_t>> alone = run_seeded_alone();
  ASSERT_EQ(alone.size(), 8u);
  for (int32_t budget : {4, 16}) {
    SCOPED_TRACE(str_cat("tree budget ", budget));
    EXPECT_EQ(run_seeded_batched(4, 4, 0, budget), alone);
    EXPECT_EQ(run_seeded_batched(3, 6, 20, budget), alone) << "under preemption";
  }
}

}  // namespace
}  // namespace arbor::engine

namespace arbor::engine {
namespace {

// Counts of the token generated at each of the first `len` positions over `n` unseeded
// temperature-1 requests: [len][vocab].
std::vector<std::vector<int64_t>> token_counts(
    bool spec, int32_t n, int32_t len, int32_t tree_budget = 0,
    executor::TreeSampling tree_sampling = executor::TreeSampling::kTopK) {
  executor::ExecutorOptions cpu;
  cpu.num_threads = 2;
  cpu.tree_budget = tree_budget;
  cpu.tree_sampling = tree_sampling;
  if (spec) {
    cpu.proposer = executor::SpecProposer::kDraft;
    cpu.draft_model = draft_gguf(3);
  }
  auto exec = ::arbor::engine::testing::load_executor(shared(model::testing::kStories260K), cpu);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  const int32_t vocab = (*exec)->vocab_size();
  EngineCoreConfig cfg;
  cfg.options.max_spec_tokens = spec ? 3 : 0;
  cfg.eos_token_ids = std::vector<int32_t>{};
  EngineCore engine(std::move(exec).value(), cfg);
  const auto counts = ::arbor::engine::testing::sampled_token_counts(engine, n, len, vocab, spec);
  if (spec) {
    EXPECT_GT(engine.metrics().num_accepted_draft_tokens, n / 4) << "drafts were verified";
  }
  if (tree_budget > 0) {
    EXPECT_GT(engine.metrics().num_tree_verify_steps, n / 4) << "trees were verified";
  }
  return counts;
}

// Unseeded sampling with a draft model verifies by the model rule (accept with min(1, p/q),
// recover from the residual): the tokens at each position keep the target's distribution.
TEST(SpecSampled, UnseededDistributionIsTheTargetsWithADraftModel) {
  constexpr int32_t kN = 4096, kLen = 6;
  testing::expect_same_distribution(token_counts(false, kN, kLen), token_counts(true, kN, kLen),
                                    kLen);
}

TEST(SpecSampled, UnseededDistributionIsTheTargetsWithTokenTrees) {
  constexpr int32_t kN = 4096, kLen = 6;
  const auto plain = token_counts(false, kN, kLen);
  for (auto ts : {executor::TreeSampling::kTopK, executor::TreeSampling::kSpecInfer,
                  executor::TreeSampling::kSequoia}) {
    SCOPED_TRACE(str_cat("tree sampling ", static_cast<int>(ts)));
    testing::expect_same_distribution(plain, token_counts(true, kN, kLen, 12, ts), kLen);
  }
}


// A greedy chain's drafts are the tokens the sampler picks from the draft model's whole rows
// (the same as requests that keep their q get), and each comes with the draft's probability of
// it — the policy's confidence — which is the softmax at that token of the draft's row after
// the drafts before it, here recomputed with the draft model run alone (SingleSequence).
TEST(DraftModelProposer, GreedyChainDraftsComeWithTheDraftsProbabilities) {
  auto draft = executor::DraftModelProposer::load(draft_gguf(3), 64, 16,
                                                  std::make_shared<kernels::ThreadPool>(1));
  ASSERT_TRUE(draft.ok()) << draft.status().to_string();
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 403, 407, 261, 378}, {1, 432, 383, 286, 261, 376, 298}, {1, 315}};
  std::vector<std::vector<int32_t>> blocks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    blocks.push_back(model::SingleSequence::contiguous_blocks(static_cast<int32_t>(4 * i), 4));
  }
  std::vector<executor::DraftOutput> proposed[2];
  for (int keep = 0; keep < 2; ++keep) {
    std::vector<executor::DraftInput> inputs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      inputs.push_back(executor::DraftInput{
          .request_id = static_cast<step::RequestId>(10 * keep + i),
          .token_ids = prompts[i],
          .num_prompt_tokens = static_cast<int32_t>(prompts[i].size()),
          .max_depth = 6 - static_cast<int32_t>(i),  // ragged rounds
          .max_nodes = 0,
          .sampling = &greedy,
          .seed = 0,
          .block_ids = blocks[i],
          .draw = keep == 1 ? std::optional(sampling::SiblingDraws::kWithReplacement)
                            : std::nullopt});
    }
    auto outs = (*draft)->propose_chains(inputs);
    ASSERT_TRUE(outs.ok()) << outs.status().to_string();
    proposed[keep] = *outs;
  }
  auto alone = model::ModelRunner::load(draft_gguf(3), {.num_blocks = 16, .num_threads = 1});
  ASSERT_TRUE(alone.ok()) << alone.status().to_string();
  double lowest = 1.0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const executor::DraftOutput& out = proposed[0][i];
    EXPECT_EQ(out.tokens, proposed[1][i].tokens) << "request " << i;
    ASSERT_EQ(out.tokens.size(), 6 - i);
    ASSERT_EQ(out.probs.size(), out.tokens.size());
    EXPECT_TRUE(proposed[1][i].probs.empty()) << "drawn drafts carry their q instead";
    model::SingleSequence seq(**alone, model::SingleSequence::contiguous_blocks(0, 16));
    std::vector<int32_t> tokens = prompts[i];
    tokens.insert(tokens.end(), out.tokens.begin(), out.tokens.end() - 1);
    auto rows = seq.append_all_logits(tokens);
    ASSERT_TRUE(rows.ok()) << rows.status().to_string();
    const size_t vocab = rows->size() / tokens.size();
    for (size_t j = 0; j < out.tokens.size(); ++j) {
      const std::span<const float> row =
          rows->subspan((prompts[i].size() - 1 + j) * vocab, vocab);
      const auto best = std::max_element(row.begin(), row.end());
      EXPECT_EQ(out.tokens[j], best - row.begin()) << "request " << i << " draft " << j;
      double sum = 0.0;
      for (float x : row) sum += std::exp(static_cast<double>(x) - *best);
      const double p = std::exp(static_cast<double>(row[out.tokens[j]]) - *best) / sum;
      EXPECT_NEAR(out.probs[j], p, 1e-5 + 1e-3 * p) << "request " << i << " draft " << j;
      lowest = std::min(lowest, p);
    }
  }
  EXPECT_LT(lowest, 0.9) << "some draft is unsure, or the test could not tell 1 from p";
}

}  // namespace
}  // namespace arbor::engine

namespace arbor::engine {
namespace {

// Seeded requests whose distribution depends on their top_k best logits only get those
// candidates back from the device (LocalExecutor::top_k_suffices, sampling::fill_sparse_row);
// asking for logprobs takes whole rows instead. The tokens must be the same either way, with
// n-gram drafts, draft-model chains and token trees verified on those rows.
struct TopKRun {
  executor::SpecProposer proposer = executor::SpecProposer::kNone;
  int32_t k = 0;
  int32_t tree_budget = 0;
};

struct TopKOutcome {
  std::vector<std::vector<int32_t>> tokens;
  int64_t top_k_rows = 0;
  int64_t accepted = 0;
};

TopKOutcome run_top_k(const TopKRun& r, bool whole_rows, bool candidates_on_host = true) {
  executor::ExecutorOptions options;
  options.top_k_candidates_on_host = candidates_on_host;
  options.num_threads = 2;
  options.device = test::kTestDevice;
  options.proposer = r.proposer;
  if (r.proposer == executor::SpecProposer::kDraft) options.draft_model = draft_gguf(3);
  options.tree_budget = r.tree_budget;
  auto exec = executor::LocalExecutor::load(shared(model::testing::kStories260K), options);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return {};
  const executor::LocalExecutor* executor = exec->get();
  EngineCoreConfig cfg;
  cfg.options.max_spec_tokens = r.k;
  cfg.eos_token_ids = std::vector<int32_t>{};
  EngineCore engine(std::move(exec).value(), cfg);
  const int32_t top_ks[] = {1, 3, 12, 40, 256, 7};
  const float temperatures[] = {0.7f, 1.0f, 1.3f};
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 6; ++i) {
    GenerateRequest g;
    g.prompt_token_ids = {1, 403 + i, 407, 261, 378};
    g.sampling.temperature = temperatures[i % 3];
    g.sampling.top_k = top_ks[i];
    g.sampling.min_p = i == 3 ? 0.05f : 0.0f;
    g.sampling.top_p = i == 5 ? 0.8f : 1.0f;
    g.sampling.seed = 500 + i;
    if (whole_rows) g.sampling.logprobs = 0;
    g.max_tokens = 96;
    if (r.k > 0) g.speculation = {.mode = sched::SpecMode::kFixed, .k = r.k};
    streams.push_back(*engine.submit(std::move(g)));
  }
  TopKOutcome out;
  for (auto& s : streams) out.tokens.push_back(testing::drain(*s, 1).token_ids[0]);
  out.top_k_rows = executor->num_top_k_rows();
  out.accepted = engine.metrics().num_accepted_draft_tokens;
  if (r.tree_budget > 0) {
    EXPECT_GT(engine.metrics().num_tree_verify_steps, 0);
  }
  return out;
}

TEST(SpecSampled, TopKCandidatesGiveTheTokensOfWholeRows) {
  for (const TopKRun& r : {TopKRun{},
                           TopKRun{.proposer = executor::SpecProposer::kNgram, .k = 4},
                           TopKRun{.proposer = executor::SpecProposer::kDraft, .k = 4},
                           TopKRun{.proposer = executor::SpecProposer::kDraft, .k = 4,
                                   .tree_budget = 12}}) {
    SCOPED_TRACE(str_cat(executor::spec_proposer_name(r.proposer), ", k ", r.k, ", tree budget ",
                         r.tree_budget));
    const TopKOutcome sparse = run_top_k(r, false);
    const TopKOutcome whole = run_top_k(r, true);
    ASSERT_EQ(sparse.tokens.size(), 6u);
    EXPECT_EQ(sparse.tokens, whole.tokens);
    EXPECT_GE(sparse.top_k_rows, 6 * 96) << "the rows did not come back as candidates";
    EXPECT_EQ(whole.top_k_rows, 0) << "logprobs need whole rows";
    if (r.k > 0) {
      EXPECT_GT(sparse.accepted, 0) << "no draft was verified and accepted";
    }
    if (r.k == 0 && test::kTestDevice == executor::Device::kCpu) {
      // On the CPU the candidates path is off by default (it is slower there than sampling the
      // whole row in place) and gives the same tokens.
      const TopKOutcome host = run_top_k(r, false, false);
      EXPECT_EQ(host.top_k_rows, 0);
      EXPECT_EQ(host.tokens, whole.tokens);
    }
    std::printf("%s: %lld top-k rows, %lld drafts accepted\n",
                std::string(executor::spec_proposer_name(r.proposer)).c_str(),
                static_cast<long long>(sparse.top_k_rows), static_cast<long long>(sparse.accepted));
  }
}

}  // namespace
}  // namespace arbor::engine
