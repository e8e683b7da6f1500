// Proposer: guesses the next tokens of requests for speculative decoding. Model-free proposers
// (n-gram, suffix) live here as pure logic; the draft-model proposer needs a model and lives with
// the executor (executor/draft_proposer.h). See docs/proposers.md.
//
// Threading: one thread at a time (the executor's caller, the engine thread).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace arbor::spec {

using RequestId = uint64_t;

struct ProposalRequest {
  RequestId request_id = 0;
  std::span<const int32_t> token_ids;  // [num_tokens] committed: prompt + generated tokens
  int32_t num_prompt_tokens = 0;
  int32_t max_num_tokens = 0;          // propose at most this many (0: nothing)
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;
  // out[i] = up to requests[i].max_num_tokens draft tokens (possibly none). A request's
  // token_ids extend what the previous call for the same id saw (committed tokens only grow)
  // until forget() is called for it.
  virtual void propose(std::span<const ProposalRequest> requests,
                       std::vector<std::vector<int32_t>>& out) = 0;
  // The target accepted num_accepted of the num_drafted tokens last proposed for `id`.
  virtual void observe(RequestId id, int32_t num_drafted, int32_t num_accepted) {
    (void)id, (void)num_drafted, (void)num_accepted;
  }
  // The request finished or was preempted (it will be proposed for from its prompt again):
  // drop its state. `token_ids` is its last committed sequence, for indexes over all requests.
  virtual void forget(RequestId id, std::span<const int32_t> token_ids,
                      int32_t num_prompt_tokens) = 0;
};

}  // namespace arbor::spec
