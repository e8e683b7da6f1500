// The rejection sampler's decisions as exact tables: what it asks for, at which draw site, with
// which probability or distribution, and what it emits for each scripted outcome.
#include "sampling/rejection_sampler.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <vector>

namespace arbor::sampling {
namespace {

// Answers draws from a script and records every request.
class ScriptedDraws final : public DrawSource {
 public:
  struct Call {
    bool is_bernoulli;
    double prob;                    // bernoulli
    std::map<int32_t, double> dist; // categorical, by id
    int64_t position;
    RngStream stream;
  };
  std::deque<bool> coins;
  std::deque<int32_t> tokens;
  std::vector<Call> calls;

  bool bernoulli(double prob, int64_t position, RngStream stream) override {
    calls.push_back({true, prob, {}, position, stream});
    EXPECT_FALSE(coins.empty()) << "unscripted bernoulli";
    if (coins.empty()) return false;
    const bool c = coins.front();
    coins.pop_front();
    return c;
  }
  int32_t categorical(std::span<const Candidate> dist, int64_t position,
                      RngStream stream) override {
    std::map<int32_t, double> m;
    for (const Candidate& c : dist) m[c.token_id] = c.prob;
    calls.push_back({false, 0.0, m, position, stream});
    EXPECT_FALSE(tokens.empty()) << "unscripted categorical";
    if (tokens.empty()) return -1;
    const int32_t t = tokens.front();
    tokens.pop_front();
    return t;
  }
};

// p_i listed in full, row i after drafts d_0..d_{i-1} (node i - 1 of the chain's tree);
// records which rows were asked for.
class FixedTarget final : public TargetDistributions {
 public:
  explicit FixedTarget(std::vector<std::vector<Candidate>> rows) : rows_(std::move(rows)) {}
  std::span<const Candidate> at(int32_t node) override {
    const int32_t i = node + 1;
    asked.push_back(i);
    return rows_.at(static_cast<size_t>(i));
  }
  std::vector<int32_t> asked;

 private:
  std::vector<std::vector<Candidate>> rows_;
};

// A chain of k drafts as these tables name it; verified as the width-1 TokenTree.
struct DraftChain {
  int64_t position = 0;
  std::span<const int32_t> token_ids;                   // [k]
  std::span<const std::vector<Candidate>> draft_probs;  // [k] q_i, model drafts only
};
struct ChainVerdict {
  int32_t num_accepted = 0;
  int32_t next_token = 0;
  bool is_bonus = false;
};

// The chain rules through the one RejectionSampler: model drafts are nodes with their own q
// group, one-hot drafts one-hot nodes (the stochastic rule); sample-and-compare as is.
class ChainSampler {
 public:
  ChainVerdict verify_model_drafts(const DraftChain& c, TargetDistributions& target,
                                   DrawSource& draws) {
    return chain_verdict(sampler_.verify(TokenTree::from_chain(c.token_ids, c.draft_probs),
                                         c.position, target, draws,
                                         SiblingDraws::kWithReplacement));
  }
  ChainVerdict verify_one_hot(const DraftChain& c, TargetDistributions& target,
                              DrawSource& draws) {
    return chain_verdict(sampler_.verify(TokenTree::from_chain(c.token_ids), c.position, target,
                                         draws, SiblingDraws::kWithReplacement));
  }
  ChainVerdict verify_sample_and_compare(const DraftChain& c, TargetDistributions& target,
                                         DrawSource& draws) {
    return chain_verdict(sampler_.verify_sample_and_compare(TokenTree::from_chain(c.token_ids),
                                                            c.position, target, draws));
  }

 private:
  static ChainVerdict chain_verdict(const Verdict& v) {
    for (size_t i = 0; i < v.accepted_nodes.size(); ++i) {
      EXPECT_EQ(v.accepted_nodes[i], static_cast<int32_t>(i)) << "a chain's path";
    }
    return {v.num_accepted(), v.next_token, v.is_bonus};
  }
  RejectionSampler sampler_;
};

void expect_call(const ScriptedDraws::Call& call, bool is_bernoulli, int64_t position,
                 RngStream stream) {
  EXPECT_EQ(call.is_bernoulli, is_bernoulli);
  EXPECT_EQ(call.position, position);
  EXPECT_EQ(call.stream, stream);
}

void expect_dist(const std::map<int32_t, double>& got, const std::map<int32_t, double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, prob] : want) {
    ASSERT_TRUE(got.count(id)) << "token " << id;
    EXPECT_NEAR(got.at(id), prob, 1e-15) << "token " << id;
  }
}

const std::vector<Candidate> kP0 = {{0, 0.5}, {1, 0.3}, {2, 0.2}};
const std::vector<Candidate> kQ0 = {{0, 0.8}, {1, 0.2}};
const std::vector<Candidate> kP1 = {{1, 0.6}, {3, 0.4}};
const std::vector<Candidate> kQ1 = {{3, 1.0}};
const std::vector<Candidate> kP2 = {{2, 1.0}};

TEST(RejectionSamplerTest, ResidualAndAcceptanceProbabilityTables) {
  std::vector<Candidate> r;
  // Unsorted inputs; token 2 is outside q's support and keeps p; token 0 loses q's 0.8.
  using Dist = std::vector<Candidate>;
  residual(Dist{{2, 0.2}, {0, 0.5}, {1, 0.3}}, Dist{{1, 0.2}, {0, 0.8}}, r);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].token_id, 1);
  EXPECT_NEAR(r[0].prob, 0.1, 1e-16);
  EXPECT_EQ(r[1].token_id, 2);
  EXPECT_EQ(r[1].prob, 0.2);
  // Tokens outside p's support never appear; equal distributions leave nothing.
  residual(Dist{{4, 1.0}}, Dist{{4, 0.5}, {5, 0.5}}, r);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].token_id, 4);
  EXPECT_EQ(r[0].prob, 0.5);
  residual(kP0, kP0, r);
  EXPECT_TRUE(r.empty());

  EXPECT_DOUBLE_EQ(acceptance_probability(kP0, kQ0, 0), 0.5 / 0.8);
  EXPECT_EQ(acceptance_probability(kP0, kQ0, 1), 1.0);   // p > q: min(1, 1.5)
  EXPECT_EQ(acceptance_probability(kP0, kQ0, 2), 0.0);   // q(2) = 0: reject
  EXPECT_EQ(acceptance_probability(kP1, kQ0, 0), 0.0);   // outside p's support
  EXPECT_EQ(prob_of(kP1, 3), 0.4);
  EXPECT_EQ(prob_of(kP1, 0), 0.0);
}

TEST(RejectionSamplerTest, ModelDraftRejectedAtFirstRecoversFromResidual) {
  ChainSampler sampler;
  FixedTarget target({kP0, kP1, kP2});
  ScriptedDraws draws;
  draws.coins = {false};
  draws.tokens = {2};
  const std::vector<int32_t> drafts = {0, 3};
  const std::vector<std::vector<Candidate>> qs = {kQ0, kQ1};
  const ChainVerdict v = sampler.verify_model_drafts({100, drafts, qs}, target, draws);
  EXPECT_EQ(v.num_accepted, 0);
  EXPECT_EQ(v.next_token, 2);
  EXPECT_FALSE(v.is_bonus);
  EXPECT_EQ(target.asked, (std::vector<int32_t>{0}));  // p_1 never computed
  ASSERT_EQ(draws.calls.size(), 2u);
  expect_call(draws.calls[0], true, 100, RngStream::kAccept);
  EXPECT_DOUBLE_EQ(draws.calls[0].prob, 0.625);
  expect_call(draws.calls[1], false, 100, RngStream::kRecover);
  expect_dist(draws.calls[1].dist, {{1, 0.3 - 0.2}, {2, 0.2}});
}

TEST(RejectionSamplerTest, ModelDraftsAllAcceptedGiveBonusFromLastRow) {
  ChainSampler sampler;
  FixedTarget target({kP0, kP1, kP2});
  ScriptedDraws draws;
  draws.coins = {true, true};
  draws.tokens = {2};
  const std::vector<int32_t> drafts = {0, 3};
  const std::vector<std::vector<Candidate>> qs = {kQ0, kQ1};
  const ChainVerdict v = sampler.verify_model_drafts({7, drafts, qs}, target, draws);
  EXPECT_EQ(v.num_accepted, 2);
  EXPECT_EQ(v.next_token, 2);
  EXPECT_TRUE(v.is_bonus);
  EXPECT_EQ(target.asked, (std::vector<int32_t>{0, 1, 2}));
  ASSERT_EQ(draws.calls.size(), 3u);
  expect_call(draws.calls[0], true, 7, RngStream::kAccept);
  expect_call(draws.calls[1], true, 8, RngStream::kAccept);
  EXPECT_DOUBLE_EQ(draws.calls[1].prob, 0.4);  // p_1(3) / q_1(3)
  expect_call(draws.calls[2], false, 9, RngStream::kSample);
  expect_dist(draws.calls[2].dist, {{2, 1.0}});
}

TEST(RejectionSamplerTest, ModelDraftDegenerateCases) {
  ChainSampler sampler;
  // The draft is outside q's support: acceptance probability 0, recovered from the residual.
  {
    FixedTarget target({kP0, kP2});
    ScriptedDraws draws;
    draws.coins = {false};
    draws.tokens = {2};
    const std::vector<int32_t> drafts = {2};
    const std::vector<std::vector<Candidate>> qs = {kQ0};
    const ChainVerdict v = sampler.verify_model_drafts({0, drafts, qs}, target, draws);
    EXPECT_EQ(draws.calls[0].prob, 0.0);
    expect_dist(draws.calls[1].dist, {{1, 0.3 - 0.2}, {2, 0.2}});
    EXPECT_EQ(v.num_accepted, 0);
    EXPECT_EQ(v.next_token, 2);
  }
  // p == q and a draft outside both: the residual is empty, the recovered token comes from p.
  {
    FixedTarget target({kP0, kP2});
    ScriptedDraws draws;
    draws.coins = {false};
    draws.tokens = {1};
    const std::vector<int32_t> drafts = {6};
    const std::vector<std::vector<Candidate>> qs = {kP0};
    const ChainVerdict v = sampler.verify_model_drafts({0, drafts, qs}, target, draws);
    EXPECT_EQ(draws.calls[0].prob, 0.0);
    expect_call(draws.calls[1], false, 0, RngStream::kRecover);
    expect_dist(draws.calls[1].dist, {{0, 0.5}, {1, 0.3}, {2, 0.2}});
    EXPECT_EQ(v.next_token, 1);
  }
  // No drafts: a plain decode step, the bonus drawn at the kSample site of the position.
  {
    FixedTarget target({kP1});
    ScriptedDraws draws;
    draws.tokens = {3};
    const ChainVerdict v = sampler.verify_model_drafts({42, {}, {}}, target, draws);
    EXPECT_EQ(v.num_accepted, 0);
    EXPECT_TRUE(v.is_bonus);
    EXPECT_EQ(v.next_token, 3);
    expect_call(draws.calls[0], false, 42, RngStream::kSample);
  }
}

TEST(RejectionSamplerTest, OneHotStandardRuleAcceptsWithPAndRecoversWithoutTheDraft) {
  ChainSampler sampler;
  FixedTarget target({kP0, kP1, kP2});
  ScriptedDraws draws;
  draws.coins = {true, false};
  draws.tokens = {1};
  const std::vector<int32_t> drafts = {2, 3};
  const ChainVerdict v = sampler.verify_one_hot({50, drafts, {}}, target, draws);
  EXPECT_EQ(v.num_accepted, 1);
  EXPECT_EQ(v.next_token, 1);
  EXPECT_FALSE(v.is_bonus);
  ASSERT_EQ(draws.calls.size(), 3u);
  expect_call(draws.calls[0], true, 50, RngStream::kAccept);
  EXPECT_EQ(draws.calls[0].prob, 0.2);  // p_0(2)
  expect_call(draws.calls[1], true, 51, RngStream::kAccept);
  EXPECT_EQ(draws.calls[1].prob, 0.4);  // p_1(3)
  expect_call(draws.calls[2], false, 51, RngStream::kRecover);
  expect_dist(draws.calls[2].dist, {{1, 0.6}});  // p_1 without the draft
}

TEST(RejectionSamplerTest, SampleAndCompareDrawsAtSampleSitesUntilAMismatch) {
  ChainSampler sampler;
  const std::vector<int32_t> drafts = {0, 3};
  {
    FixedTarget target({kP0, kP1, kP2});
    ScriptedDraws draws;
    draws.tokens = {0, 1};  // matches d_0, differs from d_1
    const ChainVerdict v = sampler.verify_sample_and_compare({9, drafts, {}}, target, draws);
    EXPECT_EQ(v.num_accepted, 1);
    EXPECT_EQ(v.next_token, 1);
    EXPECT_FALSE(v.is_bonus);
    EXPECT_EQ(target.asked, (std::vector<int32_t>{0, 1}));
    ASSERT_EQ(draws.calls.size(), 2u);
    expect_call(draws.calls[0], false, 9, RngStream::kSample);
    expect_dist(draws.calls[0].dist, {{0, 0.5}, {1, 0.3}, {2, 0.2}});
    expect_call(draws.calls[1], false, 10, RngStream::kSample);
  }
  {
    FixedTarget target({kP0, kP1, kP2});
    ScriptedDraws draws;
    draws.tokens = {0, 3, 2};
    const ChainVerdict v = sampler.verify_sample_and_compare({9, drafts, {}}, target, draws);
    EXPECT_EQ(v.num_accepted, 2);
    EXPECT_EQ(v.next_token, 2);
    EXPECT_TRUE(v.is_bonus);
    expect_call(draws.calls[2], false, 11, RngStream::kSample);
  }
}

TEST(RejectionSamplerTest, CounterDrawSourceUsesTheSiteDraw) {
  CounterDrawSource draws(77);
  for (int64_t position = 0; position < 200; ++position) {
    const double u = Rng::at(77, position, RngStream::kAccept).next_double();
    EXPECT_EQ(draws.bernoulli(0.5, position, RngStream::kAccept), u < 0.5);
    EXPECT_TRUE(draws.bernoulli(1.0, position, RngStream::kAccept));
    EXPECT_FALSE(draws.bernoulli(0.0, position, RngStream::kAccept));
    const double v = Rng::at(77, position, RngStream::kRecover).next_double();
    EXPECT_EQ(draws.categorical(kP0, position, RngStream::kRecover), inverse_cdf(kP0, v));
  }
}

}  // namespace
}  // namespace arbor::sampling
