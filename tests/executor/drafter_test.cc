// The Drafter keeps each request's drafts between steps and returns only their shape; it asks
// the proposer what the scheduler asked for, and picks the verification rule.
#include "executor/drafter.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace arbor::executor {
namespace {

// Proposes a fixed tree (cut to what was asked) and records every DraftRequest.
class ScriptedProposer final : public spec::Proposer {
 public:
  ScriptedProposer(sampling::TokenTree tree, bool model) : tree_(std::move(tree)), model_(model) {}
  std::string_view name() const override { return "scripted"; }
  Status propose(std::span<const spec::DraftRequest> requests,
                 std::vector<sampling::TokenTree>& out) override {
    out.clear();
    for (const spec::DraftRequest& r : requests) {
      seen.push_back(r);
      contexts.emplace_back(r.token_ids.begin(), r.token_ids.end());
      out.push_back(tree_);
    }
    return ok_status();
  }
  void forget(spec::RequestId id, std::span<const int32_t>, int32_t) override {
    forgotten.push_back(id);
  }
  bool is_model() const override { return model_; }

  std::vector<spec::DraftRequest> seen;
  std::vector<std::vector<int32_t>> contexts;
  std::vector<spec::RequestId> forgotten;

 private:
  sampling::TokenTree tree_;
  bool model_;
};

RequestState state(std::vector<int32_t> tokens, float temperature,
                   std::optional<uint64_t> seed = std::nullopt) {
  RequestState st;
  st.token_ids = std::move(tokens);
  st.num_prompt_tokens = 2;
  st.sampling.temperature = temperature;
  st.sampling.seed = seed;
  st.seed = 99;
  return st;
}

step::SchedulerOutput step_asking(step::RequestId id, int32_t depth, int32_t nodes) {
  step::SchedulerOutput out;
  step::ScheduledRequest s;
  s.request_id = id;
  s.sample = true;
  s.max_next_draft_tokens = depth;
  s.max_next_draft_nodes = nodes;
  s.block_tables = {{1, 2}};
  out.requests.push_back(s);
  return out;
}

step::StepResult result_with(step::RequestId id, std::vector<int32_t> tokens) {
  step::StepResult r;
  step::RequestResult rr;
  rr.request_id = id;
  for (int32_t t : tokens) rr.tokens.push_back({.token_id = t});
  r.requests.push_back(rr);
  return r;
}

struct World {
  RequestStates states;
  GrammarStates grammars;
  World(step::RequestId id, RequestState st) {
    step::SchedulerOutput out;
    out.new_requests.push_back({.request_id = id,
                                .token_ids = st.token_ids,
                                .num_prompt_tokens = st.num_prompt_tokens,
                                .sampling = st.sampling,
                                .seed = st.seed});
    EXPECT_TRUE(states.apply(out).ok());
  }
};

const std::vector<int32_t> kTokens{5, 6, 7, 8, 9};
const std::vector<int32_t> kParents{-1, -1, 0, 2, 1};

TEST(Drafter, KeepsTheTreeReturnsItsShapeAndHandsBackPrefixes) {
  auto proposer = std::make_unique<ScriptedProposer>(
      sampling::TokenTree::from_parents(kTokens, kParents, std::vector<float>{1, .5f, 1, 1, .5f}),
      false);
  ScriptedProposer* p = proposer.get();
  Drafter drafter(std::move(proposer), DrafterOptions{.tree_budget = 8, .tree_width = 3});
  World w(7, state({1, 2, 3}, 0.0f));
  step::SchedulerOutput out = step_asking(7, 3, 6);
  step::StepResult res = result_with(7, {40, 41});
  ASSERT_TRUE(drafter.propose(out, res, w.states, w.grammars).ok());
  // The proposer saw the committed tokens plus this step's, and what the scheduler asked.
  ASSERT_EQ(p->seen.size(), 1u);
  EXPECT_EQ(p->contexts[0], (std::vector<int32_t>{1, 2, 3, 40, 41}));
  EXPECT_EQ(p->seen[0].max_depth, 3);
  EXPECT_EQ(p->seen[0].max_nodes, 6);
  EXPECT_EQ(p->seen[0].max_width, 3);
  EXPECT_FALSE(p->seen[0].draw.has_value()) << "a greedy request's drafts are chosen";
  // Only the shape goes back.
  EXPECT_EQ(res.requests[0].next_drafts.parent_ids, kParents);
  EXPECT_EQ(res.requests[0].next_drafts.probs, (std::vector<float>{1, .5f, 1, 1, .5f}));
  // The next step verifies a prefix.
  step::ScheduledRequest s;
  s.request_id = 7;
  for (int32_t k = 0; k <= 5; ++k) {
    s.num_drafts = k;
    Result<sampling::TokenTree> t = drafter.drafts_to_verify(s);
    ASSERT_TRUE(t.ok());
    ASSERT_EQ(t->num_nodes(), k);
    for (int32_t i = 0; i < k; ++i) {
      EXPECT_EQ(t->node(i).token_id, kTokens[i]);
      EXPECT_EQ(t->node(i).parent, kParents[i]);
    }
  }
  s.num_drafts = 6;
  EXPECT_EQ(drafter.drafts_to_verify(s).status().code(), StatusCode::kInternal);
  // The draft after a verified chain: node k while nodes 0 .. k are a chain. Here node 1 is a
  // second root, so only node 0 qualifies; none for a request without drafts.
  EXPECT_EQ(drafter.chain_draft(7, 0), std::optional<int32_t>(5));
  for (int32_t k : {-1, 1, 2, 5}) EXPECT_FALSE(drafter.chain_draft(7, k).has_value()) << k;
  EXPECT_FALSE(drafter.chain_draft(8, 0).has_value());
  s.request_id = 8;
  s.num_drafts = 1;
  EXPECT_EQ(drafter.drafts_to_verify(s).status().code(), StatusCode::kInternal)
      << "drafts for a request that has none";
  EXPECT_FALSE(drafter.rule(*drafter.drafts_to_verify(step::ScheduledRequest{.request_id = 7,
                                                                               .num_drafts = 5}))
                   .has_value())
      << "one-hot drafts: sample-and-compare";
  // Forgetting drops the tree and tells the proposer.
  drafter.forget(7, w.states.at(7));
  s.request_id = 7;
  EXPECT_FALSE(drafter.drafts_to_verify(s).ok());
  EXPECT_EQ(p->forgotten, (std::vector<spec::RequestId>{7}));
}

TEST(Drafter, AStepThatAsksNothingDropsTheKeptDraftsAndFailedRequestsGetNone) {
  auto proposer = std::make_unique<ScriptedProposer>(sampling::TokenTree::from_chain(kTokens),
                                                     false);
  ScriptedProposer* p = proposer.get();
  Drafter drafter(std::move(proposer), DrafterOptions{});
  World w(3, state({1, 2, 3}, 0.0f));
  step::StepResult res = result_with(3, {9});
  ASSERT_TRUE(drafter.propose(step_asking(3, 5, 0), res, w.states, w.grammars).ok());
  EXPECT_EQ(res.requests[0].next_drafts.parent_ids, (std::vector<int32_t>{-1, 0, 1, 2, 3}));
  EXPECT_EQ(p->seen.back().max_nodes, 0) << "chains without a tree budget";
  for (int32_t k = 0; k < 5; ++k) EXPECT_EQ(drafter.chain_draft(3, k), kTokens[k]) << k;
  EXPECT_FALSE(drafter.chain_draft(3, 5).has_value()) << "past the kept chain";
  step::StepResult plain = result_with(3, {10});
  ASSERT_TRUE(drafter.propose(step_asking(3, 0, 0), plain, w.states, w.grammars).ok());
  EXPECT_TRUE(plain.requests[0].next_drafts.empty());
  EXPECT_FALSE(drafter.drafts_to_verify(step::ScheduledRequest{.request_id = 3, .num_drafts = 1})
                   .ok());
  step::StepResult failed = result_with(3, {});
  failed.requests[0].error = internal_error("boom");
  const size_t asked = p->seen.size();
  ASSERT_TRUE(drafter.propose(step_asking(3, 5, 0), failed, w.states, w.grammars).ok());
  EXPECT_EQ(p->seen.size(), asked) << "no proposal for a failed request";
}

TEST(Drafter, AModelDrawsForUnseededSamplingRequestsOnly) {
  struct Case {
    float temperature;
    std::optional<uint64_t> seed;
    bool model;
    int32_t nodes;
    TreeSampling sampling;
    bool draws;
  };
  const Case cases[] = {
      {1.0f, std::nullopt, true, 0, TreeSampling::kTopK, true},         // a chain: model rule
      {1.0f, std::nullopt, true, 4, TreeSampling::kTopK, false},        // top-k tree
      {1.0f, std::nullopt, true, 4, TreeSampling::kSpecInfer, true},
      {1.0f, std::nullopt, true, 4, TreeSampling::kSequoia, true},
      {1.0f, uint64_t{5}, true, 0, TreeSampling::kSpecInfer, false},    // seeded
      {0.0f, std::nullopt, true, 4, TreeSampling::kSpecInfer, false},   // greedy
      {1.0f, std::nullopt, false, 4, TreeSampling::kSpecInfer, false},  // model-free
  };
  for (const Case& c : cases) {
    auto proposer = std::make_unique<ScriptedProposer>(sampling::TokenTree(), c.model);
    ScriptedProposer* p = proposer.get();
    Drafter drafter(std::move(proposer),
                    DrafterOptions{.tree_budget = 8, .tree_sampling = c.sampling});
    World w(1, state({1, 2}, c.temperature, c.seed));
    step::StepResult res = result_with(1, {4});
    ASSERT_TRUE(drafter.propose(step_asking(1, 3, c.nodes), res, w.states, w.grammars).ok());
    ASSERT_EQ(p->seen.size(), 1u);
    EXPECT_EQ(p->seen[0].draw.has_value(), c.draws)
        << "temperature " << c.temperature << " nodes " << c.nodes;
  }
  // The rule follows the tree: drawn nodes get the stochastic rule, Sequoia's without
  // replacement when asked for.
  sampling::TokenTree drawn;
  drawn.add_node(sampling::TokenTree::kRoot, 3, 0.5, drawn.add_draft_dist({{3, 0.5}, {4, 0.5}}));
  Drafter specinfer(std::make_unique<ScriptedProposer>(drawn, true),
                    DrafterOptions{.tree_budget = 8, .tree_sampling = TreeSampling::kSpecInfer});
  Drafter sequoia(std::make_unique<ScriptedProposer>(drawn, true),
                  DrafterOptions{.tree_budget = 8, .tree_sampling = TreeSampling::kSequoia});
  EXPECT_EQ(specinfer.rule(drawn), sampling::SiblingDraws::kWithReplacement);
  EXPECT_EQ(sequoia.rule(drawn), sampling::SiblingDraws::kWithoutReplacement);
  EXPECT_TRUE(draft_shape(drawn).probs.empty()) << "a drawn tree is planned without its draws";
}

// A chain goes to the scheduler with the proposer's confidence in each draft when it gave one
// (a draft model's probabilities), and without probabilities when every one is 1 (a one-hot
// chain of a model-free proposer: nothing to rank or price by).
TEST(Drafter, ChainShapesCarryConfidencesOnlyWhenThereAreAny) {
  const std::vector<int32_t> tokens{5, 6, 7};
  EXPECT_TRUE(draft_shape(sampling::TokenTree::from_chain(tokens)).probs.empty());
  const std::vector<float> ones{1, 1, 1}, probs{0.9f, 1.0f, 0.25f};
  EXPECT_TRUE(draft_shape(sampling::TokenTree::from_chain(tokens, ones)).probs.empty());
  const step::DraftShape shape = draft_shape(sampling::TokenTree::from_chain(tokens, probs));
  EXPECT_EQ(shape.parent_ids, (std::vector<int32_t>{-1, 0, 1}));
  EXPECT_EQ(shape.probs, probs);
}

TEST(Drafter, OptionsOutsideTheFlagsLimitsAreRefusedByName) {
  EXPECT_TRUE(check_drafter_options({}).ok());
  const auto message = [](DrafterOptions o) { return check_drafter_options(o).message(); };
  EXPECT_NE(message({.tree_budget = kMaxTreeBudget + 1}).find("--spec-tree-budget"),
            std::string::npos);
  EXPECT_NE(message({.tree_width = 0}).find("--spec-tree-width"), std::string::npos);
  EXPECT_NE(message({.tree_budget = 0, .tree_static_widths = {2}}).find("--spec-tree-shape"),
            std::string::npos);
  EXPECT_NE(message({.tree_budget = 4, .tree_static_widths = {kMaxTreeWidth + 1}})
                .find("--spec-tree-shape width"),
            std::string::npos);
}

}  // namespace
}  // namespace arbor::executor
