#include "spec/proposer.h"

namespace arbor::spec {

void Proposer::propose_candidates(const ProposalRequest& request, int32_t max_branches,
                                  std::vector<DraftCandidate>& out) {
  out.clear();
  if (max_branches <= 0) return;
  std::vector<std::vector<int32_t>> chain;
  propose(std::span<const ProposalRequest>(&request, 1), chain);
  if (chain[0].empty()) return;
  const double score = static_cast<double>(chain[0].size());
  out.push_back(DraftCandidate{std::move(chain[0]), score});
}

}  // namespace arbor::spec
