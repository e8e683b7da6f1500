#include "spec/proposer.h"

#include <algorithm>

namespace arbor::spec {

Status CandidateProposer::propose(std::span<const DraftRequest> requests,
                                  std::vector<sampling::TokenTree>& out) {
  out.assign(requests.size(), sampling::TokenTree());
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    if (r.max_depth <= 0) continue;
    const bool tree = r.max_nodes > 0;
    candidates(r, tree ? std::max(r.max_width, 1) : 1, scratch_);
    if (scratch_.empty()) continue;
    if (!tree) scratch_.resize(1);
    out[i] = tree_from_candidates(scratch_, tree ? r.max_nodes : r.max_depth);
  }
  return ok_status();
}

sampling::TokenTree tree_from_candidates(std::span<const DraftCandidate> candidates,
                                         int32_t max_nodes) {
  sampling::TokenTree tree;
  if (candidates.empty()) return tree;
  const double best = std::max(candidates[0].score, 1e-9);
  std::vector<int32_t> parents;
  for (const DraftCandidate& c : candidates) {
    const float p = static_cast<float>(std::clamp(c.score / best, 0.0, 1.0));
    const std::vector<float> probs(c.token_ids.size(), tree.empty() ? 1.0f : p);
    parents.resize(c.token_ids.size());
    for (size_t j = 0; j < parents.size(); ++j) parents[j] = static_cast<int32_t>(j) - 1;
    tree.merge(sampling::TokenTree::from_parents(c.token_ids, parents, probs));
    if (tree.num_nodes() >= max_nodes) break;
  }
  return tree.prefix(std::min(tree.num_nodes(), max_nodes));
}

}  // namespace arbor::spec
