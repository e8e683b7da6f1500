// Proposer: the model-free half of speculative decoding. Each step the engine asks a proposer
// for up to k draft tokens per request; the target model verifies them in one forward and the
// rejection sampler accepts a prefix. docs/proposers.md describes the proposers built on this.
//
// Lifecycle of one request, as the engine drives it:
//   propose()  every step the request may speculate; its token_ids are the committed tokens
//              (prompt + accepted output), which only grow between calls
//   observe()  after verification: how many of the drafted tokens the target accepted
//   forget()   once, when the request finishes or is reset to its prompt; drops its state
// A preemption that keeps the committed tokens and only recomputes their KV (arbor's scheduler
// does this) needs no forget(): the next propose() continues from the same tokens.
//
// Threading: engine thread only; a proposer holds no locks. Ownership: the proposer copies what
// it keeps; spans passed in need to live only for the call.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace arbor::spec {

using RequestId = uint64_t;

struct ProposalRequest {
  RequestId request_id = 0;
  std::span<const int32_t> token_ids;  // [num_tokens] committed prompt + generated tokens
  int32_t num_prompt_tokens = 0;       // token_ids[0, num_prompt_tokens) is the prompt
  int32_t max_num_tokens = 0;          // propose at most this many (0: propose nothing)
};

// One candidate continuation of a request, for token-tree speculation.
struct DraftCandidate {
  std::vector<int32_t> token_ids;  // [num_draft_tokens] first draft token first
  double score = 0.0;              // the proposer's estimate of the tokens the target accepts
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;

  // out is resized to requests.size(); out[i] = up to requests[i].max_num_tokens draft tokens
  // for requests[i] (may be empty). Precondition: for a request id seen before (and not
  // forgotten since), token_ids extends the tokens of the previous call. The cost per request is
  // O(tokens appended since the last call) for the index plus a bounded search.
  virtual void propose(std::span<const ProposalRequest> requests,
                       std::vector<std::vector<int32_t>>& out) = 0;

  // Up to max_branches distinct candidate continuations for one request, best (highest score)
  // first, each at most request.max_num_tokens long; the first is what propose() returns. Same
  // preconditions and state updates as propose(). The default wraps the chain proposal as the
  // only candidate, scored by its length.
  virtual void propose_candidates(const ProposalRequest& request, int32_t max_branches,
                                  std::vector<DraftCandidate>& out);

  // The target accepted num_accepted of the num_drafted tokens last proposed for `id`.
  virtual void observe(RequestId id, int32_t num_drafted, int32_t num_accepted) {}

  // The request finished (or was reset to its prompt); drops its per-request state. token_ids is
  // its final committed sequence ([num_tokens], the first num_prompt_tokens the prompt), which a
  // proposer with a cross-request index learns from. Unknown ids are fine.
  virtual void forget(RequestId id, std::span<const int32_t> token_ids,
                      int32_t num_prompt_tokens) = 0;
};

}  // namespace arbor::spec
