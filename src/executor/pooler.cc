#include "executor/pooler.h"

#include <algorithm>
#include <cmath>

namespace arbor::executor {

Result<std::optional<RankHead>> rank_head_from_file(const model::LlamaModel& model) {
  const kernels::WeightView& w = model.weights().cls_out;
  if (w.data == nullptr) return std::optional<RankHead>();
  std::vector<int64_t> rows(static_cast<size_t>(w.rows));
  for (int64_t r = 0; r < w.rows; ++r) rows[static_cast<size_t>(r)] = r;
  RankHead head;
  ARBOR_ASSIGN_OR_RETURN(head.weights, model::dequantize_rows(w, rows));
  head.classes = static_cast<int32_t>(w.rows);
  std::string labels;
  for (const std::string& l : model.config().classifier_labels) {
    labels += (labels.empty() ? "" : ", ") + l;
  }
  head.source = str_cat("cls.output.weight (", head.classes, " classes",
                        labels.empty() ? "" : ": " + labels, ")");
  return std::optional<RankHead>(std::move(head));
}

namespace {

// The LM head as the file holds it, every row: a tensor-parallel rank holds only its slice of the
// vocabulary's rows (model/tp.h), and the tokens' rows may be another rank's.
Result<kernels::WeightView> whole_lm_head(const model::LlamaModel& model) {
  if (model.tp_size() == 1) return model.weights().output.w;
  const gguf::GgufFile& f = model.file();
  const gguf::TensorInfo* t = f.find_tensor("output.weight");
  if (t == nullptr) t = f.find_tensor("token_embd.weight");  // tied to the embedding
  if (t == nullptr || t->dims.size() != 2) {
    return invalid_argument("the model has no LM head (output.weight or token_embd.weight)");
  }
  return kernels::make_weight_view(t->type, t->data, t->dims[1], t->dims[0]);
}

}  // namespace

Result<RankHead> rank_head_from_tokens(const model::LlamaModel& model,
                                       std::span<const int32_t> token_ids,
                                       std::span<const std::string> names) {
  ARBOR_CHECK_EQ(token_ids.size(), names.size());
  std::vector<int64_t> rows(token_ids.begin(), token_ids.end());
  RankHead head;
  ARBOR_ASSIGN_OR_RETURN(const kernels::WeightView lm_head, whole_lm_head(model));
  ARBOR_ASSIGN_OR_RETURN(head.weights, model::dequantize_rows(lm_head, rows));
  head.classes = static_cast<int32_t>(rows.size());
  head.source = "the LM head's rows of";
  for (size_t i = 0; i < rows.size(); ++i) {
    head.source += str_cat(i ? " and '" : " '", names[i], "' (", token_ids[i], ")");
  }
  return head;
}

std::pair<int32_t, int32_t> Pooler::hidden_rows(step::PoolingType type, int64_t c, int32_t n,
                                                int64_t num_prompt) {
  switch (type) {
    case step::PoolingType::kMean:
      return {0, n};
    case step::PoolingType::kCls:
      return c == 0 && n > 0 ? std::pair{0, 1} : std::pair{0, 0};
    case step::PoolingType::kLast:
    case step::PoolingType::kRank:
      return c + n == num_prompt && n > 0 ? std::pair{n - 1, n} : std::pair{0, 0};
  }
  return {0, 0};
}

void Pooler::add(step::RequestId id, step::PoolingType type, int64_t first_position,
                 std::span<const float> rows) {
  State& st = states_[id];
  const auto dim = static_cast<size_t>(dim_);
  ARBOR_CHECK_EQ(rows.size() % dim, 0u);
  if (st.sum.empty()) st.sum.assign(dim, 0.0);
  for (size_t r = 0; r * dim < rows.size(); ++r) {
    const float* row = rows.data() + r * dim;
    for (size_t d = 0; d < dim && st.error.ok(); ++d) {
      if (std::isfinite(row[d])) continue;
      st.error = internal_error("the model produced a non-finite hidden state (", row[d],
                                ") for request ", id, " at position ",
                                first_position + static_cast<int64_t>(r),
                                " (`arbor serve --check-weights` scans the weights)");
    }
    if (type == step::PoolingType::kMean) {
      for (size_t d = 0; d < dim; ++d) st.sum[d] += row[d];
    } else {
      std::copy(row, row + dim, st.sum.begin());
    }
    ++st.count;
  }
}

step::PoolingResult Pooler::rank(step::RequestId id, const std::vector<double>& h) const {
  step::PoolingResult r{.request_id = id, .error = {}, .values = {}};
  if (!rank_head_) {
    r.error = failed_precondition("request ", id, " asks for rank pooling; the model has no "
                                  "rank head (cls.output.weight)");
    return r;
  }
  const auto dim = static_cast<size_t>(dim_);
  std::vector<double> scores(static_cast<size_t>(rank_head_->classes));
  for (size_t c = 0; c < scores.size(); ++c) {
    const float* w = rank_head_->weights.data() + c * dim;
    double dot = 0.0;
    for (size_t d = 0; d < dim; ++d) dot += static_cast<double>(w[d]) * h[d];
    scores[c] = dot;
  }
  const double top = *std::max_element(scores.begin(), scores.end());
  double total = 0.0;
  for (double& s : scores) total += (s = std::exp(s - top));
  for (double s : scores) r.values.push_back(static_cast<float>(s / total));
  return r;
}

step::PoolingResult Pooler::finish(step::RequestId id, step::PoolingType type) {
  auto it = states_.find(id);
  step::PoolingResult r{.request_id = id, .error = {}, .values = {}};
  if (it == states_.end() || it->second.count == 0) {
    r.error = internal_error("request ", id, " pooled no hidden state");
    states_.erase(id);
    return r;
  }
  const State st = std::move(it->second);
  states_.erase(it);
  if (!st.error.ok()) {
    r.error = st.error;
    return r;
  }
  switch (type) {
    case step::PoolingType::kMean:
      for (double v : st.sum) r.values.push_back(static_cast<float>(v / st.count));
      return r;
    case step::PoolingType::kCls:
    case step::PoolingType::kLast:
      r.values.assign(st.sum.begin(), st.sum.end());
      return r;
    case step::PoolingType::kRank:
      return rank(id, st.sum);
  }
  return r;
}

}  // namespace arbor::executor
