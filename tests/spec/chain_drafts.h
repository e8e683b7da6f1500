// Chain proposals through the one Proposer interface: a chain is the width-1 TokenTree
// (DraftRequest::max_nodes 0); these read it back as its tokens for the chain tests.
#pragma once

#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "spec/proposer.h"

namespace arbor::spec {

inline void propose_chains(Proposer& p, std::span<const DraftRequest> requests,
                           std::vector<std::vector<int32_t>>& out) {
  std::vector<sampling::TokenTree> trees;
  ASSERT_TRUE(p.propose(requests, trees).ok());
  ASSERT_EQ(trees.size(), requests.size());
  out.assign(trees.size(), {});
  for (size_t i = 0; i < trees.size(); ++i) {
    for (const sampling::TreeNode& n : trees[i].nodes()) {
      EXPECT_EQ(n.parent, static_cast<int32_t>(out[i].size()) - 1) << "a chain";
      out[i].push_back(n.token_id);
    }
  }
}

}  // namespace arbor::spec
