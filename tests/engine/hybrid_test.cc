// Qwen3.5's hybrid models through the engine (docs/qwen35.md): every request's Gated DeltaNet
// state lives in a slot of its own, so greedy output through the engine — four requests at
// once, chunked prefill, block size 1, a pool small enough to preempt (the state is rebuilt by
// the recompute), n > 1 forks (the children copy their parent's state), a second wave whose
// prompts share prefixes with the first (a prefix-cache hit continues the state saved at the
// first prompt's last block boundary; no hits without --state-checkpoints), speculation (n-gram and draft-model chains and token trees verified in
// scratch state slots, each node continuing its parent's, the accepted path replayed into the
// request's slot) — equals a plain greedy loop over one sequence on the runner, token for token.
// Each run also shows that what it claims happened: preemptions, accepted drafts, prefix hits.
//
// Models: tiny random-weight qwen35 and qwen35moe files (model/synth_model.h presets, the
// stories260K vocabulary): three Gated DeltaNet layers, then gated attention.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine_test_util.h"
#include "executor/draft_proposer.h"
#include "executor/drafter.h"
#include "executor/local_executor.h"
#include "executor_under_test.h"
#include "kernels/thread_pool.h"
#include "model/runner.h"
#include "model/synth_model.h"
#include "spec/proposer.h"
#include "support/temp_dir.h"

namespace arbor::engine {
namespace {

constexpr int32_t kVocab = 512;
constexpr int32_t kMaxTokens = 24;

struct ModelFiles {
  test::TempDir dir{"hybrid"};
  std::map<std::string, std::string> path;  // preset -> file
};

const ModelFiles& models() {
  // Owned by a static (not leaked) so that its TempDir is removed when the test process exits.
  static const std::unique_ptr<ModelFiles> m = [] {
    auto f = std::make_unique<ModelFiles>();
    kernels::ThreadPool pool(2);
    // Writes `s` (Q8_0, the stories260K vocabulary) as f->path[name].
    const auto write = [&](const std::string& name, model::SynthShape s, uint64_t seed) {
      s.vocab = 0;
      auto w = model::synth_model(s, gguf::GgmlType::kQ8_0, seed, kVocab,
                                  testing::stories260k_tokenizer_keys(), pool);
      EXPECT_TRUE(w.ok()) << w.status().to_string();
      f->path[name] = f->dir / (name + ".gguf");
      if (w.ok()) {
        EXPECT_TRUE(w->write(f->path[name]).ok());
      }
    };
    for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe"}) {
      write(preset, *model::find_synth_preset(preset), 31);
    }
    // A constructed file whose MTP head drafts what the target says (docs/qwen35.md: the
    // residual writers damped, the head computing the damped trunk's function of the token).
    model::SynthShape echo = *model::find_synth_preset("tiny-qwen35");
    echo.tied = false;
    echo.residual_damp = 0.002f;
    echo.mtp_echo = true;
    write("tiny-qwen35-echo", echo, 33);
    // A dense draft model of the same vocabulary (qwen3, 2 layers).
    write("draft",
          model::with_arch({.name = "draft", .dim = 128, .ffn = 256, .layers = 2, .heads = 4,
                            .kv_heads = 2, .context = 4096},
                           "qwen3"),
          32);
    return f;
  }();
  return *m;
}

// Wave 1: four prompts of 30-75 tokens; wave 2: prefixes of wave 1's with new tails, and one
// prompt again.
std::vector<std::vector<int32_t>> make_prompts() {
  std::mt19937_64 rng(35);
  std::vector<std::vector<int32_t>> p;
  for (int32_t len : {30, 45, 60, 75}) p.push_back(testing::random_prompt(rng, len, kVocab));
  for (size_t i = 0; i < 3; ++i) {
    std::vector<int32_t> q(p[i].begin(), p[i].begin() + 24);
    const std::vector<int32_t> tail = testing::random_prompt(rng, 9, kVocab);
    q.insert(q.end(), tail.begin(), tail.end());
    p.push_back(q);
  }
  p.push_back(p[3]);
  return p;
}

// Plain greedy on the runner: one sequence, the prompt in one step, then one token per step.
std::vector<int32_t> plain_greedy(const std::string& path, const std::vector<int32_t>& prompt) {
  auto runner = model::ModelRunner::load(path, {.num_blocks = 16, .num_threads = 2});
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  if (!runner.ok()) return {};
  model::SingleSequence seq(**runner, model::SingleSequence::contiguous_blocks(1, 15));
  std::vector<int32_t> out;
  auto logits = seq.append(prompt);
  while (logits.ok() && static_cast<int32_t>(out.size()) < kMaxTokens) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    out.push_back(next);
    logits = seq.append(std::span<const int32_t>(&next, 1));
  }
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  return out;
}

struct HybridRun {
  std::string preset = "tiny-qwen35";
  int32_t n = 1;  // > 1: n greedy samples per request (fork children)
  int32_t block_size = 16;
  int64_t num_kv_blocks = 0;  // 0: plenty
  int32_t chunk = 0;          // long_prefill_token_threshold
  int32_t budget = 256;       // max_num_batched_tokens
  int32_t max_num_seqs = 64;
  executor::SpecProposer proposer = executor::SpecProposer::kNone;
  int32_t k = 0;  // drafts per step (fixed)
  int32_t tree_budget = 0;  // > 0: token trees of at most this many nodes
  bool oracle = false;  // drafts from the OracleProposer below (in process)
  int32_t checkpoints = 8;  // --state-checkpoints (0: no prefix caching)
  bool seeded = false;  // temperature 0.8 with a seed per request instead of greedy
  const std::vector<std::vector<int32_t>>* oracle_want = nullptr;  // the oracle's text (null: greedy)
  // Set (with proposer kMtp): the MTP head's first draft after each committed sequence it
  // drafted for is recorded here (in process, whatever ARBOR_TEST_SHARDS says).
  std::map<std::vector<int32_t>, int32_t>* mtp_first = nullptr;
};

// The MTP head, recording the first token of each tree it drafts by the committed tokens.
class RecordingMtp final : public spec::Proposer {
 public:
  RecordingMtp(std::unique_ptr<executor::DraftModelProposer> inner,
               std::map<std::vector<int32_t>, int32_t>* first)
      : inner_(std::move(inner)), first_(first) {}
  std::string_view name() const override { return "recording mtp"; }
  Status propose(std::span<const spec::DraftRequest> requests,
                 std::vector<sampling::TokenTree>& out) override {
    ARBOR_RETURN_IF_ERROR(inner_->propose(requests, out));
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].max_depth == 0 || out[i].empty()) continue;
      const std::vector<int32_t> key(requests[i].token_ids.begin(), requests[i].token_ids.end());
      const auto [it, fresh] = first_->emplace(key, out[i].node(0).token_id);
      EXPECT_EQ(it->second, out[i].node(0).token_id) << "two first drafts after one sequence";
    }
    return ok_status();
  }
  void forget(spec::RequestId id, std::span<const int32_t> t, int32_t n) override {
    inner_->forget(id, t, n);
  }
  bool is_model() const override { return true; }
  bool reads_hidden() const override { return true; }
  void copy_block(int32_t src, int32_t dst) override { inner_->copy_block(src, dst); }
  double token_cost() const override { return inner_->token_cost(); }

 private:
  std::unique_ptr<executor::DraftModelProposer> inner_;
  std::map<std::vector<int32_t>, int32_t>* first_;
};

const std::vector<std::vector<int32_t>>& reference(const std::string& preset);

// Drafts the plain greedy continuation (the reference) with one token corrupted: the draft at
// depth (committed tokens % (k + 1)) is off by one, so the accepted counts cycle through 0 .. k
// and every rollback length is exercised. Asked for a tree, it adds a wrong sibling (with a
// child of its own where the budget allows) beside every node of that chain, before it at even
// depths and after it at odd ones, so the path runs through first, middle and last children.
// A model-free proposer as far as the engine knows.
class OracleProposer final : public spec::Proposer {
 public:
  // want: each prompt's continuation to draft (make_prompts order); null: the plain greedy one.
  OracleProposer(std::string preset, const std::vector<std::vector<int32_t>>* want)
      : preset_(std::move(preset)), want_(want) {}
  std::string_view name() const override { return "oracle"; }
  Status propose(std::span<const spec::DraftRequest> requests,
                 std::vector<sampling::TokenTree>& out) override;
  void forget(spec::RequestId, std::span<const int32_t>, int32_t) override {}

 private:
  std::string preset_;
  const std::vector<std::vector<int32_t>>* want_;
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // per request, per sample: [requests * n]
  int64_t preemptions = 0;
  int64_t hit_tokens = 0;
  int64_t accepted = 0;
  int64_t tree_steps = 0;
  int64_t checkpoint_hits = 0;
  int64_t checkpoint_saves = 0;
};

Outcome run(const HybridRun& r) {
  executor::ExecutorOptions cpu;
  cpu.block_size = r.block_size;
  cpu.num_kv_blocks = r.num_kv_blocks > 0 ? r.num_kv_blocks : 4096 / r.block_size + 2;
  cpu.num_threads = 2;
  cpu.max_num_seqs = r.max_num_seqs;
  cpu.state_checkpoints = r.checkpoints;
  cpu.proposer = r.proposer;
  cpu.tree_budget = r.tree_budget;
  cpu.tree_width = 3;
  if (r.proposer == executor::SpecProposer::kDraft) cpu.draft_model = models().path.at("draft");
  // The oracle's drafter is set on an in-process executor, whatever ARBOR_TEST_SHARDS says.
  Result<std::unique_ptr<step::ModelExecutor>> exec = [&]() -> decltype(exec) {
    if (r.mtp_first != nullptr) {
      ARBOR_ASSIGN_OR_RETURN(auto local,
                             executor::LocalExecutor::load(models().path.at(r.preset), cpu));
      ARBOR_ASSIGN_OR_RETURN(auto mtp, executor::DraftModelProposer::load_mtp(
                                           local->runner().model(), local->num_kv_blocks(),
                                           local->block_size(), local->runner().shared_pool()));
      mtp->set_tree_shape(3, {});
      local->set_drafter(std::make_unique<executor::Drafter>(
          std::make_unique<RecordingMtp>(std::move(mtp), r.mtp_first),
          executor::DrafterOptions{.tree_budget = r.tree_budget, .tree_width = 3}));
      return std::unique_ptr<step::ModelExecutor>(std::move(local));
    }
    if (!r.oracle) return testing::load_executor(models().path.at(r.preset), cpu);
    ARBOR_ASSIGN_OR_RETURN(auto local, executor::LocalExecutor::load(models().path.at(r.preset), cpu));
    local->set_drafter(std::make_unique<executor::Drafter>(
        std::make_unique<OracleProposer>(r.preset, r.oracle_want),
        executor::DrafterOptions{.tree_budget = r.tree_budget, .tree_width = 3}));
    return std::unique_ptr<step::ModelExecutor>(std::move(local));
  }();
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return {};
  EXPECT_EQ((*exec)->recurrent_state_slots(), r.max_num_seqs);
  EngineCoreConfig cfg;
  cfg.options.max_num_batched_tokens = r.budget;
  cfg.options.long_prefill_token_threshold = r.chunk;
  cfg.options.max_num_seqs = r.max_num_seqs;
  cfg.options.max_spec_tokens = r.k;
  cfg.eos_token_ids = std::vector<int32_t>{};  // run to max_tokens
  EngineCore engine(std::move(exec).value(), cfg);
  Outcome out;
  const std::vector<std::vector<int32_t>> prompts = make_prompts();
  for (size_t wave = 0; wave < 2; ++wave) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = wave * 4; i < wave * 4 + 4; ++i) {
      GenerateRequest g;
      g.prompt_token_ids = prompts[i];
      g.sampling.temperature = 0.0f;
      if (r.seeded) {
        g.sampling.temperature = 0.8f;
        g.sampling.seed = 100 + i;
      }
      g.n = r.n;
      g.max_tokens = kMaxTokens;
      if (r.k > 0) g.speculation = {.mode = sched::SpecMode::kFixed, .k = r.k};
      auto s = engine.submit(std::move(g));
      EXPECT_TRUE(s.ok()) << s.status().to_string();
      if (s.ok()) streams.push_back(*s);
    }
    for (auto& s : streams) {
      const testing::Collected c = testing::drain(*s, r.n);
      EXPECT_TRUE(c.final_event.error.ok()) << c.final_event.error.to_string();
      out.tokens.insert(out.tokens.end(), c.token_ids.begin(), c.token_ids.end());
    }
    engine.wait_idle();
  }
  const EngineMetricsSnapshot m = engine.metrics();
  out.preemptions = m.num_preemptions;
  out.hit_tokens = m.num_prefix_cache_hit_tokens;
  out.accepted = m.num_accepted_draft_tokens;
  out.tree_steps = m.num_tree_verify_steps;
  out.checkpoint_hits = m.num_state_checkpoint_hits;
  out.checkpoint_saves = m.num_state_checkpoint_saves;
  std::printf("%s: preemptions %lld, prefix hit tokens %lld, accepted drafts %lld\n",
              r.preset.c_str(), static_cast<long long>(out.preemptions),
              static_cast<long long>(out.hit_tokens), static_cast<long long>(out.accepted));
  return out;
}

const std::vector<std::vector<int32_t>>& reference(const std::string& preset) {
  static std::map<std::string, std::vector<std::vector<int32_t>>> cache;
  auto it = cache.find(preset);
  if (it == cache.end()) {
    std::vector<std::vector<int32_t>> want;
    for (const std::vector<int32_t>& p : make_prompts()) {
      want.push_back(plain_greedy(models().path.at(preset), p));
    }
    it = cache.emplace(preset, std::move(want)).first;
  }
  return it->second;
}

Status OracleProposer::propose(std::span<const spec::DraftRequest> requests,
                               std::vector<sampling::TokenTree>& out) {
  const std::vector<std::vector<int32_t>> prompts = make_prompts();
  const std::vector<std::vector<int32_t>>& want = want_ != nullptr ? *want_ : reference(preset_);
  out.assign(requests.size(), sampling::TokenTree());
  for (size_t i = 0; i < requests.size(); ++i) {
    const spec::DraftRequest& q = requests[i];
    for (size_t p = 0; p < prompts.size(); ++p) {
      const std::vector<int32_t>& prompt = prompts[p];
      if (static_cast<size_t>(q.num_prompt_tokens) != prompt.size() ||
          !std::equal(prompt.begin(), prompt.end(), q.token_ids.begin())) {
        continue;
      }
      const size_t done = q.token_ids.size() - prompt.size();
      std::vector<int32_t> chain;
      for (int32_t d = 0; d < q.max_depth && done + d < want[p].size(); ++d) {
        int32_t t = want[p][done + d];
        if (d == static_cast<int32_t>(q.token_ids.size() % (q.max_depth + 1))) t = (t + 1) % kVocab;
        chain.push_back(t);
      }
      if (q.max_nodes == 0) {
        out[i] = sampling::TokenTree::from_chain(chain);
        break;
      }
      sampling::TokenTree& t = out[i];
      const auto room = [&] { return t.num_nodes() < q.max_nodes; };
      int32_t parent = sampling::TokenTree::kRoot;
      for (size_t d = 0; d < chain.size() && room(); ++d) {
        const int32_t wrong = (chain[d] + 7) % kVocab;
        int32_t next = -1;
        if (d % 2 == 0) {
          const int32_t w = t.add_node(parent, wrong);
          if (room() && static_cast<int32_t>(d) + 2 <= q.max_depth) {
            t.add_node(w, (wrong + 1) % kVocab);
          }
          if (room()) next = t.add_node(parent, chain[d]);
        } else {
          next = t.add_node(parent, chain[d]);
          if (room()) t.add_node(parent, wrong);
        }
        if (next < 0) break;
        parent = next;
      }
      break;
    }
  }
  return ok_status();
}

void expect_plain(const HybridRun& r, const Outcome& o) {
  const std::vector<std::vector<int32_t>>& want = reference(r.preset);
  ASSERT_EQ(o.tokens.size(), want.size() * r.n);
  for (size_t i = 0; i < o.tokens.size(); ++i) {
    EXPECT_EQ(o.tokens[i], want[i / r.n]) << "request " << i / r.n << " sample " << i % r.n;
  }
  // Wave 2 continues wave 1's saved states (prompt 7, prompt 3 again, from its state at 64
  // tokens — 74 with blocks of 1 — and, with blocks of 16, prompt 4 from prompt 0's at 16),
  // unless a small pool evicted the blocks; none without checkpoints.
  if (r.checkpoints == 0) {
    EXPECT_EQ(o.hit_tokens, 0) << "prefix caching is off without state checkpoints";
  } else if (r.num_kv_blocks == 0) {
    EXPECT_GE(o.hit_tokens, r.block_size == 1 ? 74 : 16 + 64)
        << "wave 2 continues wave 1's saved states";
    EXPECT_GE(o.checkpoint_hits, r.block_size == 1 ? 1 : 2);
    EXPECT_GE(o.checkpoint_saves, 4);  // wave 1's prompts each saved theirs
  }
}

// The executor a test asks for (ARBOR_TEST_SHARDS): a TP group of two refuses these models.
bool tp_refuses() {
  if (testing::test_shards() <= 1) return false;
  executor::ExecutorOptions cpu;
  cpu.num_kv_blocks = 64;
  auto exec = testing::load_executor(models().path.at("tiny-qwen35"), cpu);
  EXPECT_FALSE(exec.ok());
  if (!exec.ok()) {
    EXPECT_NE(exec.status().message().find("Gated DeltaNet"), std::string::npos)
        << exec.status().to_string();
  }
  return true;
}

TEST(Hybrid, BatchedGreedyEqualsPlainGreedy) {
  if (tp_refuses()) return;
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe"}) {
    for (int32_t bs : {16, 1}) {
      SCOPED_TRACE(str_cat(preset, ", block size ", bs));
      const HybridRun r{.preset = preset, .block_size = bs};
      expect_plain(r, run(r));
      const HybridRun off{.preset = preset, .block_size = bs, .checkpoints = 0};
      expect_plain(off, run(off));
    }
  }
}

TEST(Hybrid, ChunkedPrefillAndPreemption) {
  if (tp_refuses()) return;
  const HybridRun chunked{.chunk = 7, .budget = 20};
  expect_plain(chunked, run(chunked));
  // A pool for about two requests at a time: four running ones preempt each other, and each
  // resumed request rebuilds its state from its first token.
  const HybridRun small{.num_kv_blocks = 14, .chunk = 16, .budget = 32};
  const Outcome o = run(small);
  expect_plain(small, o);
  EXPECT_GT(o.preemptions, 0);
}

// n = 3 greedy samples per request: the children continue the parent's prompt state (copied
// into slots of their own) and must each equal plain greedy. Few slots: the parent's slot goes
// to a child and the others copy from it.
TEST(Hybrid, ForkChildrenContinueTheParentsState) {
  if (tp_refuses()) return;
  const HybridRun r{.n = 3, .chunk = 11, .budget = 64, .max_num_seqs = 6};
  expect_plain(r, run(r));
}

// Drafts verified in scratch slots, the accepted ones replayed into the request's: n-gram chains
// and a dense draft model's (a random model's text gives them little to accept), then, in
// process, the oracle's chains (every accepted count from 0 to k, beside chunked prefill and
// preemption, and n > 1 forks).
TEST(Hybrid, SpeculationEqualsPlainGreedy) {
  if (tp_refuses()) return;
  using P = executor::SpecProposer;
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe"}) {
    SCOPED_TRACE(preset);
    const HybridRun ngram{.preset = preset, .proposer = P::kNgram, .k = 4};
    expect_plain(ngram, run(ngram));
    const HybridRun draft{.preset = preset, .block_size = 1, .proposer = P::kDraft, .k = 3};
    expect_plain(draft, run(draft));
    const HybridRun ngram_trees{.preset = preset, .proposer = P::kNgram, .k = 3,
                                .tree_budget = 6};
    expect_plain(ngram_trees, run(ngram_trees));
    const HybridRun draft_trees{.preset = preset, .proposer = P::kDraft, .k = 3,
                                .tree_budget = 6};
    expect_plain(draft_trees, run(draft_trees));
  }
}

TEST(Hybrid, EveryRollbackLengthEqualsPlainGreedy) {
  using P = executor::SpecProposer;
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe"}) {
    SCOPED_TRACE(preset);
    const HybridRun oracle{.preset = preset, .proposer = P::kNgram, .k = 4, .oracle = true};
    const Outcome o = run(oracle);
    expect_plain(oracle, o);
    // 8 requests x 24 tokens, each step accepting 0 .. 4 of 4: about 2 per step.
    EXPECT_GT(o.accepted, 8 * kMaxTokens / 4);
  }
  const HybridRun small{.num_kv_blocks = 14, .chunk = 16, .budget = 32, .proposer = P::kNgram,
                        .k = 3, .oracle = true};
  const Outcome o = run(small);
  expect_plain(small, o);
  EXPECT_GT(o.preemptions, 0);
  EXPECT_GT(o.accepted, 0);
  const HybridRun forks{.n = 3, .chunk = 11, .budget = 64, .max_num_seqs = 6,
                        .proposer = P::kNgram, .k = 3, .oracle = true};
  const Outcome f = run(forks);
  expect_plain(forks, f);
  EXPECT_GT(f.accepted, 0);
}

// Token trees: every node's state continues its parent's in a scratch slot of its own (the
// parent's last child in place), the accepted path replayed. The oracle's trees put the right
// path through first, middle and last children; with preemption and with forks too.
TEST(Hybrid, TokenTreesEqualPlainGreedy) {
  using P = executor::SpecProposer;
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe"}) {
    SCOPED_TRACE(preset);
    const HybridRun trees{.preset = preset, .proposer = P::kNgram, .k = 4, .tree_budget = 8,
                          .oracle = true};
    const Outcome o = run(trees);
    expect_plain(trees, o);
    EXPECT_GT(o.accepted, 8 * kMaxTokens / 4);
    EXPECT_GT(o.tree_steps, 0);
  }
  const HybridRun small{.block_size = 1, .num_kv_blocks = 210, .chunk = 16, .budget = 32,
                        .proposer = P::kNgram, .k = 3, .tree_budget = 7, .oracle = true};
  const Outcome o = run(small);
  expect_plain(small, o);
  EXPECT_GT(o.preemptions, 0);
  EXPECT_GT(o.accepted, 0);
  const HybridRun forks{.n = 3, .chunk = 11, .budget = 64, .max_num_seqs = 6,
                        .proposer = P::kNgram, .k = 3, .tree_budget = 6, .oracle = true};
  const Outcome f = run(forks);
  expect_plain(forks, f);
  EXPECT_GT(f.accepted, 0);
}

// The file's own MTP head as the proposer (--spec mtp): it keeps up with every request from the
// target's hidden rows, drafts chains and trees, and continues on prefix-cache hits, through
// chunked prefill, preemption and forks. On the random files it rarely agrees with the target;
// on the constructed echo file it mostly does, so accepted drafts' hidden rows feed it too.
TEST(Hybrid, MtpSpeculationEqualsPlainGreedy) {
  if (tp_refuses()) return;
  using P = executor::SpecProposer;
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe"}) {
    SCOPED_TRACE(preset);
    const HybridRun chains{.preset = preset, .proposer = P::kMtp, .k = 3};
    expect_plain(chains, run(chains));
    const HybridRun trees{.preset = preset, .proposer = P::kMtp, .k = 3, .tree_budget = 6};
    expect_plain(trees, run(trees));
  }
  const char* echo = "tiny-qwen35-echo";
  for (int32_t budget : {0, 8}) {
    SCOPED_TRACE(str_cat("echo, tree budget ", budget));
    const HybridRun r{.preset = echo, .proposer = P::kMtp, .k = 4, .tree_budget = budget};
    const Outcome o = run(r);
    expect_plain(r, o);
    // 8 requests x 24 tokens; the head agrees with the damped trunk most of the time.
    EXPECT_GT(o.accepted, 8 * kMaxTokens / 2);
    const HybridRun small{.preset = echo, .num_kv_blocks = 14, .chunk = 16, .budget = 32,
                          .proposer = P::kMtp, .k = 3, .tree_budget = budget};
    const Outcome s = run(small);
    expect_plain(small, s);
    EXPECT_GT(s.preemptions, 0);
    EXPECT_GT(s.accepted, 8 * kMaxTokens / 3);
  }
  const HybridRun chunked{.preset = echo, .block_size = 1, .chunk = 7, .budget = 20,
                          .proposer = P::kMtp, .k = 3};
  const Outcome c = run(chunked);
  expect_plain(chunked, c);
  EXPECT_GT(c.accepted, 8 * kMaxTokens / 3);
  const HybridRun forks{.preset = echo, .n = 3, .chunk = 11, .budget = 64, .max_num_seqs = 6,
                        .proposer = P::kMtp, .k = 3};
  const Outcome f = run(forks);
  expect_plain(forks, f);
  EXPECT_GT(f.accepted, 0);
}

// What the MTP head must draft first after each prefix of `seq` (greedy): the argmax of its row
// at position N - 1, that row reading token N - 1 and the target's hidden row at N - 2 — both
// computed here by plain forwards over the whole sequence, apart from the proposer's
// bookkeeping. [seq.size()]: index N - 1.
std::vector<int32_t> mtp_expected_first(const std::string& path, const std::vector<int32_t>& seq) {
  auto target = model::ModelRunner::load(path, {.num_blocks = 16, .num_threads = 2,
                                                .load_mtp = true});
  EXPECT_TRUE(target.ok()) << target.status().to_string();
  if (!target.ok()) return {};
  const auto n = static_cast<int32_t>(seq.size());
  const int32_t dim = (*target)->config().dim;
  const std::vector<int32_t> blocks = model::SingleSequence::contiguous_blocks(1, 15);
  model::BatchBuilder b(16);
  b.add({.block_table = blocks, .tokens = seq, .logits = model::LogitsMode::kNone,
         .hidden_begin = 0, .hidden_end = n, .state_slot = 0});
  std::vector<float> hidden(static_cast<size_t>(n) * dim);
  EXPECT_TRUE((*target)->forward(b.batch(), model::LogitsOut{.hidden = hidden.data()}).ok());
  auto head_model = (*target)->model().mtp_model();
  EXPECT_TRUE(head_model.ok()) << head_model.status().to_string();
  auto head = model::ModelRunner::create(std::move(head_model).value(),
                                         {.num_blocks = 16, .pool = (*target)->shared_pool()});
  EXPECT_TRUE(head.ok()) << head.status().to_string();
  std::vector<float> shifted(static_cast<size_t>(n) * dim, 0.0f);  // row p: the target's p - 1
  std::copy(hidden.begin(), hidden.end() - dim, shifted.begin() + dim);
  model::BatchBuilder hb(16);
  hb.add({.block_table = blocks, .tokens = seq, .logits = model::LogitsMode::kAll,
          .input_hidden = shifted});
  const int32_t vocab = (*head)->config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(n) * vocab);
  EXPECT_TRUE((*head)->forward(hb.batch(), logits.data()).ok());
  std::vector<int32_t> first(static_cast<size_t>(n));
  for (int32_t p = 0; p < n; ++p) {
    const float* row = logits.data() + static_cast<size_t>(p) * vocab;
    first[static_cast<size_t>(p)] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  }
  return first;
}

// The MTP head's bookkeeping: whatever the schedule (one prompt step or chunks of 7, blocks of
// 16 or 1, preemption and recomputation, a continuation on a prefix-cache hit, chains or trees),
// its first draft after every committed sequence is the one plain forwards give (on the random
// file, where the head's output depends on the target's hidden rows).
TEST(Hybrid, MtpDraftsReadTheTargetsHiddenRows) {
  if (tp_refuses()) return;
  using P = executor::SpecProposer;
  const std::string preset = "tiny-qwen35";
  const std::vector<std::vector<int32_t>> prompts = make_prompts();
  const std::vector<std::vector<int32_t>>& want = reference(preset);
  std::vector<std::vector<int32_t>> expected;  // per prompt, per N - 1
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> seq = prompts[i];
    seq.insert(seq.end(), want[i].begin(), want[i].end());
    expected.push_back(mtp_expected_first(models().path.at(preset), seq));
  }
  const HybridRun runs[] = {
      {.preset = preset, .proposer = P::kMtp, .k = 3},
      {.preset = preset, .block_size = 1, .chunk = 7, .budget = 20, .proposer = P::kMtp, .k = 3},
      {.preset = preset, .num_kv_blocks = 14, .chunk = 16, .budget = 32, .proposer = P::kMtp,
       .k = 3},
      {.preset = preset, .proposer = P::kMtp, .k = 3, .tree_budget = 6},
  };
  for (const HybridRun& base : runs) {
    std::map<std::vector<int32_t>, int32_t> first;
    HybridRun r = base;
    r.mtp_first = &first;
    const Outcome o = run(r);
    expect_plain(r, o);
    int64_t checked = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int32_t> seq = prompts[i];
      for (size_t t = 0; t < want[i].size(); ++t) {
        seq.push_back(want[i][t]);
        const auto it = first.find(seq);
        if (it == first.end()) continue;
        ++checked;
        EXPECT_EQ(it->second, expected[i][seq.size() - 1])
            << "prompt " << i << " after " << seq.size() << " tokens, block size "
            << r.block_size << ", chunk " << r.chunk << ", tree budget " << r.tree_budget;
      }
    }
    // Drafts after most of the 8 x 24 committed sequences (the last token's is never asked).
    EXPECT_GT(checked, 8 * (kMaxTokens - 6));
    if (r.num_kv_blocks == 14) EXPECT_GT(o.preemptions, 0);
  }
}

// Seeded sampling (temperature 0.8, a seed per request): draws come from Rng::at(seed, position),
// and drafts are verified by sample-and-compare, so the tokens with speculation (n-gram chains,
// draft-model trees, the oracle's chains and trees), prefix hits and preemption equal those of
// the same requests without speculation.
TEST(Hybrid, SeededSamplingWithSpeculationEqualsWithout) {
  if (tp_refuses()) return;
  using P = executor::SpecProposer;
  const Outcome plain = run(HybridRun{.seeded = true});
  ASSERT_EQ(plain.tokens.size(), 8u);
  EXPECT_NE(plain.tokens[0], reference("tiny-qwen35")[0]);  // sampled: not the greedy text
  const HybridRun runs[] = {
      {.proposer = P::kNgram, .k = 4, .seeded = true},
      {.proposer = P::kDraft, .k = 3, .tree_budget = 6, .seeded = true},
      {.num_kv_blocks = 14, .chunk = 16, .budget = 32, .proposer = P::kNgram, .k = 3,
       .seeded = true},
      {.proposer = P::kMtp, .k = 3, .seeded = true},
      {.proposer = P::kMtp, .k = 3, .tree_budget = 6, .seeded = true},
  };
  for (const HybridRun& r : runs) {
    const Outcome o = run(r);
    EXPECT_EQ(o.tokens, plain.tokens) << "k " << r.k << ", tree budget " << r.tree_budget;
  }
  // The oracle drafting the seeded text itself (one token wrong per chain, right paths through
  // every child position of its trees): drafts accepted, rolled back at every length.
  for (int32_t budget : {0, 8}) {
    const HybridRun r{.proposer = P::kNgram, .k = 4, .tree_budget = budget, .oracle = true,
                      .seeded = true, .oracle_want = &plain.tokens};
    const Outcome o = run(r);
    EXPECT_EQ(o.tokens, plain.tokens) << "tree budget " << budget;
    EXPECT_GT(o.accepted, 8 * kMaxTokens / 4);
  }
}

// Counts of the token sampled at each of the first `len` positions over `n` unseeded
// temperature-1 requests from BOS: [len][vocab]; with speculation, a dense draft model's chains
// or trees verified by the model rule through the scratch state slots.
// min_accepted: drafts that must have been accepted (chains drawn from the draft model's q and
// accepted by min(1, p/q): ~7,600 of 4,096 x 6 tokens; one-hot top-k trees accepted by
// sample-and-compare, i.e. with the target's probability of the draft: ~100).
// mtp: the file's MTP head drafts instead (on the echo file, whose head agrees with it).
std::vector<std::vector<int64_t>> token_counts(bool spec, int32_t tree_budget, int32_t n,
                                               int32_t len, int64_t min_accepted = 0,
                                               const std::string& preset = "tiny-qwen35",
                                               bool mtp = false) {
  executor::ExecutorOptions cpu;
  cpu.num_kv_blocks = 1024;
  cpu.num_threads = 2;
  cpu.max_num_seqs = 64;
  if (spec) {
    cpu.proposer = mtp ? executor::SpecProposer::kMtp : executor::SpecProposer::kDraft;
    if (!mtp) cpu.draft_model = models().path.at("draft");
    cpu.tree_budget = tree_budget;
    cpu.tree_width = 3;
  }
  auto exec = testing::load_executor(models().path.at(preset), cpu);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return {};
  EngineCoreConfig cfg;
  cfg.options.max_spec_tokens = spec ? 3 : 0;
  cfg.eos_token_ids = std::vector<int32_t>{};
  EngineCore engine(std::move(exec).value(), cfg);
  const auto counts = testing::sampled_token_counts(engine, n, len, kVocab, spec);
  const EngineMetricsSnapshot m = engine.metrics();
  std::printf("tree budget %d: %lld drafts accepted\n", tree_budget,
              static_cast<long long>(m.num_accepted_draft_tokens));
  EXPECT_GE(m.num_accepted_draft_tokens, min_accepted) << "drafts were accepted";
  return counts;
}

// Unseeded temperature-1 sampling: the target's distribution at each position, with the state
// rolled back after every rejection (chains and trees), by a two-sample chi-square.
TEST(Hybrid, UnseededDistributionIsTheTargets) {
  if (tp_refuses()) return;
  constexpr int32_t kN = 4096, kLen = 6;
  const auto plain = token_counts(false, 0, kN, kLen);
  testing::expect_same_distribution(plain, token_counts(true, 0, kN, kLen, kN), kLen);
  testing::expect_same_distribution(plain, token_counts(true, 6, kN, kLen, 32), kLen);
  // The MTP head's chains drawn from its q (the model rule), on the file where it agrees.
  const auto echo_plain = token_counts(false, 0, kN, kLen, 0, "tiny-qwen35-echo");
  testing::expect_same_distribution(
      echo_plain, token_counts(true, 0, kN, kLen, kN, "tiny-qwen35-echo", /*mtp=*/true), kLen);
}

}  // namespace
}  // namespace arbor::engine
