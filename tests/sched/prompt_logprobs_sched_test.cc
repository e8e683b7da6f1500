// The scheduler's side of prompt logprobs and max_tokens 0: which positions each step asks the
// executor to score (exactly once each, in order, whatever the chunking, prefix hits and
// preemptions), and requests that only score their prompt.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "sched_harness.h"

namespace arbor::sched {
namespace {

using testing::alone_tokens;
using testing::Harness;
using testing::iota_prompt;
using testing::kopts;
using Table = std::vector<std::string>;

SchedulerOptions sopts(int32_t budget, int32_t max_seqs = 8) {
  SchedulerOptions o;
  o.max_num_batched_tokens = budget;
  o.max_num_seqs = max_seqs;
  return o;
}

std::vector<int64_t> positions(int64_t num_prompt) {
  std::vector<int64_t> v(static_cast<size_t>(num_prompt - 1));
  std::iota(v.begin(), v.end(), 1);
  return v;
}

TEST(PromptLogprobsSched, ChunksScoreTheNextChunksFirstTokenAndMaxTokensZeroSamplesNothing) {
  Harness h(sopts(3), kopts(16));
  h.prompt_logprobs = 2;
  ASSERT_TRUE(h.add("A", iota_prompt(10), 0).ok());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  Table table;
  while (h.sched.has_unfinished_requests()) {
    SchedulerOutput out = h.sched.schedule();
    ASSERT_EQ(out.requests.size(), 1u);
    EXPECT_FALSE(out.requests[0].sample);
    ranges.emplace_back(out.requests[0].prompt_logprobs_begin, out.requests[0].prompt_logprobs_end);
    Result<std::vector<RequestOutput>> outs = h.sched.update_from_output(out, h.model.execute(out));
    ASSERT_TRUE(outs.ok()) << outs.status().to_string();
    ASSERT_EQ(outs->size(), 1u);
    EXPECT_TRUE((*outs)[0].new_tokens.empty());
    if ((*outs)[0].stop_reason) {
      EXPECT_EQ((*outs)[0].stop_reason->kind, StopKind::kMaxTokens);
      table.push_back("done");
    }
  }
  // Rows [0,3) score positions 1..3, rows [3,6) 4..6, [6,9) 7..9, row 9 nothing (no position 10).
  EXPECT_EQ(ranges, (std::vector<std::pair<int64_t, int64_t>>{{1, 4}, {4, 7}, {7, 10}, {0, 0}}));
  EXPECT_EQ(table, Table{"done"});
  EXPECT_EQ(h.kv.num_free_blocks(), 15);
}

TEST(PromptLogprobsSched, SamplingStepScoresTheLastPromptTokenAlongside) {
  Harness h(sopts(64), kopts(16));
  h.prompt_logprobs = 0;
  ASSERT_TRUE(h.add("A", iota_prompt(6), 2).ok());
  EXPECT_EQ(h.run(), (Table{"A:6", "A:1 done:A"}));
  EXPECT_EQ(h.prompt_positions["A"], positions(6));
  EXPECT_EQ(h.tokens["A"], alone_tokens(iota_prompt(6), 2));
}

TEST(PromptLogprobsSched, MaxTokensZeroIsRefusedWithSeveralSamples) {
  RequestSpec spec;
  spec.request_id = 1;
  spec.prompt_token_ids = iota_prompt(6);
  spec.stop.max_tokens = 0;
  EXPECT_TRUE(validate_request_spec(spec, 100).ok());
  spec.n = 2;
  const Status st = validate_request_spec(spec, 100);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("max_tokens is 0"), std::string::npos) << st.message();
}

TEST(PromptLogprobsSched, PrefixHitsStopBeforeTheFirstPositionToScore) {
  Harness h(sopts(64), kopts(64));
  ASSERT_TRUE(h.add("A", iota_prompt(12), 1).ok());
  EXPECT_EQ(h.run(), (Table{"A:12 done:A"}));
  // B has A's prompt and asks prompt logprobs: no cached block is used, every position scored.
  h.prompt_logprobs = 1;
  ASSERT_TRUE(h.add("B", iota_prompt(12), 1).ok());
  EXPECT_EQ(h.run(), (Table{"B:12 done:B"}));
  EXPECT_EQ(h.last_outputs[0].num_cached_tokens, 0);
  EXPECT_EQ(h.prompt_positions["B"], positions(12));
  // Without prompt logprobs the same prompt hits 2 blocks.
  h.prompt_logprobs.reset();
  ASSERT_TRUE(h.add("C", iota_prompt(12), 1).ok());
  EXPECT_EQ(h.run(), (Table{"C:4 done:C"}));
}

TEST(PromptLogprobsSched, ForkParentScoresThePromptOnceForAllSamples) {
  Harness h(sopts(64), kopts(64));
  h.prompt_logprobs = 3;
  ASSERT_TRUE(h.add("A", iota_prompt(9), 2, 0, /*best_of=*/3).ok());
  h.run();
  EXPECT_EQ(h.prompt_positions["A"], positions(9));
  for (const auto& [name, p] : h.prompt_positions) {
    if (name != "A") ADD_FAILURE() << name << " scored " << p.size() << " prompt positions";
  }
}

TEST(PromptLogprobsSched, MalformedPromptLogprobsAreErrorsThatChangeNothing) {
  SchedulerOptions o = sopts(4);
  o.vocab_size = 100;
  Harness h(o, kopts(16));
  h.prompt_logprobs = 2;
  ASSERT_TRUE(h.add("A", iota_prompt(10), 1).ok());
  h.prompt_logprobs.reset();
  ASSERT_TRUE(h.add("B", iota_prompt(3, 50), 1).ok());
  h.step();  // A:4, positions 1..4
  const SchedulerOutput out = h.sched.schedule();  // A:4 (positions 5..8)
  ASSERT_EQ(out.requests.size(), 1u);
  ASSERT_EQ(out.requests[0].prompt_logprobs_begin, 5);
  const StepResult good = h.model.execute(out);
  const Request* a = h.sched.find(h.id("A"));
  auto expect_error = [&](StepResult bad, const std::string& what) {
    Result<std::vector<RequestOutput>> r = h.sched.update_from_output(out, bad);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kInternal) << what;
    EXPECT_EQ(a->next_prompt_logprob, 5) << what;
    EXPECT_EQ(a->num_computed_tokens, 4) << what;
  };
  StepResult bad = good;
  bad.prompt_logprobs.clear();
  expect_error(bad, "missing");
  bad = good;
  bad.prompt_logprobs.push_back(good.prompt_logprobs[0]);
  expect_error(bad, "twice");
  bad = good;
  bad.prompt_logprobs[0].request_id = h.id("B");
  expect_error(bad, "for a request that asked none");
  bad = good;
  bad.prompt_logprobs[0].first_position = 4;
  expect_error(bad, "shifted");
  bad = good;
  bad.prompt_logprobs[0].entries.pop_back();
  expect_error(bad, "one short");
  bad = good;
  bad.prompt_logprobs[0].entries[1].rank = 0;
  expect_error(bad, "rank 0");
  bad = good;
  bad.prompt_logprobs[0].entries[2].token_id = 100;
  expect_error(bad, "token outside the vocabulary");
  bad = good;
  bad.prompt_logprobs[0].entries[0].top.push_back({.token_id = -1, .logprob = -1.0f});
  expect_error(bad, "alternative outside the vocabulary");
  ASSERT_TRUE(h.sched.update_from_output(out, good).ok());
  EXPECT_EQ(a->next_prompt_logprob, 9);
}

// Seeded configurations of pool size and token budget, several requests asking prompt logprobs:
// whatever preempts (mid-prefill or mid-generation) and recomputes, each request gets positions
// 1 .. P-1 exactly once, in order, and the tokens it generates alone.
TEST(PromptLogprobsSched, PreemptionNeverRepeatsNorSkipsAPosition) {
  int64_t preemptions = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    const int32_t budget = 2 + static_cast<int32_t>(rng() % 12);
    const int32_t blocks = 8 + static_cast<int32_t>(rng() % 4);
    Harness h(sopts(budget), kopts(blocks));
    h.prompt_logprobs = 1;
    std::map<std::string, std::pair<std::vector<int32_t>, int32_t>> asked;
    for (int i = 0; i < 3; ++i) {
      const std::string name(1, static_cast<char>('A' + i));
      std::vector<int32_t> prompt = iota_prompt(3 + static_cast<int32_t>(rng() % 10),
                                                3 + 7 * i + static_cast<int32_t>(rng() % 5));
      const int32_t max_tokens = static_cast<int32_t>(rng() % 16);
      ASSERT_TRUE(h.add(name, prompt, max_tokens).ok()) << "seed " << seed;
      asked[name] = {prompt, max_tokens};
    }
    h.run();
    ASSERT_FALSE(h.sched.has_unfinished_requests()) << "seed " << seed;
    preemptions += h.sched.stats().num_preemptions;
    for (const auto& [name, pm] : asked) {
      EXPECT_EQ(h.prompt_positions[name],
                positions(static_cast<int64_t>(pm.first.size())))
          << "seed " << seed << " request " << name;
      EXPECT_EQ(h.tokens[name], alone_tokens(pm.first, pm.second))
          << "seed " << seed << " request " << name;
    }
    EXPECT_EQ(h.kv.num_free_blocks(), blocks - 1) << "seed " << seed;
  }
  EXPECT_GT(preemptions, 10);  // the configurations do preempt
}

}  // namespace
}  // namespace arbor::sched
