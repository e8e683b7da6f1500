// validate_step_result and the draft-shape helpers: every rule a result can break is a kInternal
// naming the request.
#include "step/step.h"

#include <gtest/gtest.h>

namespace arbor::step {
namespace {

TEST(DraftShape, DepthsLevelsAndChains) {
  EXPECT_EQ(draft_depths(std::vector<int32_t>{-1, 0, 1}), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(draft_depths(std::vector<int32_t>{-1, -1, 0, 2}), (std::vector<int32_t>{1, 1, 2, 3}));
  EXPECT_EQ(draft_levels(std::vector<int32_t>{-1, -1, 0, 2}), 3);
  EXPECT_EQ(draft_levels(std::vector<int32_t>{}), 0);
  EXPECT_TRUE(is_chain(std::vector<int32_t>{}));
  EXPECT_TRUE(is_chain(std::vector<int32_t>{-1, 0, 1}));
  EXPECT_FALSE(is_chain(std::vector<int32_t>{-1, -1}));
  EXPECT_TRUE(check_draft_parents(std::vector<int32_t>{-1, 0, 0, 2}).ok());
  EXPECT_FALSE(check_draft_parents(std::vector<int32_t>{-1, 1}).ok()) << "a parent after it";
  EXPECT_FALSE(check_draft_parents(std::vector<int32_t>{-2}).ok());
}

TEST(DraftShape, AcceptedPathsMustContinueFromTheRoot) {
  const std::vector<int32_t> parents{-1, -1, 1, 1, 3};
  RequestResult r;
  r.accepted_draft_indices = {1, 3, 4};
  EXPECT_TRUE(check_accepted_path(parents, r).ok());
  r.accepted_draft_indices = {1, 2, 4};
  EXPECT_FALSE(check_accepted_path(parents, r).ok());
  r.accepted_draft_indices = {3};
  EXPECT_FALSE(check_accepted_path(parents, r).ok()) << "not a child of the root";
  r.accepted_draft_indices = {5};
  EXPECT_FALSE(check_accepted_path(parents, r).ok()) << "beyond the verified drafts";
}

SchedulerOutput one_request(int32_t k, int32_t depth, int32_t nodes) {
  SchedulerOutput out;
  ScheduledRequest s;
  s.request_id = 9;
  s.num_scheduled_tokens = 1 + k;
  s.num_drafts = k;
  s.sample = true;
  s.max_next_draft_tokens = depth;
  s.max_next_draft_nodes = nodes;
  out.requests.push_back(s);
  return out;
}

RequestResult result(int32_t k, int32_t accepted) {
  RequestResult r;
  r.request_id = 9;
  r.num_draft_tokens = k;
  r.num_accepted = accepted;
  for (int32_t i = 0; i < accepted; ++i) r.accepted_draft_indices.push_back(i);
  for (int32_t i = 0; i <= accepted; ++i) r.tokens.push_back({.token_id = 3});
  return r;
}

TEST(ValidateStepResult, EachBrokenRuleIsAnInternalError) {
  const auto check = [](const SchedulerOutput& out, RequestResult r) {
    StepResult res;
    res.requests.push_back(std::move(r));
    return validate_step_result(out, res, 10);
  };
  EXPECT_TRUE(check(one_request(2, 3, 0), result(2, 1)).ok());
  RequestResult r = result(2, 1);
  r.num_draft_tokens = 1;
  EXPECT_EQ(check(one_request(2, 3, 0), r).code(), StatusCode::kInternal) << "k differs";
  r = result(2, 1);
  r.accepted_draft_indices = {};
  EXPECT_FALSE(check(one_request(2, 3, 0), r).ok()) << "path shorter than accepted";
  r = result(2, 1);
  r.accepted_draft_indices = {2};
  EXPECT_FALSE(check(one_request(2, 3, 0), r).ok()) << "a draft that was not verified";
  r = result(2, 1);
  r.tokens[0].token_id = 10;
  EXPECT_FALSE(check(one_request(2, 3, 0), r).ok()) << "outside the vocabulary";
  r = result(0, 0);
  r.next_drafts.parent_ids = {-1, 0, 1, 2};
  EXPECT_FALSE(check(one_request(0, 3, 0), r).ok()) << "deeper than asked";
  r.next_drafts.parent_ids = {-1, 0, 1};
  EXPECT_TRUE(check(one_request(0, 3, 0), r).ok());
  r.next_drafts.parent_ids = {-1, -1};
  EXPECT_FALSE(check(one_request(0, 3, 0), r).ok()) << "a tree when a chain was asked for";
  EXPECT_TRUE(check(one_request(0, 3, 2), r).ok());
  r.next_drafts.parent_ids = {-1, -1, 0};
  EXPECT_FALSE(check(one_request(0, 3, 2), r).ok()) << "more nodes than asked for";
  r.next_drafts = {{-1, 0}, {0.5f}};
  EXPECT_FALSE(check(one_request(0, 3, 0), r).ok()) << "probabilities of another length";
  r.next_drafts = {{-1, 0}, {0.5f, -0.1f}};
  EXPECT_FALSE(check(one_request(0, 3, 0), r).ok()) << "a probability below 0";
  r = result(0, 0);
  r.tokens.clear();
  r.error = internal_error("the model failed");
  EXPECT_TRUE(check(one_request(0, 3, 0), r).ok()) << "a failed request, nothing returned";
  r.next_drafts.parent_ids = {-1};
  EXPECT_FALSE(check(one_request(0, 3, 0), r).ok()) << "a failed request with drafts";
  // The next kept draft's agreement: reported only when every verified draft was accepted
  // (none verified counts), and 0 or 1.
  for (int32_t k = 0; k <= 2; ++k) {
    for (int32_t accepted = 0; accepted <= k; ++accepted) {
      for (int32_t agreed : {-2, -1, 0, 1, 2}) {
        r = result(k, accepted);
        r.unverified_first_draft_agreed = agreed;
        const bool ok = agreed == -1 || ((agreed == 0 || agreed == 1) && accepted == k);
        EXPECT_EQ(check(one_request(k, 3, 0), r).ok(), ok)
            << "k " << k << " accepted " << accepted << " agreed " << agreed;
      }
    }
  }
}

}  // namespace
}  // namespace arbor::step

namespace arbor::step {
namespace {

// A pooling step's results: exactly one non-empty, finite vector per request with `pool`, or an
// error without values; none for other requests.
// Three sampling requests (ids 1, 2, 3) and one that does not sample (4), one token each.
SchedulerOutput three_sampling() {
  SchedulerOutput out;
  for (RequestId id : {1, 4, 2, 3}) {
    ScheduledRequest s;
    s.request_id = id;
    s.num_scheduled_tokens = 1;
    s.sample = id != 4;
    out.requests.push_back(s);
  }
  return out;
}

StepResult results_for(std::initializer_list<RequestId> ids) {
  StepResult res;
  for (RequestId id : ids) {
    RequestResult r;
    r.request_id = id;
    r.tokens = {SampledToken{.token_id = 5, .logprob = 0, .top_logprobs = {}}};
    res.requests.push_back(r);
  }
  return res;
}

TEST(ValidateStepResult, ResultsInAnyOrderMatchByIdAndMissingExtraOrRepeatedOnesAreNamed) {
  const SchedulerOutput out = three_sampling();
  EXPECT_TRUE(validate_step_result(out, results_for({1, 2, 3}), 10).ok()) << "the usual order";
  EXPECT_TRUE(validate_step_result(out, results_for({3, 1, 2}), 10).ok()) << "another order";
  struct Case {
    std::initializer_list<RequestId> ids;
    const char* message;
  };
  for (const Case& c : {Case{{1, 2}, "no result for request 3"},
                        Case{{1, 2, 3, 4}, "request 4, which did not sample"},
                        Case{{1, 2, 2}, "two results for request 2"},
                        Case{{1, 1, 3}, "two results for request 1"},
                        Case{{}, "no result for request"}}) {
    const Status st = validate_step_result(out, results_for(c.ids), 10);
    EXPECT_EQ(st.code(), StatusCode::kInternal) << c.message;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << st.message();
  }
  // The in-order path checks each result like the other one: a token outside the vocabulary.
  StepResult bad = results_for({1, 2, 3});
  bad.requests[1].tokens[0].token_id = 10;
  EXPECT_EQ(validate_step_result(out, bad, 10).code(), StatusCode::kInternal);
}

TEST(ValidateStepResult, PooledVectorsOnlyForPoolingStepsAndFinite) {
  SchedulerOutput out;
  ScheduledRequest s;
  s.request_id = 4;
  s.num_scheduled_tokens = 3;
  s.pool = true;
  out.requests.push_back(s);
  s.request_id = 5;
  s.pool = false;
  out.requests.push_back(s);
  StepResult r;
  auto expect = [&](const std::string& message) {
    const Status st = validate_step_result(out, r, 100);
    if (message.empty()) {
      EXPECT_TRUE(st.ok()) << st.to_string();
    } else {
      EXPECT_EQ(st.code(), StatusCode::kInternal);
      EXPECT_NE(st.message().find(message), std::string::npos) << st.to_string();
    }
  };
  expect("returned no pooled vector for request 4");
  r.pooled.push_back({.request_id = 4, .error = {}, .values = {0.5f, -1.0f}});
  expect("");
  r.pooled.push_back({.request_id = 5, .error = {}, .values = {1.0f}});
  expect("request 5, which did not pool this step");
  r.pooled.pop_back();
  r.pooled.push_back(r.pooled[0]);
  expect("two pooled vectors for request 4");
  r.pooled.pop_back();
  r.pooled[0].values = {};
  expect("empty pooled vector");
  r.pooled[0].values = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  expect("holds nan");
  r.pooled[0].error = internal_error("bad");
  expect("failed request 4 but returned a pooled vector");
  r.pooled[0].values.clear();
  expect("");
  EXPECT_EQ(parse_pooling_type("last"), PoolingType::kLast);
  EXPECT_EQ(parse_pooling_type("4"), PoolingType::kRank);
  EXPECT_FALSE(parse_pooling_type("none").has_value());
  EXPECT_TRUE(pools_early_rows(PoolingType::kMean));
  EXPECT_TRUE(pools_early_rows(PoolingType::kCls));
  EXPECT_FALSE(pools_early_rows(PoolingType::kLast));
}

}  // namespace
}  // namespace arbor::step
