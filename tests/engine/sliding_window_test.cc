// Sliding-window layers with KV reclaim (docs/kv_layout.md, "KV cache groups"): greedy output
// with the blocks that left every window released equals the same model's output with every
// block kept (--no-kv-reclaim: one group, the attention still windowed), token for token, at
// contexts well past the windows, under block sizes 1 and 16, chunked prefill, prefix caching,
// preemption, n > 1 forks, n-gram and draft-model speculation and token trees. Each run also
// shows that what it claims happened: blocks released, prefix hits, preemptions, drafts
// accepted, trees verified.
//
// Models: tiny random-weight Gemma 3 and Gemma 2 files (model/synth_model.h, the stories260K
// vocabulary). Gemma 3: 6 layers, 2 and 5 global, the others a window of 8 (3 KV cache groups
// over 2 pools, as Gemma 3's own 1:5 pattern groups); Gemma 2: 4 layers alternating, window 13.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "executor_under_test.h"
#include "engine/engine_core.h"
#include "engine_test_util.h"
#include "executor/local_executor.h"
#include "gguf/gguf.h"
#include "kernels/thread_pool.h"
#include "model/synth_model.h"
#include "support/temp_dir.h"

namespace arbor::engine {
namespace {

constexpr int32_t kVocab = 512;

struct ModelFiles {
  test::TempDir dir{"sliding_window"};
  std::string gemma3, gemma3_draft, gemma2;
};

std::string write_model(const std::string& arch, int64_t layers, int64_t window, int64_t pattern,
                        uint64_t seed, const std::string& path) {
  model::SynthShape base{.name = "swa-" + arch, .dim = 128, .ffn = 256, .layers = layers,
                         .heads = 4, .kv_heads = 2, .context = 4096};
  model::SynthShape s = model::with_arch(base, arch);
  s.vocab = 0;
  s.head_dim = 32;
  s.window = window;
  s.swa_pattern = pattern;
  kernels::ThreadPool pool(2);
  auto w = model::synth_model(s, gguf::GgmlType::kQ8_0, seed, kVocab,
                              testing::stories260k_tokenizer_keys(), pool);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  if (w.ok()) {
    EXPECT_TRUE(w->write(path).ok());
  }
  return path;
}

const ModelFiles& models() {
  // Owned by a static (not leaked) so that its TempDir is removed when the test process exits.
  static const std::unique_ptr<ModelFiles> m = [] {
    auto f = std::make_unique<ModelFiles>();
    f->gemma3 = write_model("gemma3", 6, 8, 3, 21, f->dir / "gemma3.gguf");
    f->gemma3_draft = write_model("gemma3", 3, 8, 3, 22, f->dir / "gemma3_draft.gguf");
    f->gemma2 = write_model("gemma2", 4, 13, 2, 23, f->dir / "gemma2.gguf");
    return f;
  }();
  return *m;
}

struct SwaRun {
  std::string model = "gemma3";  // or "gemma2"
  int32_t n = 1;               // > 1: n seeded samples per request (forks, copy-on-write)
  bool reclaim = true;
  int32_t block_size = 16;
  int64_t num_kv_blocks = 0;   // 0: plenty
  int32_t chunk = 0;           // long_prefill_token_threshold
  int32_t budget = 256;        // max_num_batched_tokens
  executor::SpecProposer proposer = executor::SpecProposer::kNone;
  int32_t k = 0;
  int32_t tree_budget = 0;
  bool self_draft = false;     // the target as its own draft (every draft accepted)
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // per request, both waves
  int64_t released = 0;
  int64_t preemptions = 0;
  int64_t hit_tokens = 0;
  int64_t accepted = 0;
  int64_t tree_verifications = 0;
};

struct Waves {
  std::vector<std::vector<int32_t>> first, second;
};

// Wave 1: four prompts of 30-75 tokens. Wave 2, submitted when wave 1 is done: a prefix of
// prompt 0 with a new tail, prompt 1 extended, prompt 2 again, prompt 3's first 64 tokens with
// a new tail: prefix hits that end past the windows.
Waves make_waves() {
  std::mt19937_64 rng(33);
  Waves w;
  for (int32_t len : {30, 45, 60, 75}) w.first.push_back(testing::random_prompt(rng, len, kVocab));
  auto extend = [&](std::vector<int32_t> p, size_t keep, int32_t more) {
    p.resize(keep);
    const std::vector<int32_t> tail = testing::random_prompt(rng, more, kVocab);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  w.second.push_back(extend(w.first[0], 24, 20));
  w.second.push_back(extend(w.first[1], 45, 10));
  w.second.push_back(w.first[2]);
  w.second.push_back(extend(w.first[3], 64, 5));
  return w;
}

constexpr int32_t kMaxTokens = 48;

Outcome run(const SwaRun& r) {
  executor::ExecutorOptions cpu;
  cpu.block_size = r.block_size;
  cpu.num_kv_blocks = r.num_kv_blocks > 0 ? r.num_kv_blocks : 8192 / r.block_size + 2;
  cpu.num_threads = 2;
  cpu.kv_reclaim = r.reclaim;
  cpu.proposer = r.proposer;
  if (r.proposer == executor::SpecProposer::kDraft) {
    cpu.draft_model = r.self_draft ? models().gemma3 : models().gemma3_draft;
  }
  cpu.tree_budget = r.tree_budget;
  cpu.tree_width = 3;
  const std::string& target = r.model == "gemma2" ? models().gemma2 : models().gemma3;
  auto exec = ::arbor::engine::testing::load_executor(target, cpu);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return {};
  EngineCoreConfig cfg;
  cfg.options.max_spec_tokens = r.k;
  cfg.options.max_num_batched_tokens = r.budget;
  cfg.options.long_prefill_token_threshold = r.chunk;
  cfg.eos_token_ids = std::vector<int32_t>{};  // run to max_tokens
  EngineCore engine(std::move(exec).value(), cfg);
  Outcome out;
  const Waves waves = make_waves();
  for (const auto* wave : {&waves.first, &waves.second}) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const std::vector<int32_t>& p : *wave) {
      GenerateRequest g;
      g.prompt_token_ids = p;
      g.sampling.temperature = 0.0f;
      if (r.n > 1) {
        g.sampling.temperature = 0.8f;
        g.sampling.seed = 7 + streams.size();
        g.n = r.n;
      }
      g.max_tokens = kMaxTokens;
      if (r.k > 0) g.speculation = {.mode = sched::SpecMode::kFixed, .k = r.k};
      auto s = engine.submit(std::move(g));
      EXPECT_TRUE(s.ok()) << s.status().to_string();
      if (s.ok()) streams.push_back(*s);
    }
    for (auto& s : streams) {
      const testing::Collected c = testing::drain(*s, r.n);
      out.tokens.insert(out.tokens.end(), c.token_ids.begin(), c.token_ids.end());
    }
    engine.wait_idle();
  }
  const EngineMetricsSnapshot m = engine.metrics();
  for (int64_t n : m.kv_group_released_blocks) out.released += n;
  out.preemptions = m.num_preemptions;
  out.hit_tokens = m.num_prefix_cache_hit_tokens;
  out.accepted = m.num_accepted_draft_tokens;
  out.tree_verifications = m.num_tree_verify_steps;
  std::printf("released %lld, preemptions %lld, prefix hit tokens %lld, accepted drafts %lld, "
              "tree verifications %lld\n",
              static_cast<long long>(out.released), static_cast<long long>(out.preemptions),
              static_cast<long long>(out.hit_tokens), static_cast<long long>(out.accepted),
              static_cast<long long>(out.tree_verifications));
  return out;
}

// Every block kept: the reference, per model, block size and n (a row's bits depend on the
// block size: the attention's block-wise softmax).
const std::vector<std::vector<int32_t>>& reference(const SwaRun& r) {
  static std::map<std::tuple<std::string, int32_t, int32_t>, std::vector<std::vector<int32_t>>>
      cache;
  const auto key = std::tuple(r.model, r.block_size, r.n);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const Outcome o =
        run(SwaRun{.model = r.model, .n = r.n, .reclaim = false, .block_size = r.block_size});
    EXPECT_EQ(o.released, 0);
    it = cache.emplace(key, o.tokens).first;
  }
  return it->second;
}

void expect_equal_to_reference(const SwaRun& r, const Outcome& o) {
  const std::vector<std::vector<int32_t>>& want = reference(r);
  ASSERT_EQ(o.tokens.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(o.tokens[i].size(), static_cast<size_t>(kMaxTokens)) << "request " << i;
    EXPECT_EQ(o.tokens[i], want[i]) << "request " << i;
  }
  // Contexts reach 75 + 48 tokens; the windows are 8 and 13: every run releases blocks.
  EXPECT_GT(o.released, 0);
  // Wave 2 hits wave 1's blocks, unless a small pool evicted them.
  if (r.num_kv_blocks == 0) EXPECT_GT(o.hit_tokens, 0);
}

TEST(SlidingWindow, ReclaimEqualsKeepingEveryBlock) {
  for (const std::string model : {"gemma3", "gemma2"}) {
    for (int32_t bs : {16, 1}) {
      SCOPED_TRACE(str_cat(model, ", block_size ", bs));
      const SwaRun r{.model = model, .block_size = bs};
      expect_equal_to_reference(r, run(r));
    }
  }
}

TEST(SlidingWindow, ChunkedPrefillAndPreemption) {
  for (int32_t bs : {16, 1}) {
    SCOPED_TRACE(str_cat("block_size ", bs));
    const SwaRun chunked{.block_size = bs, .chunk = 7, .budget = 20};
    expect_equal_to_reference(chunked, run(chunked));
    // A pool for about two requests at a time: four running ones preempt each other.
    const SwaRun small{.block_size = bs, .num_kv_blocks = bs == 16 ? 24 : 300, .chunk = 16,
                    .budget = 32};
    const Outcome o = run(small);
    expect_equal_to_reference(small, o);
    EXPECT_GT(o.preemptions, 0);
  }
}

// n = 3 seeded samples per request: the parent's prompt blocks are shared by its forks, each
// group's partial tail copied; the samples draw from identical logits with and without reclaim.
TEST(SlidingWindow, ForksWithCopyOnWrite) {
  for (int32_t bs : {16, 1}) {
    SCOPED_TRACE(str_cat("block_size ", bs));
    const SwaRun r{.n = 3, .block_size = bs, .chunk = 11, .budget = 64};
    const Outcome o = run(r);
    expect_equal_to_reference(r, o);
    EXPECT_NE(o.tokens[0], o.tokens[1]);  // sampled: the forks differ
  }
}

TEST(SlidingWindow, Speculation) {
  struct Case {
    const char* name;
    SwaRun run;
    bool trees;
  };
  using P = executor::SpecProposer;
  const Case cases[] = {
      {"ngram", {.proposer = P::kNgram, .k = 4}, false},
      {"draft, chunked, bs 1",
       {.block_size = 1, .chunk = 9, .budget = 40, .proposer = P::kDraft, .k = 4}, false},
      {"self draft, bs 16", {.proposer = P::kDraft, .k = 5, .self_draft = true}, false},
      {"draft trees", {.proposer = P::kDraft, .k = 3, .tree_budget = 6}, true},
      {"self draft trees, bs 1, small pool",
       {.block_size = 1, .num_kv_blocks = 300, .chunk = 16, .budget = 32, .proposer = P::kDraft,
        .k = 3, .tree_budget = 6, .self_draft = true},
       true},
      {"ngram trees, gemma2", {.model = "gemma2", .proposer = P::kNgram, .k = 4,
                               .tree_budget = 8},
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Outcome o = run(c.run);
    expect_equal_to_reference(c.run, o);
    EXPECT_GT(o.accepted, 0);
    if (c.trees) EXPECT_GT(o.tree_verifications, 0);
  }
}

}  // namespace
}  // namespace arbor::engine
