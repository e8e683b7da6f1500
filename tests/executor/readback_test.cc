// LogitsReadback decides what comes back of each row, rebuilds top-k rows, and fails a request
// whose row is not finite (naming the position and the runner's diagnosis); the prompt scorer
// asks for exactly the rows a prompt logprobs range needs.
#include "executor/readback.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "executor/prompt_scorer.h"

namespace arbor::executor {
namespace {

constexpr int32_t kRowVocab = 5;

step::NewRequestData new_request(step::RequestId id, float temperature, int32_t top_k,
                                 std::optional<int32_t> logprobs) {
  step::NewRequestData d{.request_id = id, .token_ids = {1, 2, 3}, .num_prompt_tokens = 3};
  d.sampling.temperature = temperature;
  d.sampling.top_k = top_k;
  d.sampling.logprobs = logprobs;
  return d;
}

step::ScheduledRequest scheduled(step::RequestId id, int32_t k) {
  step::ScheduledRequest s;
  s.request_id = id;
  s.num_computed_tokens = 2;
  s.num_scheduled_tokens = 1 + k;
  s.num_drafts = k;
  s.sample = true;
  return s;
}

TEST(LogitsReadback, DecidesEachRowOnceAndReadsItBack) {
  RequestStates states;
  step::SchedulerOutput out;
  out.new_requests = {new_request(1, 0.0f, 0, std::nullopt),  // greedy: argmax only
                      new_request(2, 0.0f, 0, 1),             // logprobs: whole rows
                      new_request(3, 0.8f, 2, std::nullopt)}; // top_k 2: candidates
  ASSERT_TRUE(states.apply(out).ok());
  out.requests = {scheduled(1, 1), scheduled(2, 0), scheduled(3, 0)};
  const std::vector<int32_t> rows{0, 2, 3}, prompt_rows{-1, -1, -1};
  LogitsReadback rb;
  rb.set_top_k_candidates(true);
  rb.plan(out, rows, prompt_rows, states, 4, kRowVocab);
  model::LogitsOut o = rb.out();
  ASSERT_EQ(o.want.size(), 4u);
  EXPECT_EQ(o.want[0], model::RowOut::kArgmax);
  EXPECT_EQ(o.want[1], model::RowOut::kArgmax);
  EXPECT_EQ(o.want[2], model::RowOut::kRow);
  EXPECT_EQ(o.want[3], model::RowOut::kTopK);
  EXPECT_EQ(o.top_k, 2);
  EXPECT_FLOAT_EQ(o.top_k_scale[3], 1.0f / 0.8f);
  // What a forward writes: argmax 4 and 0, a whole row, two candidates.
  o.argmax[0] = 4;
  o.argmax[1] = 0;
  for (int32_t t = 0; t < kRowVocab; ++t) o.logits[2 * kRowVocab + t] = static_cast<float>(t);
  o.top_ids[3 * 2] = 1;
  o.top_ids[3 * 2 + 1] = 3;
  o.top_logits[3 * 2] = 2.5f;
  o.top_logits[3 * 2 + 1] = 1.5f;
  const LogitsReadback::OriginFn origin = [](int32_t) { return std::string("layer 7"); };
  Result<RequestRows> a = rb.rows(out.requests[0], 0, origin);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->logits, nullptr);
  EXPECT_EQ(std::vector<int32_t>(a->argmax.begin(), a->argmax.end()), (std::vector<int32_t>{4, 0}));
  Result<RequestRows> whole = rb.rows(out.requests[1], 2, origin);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->logits[4], 4.0f);
  Result<RequestRows> top = rb.rows(out.requests[2], 3, origin);
  ASSERT_TRUE(top.ok());
  const float inf = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(std::vector<float>(top->logits, top->logits + kRowVocab),
            (std::vector<float>{inf, 2.5f, inf, 1.5f, inf}))
      << "the candidates in a row of -inf";
  EXPECT_EQ(rb.num_top_k_rows(), 1);
  // A non-finite row fails its request alone, naming the position and the diagnosis.
  o.logits[2 * kRowVocab + 1] = std::nanf("");
  Result<RequestRows> bad = rb.rows(out.requests[1], 2, origin);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("position 2"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("layer 7"), std::string::npos);
  o.argmax[1] = -1;  // the device flags a non-finite argmax row with -1
  EXPECT_FALSE(rb.rows(out.requests[0], 0, origin).ok());
}

TEST(PromptScorer, AsksForTheRowsOfItsRangeAndRefusesOthers) {
  RequestState st;
  st.token_ids = {1, 2, 3, 4, 0, 1};
  st.num_prompt_tokens = 6;
  st.sampling.prompt_logprobs = 1;
  step::ScheduledRequest s;
  s.request_id = 4;
  s.num_computed_tokens = 2;
  s.num_scheduled_tokens = 3;  // runs positions 2, 3, 4
  s.prompt_logprobs_begin = 3;
  s.prompt_logprobs_end = 6;   // scored by rows of positions 2, 3, 4
  model::SequenceInput in;
  ASSERT_TRUE(set_prompt_logprobs_rows(s, st, 3, in).ok());
  EXPECT_EQ(in.logits, model::LogitsMode::kRange);
  EXPECT_EQ(in.logits_begin, 0);
  EXPECT_EQ(in.logits_end, 3);
  s.prompt_logprobs_end = 7;  // past the prompt
  EXPECT_EQ(set_prompt_logprobs_rows(s, st, 3, in).code(), StatusCode::kInternal);
  s.prompt_logprobs_end = 6;
  s.prompt_logprobs_begin = 2;  // position 2's row is not run
  EXPECT_EQ(set_prompt_logprobs_rows(s, st, 3, in).code(), StatusCode::kInternal);
  // Scores: row i scores position begin + i.
  s.prompt_logprobs_begin = 3;
  std::vector<float> rows(3 * kRowVocab, 0.0f);
  rows[0 * kRowVocab + 4] = 5.0f;  // position 3's token is 4: its row makes it the likeliest
  sampling::Sampler sampler;
  const step::PromptLogprobsResult r = score_prompt(sampler, s, st, rows.data(), kRowVocab);
  ASSERT_EQ(r.entries.size(), 3u);
  EXPECT_EQ(r.first_position, 3);
  EXPECT_EQ(r.entries[0].token_id, 4);
  EXPECT_EQ(r.entries[0].rank, 1);
  EXPECT_EQ(r.entries[1].token_id, 0);
}

}  // namespace
}  // namespace arbor::executor
