// NgramProposer: prompt-lookup decoding (vLLM's `ngram`, llama.cpp's `lookup`). For n from
// max_n down to min_n, find the most recent earlier occurrence of the request's last n tokens in
// its own tokens (prompt and output) and propose the tokens that followed it, up to k (fewer when
// the occurrence is near the end).
//
// Per request an index maps each n-gram (min_n <= n <= max_n) to the end of its most recent
// occurrence; propose() indexes only the tokens appended since the last call, so a step costs
// O((new tokens + 1) * (max_n - min_n + 1) * max_n), whatever the context length. Memory:
// (max_n - min_n + 1) entries per token of each live request.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "spec/proposer.h"

namespace arbor::spec {

struct NgramOptions {
  int32_t min_n = 1;  // shortest suffix matched, >= 1
  int32_t max_n = 4;  // longest suffix matched, >= min_n
};

class NgramProposer : public Proposer {
 public:
  explicit NgramProposer(NgramOptions options);

  std::string_view name() const override { return "ngram"; }
  void propose(std::span<const ProposalRequest> requests,
               std::vector<std::vector<int32_t>>& out) override;
  void forget(RequestId id, std::span<const int32_t> token_ids,
              int32_t num_prompt_tokens) override;

  // The proposal for one request (also used by tests).
  std::vector<int32_t> propose_one(const ProposalRequest& request);
  size_t num_requests() const { return states_.size(); }

 private:
  struct State {
    int64_t num_indexed = 0;  // n-grams ending before this position are indexed
    // [max_n - min_n + 1] n-gram hash -> end (exclusive) of its most recent occurrence.
    std::vector<std::unordered_map<uint64_t, int64_t>> last_end;
  };
  static uint64_t hash(std::span<const int32_t> ngram);
  void index(State& st, std::span<const int32_t> tokens);

  NgramOptions options_;
  std::unordered_map<RequestId, State> states_;
};

}  // namespace arbor::spec
