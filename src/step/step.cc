#include "step/step.h"

#include <unordered_map>

namespace arbor::step {

namespace {

Status check_result(const ScheduledRequest& s, const RequestResult& r, int32_t vocab_size) {
  const RequestId id = s.request_id;
  if (r.num_draft_tokens != s.num_draft_tokens()) {
    return internal_error("request ", id, ": result verified ", r.num_draft_tokens,
                          " drafts, ", s.num_draft_tokens(), " were scheduled");
  }
  if (r.num_accepted < 0 || r.num_accepted > r.num_draft_tokens) {
    return internal_error("request ", id, ": ", r.num_accepted, " drafts accepted of ",
                          r.num_draft_tokens);
  }
  if (r.tokens.size() != static_cast<size_t>(r.num_accepted) + 1) {
    return internal_error("request ", id, ": ", r.tokens.size(), " tokens returned, ",
                          r.num_accepted, " accepted drafts need ", r.num_accepted + 1);
  }
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    const int32_t t = r.tokens[i].token_id;
    if (t < 0 || t >= vocab_size) {
      return internal_error("request ", id, ": token ", i, " is ", t, ", vocabulary size is ",
                            vocab_size);
    }
    if (static_cast<int32_t>(i) < r.num_accepted && t != s.draft_token_ids[i]) {
      return internal_error("request ", id, ": accepted token ", i, " is ", t, ", the draft was ",
                            s.draft_token_ids[i]);
    }
  }
  if (static_cast<int32_t>(r.next_draft_token_ids.size()) > s.max_next_draft_tokens) {
    return internal_error("request ", id, ": ", r.next_draft_token_ids.size(),
                          " next drafts, at most ", s.max_next_draft_tokens, " were asked for");
  }
  for (int32_t t : r.next_draft_token_ids) {
    if (t < 0 || t >= vocab_size) {
      return internal_error("request ", id, ": draft token ", t, ", vocabulary size is ",
                            vocab_size);
    }
  }
  return ok_status();
}

}  // namespace

Status validate_step_result(const SchedulerOutput& output, const StepResult& result,
                            int32_t vocab_size) {
  std::unordered_map<RequestId, const ScheduledRequest*> sampling;
  for (const ScheduledRequest& s : output.requests) {
    if (s.sample) sampling.emplace(s.request_id, &s);
  }
  std::unordered_map<RequestId, bool> seen;
  for (const RequestResult& r : result.requests) {
    auto it = sampling.find(r.request_id);
    if (it == sampling.end()) {
      return internal_error("the executor returned a result for request ", r.request_id,
                            ", which did not sample this step");
    }
    if (!seen.emplace(r.request_id, true).second) {
      return internal_error("the executor returned two results for request ", r.request_id);
    }
    const Status st = check_result(*it->second, r, vocab_size);
    if (!st.ok()) return st;
  }
  if (seen.size() != sampling.size()) {
    for (const auto& [id, s] : sampling) {
      if (!seen.contains(id)) return internal_error("the executor returned no result for request ", id);
    }
  }
  return ok_status();
}

}  // namespace arbor::step
