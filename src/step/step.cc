#include "step/step.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace arbor::step {

std::string_view pooling_type_name(PoolingType type) {
  switch (type) {
    case PoolingType::kMean: return "mean";
    case PoolingType::kCls: return "cls";
    case PoolingType::kLast: return "last";
    case PoolingType::kRank: return "rank";
  }
  return "?";
}

std::optional<PoolingType> parse_pooling_type(std::string_view name) {
  for (PoolingType t : {PoolingType::kMean, PoolingType::kCls, PoolingType::kLast,
                        PoolingType::kRank}) {
    if (name == pooling_type_name(t) || name == std::to_string(static_cast<int>(t))) return t;
  }
  return std::nullopt;
}

bool pools_early_rows(PoolingType type) {
  switch (type) {
    case PoolingType::kMean:
    case PoolingType::kCls:
      return true;
    case PoolingType::kLast:
    case PoolingType::kRank:
      return false;
  }
  return true;
}

Status check_draft_parents(std::span<const int32_t> parents) {
  for (size_t i = 0; i < parents.size(); ++i) {
    if (parents[i] != kDraftRoot && (parents[i] < 0 || static_cast<size_t>(parents[i]) >= i)) {
      return internal_error("draft ", i, " has parent ", parents[i],
                            ": a parent is the root (-1) or an earlier draft");
    }
  }
  return ok_status();
}

std::vector<int32_t> draft_depths(std::span<const int32_t> parents) {
  std::vector<int32_t> depth(parents.size());
  for (size_t i = 0; i < parents.size(); ++i) {
    depth[i] = parents[i] == kDraftRoot ? 1 : depth[static_cast<size_t>(parents[i])] + 1;
  }
  return depth;
}

int32_t draft_levels(std::span<const int32_t> parents) {
  const std::vector<int32_t> depth = draft_depths(parents);
  return depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end());
}

bool is_chain(std::span<const int32_t> parents) {
  for (size_t i = 0; i < parents.size(); ++i) {
    if (parents[i] != static_cast<int32_t>(i) - 1) return false;
  }
  return true;
}

Status check_accepted_path(std::span<const int32_t> parents, const RequestResult& r) {
  int32_t parent = kDraftRoot;
  for (int32_t node : r.accepted_draft_indices) {
    if (node < 0 || static_cast<size_t>(node) >= parents.size() ||
        parents[static_cast<size_t>(node)] != parent) {
      return internal_error("request ", r.request_id, ": accepted draft ", node,
                            " does not continue the accepted path at draft ", parent);
    }
    parent = node;
  }
  return ok_status();
}

namespace {

Status check_next_drafts(const ScheduledRequest& s, const RequestResult& r) {
  const RequestId id = s.request_id;
  const DraftShape& next = r.next_drafts;
  const auto n = static_cast<size_t>(next.size());
  Status st = check_draft_parents(next.parent_ids);
  if (!st.ok()) return st.with_context(str_cat("request ", id, "'s next drafts"));
  if (!next.probs.empty() && next.probs.size() != n) {
    return internal_error("request ", id, ": ", next.probs.size(), " draft probabilities for ",
                          n, " next drafts");
  }
  for (float p : next.probs) {
    if (!(p >= 0.0f && p <= 1.0f)) {
      return internal_error("request ", id, ": draft probability ", p, " outside [0, 1]");
    }
  }
  if (s.max_next_draft_nodes > 0 ? n > static_cast<size_t>(s.max_next_draft_nodes)
                                 : !is_chain(next.parent_ids)) {
    return internal_error("request ", id, ": ", n, " next drafts",
                          is_chain(next.parent_ids) ? "" : " in a tree", ", at most ",
                          s.max_next_draft_nodes, " tree nodes were asked for");
  }
  const int32_t levels = draft_levels(next.parent_ids);
  if (levels > s.max_next_draft_tokens) {
    return internal_error("request ", id, ": next drafts ", levels, " deep, at most ",
                          s.max_next_draft_tokens, " were asked for");
  }
  return ok_status();
}

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
  if (r.accepted_draft_indices.size() != static_cast<size_t>(r.num_accepted)) {
    return internal_error("request ", id, ": ", r.accepted_draft_indices.size(),
                          " accepted drafts named, ", r.num_accepted, " accepted");
  }
  for (int32_t node : r.accepted_draft_indices) {
    if (node < 0 || node >= s.num_draft_tokens()) {
      return internal_error("request ", id, ": accepted draft ", node, " of ",
                            s.num_draft_tokens(), " verified");
    }
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
  }
  const int32_t agreed = r.unverified_first_draft_agreed;
  if (agreed < -1 || agreed > 1 || (agreed >= 0 && r.num_accepted != s.num_draft_tokens())) {
    return internal_error("request ", id, ": unverified_first_draft_agreed ", agreed, " with ",
                          r.num_accepted, " of ", s.num_draft_tokens(), " drafts accepted");
  }
  return check_next_drafts(s, r);
}

Status check_prompt_logprobs(const ScheduledRequest& s, const PromptLogprobsResult& r,
                             int32_t vocab_size) {
  const RequestId id = s.request_id;
  if (r.first_position != s.prompt_logprobs_begin ||
      r.entries.size() != static_cast<size_t>(s.num_prompt_logprobs())) {
    return internal_error("request ", id, ": prompt logprobs for ", r.entries.size(),
                          " positions from ", r.first_position, ", positions [",
                          s.prompt_logprobs_begin, ", ", s.prompt_logprobs_end,
                          ") were asked for");
  }
  for (size_t i = 0; i < r.entries.size(); ++i) {
    const sampling::PromptLogprob& e = r.entries[i];
    const int64_t pos = r.first_position + static_cast<int64_t>(i);
    if (e.token_id < 0 || e.token_id >= vocab_size || e.rank < 1 || e.rank > vocab_size ||
        e.top.size() > static_cast<size_t>(sampling::kMaxLogprobs)) {
      return internal_error("request ", id, ": prompt position ", pos, " has token ", e.token_id,
                            ", rank ", e.rank, " and ", e.top.size(),
                            " alternatives; vocabulary size is ", vocab_size);
    }
    for (const sampling::TokenLogprob& t : e.top) {
      if (t.token_id < 0 || t.token_id >= vocab_size) {
        return internal_error("request ", id, ": prompt position ", pos, " has alternative ",
                              t.token_id, ", vocabulary size is ", vocab_size);
      }
    }
  }
  return ok_status();
}

Status validate_prompt_logprobs(const SchedulerOutput& output, const StepResult& result,
                                int32_t vocab_size) {
  std::unordered_map<RequestId, const ScheduledRequest*> asked;
  for (const ScheduledRequest& s : output.requests) {
    if (s.num_prompt_logprobs() > 0) asked.emplace(s.request_id, &s);
  }
  std::unordered_map<RequestId, bool> seen;
  for (const PromptLogprobsResult& r : result.prompt_logprobs) {
    auto it = asked.find(r.request_id);
    if (it == asked.end()) {
      return internal_error("the executor returned prompt logprobs for request ", r.request_id,
                            ", which asked for none this step");
    }
    if (!seen.emplace(r.request_id, true).second) {
      return internal_error("the executor returned prompt logprobs twice for request ",
                            r.request_id);
    }
    ARBOR_RETURN_IF_ERROR(check_prompt_logprobs(*it->second, r, vocab_size));
  }
  for (const auto& [id, s] : asked) {
    if (!seen.contains(id)) {
      return internal_error("the executor returned no prompt logprobs for request ", id);
    }
  }
  return ok_status();
}

Status validate_pooled(const SchedulerOutput& output, const StepResult& result) {
  std::unordered_map<RequestId, bool> asked;
  for (const ScheduledRequest& s : output.requests) {
    if (s.pool) asked.emplace(s.request_id, false);
  }
  for (const PoolingResult& r : result.pooled) {
    auto it = asked.find(r.request_id);
    if (it == asked.end()) {
      return internal_error("the executor returned a pooled vector for request ", r.request_id,
                            ", which did not pool this step");
    }
    if (it->second) {
      return internal_error("the executor returned two pooled vectors for request ",
                            r.request_id);
    }
    it->second = true;
    if (!r.error.ok()) {
      if (!r.values.empty()) {
        return internal_error("the executor failed request ", r.request_id,
                              " but returned a pooled vector for it");
      }
      continue;
    }
    if (r.values.empty()) {
      return internal_error("the executor returned an empty pooled vector for request ",
                            r.request_id);
    }
    for (float v : r.values) {
      if (!std::isfinite(v)) {
        return internal_error("the pooled vector of request ", r.request_id, " holds ", v);
      }
    }
  }
  for (const auto& [id, seen] : asked) {
    if (!seen) return internal_error("the executor returned no pooled vector for request ", id);
  }
  return ok_status();
}

}  // namespace

Status validate_step_result(const SchedulerOutput& output, const StepResult& result,
                            int32_t vocab_size) {
  const auto check_one = [&](const ScheduledRequest& s, const RequestResult& r) -> Status {
    if (!r.error.ok()) {
      if (!r.tokens.empty() || r.num_accepted != 0 || !r.next_drafts.empty()) {
        return internal_error("the executor failed request ", r.request_id,
                              " but returned tokens for it");
      }
      return ok_status();
    }
    return check_result(s, r, vocab_size);
  };
  // Every executor returns the results in the order of the sampling requests: checked in one
  // pass, without maps (the shard protocol checks every reply: docs/shards.md).
  size_t k = 0;
  bool in_order = true;
  for (const ScheduledRequest& s : output.requests) {
    if (!s.sample) continue;
    if (k >= result.requests.size() || result.requests[k].request_id != s.request_id) {
      in_order = false;
      break;
    }
    ++k;
  }
  if (in_order && k == result.requests.size()) {
    k = 0;
    for (const ScheduledRequest& s : output.requests) {
      if (s.sample) ARBOR_RETURN_IF_ERROR(check_one(s, result.requests[k++]));
    }
  } else {
    // Any other order: matched by id, naming what is missing, extra or repeated.
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
      ARBOR_RETURN_IF_ERROR(check_one(*it->second, r));
    }
    if (seen.size() != sampling.size()) {
      for (const auto& [id, s] : sampling) {
        if (!seen.contains(id)) return internal_error("the executor returned no result for request ", id);
      }
    }
  }
  ARBOR_RETURN_IF_ERROR(validate_prompt_logprobs(output, result, vocab_size));
  return validate_pooled(output, result);
}

}  // namespace arbor::step
