#include "executor/drafter.h"

#include <algorithm>
#include <utility>

namespace arbor::executor {

Status check_drafter_options(const DrafterOptions& o) {
  if (o.tree_budget < 0 || o.tree_budget > kMaxTreeBudget) {
    return invalid_argument("--spec-tree-budget is ", o.tree_budget, ", must be in [0, ",
                            kMaxTreeBudget, "]");
  }
  if (o.tree_width < 1 || o.tree_width > kMaxTreeWidth) {
    return invalid_argument("--spec-tree-width is ", o.tree_width, ", must be in [1, ",
                            kMaxTreeWidth, "]");
  }
  if (o.tree_static_widths.size() > static_cast<size_t>(kMaxProposedTokens)) {
    return invalid_argument("--spec-tree-shape has ", o.tree_static_widths.size(),
                            " levels, at most ", kMaxProposedTokens);
  }
  for (int32_t w : o.tree_static_widths) {
    if (w < 1 || w > kMaxTreeWidth) {
      return invalid_argument("--spec-tree-shape width ", w, ", must be in [1, ", kMaxTreeWidth,
                              "]");
    }
  }
  if (!o.tree_static_widths.empty() && o.tree_budget == 0) {
    return invalid_argument("--spec-tree-shape needs --spec-tree-budget (the most nodes a tree "
                            "may have)");
  }
  return ok_status();
}

step::DraftShape draft_shape(const sampling::TokenTree& tree) {
  step::DraftShape shape;
  const bool drawn = tree.num_draft_dists() > 0;
  bool informative = false;  // some probability below 1
  for (const sampling::TreeNode& n : tree.nodes()) {
    shape.parent_ids.push_back(n.parent);
    if (drawn) continue;
    shape.probs.push_back(static_cast<float>(std::clamp(n.draft_prob, 0.0, 1.0)));
    informative = informative || shape.probs.back() < 1.0f;
  }
  if (!informative) shape.probs.clear();  // all 1: no ranking, no confidence (a one-hot chain)
  return shape;
}

Drafter::Drafter(std::unique_ptr<spec::Proposer> proposer, DrafterOptions options)
    : proposer_(std::move(proposer)), options_(std::move(options)) {}

Result<sampling::TokenTree> Drafter::drafts_to_verify(const step::ScheduledRequest& s) const {
  if (s.num_drafts == 0) return sampling::TokenTree();
  const auto it = trees_.find(s.request_id);
  const int32_t kept = it == trees_.end() ? 0 : it->second.num_nodes();
  if (s.num_drafts < 0 || s.num_drafts > kept) {
    return internal_error("request ", s.request_id, " verifies ", s.num_drafts,
                          " drafts, the executor keeps ", kept, " for it");
  }
  return it->second.prefix(s.num_drafts);
}

std::optional<int32_t> Drafter::chain_draft(step::RequestId id, int32_t k) const {
  const auto it = trees_.find(id);
  if (it == trees_.end() || k < 0 || it->second.num_nodes() <= k) return std::nullopt;
  for (int32_t i = 0; i <= k; ++i) {
    if (it->second.node(i).parent != (i == 0 ? sampling::TokenTree::kRoot : i - 1)) {
      return std::nullopt;
    }
  }
  return it->second.node(k).token_id;
}

std::optional<sampling::SiblingDraws> Drafter::rule(const sampling::TokenTree& tree) const {
  if (tree.num_draft_dists() == 0) return std::nullopt;
  // A drawn chain has one node per group: both rules are the same rule for it.
  return options_.tree_sampling == TreeSampling::kSequoia
             ? sampling::SiblingDraws::kWithoutReplacement
             : sampling::SiblingDraws::kWithReplacement;
}

// Draws from q only for a model drafter and an unseeded sampling request (greedy and seeded
// requests' tokens must not depend on the batch or the drafts): a chain always, a tree as
// --spec-tree-sampling says.
std::optional<sampling::SiblingDraws> Drafter::draws_for(const RequestState& st,
                                                         bool tree) const {
  if (!proposer_->is_model() || st.sampling.greedy() || st.sampling.seed.has_value()) return {};
  if (!tree) return sampling::SiblingDraws::kWithReplacement;
  switch (options_.tree_sampling) {
    case TreeSampling::kTopK: return {};
    case TreeSampling::kSpecInfer: return sampling::SiblingDraws::kWithReplacement;
    case TreeSampling::kSequoia: return sampling::SiblingDraws::kWithoutReplacement;
  }
  return {};
}

spec::DraftRequest Drafter::request(const step::ScheduledRequest& s, const RequestState& st,
                                    std::span<const int32_t> context) const {
  const int32_t nodes =
      options_.tree_budget > 0 ? std::min(s.max_next_draft_nodes, options_.tree_budget) : 0;
  return spec::DraftRequest{.request_id = s.request_id,
                            .token_ids = context,
                            .num_prompt_tokens = st.num_prompt_tokens,
                            .max_depth = std::min(s.max_next_draft_tokens, kMaxProposedTokens),
                            .max_nodes = nodes,
                            .max_width = options_.tree_width,
                            .sampling = &st.sampling,
                            .seed = st.seed,
                            .block_ids = s.block_tables[0],
                            .draw = draws_for(st, nodes > 0)};
}

Status Drafter::propose(const step::SchedulerOutput& output, step::StepResult& result,
                        RequestStates& states, GrammarStates& grammars,
                        std::span<const TargetHidden> hidden) {
  for (const step::RequestResult& r : result.requests) {
    if (r.num_draft_tokens > 0) proposer_->observe(r.request_id, r.num_draft_tokens, r.num_accepted);
  }
  std::unordered_map<step::RequestId, step::RequestResult*> results;
  for (step::RequestResult& r : result.requests) results.emplace(r.request_id, &r);
  const bool feed = proposer_->reads_hidden();
  std::vector<spec::DraftRequest> requests;
  std::vector<step::RequestResult*> targets;  // null: the request only keeps the proposer up
  std::vector<std::vector<int32_t>> contexts;
  contexts.reserve(output.requests.size());
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const step::ScheduledRequest& s = output.requests[i];
    trees_.erase(s.request_id);
    const auto r = results.find(s.request_id);
    const bool sampled = r != results.end();
    if (sampled && !r->second->error.ok()) continue;
    const bool drafts = s.max_next_draft_tokens > 0 && sampled;
    const RequestState& st = states.at(s.request_id);
    if (!drafts && (!feed || st.pooling)) continue;
    std::vector<int32_t>& ctx = contexts.emplace_back(st.token_ids);
    if (sampled) {
      for (const step::SampledToken& t : r->second->tokens) ctx.push_back(t.token_id);
    }
    spec::DraftRequest req = request(s, st, ctx);
    if (!drafts) {
      req.max_depth = 0;
      req.max_nodes = 0;
    }
    if (feed && i < hidden.size()) {
      req.hidden = hidden[i].rows;
      req.hidden_position = hidden[i].position;
    }
    requests.push_back(req);
    targets.push_back(drafts ? r->second : nullptr);
  }
  if (requests.empty()) return ok_status();
  std::vector<sampling::TokenTree> trees;
  ARBOR_RETURN_IF_ERROR(proposer_->propose(requests, trees));
  for (size_t i = 0; i < requests.size(); ++i) {
    if (targets[i] == nullptr) continue;
    step::RequestResult& r = *targets[i];
    std::vector<int32_t> emitted;
    for (const step::SampledToken& t : r.tokens) emitted.push_back(t.token_id);
    ARBOR_RETURN_IF_ERROR(
        constrain(trees[i], states.at(r.request_id), r.request_id, emitted, grammars));
    if (trees[i].empty()) continue;
    r.next_drafts = draft_shape(trees[i]);
    trees_[r.request_id] = std::move(trees[i]);
  }
  return ok_status();
}

Status Drafter::constrain(sampling::TokenTree& tree, const RequestState& st, step::RequestId id,
                          std::span<const int32_t> emitted, GrammarStates& grammars) {
  if (tree.empty() || !st.sampling.grammar.has_value() || tree.num_draft_dists() > 0) {
    return ok_status();
  }
  Result<grammar::OutputGrammar*> g = grammars.sync(id, st);
  if (!g.ok() || *g == nullptr) return ok_status();  // verification reports the grammar's error
  tree = tree.kept(GrammarStates::valid_drafts(**g, emitted, tree));
  return ok_status();
}

void Drafter::forget(step::RequestId id, const RequestState& st) {
  trees_.erase(id);
  proposer_->forget(id, st.token_ids, st.num_prompt_tokens);
}

}  // namespace arbor::executor
