#include "sampling/rejection_sampler.h"

#include <algorithm>

#include "base/check.h"

namespace arbor::sampling {

namespace {

bool by_id(const Candidate& a, const Candidate& b) { return a.token_id < b.token_id; }

// `dist` itself when it is in id order, else a sorted copy kept in `storage`.
std::span<const Candidate> in_id_order(std::span<const Candidate> dist,
                                       std::vector<Candidate>& storage) {
  if (std::is_sorted(dist.begin(), dist.end(), by_id)) return dist;
  storage.assign(dist.begin(), dist.end());
  std::sort(storage.begin(), storage.end(), by_id);
  return storage;
}

// The standard rule, written once for model drafts and one-hot drafts: q_at(i) is q_i.
template <typename DraftProbAt>
ChainVerdict verify_with_residual(const DraftChain& chain, DraftProbAt q_at,
                                  TargetDistributions& target, DrawSource& draws,
                                  std::vector<Candidate>& scratch) {
  const auto k = static_cast<int32_t>(chain.token_ids.size());
  for (int32_t i = 0; i < k; ++i) {
    const int64_t position = chain.position + i;
    const std::span<const Candidate> p = target.at(i);
    const std::span<const Candidate> q = q_at(i);
    const double accept = acceptance_probability(p, q, chain.token_ids[i]);
    if (draws.bernoulli(accept, position, RngStream::kAccept)) continue;
    residual(p, q, scratch);
    // An empty residual has no mass: unreachable for a draft drawn from q (see the header).
    const std::span<const Candidate> from =
        scratch.empty() ? p : std::span<const Candidate>(scratch);
    return {i, draws.categorical(from, position, RngStream::kRecover), false};
  }
  return {k, draws.categorical(target.at(k), chain.position + k, RngStream::kSample), true};
}

}  // namespace

bool CounterDrawSource::bernoulli(double prob, int64_t position, RngStream stream) {
  return Rng::at(seed_, position, stream).next_double() < prob;
}

int32_t CounterDrawSource::categorical(std::span<const Candidate> dist, int64_t position,
                                       RngStream stream) {
  return inverse_cdf(dist, Rng::at(seed_, position, stream).next_double());
}

LogitsTarget::LogitsTarget(Sampler& sampler, const Rows& rows) : sampler_(sampler), rows_(rows) {
  ARBOR_CHECK(rows.params != nullptr);
  ARBOR_CHECK(rows.vocab_size > 0 &&
              rows.logits.size() ==
                  static_cast<size_t>(rows.vocab_size) * (rows.draft_ids.size() + 1))
      << rows.logits.size() << " logits for " << rows.draft_ids.size() + 1 << " rows of "
      << rows.vocab_size;
  outputs_.assign(rows.history.output_ids.begin(), rows.history.output_ids.end());
  outputs_.insert(outputs_.end(), rows.draft_ids.begin(), rows.draft_ids.end());
}

std::span<const Candidate> LogitsTarget::at(int32_t i) {
  ARBOR_CHECK(i >= 0 && static_cast<size_t>(i) <= rows_.draft_ids.size()) << i;
  const auto vocab = static_cast<size_t>(rows_.vocab_size);
  const std::span<const float> raw = rows_.logits.subspan(static_cast<size_t>(i) * vocab, vocab);
  row_.assign(raw.begin(), raw.end());
  const size_t num_outputs = rows_.history.output_ids.size() + static_cast<size_t>(i);
  const TokenHistory history{rows_.history.prompt_ids,
                             std::span<const int32_t>(outputs_).first(num_outputs)};
  sampler_.apply_penalties(row_, *rows_.params, history);
  dist_ = sampler_.distribution(row_, *rows_.params, CandidateOrder::kById);
  return dist_;
}

std::span<const Candidate> ArgmaxTarget::at(int32_t i) {
  ARBOR_CHECK(i >= 0 && static_cast<size_t>(i) < ids_.size()) << i;
  ARBOR_CHECK_GE(ids_[static_cast<size_t>(i)], 0) << "row " << i << " has no argmax";
  one_ = Candidate{.token_id = ids_[static_cast<size_t>(i)], .prob = 1.0};
  return {&one_, 1};
}

double prob_of(std::span<const Candidate> dist, int32_t token_id) {
  for (const Candidate& c : dist) {
    if (c.token_id == token_id) return c.prob;
  }
  return 0.0;
}

double acceptance_probability(std::span<const Candidate> p, std::span<const Candidate> q,
                              int32_t token_id) {
  const double q_prob = prob_of(q, token_id);
  if (!(q_prob > 0.0)) return 0.0;
  return std::min(1.0, prob_of(p, token_id) / q_prob);
}

void residual(std::span<const Candidate> p, std::span<const Candidate> q,
              std::vector<Candidate>& out) {
  std::vector<Candidate> p_storage, q_storage;
  p = in_id_order(p, p_storage);
  q = in_id_order(q, q_storage);
  out.clear();
  size_t j = 0;
  for (const Candidate& c : p) {
    while (j < q.size() && q[j].token_id < c.token_id) ++j;
    const double q_prob = j < q.size() && q[j].token_id == c.token_id ? q[j].prob : 0.0;
    const double weight = c.prob - q_prob;
    if (weight > 0.0) out.push_back({c.token_id, weight});
  }
}

ChainVerdict RejectionSampler::verify_model_drafts(const DraftChain& chain,
                                                   TargetDistributions& target,
                                                   DrawSource& draws) {
  ARBOR_CHECK(chain.draft_probs.size() == chain.token_ids.size())
      << chain.draft_probs.size() << " draft distributions for " << chain.token_ids.size()
      << " draft tokens";
  auto q_at = [&](int32_t i) { return std::span<const Candidate>(chain.draft_probs[i]); };
  return verify_with_residual(chain, q_at, target, draws, residual_);
}

ChainVerdict RejectionSampler::verify_one_hot(const DraftChain& chain,
                                              TargetDistributions& target, DrawSource& draws) {
  Candidate one_hot;
  auto q_at = [&](int32_t i) {
    one_hot = {chain.token_ids[i], 1.0};
    return std::span<const Candidate>(&one_hot, 1);
  };
  return verify_with_residual(chain, q_at, target, draws, residual_);
}

ChainVerdict RejectionSampler::verify_sample_and_compare(const DraftChain& chain,
                                                         TargetDistributions& target,
                                                         DrawSource& draws) {
  const auto k = static_cast<int32_t>(chain.token_ids.size());
  for (int32_t i = 0;; ++i) {
    const int32_t x = draws.categorical(target.at(i), chain.position + i, RngStream::kSample);
    if (i == k || x != chain.token_ids[i]) return {i, x, i == k};
  }
}

}  // namespace arbor::sampling
