// Prompt logprobs over the real CPU executor and stories260K: against a naive reference (one
// forward over the whole prompt, log_softmax / rank / top-n in double), bit-identical whatever the
// chunking and the batch, consistent with the logprobs reported while generating, with prefix
// caching on, and under preemption. Also max_tokens 0: nothing sampled, every block returned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "executor_under_test.h"
#include "batched_equals_alone.h"

namespace arbor::engine {
namespace {

using testing::drain;
using Entries = std::vector<sampling::PromptLogprob>;

constexpr int32_t kVocab = 512;

struct Scored {
  Entries prompt;                            // [num_prompt - 1]
  std::vector<int32_t> tokens;               // generated
  std::vector<TokenLogprobs> logprobs;       // of the generated tokens
  std::optional<sched::FinishReason> finish;
};

// Drains one request's stream, collecting its prompt logprobs (exactly one event carries them
// when they were asked for, none otherwise).
Scored collect(RequestStream& stream, bool asked = true) {
  Scored s;
  int carriers = 0;
  while (std::optional<StreamEvent> e = stream.next()) {
    if (e->final) {
      EXPECT_TRUE(e->error.ok()) << e->error.to_string();
      break;
    }
    if (e->prompt_logprobs != nullptr) {
      ++carriers;
      s.prompt = *e->prompt_logprobs;
    }
    s.tokens.insert(s.tokens.end(), e->token_ids.begin(), e->token_ids.end());
    s.logprobs.insert(s.logprobs.end(), e->logprobs.begin(), e->logprobs.end());
    if (e->finish_reason()) s.finish = e->finish_reason();
  }
  EXPECT_EQ(carriers, asked ? 1 : 0);
  return s;
}

std::unique_ptr<EngineCore> make_engine(int32_t budget, int64_t blocks = 256,
                                        bool prefix_caching = true) {
  testing::RunOptions o = testing::alone_options(budget, blocks);
  o.engine.enable_prefix_caching = prefix_caching;
  auto exec = ::arbor::engine::testing::load_executor(testing::stories260k_path(), o.cpu);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  EngineCoreConfig cfg;
  cfg.options = o.engine;
  cfg.eos_token_ids = std::vector<int32_t>{};
  return std::make_unique<EngineCore>(std::move(*exec), cfg);
}

GenerateRequest scoring_request(std::vector<int32_t> prompt, int32_t top, int32_t max_tokens = 0) {
  GenerateRequest r;
  r.prompt_token_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.prompt_logprobs = top;
  r.max_tokens = max_tokens;
  return r;
}

Scored run_one(EngineCore& engine, GenerateRequest r) {
  const bool asked = r.sampling.prompt_logprobs.has_value();
  auto s = engine.submit(std::move(r));
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return collect(**s, asked);
}

// Bitwise equality of two scorings (floats compared by their bits: "exactly identical").
void expect_identical(const Entries& a, const Entries& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].token_id, b[i].token_id) << what << " position " << i + 1;
    EXPECT_EQ(std::memcmp(&a[i].logprob, &b[i].logprob, sizeof(float)), 0)
        << what << " position " << i + 1 << ": " << a[i].logprob << " vs " << b[i].logprob;
    EXPECT_EQ(a[i].rank, b[i].rank) << what << " position " << i + 1;
    ASSERT_EQ(a[i].top.size(), b[i].top.size()) << what;
    for (size_t j = 0; j < a[i].top.size(); ++j) {
      EXPECT_EQ(a[i].top[j].token_id, b[i].top[j].token_id) << what << " position " << i + 1;
      EXPECT_EQ(std::memcmp(&a[i].top[j].logprob, &b[i].top[j].logprob, sizeof(float)), 0)
          << what << " position " << i + 1 << " alternative " << j;
    }
  }
}

// The naive reference: every prompt row's logits from one forward over the whole prompt
// (SingleSequence, no scheduler or executor), log_softmax in double, rank = #{logit >= the
// token's}, the top n by a full sort (logprob desc, id asc).
Entries reference(const std::vector<int32_t>& prompt, int32_t top) {
  model::RunnerOptions ro;
  ro.num_blocks = 64;
  ro.num_threads = 1;
  auto runner = model::ModelRunner::load(testing::stories260k_path(), ro);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  model::SingleSequence seq(**runner, model::SingleSequence::contiguous_blocks(1, 63));
  auto all = seq.append_all_logits(prompt);
  EXPECT_TRUE(all.ok()) << all.status().to_string();
  Entries out;
  for (size_t p = 1; p < prompt.size(); ++p) {
    const float* row = all->data() + (p - 1) * kVocab;
    double mx = row[0];
    for (int32_t v = 0; v < kVocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    double sum = 0;
    for (int32_t v = 0; v < kVocab; ++v) sum += std::exp(row[v] - mx);
    const double lse = mx + std::log(sum);
    sampling::PromptLogprob e;
    e.token_id = prompt[p];
    e.logprob = static_cast<float>(row[prompt[p]] - lse);
    e.rank = static_cast<int32_t>(
        std::count_if(row, row + kVocab, [&](float x) { return x >= row[prompt[p]]; }));
    std::vector<int32_t> ids(kVocab);
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (int32_t j = 0; j < top; ++j) {
      e.top.push_back({.token_id = ids[j], .logprob = static_cast<float>(row[ids[j]] - lse)});
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<int32_t> prompt_of(uint64_t seed, int32_t length) {
  std::mt19937_64 rng(seed);
  return testing::random_prompt(rng, length, kVocab);
}

TEST(PromptLogprobs, MatchesTheNaiveReferenceAndMaxTokensZeroSamplesNothing) {
  const std::vector<int32_t> prompt = prompt_of(11, 57);
  auto engine = make_engine(2048);
  const int32_t free_at_start = engine->num_free_blocks();
  const Scored s = run_one(*engine, scoring_request(prompt, 5));
  EXPECT_TRUE(s.tokens.empty());
  EXPECT_EQ(s.finish, sched::FinishReason::kLength);
  const Entries ref = reference(prompt, 5);
  ASSERT_EQ(s.prompt.size(), prompt.size() - 1);
  for (size_t i = 0; i < ref.size(); ++i) {
    SCOPED_TRACE(str_cat("position ", i + 1));
    EXPECT_EQ(s.prompt[i].token_id, prompt[i + 1]);
    // Float exp summed in double vs double throughout: ~1e-7 apart on logprobs of order 1..10.
    EXPECT_NEAR(s.prompt[i].logprob, ref[i].logprob, 2e-5);
    EXPECT_EQ(s.prompt[i].rank, ref[i].rank);
    ASSERT_EQ(s.prompt[i].top.size(), 5u);
    for (size_t j = 0; j < 5; ++j) {
      EXPECT_EQ(s.prompt[i].top[j].token_id, ref[i].top[j].token_id);
      EXPECT_NEAR(s.prompt[i].top[j].logprob, ref[i].top[j].logprob, 2e-5);
    }
  }
  engine->wait_idle();
  EXPECT_EQ(engine->num_free_blocks(), free_at_start);
  EXPECT_EQ(engine->metrics().num_generation_tokens, 0);
}

// Budgets 1, 3, 7 and the whole prompt cut it into different chunks; with three generating
// requests beside it the rows sit in other batches. The scores must not change by one bit.
TEST(PromptLogprobs, IdenticalWhateverTheChunksAndTheBatch) {
  const std::vector<int32_t> prompt = prompt_of(12, 41);
  Entries whole;
  {
    auto engine = make_engine(2048);
    whole = run_one(*engine, scoring_request(prompt, 3)).prompt;
  }
  ASSERT_EQ(whole.size(), prompt.size() - 1);
  for (int32_t budget : {1, 3, 7}) {
    auto engine = make_engine(budget);
    expect_identical(run_one(*engine, scoring_request(prompt, 3)).prompt, whole,
                     str_cat("budget ", budget));
  }
  auto engine = make_engine(7);
  std::vector<std::shared_ptr<RequestStream>> others;
  std::vector<bool> asked;
  for (uint64_t i = 0; i < 3; ++i) {
    GenerateRequest g = scoring_request(prompt_of(100 + i, 9 + 5 * static_cast<int32_t>(i)), 1, 6);
    if (i == 1) g.sampling.prompt_logprobs.reset();
    asked.push_back(g.sampling.prompt_logprobs.has_value());
    others.push_back(*engine->submit(std::move(g)));
  }
  auto mine = engine->submit(scoring_request(prompt, 3, 4));
  ASSERT_TRUE(mine.ok());
  const Scored batched = collect(**mine);
  expect_identical(batched.prompt, whole, "batched with 3 generating requests, budget 7");
  EXPECT_EQ(batched.tokens.size(), 4u);
  for (size_t i = 0; i < others.size(); ++i) collect(*others[i], asked[i]);
}

// Scoring prompt + its greedy continuation gives the continuation's tokens exactly the logprobs
// reported while generating them: the same rows (our kernels are batch-invariant, so a row does
// not depend on the rows computed with it) through the same log_softmax code, so bit-equal.
TEST(PromptLogprobs, EchoScoringEqualsTheLogprobsOfGeneration) {
  const std::vector<int32_t> prompt = prompt_of(13, 23);
  auto engine = make_engine(16);
  GenerateRequest gen = scoring_request(prompt, 2, 12);
  gen.sampling.prompt_logprobs.reset();
  gen.sampling.logprobs = 2;
  const Scored g = run_one(*engine, std::move(gen));
  ASSERT_EQ(g.tokens.size(), 12u);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), g.tokens.begin(), g.tokens.end());
  const Scored s = run_one(*engine, scoring_request(full, 2));
  ASSERT_EQ(s.prompt.size(), full.size() - 1);
  for (size_t i = 0; i < g.tokens.size(); ++i) {
    const sampling::PromptLogprob& e = s.prompt[prompt.size() - 1 + i];
    EXPECT_EQ(e.token_id, g.tokens[i]);
    EXPECT_EQ(e.logprob, g.logprobs[i].logprob) << "generated token " << i;
    EXPECT_EQ(e.rank, 1) << "a greedy token is the most likely";
    ASSERT_EQ(e.top.size(), 2u);
    EXPECT_EQ(e.top[0].token_id, g.logprobs[i].top[0].token_id);
    EXPECT_EQ(e.top[1].logprob, g.logprobs[i].top[1].logprob);
  }
}

TEST(PromptLogprobs, PrefixCachingStillScoresEveryPosition) {
  const std::vector<int32_t> prompt = prompt_of(14, 70);
  auto engine = make_engine(2048);
  const Scored first = run_one(*engine, scoring_request(prompt, 1, 1));
  const Scored again = run_one(*engine, scoring_request(prompt, 1, 1));
  expect_identical(again.prompt, first.prompt, "second identical request");
  // A third one without prompt logprobs does hit the cache (the blocks are there).
  GenerateRequest plain = scoring_request(prompt, 1, 1);
  plain.sampling.prompt_logprobs.reset();
  auto s = engine->submit(std::move(plain));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(drain(**s).final_event.usage.cached_tokens, 64);
}

// A pool of 12 blocks of 16 for eight requests of up to 120 tokens: requests are preempted,
// some mid-prefill, and recomputed. Each still gets every position once, equal to its score alone.
TEST(PromptLogprobs, PreemptionNeitherRepeatsNorLosesAPosition) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Entries> alone;
  {
    auto engine = make_engine(2048);
    for (uint64_t i = 0; i < 8; ++i) {
      prompts.push_back(prompt_of(200 + i, 20 + 11 * static_cast<int32_t>(i)));
      alone.push_back(run_one(*engine, scoring_request(prompts.back(), 2)).prompt);
    }
  }
  auto engine = make_engine(24, 12);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) {
    auto s = engine->submit(scoring_request(p, 2, 40));
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const Scored s = collect(*streams[i]);
    expect_identical(s.prompt, alone[i], str_cat("request ", i));
    EXPECT_EQ(s.tokens.size(), 40u);
  }
  engine->wait_idle();
  EXPECT_GT(engine->metrics().num_preemptions, 0);
}

}  // namespace
}  // namespace arbor::engine
