// SuffixProposer: SuffixDecoding (Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding
// for Emerging AI Applications"), written from the paper's description. Two kinds of SuffixTrie:
//   request trie  one per request, over its own tokens (prompt + output), grown incrementally
//   global trie   over the outputs (optionally the whole sequences) of finished requests of all
//                 clients, bounded by a token budget, oldest requests evicted first
// Each step, for each trie and each match length m (the request's last m tokens, m <= max_depth,
// present in that trie), the greedy continuation from the match (SuffixTrie::continue_greedy)
// is a candidate, at most floor(max_spec_factor * m + max_spec_offset) tokens long: a longer
// match earns a longer draft. The candidate with the highest score (expected accepted tokens =
// sum of the path probabilities) wins; ties go to the request trie, then the longer match.
//
// In the request trie the request's own latest occurrence of the match counts too (it has no
// continuation yet), so a pattern seen once before continues with probability 1/2, twice 2/3:
// the trie's counts, unmodified, as SuffixDecoding uses them.
//
// Threading: engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "spec/proposer.h"
#include "spec/suffix_trie.h"

namespace arbor::spec {

struct SuffixProposerOptions {
  // Longest indexed string (trie depth) and so longest match plus continuation. >= 1.
  // SuffixDecoding's max_tree_depth (vLLM's default 24, Arctic Inference's 64).
  int32_t max_depth = 32;
  // Most draft tokens per request per step (also capped by DraftRequest::max_depth).
  // >= 0.
  int32_t num_speculative_tokens = 8;
  // A match of m tokens proposes at most floor(max_spec_factor * m + max_spec_offset) tokens.
  // >= 0 each.
  double max_spec_factor = 1.0;
  double max_spec_offset = 0.0;
  // A continuation stops before the token whose path probability (the product of
  // count(child) / count(parent) from the match on) would fall below this: that token's
  // expected acceptance no longer pays for its verification. In [0, 1].
  double min_token_prob = 0.1;
  // Budget of the global trie in tokens (the retained sequences' total length; the trie's
  // memory is below ~250 bytes per token). 0 disables the global trie. >= 0.
  int64_t global_max_tokens = int64_t{1} << 18;
  // The global trie learns each finished request's whole sequence (prompt + output) rather
  // than its output alone.
  bool global_index_prompts = false;
};

class SuffixProposer final : public CandidateProposer {
 public:
  // Checks the options (a broken option is a programming error).
  explicit SuffixProposer(SuffixProposerOptions options = {});

  std::string_view name() const override { return "suffix"; }
  // Every non-empty candidate (each trie, each match length), best first (stable: ties keep
  // the chain's order), identical drafts once. max_branches 1: the chain draft alone (the same
  // first candidate, found by a pruned search: a match whose length cap cannot beat the best
  // score so far is skipped). O(new tokens * max_depth) to update the request trie,
  // O(max_depth^2) to match the global trie, O(max_depth * num_speculative_tokens) per
  // candidate.
  void candidates(const DraftRequest& request, int32_t max_branches,
                  std::vector<DraftCandidate>& out) override;
  // Drops the request trie; adds token_ids[num_prompt_tokens:] (or all of token_ids with
  // global_index_prompts) to the global trie as one sequence, evicting the oldest sequences
  // until it fits the budget (a sequence longer than the budget keeps its last
  // global_max_tokens tokens). O(its length * max_depth) plus the evictions.
  void forget(RequestId id, std::span<const int32_t> token_ids, int32_t num_prompt_tokens) override;

  const SuffixProposerOptions& options() const { return options_; }
  const SuffixTrie& global_trie() const { return global_; }
  int32_t num_requests() const { return static_cast<int32_t>(requests_.size()); }
  // The request's trie, or nullptr before its first proposal with max_depth > 0.
  const SuffixTrie* request_trie(RequestId id) const;

 private:
  // The request's trie, brought up to date with its token_ids.
  SuffixTrie& sync(const DraftRequest& request);
  // Calls visit(trie, position, m) for each candidate match in the chain's tie order: the
  // request trie then the global one, longer matches first.
  template <typename Visit>
  void for_each_match(const SuffixTrie& own, std::span<const int32_t> context, Visit&& visit);
  int32_t max_tokens_for_match(int32_t m, int32_t max_tokens) const;
  // The chain draft and its score for one request (empty, 0 when none).
  double best_draft(const SuffixTrie& own, const DraftRequest& request,
                    std::vector<int32_t>& out);

  SuffixProposerOptions options_;
  SuffixTrie global_;
  std::unordered_map<RequestId, std::unique_ptr<SuffixTrie>> requests_;
  std::vector<SuffixTrie::Position> global_matches_;  // scratch: [m - 1] = place of last m
  std::vector<int32_t> scratch_;
};

}  // namespace arbor::spec
