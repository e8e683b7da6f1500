// The Verifier on hand-built logits rows: chains and trees, whole rows and argmax rows, logprobs,
// min_tokens, and a seeded request's first token equal to a plain step's.
#include "executor/verifier.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "sampling/rng.h"

namespace arbor::executor {
namespace {

constexpr int32_t kVocab = 6;

// Row i's logits put `best[i]` first (3.0), then the other ids at decreasing values.
std::vector<float> rows_with_argmax(const std::vector<int32_t>& best) {
  std::vector<float> rows;
  for (int32_t b : best) {
    for (int32_t t = 0; t < kVocab; ++t) rows.push_back(t == b ? 3.0f : 1.0f - 0.25f * t);
  }
  return rows;
}

RequestState greedy_state() {
  RequestState st;
  st.token_ids = {1, 2, 3};
  st.num_prompt_tokens = 3;
  st.sampling.temperature = 0.0f;
  st.sampling.logprobs = 2;
  st.seed = 11;
  return st;
}

step::ScheduledRequest sched(int32_t k) {
  step::ScheduledRequest s;
  s.request_id = 1;
  s.num_drafts = k;
  s.sample = true;
  return s;
}

TEST(Verifier, AGreedyChainAcceptsTheArgmaxPrefixAndReportsPlainLogprobs) {
  GrammarStates grammars;
  Verifier v(kVocab);
  const RequestState st = greedy_state();
  // Rows 0..3: argmax 4, 5, 2, 0; drafts 4, 5, 1: the third is wrong.
  std::vector<float> rows = rows_with_argmax({4, 5, 2, 0});
  const std::vector<float> original = rows;
  const sampling::TokenTree chain = sampling::TokenTree::from_chain(std::vector<int32_t>{4, 5, 1});
  const step::RequestResult r = v.verify(sched(3), st, chain, std::nullopt,
                                         RequestRows{.logits = rows.data()}, grammars);
  ASSERT_TRUE(r.error.ok());
  EXPECT_EQ(r.num_draft_tokens, 3);
  EXPECT_EQ(r.num_accepted, 2);
  EXPECT_EQ(r.accepted_draft_indices, (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(r.tokens.size(), 3u);
  EXPECT_EQ(r.tokens[0].token_id, 4);
  EXPECT_EQ(r.tokens[1].token_id, 5);
  EXPECT_EQ(r.tokens[2].token_id, 2);
  // Each token's logprobs are what a plain step reports from the row it was sampled from.
  sampling::Sampler plain;
  for (int32_t i = 0; i < 3; ++i) {
    const auto row = std::span<const float>(original).subspan(static_cast<size_t>(i) * kVocab,
                                                              kVocab);
    const sampling::SampleResult want = plain.score(row, r.tokens[i].token_id, st.sampling);
    EXPECT_FLOAT_EQ(r.tokens[i].logprob, want.logprob) << i;
    ASSERT_EQ(r.tokens[i].top_logprobs.size(), want.top_logprobs.size());
  }
  // The same rows as argmax only (the device's readback): the same tokens.
  const std::vector<int32_t> argmax{4, 5, 2, 0};
  const step::RequestResult a = v.verify(sched(3), st, chain, std::nullopt,
                                         RequestRows{.logits = nullptr, .argmax = argmax},
                                         grammars);
  EXPECT_EQ(a.accepted_draft_indices, r.accepted_draft_indices);
  ASSERT_EQ(a.tokens.size(), r.tokens.size());
  for (size_t i = 0; i < a.tokens.size(); ++i) EXPECT_EQ(a.tokens[i].token_id, r.tokens[i].token_id);
}

TEST(Verifier, ATreeAcceptsTheArgmaxPathThroughItsSecondChild) {
  GrammarStates grammars;
  Verifier v(kVocab);
  // Nodes: 0 = 3 (wrong root child), 1 = 4 (right), 2 = 5 under node 1 (right), 3 = 1 under 0.
  const sampling::TokenTree tree = sampling::TokenTree::from_parents(
      std::vector<int32_t>{3, 4, 5, 1}, std::vector<int32_t>{-1, -1, 1, 0});
  // Rows by slot: root, node 0, node 1, node 2, node 3.
  std::vector<float> rows = rows_with_argmax({4, 0, 5, 2, 0});
  const step::RequestResult r = v.verify(sched(4), greedy_state(), tree, std::nullopt,
                                         RequestRows{.logits = rows.data()}, grammars);
  EXPECT_EQ(r.accepted_draft_indices, (std::vector<int32_t>{1, 2}));
  ASSERT_EQ(r.tokens.size(), 3u);
  EXPECT_EQ(r.tokens[2].token_id, 2) << "the bonus token from node 2's row";
}

TEST(Verifier, MinTokensBansItsIdsUntilEnoughAreOutAndASeededTokenIsThePlainOne) {
  GrammarStates grammars;
  Verifier v(kVocab);
  RequestState st = greedy_state();
  st.sampling.min_tokens = 1;
  st.sampling.min_tokens_banned = {4};
  std::vector<float> rows = rows_with_argmax({4});
  const step::RequestResult r =
      v.verify(sched(0), st, sampling::TokenTree(), std::nullopt,
               RequestRows{.logits = rows.data()}, grammars);
  ASSERT_EQ(r.tokens.size(), 1u);
  EXPECT_NE(r.tokens[0].token_id, 4) << "banned before min_tokens outputs";
  // A seeded sampling request without drafts: the token plain sampling draws at its position.
  RequestState sampled = greedy_state();
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.seed = 5;
  sampled.seed = 5;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    sampled.seed = seed;
    std::vector<float> row = rows_with_argmax({2});
    const std::vector<float> copy = row;
    const step::RequestResult s = v.verify(sched(0), sampled, sampling::TokenTree(), std::nullopt,
                                           RequestRows{.logits = row.data()}, grammars);
    sampling::Sampler plain;
    sampling::Rng rng = sampling::Rng::at(seed, 3, sampling::RngStream::kSample);
    const int32_t want = plain.sample(copy, sampled.sampling, {sampled.prompt_ids(), {}}, rng).token_id;
    EXPECT_EQ(s.tokens[0].token_id, want) << "seed " << seed;
  }
}

}  // namespace
}  // namespace arbor::executor
