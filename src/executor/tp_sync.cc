#include "executor/tp_sync.h"

#include <algorithm>

namespace arbor::executor {

namespace {

// Slots a step's drafts take in a broadcast: per request with drafts, k tokens and k parents.
int64_t draft_slots(const step::SchedulerOutput& output) {
  int64_t n = 0;
  for (const step::ScheduledRequest& s : output.requests) n += 2 * int64_t{s.num_drafts};
  return n;
}

}  // namespace

collective::CollectiveTag TpSync::tag(const step::SchedulerOutput& output) {
  // The forward's own collectives carry its step counter and batch digest; these are told
  // apart from them by the high bit of op.
  return collective::CollectiveTag{.step = static_cast<uint64_t>(output.step),
                                   .digest = static_cast<uint64_t>(output.total_num_scheduled_tokens),
                                   .op = 0x80000000u | calls_++};
}

Status TpSync::share_drafts(const step::SchedulerOutput& output,
                            std::vector<sampling::TokenTree>& trees) {
  const int64_t slots = draft_slots(output);
  if (!active() || slots == 0) return ok_status();
  buf_.assign(static_cast<size_t>(slots), 0);
  if (leader()) {
    size_t at = 0;
    for (size_t i = 0; i < output.requests.size(); ++i) {
      const int32_t k = output.requests[i].num_drafts;
      if (k == 0) continue;
      const std::vector<int32_t> parents = trees[i].parents();
      for (int32_t j = 0; j < k; ++j) buf_[at + j] = trees[i].node(j).token_id;
      std::copy(parents.begin(), parents.begin() + k, buf_.begin() + at + k);
      at += 2 * static_cast<size_t>(k);
    }
  }
  ARBOR_RETURN_IF_ERROR(
      collective_->broadcast(buf_.data(), buf_.size() * sizeof(int32_t), tag(output)));
  if (leader()) return ok_status();
  size_t at = 0;
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const size_t k = static_cast<size_t>(output.requests[i].num_drafts);
    if (k == 0) continue;
    const std::span<const int32_t> tokens(buf_.data() + at, k), parents(buf_.data() + at + k, k);
    for (size_t j = 0; j < k; ++j) {
      if (parents[j] < sampling::TokenTree::kRoot || parents[j] >= static_cast<int32_t>(j)) {
        return data_loss("TP rank 0 sent draft ", j, " of request ", output.requests[i].request_id,
                         " with parent ", parents[j]);
      }
    }
    trees[i] = sampling::TokenTree::from_parents(tokens, parents);
    at += 2 * k;
  }
  return ok_status();
}

Status TpSync::share_accepted(const step::SchedulerOutput& output,
                              std::vector<std::vector<int32_t>>& accepted) {
  // Per request with drafts: a count, then room for every draft.
  int64_t slots = 0;
  for (const step::ScheduledRequest& s : output.requests) {
    if (s.num_drafts > 0) slots += 1 + int64_t{s.num_drafts};
  }
  if (!active() || slots == 0) return ok_status();
  buf_.assign(static_cast<size_t>(slots), 0);
  size_t at = 0;
  if (leader()) {
    for (size_t i = 0; i < output.requests.size(); ++i) {
      const int32_t k = output.requests[i].num_drafts;
      if (k == 0) continue;
      const std::vector<int32_t>& a = accepted[i];
      buf_[at] = static_cast<int32_t>(std::min<size_t>(a.size(), static_cast<size_t>(k)));
      std::copy(a.begin(), a.begin() + buf_[at], buf_.begin() + at + 1);
      at += 1 + static_cast<size_t>(k);
    }
  }
  ARBOR_RETURN_IF_ERROR(
      collective_->broadcast(buf_.data(), buf_.size() * sizeof(int32_t), tag(output)));
  if (leader()) return ok_status();
  accepted.assign(output.requests.size(), {});
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const int32_t k = output.requests[i].num_drafts;
    if (k == 0) continue;
    const int32_t n = buf_[at];
    if (n < 0 || n > k) {
      return data_loss("TP rank 0 sent ", n, " accepted drafts of ", k, " for request ",
                       output.requests[i].request_id);
    }
    accepted[i].assign(buf_.begin() + at + 1, buf_.begin() + at + 1 + n);
    for (int32_t d : accepted[i]) {
      if (d < 0 || d >= k) return data_loss("TP rank 0 sent accepted draft index ", d);
    }
    at += 1 + static_cast<size_t>(k);
  }
  return ok_status();
}

}  // namespace arbor::executor
