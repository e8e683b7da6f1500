// NgramProposer: prompt lookup decoding (vLLM's `ngram` method, llama.cpp's `lookup`). The draft
// for a request is what followed the latest earlier occurrence of its last n tokens in its own
// tokens (prompt and output), trying n = max_n first and down to min_n.
//
// Example (min_n 2, max_n 3, k 3), tokens  A B C D  X B C D  E  A B C:
//   n = 3: "A B C" occurred ending at position 3 -> draft D X B.
// A continuation that runs into the request's end continues with the draft itself (LZ77-style
// overlap copy), so "x x x x" proposes "x x x ..." and a repeated short pattern keeps repeating.
//
// Among several earlier occurrences the most recent one wins: recent text (the line being edited,
// the last turn of a chat) predicts better than old text, and it is what an incremental
// "latest position" index gives in O(1).
//
// Threading: engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "spec/flat_map.h"
#include "spec/proposer.h"

namespace arbor::spec {

struct NgramProposerOptions {
  // Match lengths, tried longest first. 1 <= min_n <= max_n <= 32. A 1-token match fires on
  // almost every common token and mostly wastes verification, hence min_n 2 (vLLM's
  // prompt_lookup_min / prompt_lookup_max).
  int32_t min_n = 2;
  int32_t max_n = 4;
  // Most draft tokens per request per step (also capped by DraftRequest::max_depth).
  // >= 0.
  int32_t num_speculative_tokens = 4;
};

// The incremental n-gram index of one token sequence: for every n in [min_n, max_n] and every
// n-gram that has at least one token after it, the end (exclusive) of its latest occurrence.
// Memory: a copy of the tokens plus about (max_n - min_n + 1) map entries per token (16-32 bytes
// each). n-grams are keyed by a 64-bit hash; every hit is verified against the tokens, so a hash
// collision can only lose a proposal, never make a wrong one.
class NgramIndex {
 public:
  NgramIndex(int32_t min_n, int32_t max_n);

  int32_t num_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  std::span<const int32_t> tokens() const { return tokens_; }
  size_t memory_bytes() const;

  // Appends tokens to the sequence. O(tokens.size() * (max_n - min_n + 1) * max_n).
  void append(std::span<const int32_t> tokens);

  // The end (exclusive) of the latest occurrence of the last n tokens that ends before the
  // sequence's end, or -1 (also when num_tokens() <= n). n in [min_n, max_n]. O(n).
  int32_t latest_match_end(int32_t n) const;

  // out = the draft for the current end: up to max_tokens tokens continuing the longest n-gram
  // match (empty when no n in [min_n, max_n] matches). O(max_n^2 + max_tokens).
  void propose(int32_t max_tokens, std::vector<int32_t>& out) const;
  // The continuation of the latest match of the last n tokens (as propose() does for the
  // longest matching n): up to max_tokens tokens, empty when the n-gram has no earlier
  // occurrence. O(n + max_tokens).
  void continuation(int32_t n, int32_t max_tokens, std::vector<int32_t>& out) const;

 private:
  uint64_t key(int32_t end, int32_t n) const;  // of tokens_[end - n, end)

  int32_t min_n_;
  int32_t max_n_;
  std::vector<int32_t> tokens_;  // [num_tokens]
  FlatMap latest_end_;           // key(n-gram) -> end of its latest occurrence, end < num_tokens
};

class NgramProposer final : public CandidateProposer {
 public:
  // Checks the options (a broken option is a programming error).
  explicit NgramProposer(NgramProposerOptions options = {});

  std::string_view name() const override { return "ngram"; }
  void forget(RequestId id, std::span<const int32_t> token_ids, int32_t num_prompt_tokens) override;
  // One candidate per match length n (max_n down to min_n) whose continuation differs from the
  // longer matches' ones, scored by n (a longer match predicts better); the first is the chain
  // draft (NgramIndex::propose). O(max_n * (max_n + max_depth)).
  void candidates(const DraftRequest& request, int32_t max_branches,
                  std::vector<DraftCandidate>& out) override;

  const NgramProposerOptions& options() const { return options_; }
  int32_t num_requests() const { return static_cast<int32_t>(indexes_.size()); }

 private:
  // The request's index, brought up to date with its token_ids.
  NgramIndex& sync(const DraftRequest& request);

  NgramProposerOptions options_;
  std::unordered_map<RequestId, NgramIndex> indexes_;
};

}  // namespace arbor::spec
