#include "executor/request_states.h"

#include <utility>

namespace arbor::executor {

Result<std::vector<std::pair<step::RequestId, RequestState>>> RequestStates::apply(
    const step::SchedulerOutput& output) {
  std::vector<std::pair<step::RequestId, RequestState>> forgotten;
  for (const auto* ids : {&output.finished_ids, &output.preempted_ids}) {
    for (step::RequestId id : *ids) {
      auto it = states_.find(id);
      if (it == states_.end()) continue;
      forgotten.emplace_back(id, std::move(it->second));
      states_.erase(it);
    }
  }
  for (const step::NewRequestData& d : output.new_requests) {
    if (states_.contains(d.request_id)) {
      return internal_error("step ", output.step, ": new request ", d.request_id,
                            " is already known to the executor");
    }
    states_.emplace(d.request_id, RequestState{.token_ids = d.token_ids,
                                               .num_prompt_tokens = d.num_prompt_tokens,
                                               .sampling = d.sampling,
                                               .seed = d.seed,
                                               .pooling = d.pooling});
  }
  for (const step::ScheduledRequest& s : output.requests) {
    auto it = states_.find(s.request_id);
    if (it == states_.end()) {
      return internal_error("step ", output.step, ": request ", s.request_id,
                            " is scheduled but unknown to the executor");
    }
    RequestState& st = it->second;
    st.token_ids.insert(st.token_ids.end(), s.new_token_ids.begin(), s.new_token_ids.end());
    const int64_t committed_end =
        s.num_computed_tokens + s.num_scheduled_tokens - s.num_draft_tokens();
    if (s.num_draft_tokens() > s.num_scheduled_tokens ||
        committed_end > static_cast<int64_t>(st.token_ids.size()) ||
        (s.sample && committed_end != static_cast<int64_t>(st.token_ids.size()))) {
      return internal_error("step ", output.step, ": request ", s.request_id, " runs tokens [",
                            s.num_computed_tokens, ", ", committed_end, ") + ",
                            s.num_draft_tokens(), " drafts, the executor knows ",
                            st.token_ids.size(), " tokens");
    }
  }
  return forgotten;
}

RequestState& RequestStates::at(step::RequestId id) {
  auto it = states_.find(id);
  ARBOR_CHECK(it != states_.end()) << "request " << id << " is unknown to the executor";
  return it->second;
}

}  // namespace arbor::executor
