// Every architecture of the table (with the mixtures of experts: qwen3moe, qwen2moe — a shared
// expert —, gpt-oss — sinks, windows on even layers, YaRN, biased experts — and llama with
// experts as Mixtral) keeps arbor's guarantees: greedy output with n-gram and draft-model
// speculation, token trees, prefix caching, chunked prefill and preemption equals plain greedy
// output token for token, at block sizes 1 and 16, and for the sliding-window rows
// at contexts several times their window (16 here; prompts + outputs reach 90 tokens).
//
// Each row gets a tiny random-weight Q8_0 target (model/synth_model.h, the stories260K
// vocabulary) and a 2-layer draft of the same row with other weights (most drafts rejected) —
// plus the target as its own draft (every draft accepted), so both verification paths run.
// Reference: each prompt alone through an engine without speculation, prefix caching or
// chunking, at the same block size.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine_core.h"
#include "engine_test_util.h"
#include "executor/local_executor.h"
#include "gguf/gguf.h"
#include "kernels/thread_pool.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/synth_model.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

namespace arbor::engine {
namespace {

constexpr int32_t kVocab = 512;
constexpr int32_t kMaxTokens = 40;

struct Row {
  std::string arch;
  int64_t window = 0;
  int64_t head_dim = 0;
  int64_t experts = 0, experts_used = 0;  // a mixture of experts (qwen3moe, llama as Mixtral)
  std::string name{};                     // the test's name; empty: arch
};

std::string write_model(const Row& row, int64_t layers, uint64_t seed, const std::string& path) {
  model::SynthShape base{.name = "spec-" + row.arch, .dim = 256, .ffn = 512, .layers = layers,
                         .heads = 4, .kv_heads = 2, .context = 4096};
  model::SynthShape s = model::with_arch(base, row.arch);
  s.vocab = 0;
  s.head_dim = row.head_dim;
  s.window = row.window;
  if (row.arch == "gemma3") s.swa_pattern = 2;  // a global layer among 4
  if (row.arch == "olmo2") s.tied = false;
  s.experts = row.experts;
  s.experts_used = row.experts_used;
  s.expert_ffn =
      row.arch == "qwen3moe" || row.arch == "gpt-oss" || row.arch == "qwen2moe" ? 128 : 0;
  kernels::ThreadPool pool(2);
  auto w = model::synth_model(s, gguf::GgmlType::kQ8_0, seed, kVocab,
                              testing::stories260k_tokenizer_keys(), pool);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  if (w.ok()) {
    EXPECT_TRUE(w->write(path).ok());
  }
  return path;
}

struct Config {
  std::string name;
  executor::SpecProposer proposer = executor::SpecProposer::kNone;
  bool self_draft = false;   // the target as its own draft
  int32_t k = 0;             // 0: no speculation
  int32_t tree_budget = 0;
  int32_t block_size = 16;
  int64_t num_kv_blocks = 0;       // 0: plenty
  int32_t max_batched_tokens = 512;
  bool prefix_caching = true;
  bool all_at_once = true;   // every prompt submitted together (else one after another)
};

// Prompts: random ones, and three that share a 24-token prefix with the first (prefix-cache
// hits from the second admission on).
std::vector<std::vector<int32_t>> prompts() {
  std::mt19937_64 rng(7);
  std::vector<std::vector<int32_t>> p;
  for (int32_t len : {5, 17, 33, 50}) p.push_back(testing::random_prompt(rng, len, kVocab));
  for (int32_t extra : {3, 11, 30}) {
    std::vector<int32_t> q(p[3].begin(), p[3].begin() + 24);
    const std::vector<int32_t> tail = testing::random_prompt(rng, extra, kVocab);
    q.insert(q.end(), tail.begin(), tail.end());
    p.push_back(q);
  }
  return p;
}

// A pool of the bytes of `blocks` blocks that hold every layer: with sliding layers the KV cache
// groups' blocks hold only num_pools layers (docs/kv_layout.md), so more of them.
int64_t same_bytes_blocks(const std::string& target, int64_t blocks) {
  auto f = gguf::GgufFile::open(target);
  EXPECT_TRUE(f.ok());
  if (!f.ok()) return blocks;
  auto cfg = model::ModelConfig::from_gguf(*f);
  EXPECT_TRUE(cfg.ok());
  if (!cfg.ok()) return blocks;
  std::vector<int32_t> windows;
  for (int l = 0; l < cfg->num_layers; ++l) windows.push_back(cfg->layer_window(l));
  auto layout = model::plan_kv_cache_layout(windows, /*reclaim=*/true);
  EXPECT_TRUE(layout.ok());
  if (!layout.ok()) return blocks;
  return (blocks - 1) * cfg->num_layers / layout->num_pools + 1;
}

std::vector<std::vector<int32_t>> generate(const std::string& target, const std::string& draft,
                                           const Config& c, int64_t* preemptions) {
  executor::ExecutorOptions o;
  o.block_size = c.block_size;
  o.num_kv_blocks = c.num_kv_blocks > 0 ? same_bytes_blocks(target, c.num_kv_blocks)
                                        : 4096 / c.block_size + 2;
  o.num_threads = 2;
  o.proposer = c.proposer;
  if (c.proposer == executor::SpecProposer::kDraft) o.draft_model = c.self_draft ? target : draft;
  o.tree_budget = c.tree_budget;
  o.tree_width = 3;
  auto exec = executor::LocalExecutor::load(target, o);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return {};
  EngineCoreConfig cfg;
  cfg.options.max_spec_tokens = c.k;
  cfg.options.max_num_batched_tokens = c.max_batched_tokens;
  cfg.options.enable_prefix_caching = c.prefix_caching;
  cfg.eos_token_ids = std::vector<int32_t>{};  // random weights: run to max_tokens
  EngineCore engine(std::move(exec).value(), cfg);
  std::vector<std::vector<int32_t>> out;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const std::vector<int32_t>& p : prompts()) {
    GenerateRequest g;
    g.prompt_token_ids = p;
    g.sampling.temperature = 0.0f;
    g.max_tokens = kMaxTokens;
    g.speculation.mode = c.k > 0 ? sched::SpecMode::kFixed : sched::SpecMode::kOff;
    g.speculation.k = c.k;
    streams.push_back(*engine.submit(std::move(g)));
    if (!c.all_at_once) out.push_back(testing::drain(*streams.back(), 1).token_ids[0]);
  }
  if (c.all_at_once) {
    for (auto& s : streams) out.push_back(testing::drain(*s, 1).token_ids[0]);
  }
  engine.wait_idle();
  *preemptions = engine.metrics().num_preemptions;
  return out;
}

class ArchSpecTest : public ::testing::TestWithParam<Row> {};

// Under the sanitizers (which run this 8x slower) three rows take every path: llama, gemma3
// (sliding windows) and qwen3moe (experts). The others run their forward, draft trees and
// preemption at block size 16 there, which still walks each row's own loading, attention and
// FFN code; the Release pass runs every path of every row.
bool every_path(const Row& row) {
#ifdef ARBOR_SANITIZE_BUILD
  return (row.arch == "llama" && row.experts == 0) || row.arch == "gemma3" ||
         row.arch == "qwen3moe";
#else
  (void)row;
  return true;
#endif
}

bool sanitizer_subset(std::string_view config_name) {
  return config_name == "draft trees budget 12" ||
         config_name == "preemption (small pool), draft k 3";
}

TEST_P(ArchSpecTest, EverySchedulingAndSpeculationPathEqualsPlainGreedy) {
  const Row& row = GetParam();
  test::TempDir dir("arch_spec");
  const std::string target = write_model(row, 4, 11, dir / "target.gguf");
  const std::string draft = write_model(row, 2, 12, dir / "draft.gguf");
  int64_t preemptions = 0;
  // A row's bits depend on the block size (the attention kernel's block-wise softmax), so each
  // block size has its own reference.
  std::map<int32_t, std::vector<std::vector<int32_t>>> reference;
  for (int32_t block : {1, 16}) {
    if (block == 1 && !every_path(row)) continue;
    const Config plain{.name = "plain, one at a time", .block_size = block,
                       .prefix_caching = false, .all_at_once = false};
    reference[block] = generate(target, draft, plain, &preemptions);
    ASSERT_EQ(reference[block].size(), prompts().size());
  }
  using P = executor::SpecProposer;
  const Config configs[] = {
      {.name = "plain batched, prefix caching, block 1", .block_size = 1},
      {.name = "chunked prefill (16-token steps)", .max_batched_tokens = 16},
      {.name = "n-gram k 4", .proposer = P::kNgram, .k = 4},
      {.name = "draft k 4, block 1", .proposer = P::kDraft, .k = 4, .block_size = 1},
      {.name = "self draft k 5", .proposer = P::kDraft, .self_draft = true, .k = 5},
      {.name = "draft trees budget 12", .proposer = P::kDraft, .k = 4, .tree_budget = 12},
      {.name = "self draft trees, block 1, chunked", .proposer = P::kDraft, .self_draft = true,
       .k = 3, .tree_budget = 8, .block_size = 1, .max_batched_tokens = 24},
      {.name = "preemption (small pool), draft k 3", .proposer = P::kDraft, .k = 3,
       .num_kv_blocks = 14},
      // 120 blocks (of every layer's bytes): a sliding row releases so much that 200 would not
      // preempt.
      {.name = "preemption, block 1, n-gram", .proposer = P::kNgram, .k = 2, .block_size = 1,
       .num_kv_blocks = 120},
  };
  for (const Config& c : configs) {
    if (!every_path(row) && !sanitizer_subset(c.name)) continue;
    SCOPED_TRACE(row.arch + ": " + c.name);
    const std::vector<std::vector<int32_t>> got = generate(target, draft, c, &preemptions);
    const std::vector<std::vector<int32_t>>& want = reference[c.block_size];
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
    if (c.num_kv_blocks > 0) {
      EXPECT_GT(preemptions, 0) << "the small pool must force preemption";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryArchitecture, ArchSpecTest,
    ::testing::Values(Row{"llama"}, Row{"qwen2"}, Row{"qwen3", 0, 128}, Row{"gemma2", 16, 128},
                      Row{"gemma3", 16, 128}, Row{"mistral3"}, Row{"phi3"}, Row{"smollm3"},
                      Row{"olmo2", 16}, Row{"granite"}, Row{"qwen3moe", 0, 128, 8, 2},
                      Row{"llama", 0, 0, 4, 2, "mixtral"}, Row{"gpt-oss", 16, 64, 8, 2, "gpt_oss"},
                      Row{"qwen2moe", 0, 0, 8, 2}),
    [](const ::testing::TestParamInfo<Row>& info) {
      return info.param.name.empty() ? info.param.arch : info.param.name;
    });

}  // namespace
}  // namespace arbor::engine
