// RequestStates: what an executor remembers of each running request between steps (the step
// protocol is by value: see step/step.h). Shared by every executor.
//
// Threading: the engine thread (the executor's caller) only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "step/step.h"

namespace arbor::executor {

struct RequestState {
  std::vector<int32_t> token_ids;  // [num_tokens] committed: prompt + generated
  int32_t num_prompt_tokens = 0;
  sampling::SamplingParams sampling{};
  uint64_t seed = 0;
  std::optional<step::PoolingType> pooling;  // a pooling request (NewRequestData::pooling)
  // A model with recurrent layers: the request's state slot (model::RecurrentStateCache) and
  // how many of its tokens that state has absorbed; -1 / 0 otherwise.
  int32_t state_slot = -1;
  int64_t state_tokens = 0;

  std::span<const int32_t> prompt_ids() const {
    return std::span<const int32_t>(token_ids).first(static_cast<size_t>(num_prompt_tokens));
  }
  std::span<const int32_t> output_ids() const {
    return std::span<const int32_t>(token_ids).subspan(static_cast<size_t>(num_prompt_tokens));
  }
};

class RequestStates {
 public:
  // Brings the states up to date with `output`, in this order: forgets finished_ids and
  // preempted_ids, learns new_requests, appends each scheduled request's new_token_ids. Errors
  // (nothing is applied after the first): a new request already known, a scheduled request not
  // known, a scheduled request whose num_computed_tokens + committed tokens run exceeds its
  // known tokens. Returns the states forgotten (for per-request state kept elsewhere, e.g. a
  // draft model's, and for proposers that learn from finished requests).
  Result<std::vector<std::pair<step::RequestId, RequestState>>> apply(
      const step::SchedulerOutput& output);

  // The state of a known request (CHECKed).
  RequestState& at(step::RequestId id);
  bool contains(step::RequestId id) const { return states_.contains(id); }
  size_t size() const { return states_.size(); }

 private:
  std::unordered_map<step::RequestId, RequestState> states_;
};

}  // namespace arbor::executor
