// EngineCore with the fake executor: streaming, n / best_of, abort, admission, metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

#include "engine/engine_core.h"
#include "executor/fake_executor.h"
#include "engine_test_util.h"

namespace arbor::engine {
namespace {

using executor::FakeExecutor;
using executor::FakeExecutorOptions;

using testing::drain;

struct FakeEngine {
  explicit FakeEngine(EngineOptions o = {}, FakeExecutorOptions f = {}) : fopts(f) {
    EngineCoreConfig cfg;
    cfg.options = o;
    cfg.eos_token_ids = std::vector<int32_t>{2};
    engine = std::make_unique<EngineCore>(std::make_unique<FakeExecutor>(f), cfg);
  }
  std::shared_ptr<RequestStream> submit(GenerateRequest r) {
    auto s = engine->submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? *s : nullptr;
  }
  FakeExecutorOptions fopts;
  std::unique_ptr<EngineCore> engine;
};

GenerateRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerateRequest r;
  r.prompt_token_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  return r;
}

std::vector<int32_t> fake_alone(std::vector<int32_t> tokens, int32_t n,
                                const FakeExecutorOptions& o) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    out.push_back(fake_greedy_token(tokens, o));
    tokens.push_back(out.back());
  }
  return out;
}

TEST(EngineFake, StreamsOneEventPerTokenThenFinal) {
  FakeEngine fe;
  auto s = fe.submit(greedy({5, 6, 7}, 5));
  const testing::Collected c = drain(*s);
  EXPECT_EQ(c.token_ids[0], fake_alone({5, 6, 7}, 5, fe.fopts));
  EXPECT_EQ(c.finish[0], sched::FinishReason::kLength);
  EXPECT_EQ(c.num_events, 6);  // 5 token events (the last with the finish reason) + final
  EXPECT_EQ(c.final_event.usage.prompt_tokens, 3);
  EXPECT_EQ(c.final_event.usage.completion_tokens, 5);
}

TEST(EngineFake, StopTokenIdEndsTheSample) {
  FakeEngine fe;
  const std::vector<int32_t> expect = fake_alone({9, 9}, 6, fe.fopts);
  GenerateRequest r = greedy({9, 9}, 50);
  r.stop_token_ids = {expect[3]};
  const testing::Collected c = drain(*fe.submit(std::move(r)));
  // The stop id is the last token (as vLLM reports it); nothing after it.
  EXPECT_EQ(c.token_ids[0], std::vector<int32_t>(expect.begin(), expect.begin() + 4));
  EXPECT_EQ(c.finish[0], sched::FinishReason::kStop);
}

TEST(EngineFake, SeededParallelSamplingIsReproducible) {
  auto run = [] {
    FakeEngine fe;
    GenerateRequest r;
    r.prompt_token_ids = {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
    r.sampling.temperature = 0.8f;
    r.sampling.seed = 1234;
    r.n = 4;
    r.max_tokens = 12;
    return drain(*fe.submit(std::move(r)), 4).token_ids;
  };
  const auto a = run();
  const auto b = run();
  EXPECT_EQ(a, b);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i].size(), 12u);
  EXPECT_NE(a[0], a[1]);  // each sample has its own Rng stream
  EXPECT_NE(a[2], a[3]);
}

TEST(EngineFake, BestOfReturnsTheHighestCumulativeLogprobs) {
  FakeEngine fe;
  GenerateRequest r;
  r.prompt_token_ids = {3, 4, 5, 6, 7};
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 99;
  r.n = 2;
  r.best_of = 6;
  r.max_tokens = 8;
  const testing::Collected c = drain(*fe.submit(std::move(r)), 2);
  // Recompute every sample's cumulative logprob: the fake's logprob is -((t % 13) + 1) / 10.
  EXPECT_GE(c.cumulative_logprob[0], c.cumulative_logprob[1]);
  for (int i = 0; i < 2; ++i) {
    double sum = 0;
    for (int32_t t : c.token_ids[i]) sum += -static_cast<float>((t % 13) + 1) / 10.0f;
    EXPECT_NEAR(c.cumulative_logprob[i], sum, 1e-4);
  }
  EXPECT_EQ(c.final_event.usage.completion_tokens, 6 * 8);  // all best_of samples count
}

TEST(EngineFake, AbortReturnsEveryBlock) {
  FakeExecutorOptions f;
  f.block_size = 4;
  f.num_kv_blocks = 400;
  f.step_delay_us = 500;
  FakeEngine fe({}, f);
  const int32_t free_at_start = fe.engine->num_free_blocks();
  GenerateRequest r = greedy(std::vector<int32_t>(37, 8), 300);
  r.request_id = "victim";
  r.n = 4;
  r.sampling.temperature = 1.0f;
  auto s = fe.submit(std::move(r));
  auto other = fe.submit(greedy({4, 4, 4}, 300));
  // Wait for a few tokens, then abort mid-generation.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->next().has_value());
  for (int i = 0; i < 200 && fe.engine->num_free_blocks() == free_at_start; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_LT(fe.engine->num_free_blocks(), free_at_start);
  fe.engine->abort("victim");
  fe.engine->abort(other->request_id());
  const testing::Collected c = drain(*s, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.finish[i], sched::FinishReason::kAbort);
  drain(*other);
  fe.engine->wait_idle();
  // The engine publishes after the aborts are handled; poll the next publication.
  for (int i = 0; i < 100 && fe.engine->num_free_blocks() != free_at_start; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(fe.engine->num_free_blocks(), free_at_start);
  EXPECT_EQ(fe.engine->metrics().num_requests_aborted, 2);
}

TEST(EngineFake, AdmissionControlRejectsOverflowWithAClearError) {
  EngineOptions o;
  o.max_num_seqs = 1;
  o.max_waiting_requests = 2;
  FakeExecutorOptions f;
  f.step_delay_us = 20000;  // 100 ms per request: the 10 submissions outpace the engine
  FakeEngine fe(o, f);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 10; ++i) streams.push_back(fe.submit(greedy({5, 6}, 5)));
  int rejected = 0;
  int completed = 0;
  for (auto& s : streams) {
    const testing::Collected c = drain(*s);
    if (c.final_event.error.ok()) {
      ++completed;
      EXPECT_EQ(c.token_ids[0].size(), 5u);
    } else {
      ++rejected;
      EXPECT_EQ(c.final_event.error.code(), StatusCode::kResourceExhausted);
      EXPECT_NE(c.final_event.error.message().find("waiting queue is full"), std::string::npos);
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GE(completed, 2);  // at least the two that fit the waiting queue
  EXPECT_EQ(fe.engine->metrics().num_requests_rejected, rejected);
}

TEST(EngineFake, InvalidRequestsFailAtSubmit) {
  FakeEngine fe;
  EXPECT_EQ(fe.engine->submit(greedy({}, 5)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fe.engine->submit(greedy({600}, 5)).status().code(), StatusCode::kInvalidArgument);
  GenerateRequest r = greedy({5}, 5);
  r.stop = {"x"};  // no tokenizer
  EXPECT_EQ(fe.engine->submit(std::move(r)).status().code(), StatusCode::kInvalidArgument);
  // A duplicate id while the first is still running: 1 ms per step, so the first (aborted
  // afterwards) cannot finish before the second submit even on a busy machine.
  FakeExecutorOptions slow;
  slow.step_delay_us = 1000;
  FakeEngine fs({}, slow);
  GenerateRequest a = greedy({5}, 1000);
  a.request_id = "same";
  auto s = fs.submit(a);
  EXPECT_EQ(fs.engine->submit(a).status().code(), StatusCode::kInvalidArgument);
  fs.engine->abort("same");
  drain(*s);
}

TEST(EngineFake, MaxModelLenDefaultsToTheExecutorsAndIsCappedByTheKvPool) {
  FakeExecutorOptions f;
  f.context_length = 32;
  EXPECT_EQ(FakeEngine({}, f).engine->max_model_len(), 32);
  EngineOptions o;
  o.max_model_len = 20;
  EXPECT_EQ(FakeEngine(o, f).engine->max_model_len(), 20);
  FakeExecutorOptions small_pool;
  small_pool.num_kv_blocks = 5;  // 4 usable blocks of 16 tokens
  EXPECT_EQ(FakeEngine({}, small_pool).engine->max_model_len(), 64);
}

TEST(EngineFake, GenerationStopsWithLengthAtMaxModelLen) {
  FakeExecutorOptions f;
  f.context_length = 32;
  for (int64_t limit : {int64_t{0}, int64_t{20}}) {
    EngineOptions o;
    o.max_model_len = limit;
    FakeEngine fe(o, f);
    const int32_t free_at_start = fe.engine->num_free_blocks();
    const int64_t max_len = fe.engine->max_model_len();
    const testing::Collected c = drain(*fe.submit(greedy({5, 6, 7}, 100)));
    // Exactly max_model_len tokens: 3 prompt + the rest generated, as alone.
    const auto num_out = static_cast<int32_t>(max_len - 3);
    EXPECT_EQ(c.token_ids[0], fake_alone({5, 6, 7}, num_out, fe.fopts)) << "limit " << max_len;
    EXPECT_EQ(c.finish[0], sched::FinishReason::kLength);
    EXPECT_EQ(c.final_event.usage.completion_tokens, num_out);
    fe.engine->wait_idle();
    EXPECT_EQ(fe.engine->num_free_blocks(), free_at_start);
  }
}

TEST(EngineFake, PromptOfMaxModelLenIsRejectedAtSubmit) {
  FakeExecutorOptions f;
  f.context_length = 32;
  FakeEngine fe({}, f);
  const int32_t free_at_start = fe.engine->num_free_blocks();
  auto rejected = fe.engine->submit(greedy(std::vector<int32_t>(32, 9), 5));
  ASSERT_FALSE(rejected.ok());
  EXPECT_EQ(rejected.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rejected.status().message().find("prompt has 32 tokens, max_model_len is 32"),
            std::string::npos)
      << rejected.status().to_string();
  // One token shorter fits and generates exactly one token.
  const testing::Collected c = drain(*fe.submit(greedy(std::vector<int32_t>(31, 9), 5)));
  EXPECT_EQ(c.token_ids[0].size(), 1u);
  EXPECT_EQ(c.finish[0], sched::FinishReason::kLength);
  fe.engine->wait_idle();
  EXPECT_EQ(fe.engine->num_free_blocks(), free_at_start);
  EXPECT_EQ(fe.engine->metrics().num_requests_submitted, 1);
}

TEST(EngineFake, MetricsCountTokensAndLatencies) {
  FakeExecutorOptions f;
  f.step_delay_us = 200;
  FakeEngine fe({}, f);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 8; ++i) streams.push_back(fe.submit(greedy({5, 6, 7, 8}, 10)));
  for (auto& s : streams) drain(*s);
  fe.engine->wait_idle();
  const EngineMetricsSnapshot m = fe.engine->metrics();
  EXPECT_EQ(m.num_requests_finished, 8);
  EXPECT_EQ(m.num_prompt_tokens, 32);
  EXPECT_EQ(m.num_generation_tokens, 80);
  EXPECT_EQ(m.ttft_s.count(), 8u);
  EXPECT_EQ(m.e2e_s.count(), 8u);
  EXPECT_EQ(m.queue_time_s.count(), 8u);
  EXPECT_EQ(m.inter_token_s.count(), 72u);
  EXPECT_GT(m.inter_token_s.sum(), 0.0);
  uint64_t buckets = 0;
  for (uint64_t b : m.inter_token_s.counts()) buckets += b;
  EXPECT_EQ(buckets, 72u);
  EXPECT_EQ(m.batch_size.count(), static_cast<uint64_t>(m.num_steps));
  EXPECT_EQ(m.tokens_per_step.sum(), 32 + 80 - 8);  // the last token of each is never run
  EXPECT_EQ(m.kv_usage, 0.0);
}

}  // namespace
}  // namespace arbor::engine

namespace arbor::engine {
namespace {

// Everything a client sees of a request, run with and without speculation (the fake proposes
// drafts that are right up to `draft_correct` tokens): tokens, text, stop reasons, cumulative
// logprobs and usage must be equal; with speculation, drafts were verified.
struct SpecCase {
  GenerateRequest request;
  int32_t n = 1;
};

testing::Collected run_fake(const SpecCase& c, int32_t k, int32_t draft_correct,
                            const tokenizer::Tokenizer* tok, int64_t* drafts) {
  EngineCoreConfig cfg;
  cfg.tokenizer = tok;
  cfg.eos_token_ids = std::vector<int32_t>{2};
  cfg.options.max_spec_tokens = k;
  FakeExecutorOptions f;
  if (tok != nullptr) f.vocab_size = tok->vocab_size();
  f.draft_correct_prefix = k > 0 ? draft_correct : -1;
  f.min_token_id = 2;  // EOS (2) can come out
  EngineCore engine(std::make_unique<FakeExecutor>(f), cfg);
  auto s = engine.submit(c.request);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  if (!s.ok()) return {};
  testing::Collected out = testing::drain(**s, c.n);
  engine.wait_idle();
  *drafts = engine.metrics().num_draft_tokens;
  return out;
}

TEST(EngineFakeSpec, EverythingAClientSeesIsUnchanged) {
  auto tok = tokenizer::Tokenizer::from_file(testing::stories260k_path());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  std::vector<SpecCase> cases;
  for (int i = 0; i < 6; ++i) {
    SpecCase c;
    c.request.prompt_token_ids = {1, 400 + i, 300, 200 + i};
    c.request.max_tokens = 40 + 7 * i;
    c.request.sampling.temperature = i % 2 == 0 ? 0.0f : 1.0f;
    c.request.sampling.seed = 77 + i;
    c.request.sampling.logprobs = i % 3;
    if (i == 2 || i == 5) c.request.stop = {"e", "th"};  // stop strings end runs mid-step
    if (i >= 3) {
      c.n = 2;
      c.request.n = 2;
      c.request.best_of = i == 4 ? 4 : 2;  // best_of > n ranks by cumulative logprob
    }
    if (i == 1) c.request.ignore_eos = true;
    cases.push_back(c);
  }
  std::set<sched::StopKind> kinds;  // the cases must end samples in every way
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    int64_t plain_drafts = 0;
    const testing::Collected plain = run_fake(cases[ci], 0, 0, tok->get(), &plain_drafts);
    EXPECT_EQ(plain_drafts, 0);
    for (const auto& stop : plain.stop) {
      if (stop) kinds.insert(stop->kind);
    }
    for (int32_t k : {1, 3, 8}) {
      for (int32_t correct : {0, 2, 100}) {
        SCOPED_TRACE(str_cat("case ", ci, " k ", k, " correct ", correct));
        int64_t drafts = 0;
        const testing::Collected spec = run_fake(cases[ci], k, correct, tok->get(), &drafts);
        EXPECT_EQ(spec.token_ids, plain.token_ids);
        EXPECT_EQ(spec.text, plain.text);
        EXPECT_EQ(spec.stop, plain.stop);
        EXPECT_EQ(spec.cumulative_logprob, plain.cumulative_logprob);
        EXPECT_EQ(spec.final_event.usage.completion_tokens,
                  plain.final_event.usage.completion_tokens);
        EXPECT_GT(drafts, 0);
        EXPECT_EQ(spec.final_event.usage.draft_tokens > 0, true);
      }
    }
  }
  EXPECT_TRUE(kinds.contains(sched::StopKind::kStopString));
  EXPECT_TRUE(kinds.contains(sched::StopKind::kEos));
  EXPECT_TRUE(kinds.contains(sched::StopKind::kMaxTokens));
}

}  // namespace
}  // namespace arbor::engine

namespace arbor::engine {
namespace {

// Every sample's first event carries the whole prompt's logprobs (the fake's: token p, rank
// 1 + token % 7, its greedy token first among the alternatives), streamed (n = 3) or buffered
// (best_of 3 > n = 2); a fork parent's chunks arrive before any sample's first token.
TEST(EngineFake, EachSamplesFirstEventCarriesThePromptLogprobs) {
  EngineOptions o;
  o.max_num_batched_tokens = 4;  // the 11-token prompt in chunks
  for (const auto& [n, best_of] : {std::pair{3, 3}, std::pair{2, 3}, std::pair{1, 1}}) {
    FakeEngine fe(o);
    GenerateRequest r = greedy({5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, n == 1 ? 0 : 4);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 3;
    r.sampling.prompt_logprobs = 2;
    r.n = n;
    r.best_of = best_of;
    auto s = fe.submit(r);
    std::vector<int> carriers(static_cast<size_t>(n));
    while (std::optional<StreamEvent> e = s->next()) {
      if (e->final) break;
      if (e->prompt_logprobs == nullptr) continue;
      ++carriers[static_cast<size_t>(e->index)];
      const PromptLogprobs& lp = *e->prompt_logprobs;
      ASSERT_EQ(lp.size(), r.prompt_token_ids.size() - 1);
      for (size_t i = 0; i < lp.size(); ++i) {
        const int32_t token = r.prompt_token_ids[i + 1];
        EXPECT_EQ(lp[i].token_id, token);
        EXPECT_EQ(lp[i].rank, 1 + token % 7);
        ASSERT_EQ(lp[i].top.size(), 2u);
        EXPECT_EQ(lp[i].top[0].token_id,
                  executor::fake_greedy_token(
                      std::span<const int32_t>(r.prompt_token_ids).first(i + 1), fe.fopts));
      }
    }
    EXPECT_EQ(carriers, std::vector<int>(static_cast<size_t>(n), 1)) << "n " << n;
    fe.engine->wait_idle();
    EXPECT_EQ(fe.engine->num_free_blocks(), fe.fopts.num_kv_blocks - 1);
  }
}

}  // namespace
}  // namespace arbor::engine
