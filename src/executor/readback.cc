#include "executor/readback.h"

#include <algorithm>
#include <cmath>

#include "sampling/sampler.h"

namespace arbor::executor {

namespace {

int64_t position_of_row(const step::ScheduledRequest& s, int64_t row) {
  return s.num_computed_tokens + s.num_scheduled_tokens - s.num_draft_tokens() - 1 + row;
}

std::string origin_of(const LogitsReadback::OriginFn& origin, int32_t row) {
  const std::string o = origin ? origin(row) : std::string();
  return o.empty() ? std::string("an unknown place") : o;
}

// kInternal naming the first non-finite logit of `rows` ([n, vocab]): a NaN or Inf weight, or
// an activation that overflowed, reached the classifier. The sampler must never see one.
// `first_row`: the request's first row among the step's logits (for the diagnosis).
Status check_finite_logits(const step::ScheduledRequest& s, std::span<const float> rows,
                           int32_t vocab, const LogitsReadback::OriginFn& origin, int32_t first_row) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (std::isfinite(rows[i])) continue;
    const int64_t row = static_cast<int64_t>(i) / vocab;
    return internal_error(
        "the model produced a non-finite logit (", rows[i], ") for request ", s.request_id,
        " at position ", position_of_row(s, row), ", token id ", static_cast<int64_t>(i) % vocab,
        "; the hidden state first became non-finite in ",
        origin_of(origin, first_row + static_cast<int32_t>(row)),
        " (`arbor serve --check-weights` scans the weights)");
  }
  return ok_status();
}

// The same check for rows that came back as their argmax or top-k candidates only: row i's
// flag is ids[i * stride], -1 when the row has an Inf or NaN. ids: [num_rows, stride].
Status check_finite_ids(const step::ScheduledRequest& s, std::span<const int32_t> ids,
                        size_t stride, const LogitsReadback::OriginFn& origin, int32_t first_row) {
  for (size_t row = 0; row * stride < ids.size(); ++row) {
    if (ids[row * stride] >= 0) continue;
    return internal_error("the model produced a non-finite logit for request ", s.request_id,
                          " at position ", position_of_row(s, static_cast<int64_t>(row)),
                          "; the hidden state first became non-finite in ",
                          origin_of(origin, first_row + static_cast<int32_t>(row)),
                          " (`arbor serve --check-weights` scans the weights)");
  }
  return ok_status();
}

}  // namespace

bool LogitsReadback::reads_only_the_best(const RequestState& st) {
  const sampling::SamplingParams& p = st.sampling;
  return !p.logprobs.has_value() && !p.has_logit_transforms() && !p.grammar.has_value() &&
         static_cast<int64_t>(st.output_ids().size()) >= p.min_tokens;
}

bool LogitsReadback::argmax_suffices(const RequestState& st) {
  return st.sampling.greedy() && reads_only_the_best(st);
}

bool LogitsReadback::top_k_suffices(const RequestState& st) {
  const sampling::SamplingParams& p = st.sampling;
  return !p.greedy() && p.top_k >= 1 && p.top_k <= model::kMaxDeviceTopK &&
         reads_only_the_best(st);
}

model::RowOut LogitsReadback::row_out(const RequestState& st) const {
  if (argmax_suffices(st)) return model::RowOut::kArgmax;
  if (top_k_candidates_ && top_k_suffices(st)) return model::RowOut::kTopK;
  return model::RowOut::kRow;
}

void LogitsReadback::plan(const step::SchedulerOutput& output, std::span<const int32_t> rows,
                          std::span<const int32_t> prompt_rows, RequestStates& states,
                          int32_t num_logits, int32_t vocab_size) {
  vocab_ = vocab_size;
  const auto n = static_cast<size_t>(num_logits);
  logits_.resize(n * static_cast<size_t>(vocab_size));
  want_.assign(n, model::RowOut::kRow);
  argmax_.assign(n, -1);
  top_k_scale_.assign(n, 1.0f);
  top_k_ = 0;
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const step::ScheduledRequest& s = output.requests[i];
    if (rows[i] < 0 || prompt_rows[i] >= 0) continue;
    const RequestState& st = states.at(s.request_id);
    const model::RowOut kind = row_out(st);
    std::fill_n(want_.begin() + rows[i], s.num_draft_tokens() + 1, kind);
    if (kind != model::RowOut::kTopK) continue;
    // Sampler's inv_t, the same float expression, so the device ranks by Sampler's scores.
    std::fill_n(top_k_scale_.begin() + rows[i], s.num_draft_tokens() + 1,
                1.0f / st.sampling.temperature);
    top_k_ = std::max(top_k_, std::min(st.sampling.top_k, vocab_size));
    num_top_k_rows_ += s.num_draft_tokens() + 1;
  }
  top_ids_.assign(n * static_cast<size_t>(top_k_), -1);
  top_logits_.resize(n * static_cast<size_t>(top_k_));
}

model::LogitsOut LogitsReadback::out() {
  return model::LogitsOut{.logits = logits_.data(),
                          .want = want_,
                          .argmax = argmax_.data(),
                          .top_k = top_k_,
                          .top_k_scale = top_k_scale_,
                          .top_ids = top_ids_.data(),
                          .top_logits = top_logits_.data()};
}

Result<RequestRows> LogitsReadback::rows(const step::ScheduledRequest& s, int32_t row,
                                         const OriginFn& origin) {
  const auto first = static_cast<size_t>(row);
  const auto vocab = static_cast<size_t>(vocab_);
  // One logits row per draft plus the bonus row.
  const size_t num_rows = static_cast<size_t>(s.num_draft_tokens()) + 1;
  float* logits = logits_.data() + first * vocab;
  switch (want_[first]) {
    case model::RowOut::kArgmax: {
      const auto ids = std::span<const int32_t>(argmax_).subspan(first, num_rows);
      ARBOR_RETURN_IF_ERROR(check_finite_ids(s, ids, 1, origin, row));
      return RequestRows{.logits = nullptr, .argmax = ids};
    }
    case model::RowOut::kTopK: {
      const auto k = static_cast<size_t>(top_k_);
      const auto ids = std::span<const int32_t>(top_ids_).subspan(first * k, num_rows * k);
      const auto values = std::span<const float>(top_logits_).subspan(first * k, num_rows * k);
      ARBOR_RETURN_IF_ERROR(check_finite_ids(s, ids, k, origin, row));
      // The rows Sampler sees: -inf but for the candidates (sampling::fill_sparse_row's
      // argument: its tokens are those the whole rows give).
      for (size_t r = 0; r < num_rows; ++r) {
        sampling::fill_sparse_row(ids.subspan(r * k, k), values.subspan(r * k, k),
                                  std::span<float>(logits + r * vocab, vocab));
      }
      return RequestRows{.logits = logits, .argmax = {}};
    }
    case model::RowOut::kRow:
      break;
  }
  ARBOR_RETURN_IF_ERROR(check_finite_logits(
      s, std::span<const float>(logits, num_rows * vocab), vocab_, origin, row));
  return RequestRows{.logits = logits, .argmax = {}};
}

}  // namespace arbor::executor
