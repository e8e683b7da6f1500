#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/check.h"

namespace arbor::sampling {

namespace {

// First index of the maximum; NaN entries never win.
int32_t argmax(std::span<const float> row) {
  int32_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < row.size(); ++i) {
    if (row[i] > best_value) {
      best_value = row[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

// The one inverse-CDF walk behind sample() and inverse_cdf(), over n entries in increasing id
// given as prob(i) (double) and id(i): total = sum of the positive probs (fixed order); the
// first entry whose running sum exceeds u * total; the last positive entry when rounding runs
// past the end.
template <typename ProbAt, typename IdAt>
int32_t walk_cdf(size_t n, ProbAt prob_at, IdAt id_at, double u) {
  // Four partial sums break the dependency chain of one long sum (this pass costs as much as
  // the walk otherwise); any fixed summation order is fine: only the walk must be sequential.
  // Entry i goes to partial sum i % 4 (entries without mass, NaN too, add 0; they still take
  // their slot, so sample() and distribution() both hold positive entries only).
  auto positive = [&](size_t i) {
    const double p = prob_at(i);
    return p > 0.0 ? p : 0.0;
  };
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += positive(i);
    s1 += positive(i + 1);
    s2 += positive(i + 2);
    s3 += positive(i + 3);
  }
  for (; i < n; ++i) s0 += positive(i);
  const double total = (s0 + s1) + (s2 + s3);
  ARBOR_CHECK(total > 0.0) << "distribution of " << n << " candidates has no positive mass";
  const double target = u * total;
  double cum = 0.0;
  int32_t chosen = -1;
  for (size_t i = 0; i < n; ++i) {
    const double p = prob_at(i);
    if (!(p > 0.0)) continue;
    cum += p;
    chosen = id_at(i);
    if (target < cum) break;
  }
  return chosen;
}

// The smallest top_p prefix is searched among this many best candidates first, then 4x more.
constexpr size_t kTopPFirstPrefix = 256;
// top_k up to this size selects with a heap of k; larger k with nth_element over all survivors.
constexpr size_t kHeapTopK = 1024;

}  // namespace

void Sampler::apply_penalties(std::span<float> logits, const SamplingParams& params,
                              const TokenHistory& history) {
  const size_t vocab = logits.size();
  for (const auto& [token_id, bias] : params.logit_bias) {
    ARBOR_CHECK(token_id >= 0 && static_cast<size_t>(token_id) < vocab) << token_id;
    logits[token_id] += bias;
  }
  const bool repetition = params.repetition_penalty != 1.0f;
  const bool counted = params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f;
  if (!repetition && !counted) return;
  if (counts_.size() != vocab) {
    counts_.assign(vocab, 0);
    seen_.assign(vocab, 0);
  }
  touched_.clear();
  // seen_ marks every id touched (deduplicates touched_); counts_ counts generated ids.
  auto touch = [&](int32_t id) {
    ARBOR_CHECK(id >= 0 && static_cast<size_t>(id) < vocab)
        << "token id " << id << " outside vocabulary of " << vocab;
    if (seen_[id] == 0) touched_.push_back(id);
    seen_[id] = 1;
  };
  if (repetition) {
    for (int32_t id : history.prompt_ids) touch(id);
  }
  for (int32_t id : history.output_ids) {
    touch(id);
    ++counts_[id];
  }
  for (int32_t id : touched_) {
    float& x = logits[id];
    if (repetition) x = x > 0.0f ? x / params.repetition_penalty : x * params.repetition_penalty;
    if (counted && counts_[id] > 0) {
      x -= params.presence_penalty + params.frequency_penalty * static_cast<float>(counts_[id]);
    }
    seen_[id] = 0;
    counts_[id] = 0;
  }
}

// Strict weak order of candidates: higher score first, ties by lower id.
bool Sampler::before(const Scored& a, const Scored& b) {
  return a.score > b.score || (a.score == b.score && a.token_id < b.token_id);
}

// kept_ = the best min(k, survivors) tokens with score >= min_score, sorted. A small k keeps a
// heap of k (most tokens are rejected by one comparison with its worst element); a large k
// collects every survivor and uses nth_element.
void Sampler::collect_top_k(std::span<const float> logits, float max_logit, float inv_t,
                            float min_score, size_t k) {
  kept_.clear();
  if (k > kHeapTopK) {
    collect_all(logits, max_logit, inv_t, min_score);
    k = std::min(k, kept_.size());
    std::nth_element(kept_.begin(), kept_.begin() + (k - 1), kept_.end(), before);
    kept_.resize(k);
  } else {
    for (size_t i = 0; i < logits.size(); ++i) {
      const Scored c{(logits[i] - max_logit) * inv_t, 0.0f, static_cast<int32_t>(i)};
      if (!(c.score >= min_score)) continue;
      if (kept_.size() < k) {
        kept_.push_back(c);
        std::push_heap(kept_.begin(), kept_.end(), before);  // front = worst kept
      } else if (before(c, kept_.front())) {
        std::pop_heap(kept_.begin(), kept_.end(), before);
        kept_.back() = c;
        std::push_heap(kept_.begin(), kept_.end(), before);
      }
    }
  }
  std::sort(kept_.begin(), kept_.end(), before);
}

void Sampler::collect_all(std::span<const float> logits, float max_logit, float inv_t,
                          float min_score) {
  kept_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    const float score = (logits[i] - max_logit) * inv_t;
    if (score >= min_score) kept_.push_back({score, 0.0f, static_cast<int32_t>(i)});
  }
}

double Sampler::select_candidates(std::span<const float> logits, const SamplingParams& params,
                                  bool& sorted) {
  const float max_logit = logits[argmax(logits)];
  ARBOR_CHECK(std::isfinite(max_logit)) << "logits row has no finite maximum";
  const float inv_t = 1.0f / params.temperature;
  // min_p keeps p_i >= min_p * p_max, i.e. exp(score_i) >= min_p with score = (x - max) / T.
  const float min_score =
      params.min_p > 0.0f ? std::log(params.min_p) : -std::numeric_limits<float>::infinity();
  sorted = params.top_k_enabled();
  if (sorted) {
    collect_top_k(logits, max_logit, inv_t, min_score, static_cast<size_t>(params.top_k));
  } else {
    collect_all(logits, max_logit, inv_t, min_score);
  }
  // Tokens whose exp(score) underflows to 0 leave the kept set here, so that what sample()
  // walks and what distribution() lists are the same entries (compaction keeps the order; the
  // row maximum, weight 1, always stays).
  double total = 0.0;
  size_t num_kept = 0;
  for (Scored c : kept_) {
    c.weight = std::exp(c.score);
    if (!(c.weight > 0.0f)) continue;
    total += c.weight;
    kept_[num_kept++] = c;
  }
  kept_.resize(num_kept);
  if (params.top_p < 1.0f) {
    total = top_p_prefix(params, total);
    sorted = true;
  }
  return total;
}

// Truncates kept_ (weights filled) to the smallest best-first prefix whose mass reaches
// top_p * total: a token is kept when the mass strictly before it is below that target.
// The sorted prefix grows 256, 1024, 4096, ...: each round selects the next best candidates
// from the unsorted rest with nth_element and sorts only them, O(V + kept log kept) overall.
double Sampler::top_p_prefix(const SamplingParams& params, double total_mass) {
  const double target = static_cast<double>(params.top_p) * total_mass;
  const size_t n = kept_.size();
  size_t sorted = 0;
  double cum = 0.0;
  while (sorted < n) {
    const size_t next = std::min(n, std::max(kTopPFirstPrefix, sorted * 4));
    const auto first = kept_.begin() + sorted, last = kept_.begin() + next;
    if (next < n) std::nth_element(first, last, kept_.end(), before);
    std::sort(first, last, before);
    for (size_t i = sorted; i < next; ++i) {
      if (cum >= target) {
        kept_.resize(i);
        return cum;
      }
      cum += kept_[i].weight;
    }
    sorted = next;
  }
  return cum;
}

double Sampler::kept_in_order(std::span<const float> logits, const SamplingParams& params,
                              CandidateOrder order) {
  bool sorted = false;
  const double total = select_candidates(logits, params, sorted);
  // Unsorted, kept_ is in id order: collect_all scans the row in id order.
  switch (order) {
    case CandidateOrder::kByProbability:
      if (!sorted) std::sort(kept_.begin(), kept_.end(), before);
      break;
    case CandidateOrder::kById:
      if (sorted) sort_kept_by_id(logits.size());
      break;
  }
  return total;
}

// A comparison sort for small kept sets (top_k), one O(vocab) counting pass for large ones
// (top_p on a flat row keeps tens of thousands of tokens).
void Sampler::sort_kept_by_id(size_t vocab) {
  const size_t n = kept_.size();
  if (n < 4096 || n * 16 < vocab) {
    std::sort(kept_.begin(), kept_.end(),
              [](const Scored& a, const Scored& b) { return a.token_id < b.token_id; });
    return;
  }
  slot_.assign(vocab, -1);
  for (size_t i = 0; i < n; ++i) slot_[kept_[i].token_id] = static_cast<int32_t>(i);
  by_id_.clear();
  for (int32_t slot : slot_) {
    if (slot >= 0) by_id_.push_back(kept_[slot]);
  }
  kept_.swap(by_id_);
}

std::vector<Candidate> Sampler::distribution(std::span<const float> logits,
                                             const SamplingParams& params,
                                             CandidateOrder order) {
  if (params.greedy()) return {{argmax(logits), 1.0}};
  const double inv_total = 1.0 / kept_in_order(logits, params, order);
  std::vector<Candidate> out;
  out.reserve(kept_.size());
  for (const Scored& c : kept_) {
    const double prob = kept_prob(c, inv_total);
    if (prob > 0.0) out.push_back({c.token_id, prob});
  }
  return out;
}

void Sampler::compute_logprobs(std::span<const float> logits, int32_t num_top,
                               SampleResult& result) {
  const float max_logit = logits[argmax(logits)];
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - max_logit);  // f32 exp, f64 sum
  const double lse = max_logit + std::log(sum);
  result.logprob = static_cast<float>(logits[result.token_id] - lse);
  // Insertion into a small sorted list: ids are scanned in increasing order and only a strictly
  // larger logit moves ahead, so ties stay ordered by id.
  std::vector<TokenLogprob>& top = result.top_logprobs;
  top.clear();
  if (num_top <= 0) return;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (x == -std::numeric_limits<float>::infinity()) continue;  // masked: not a candidate
    if (top.size() == static_cast<size_t>(num_top) && !(x > top.back().logprob)) continue;
    auto pos = std::find_if(top.begin(), top.end(),
                            [x](const TokenLogprob& t) { return x > t.logprob; });
    top.insert(pos, {static_cast<int32_t>(i), x});
    if (top.size() > static_cast<size_t>(num_top)) top.pop_back();
  }
  for (TokenLogprob& t : top) t.logprob = static_cast<float>(t.logprob - lse);
}

SampleResult Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                             const TokenHistory& history, Rng& rng) {
  ARBOR_CHECK(!logits.empty());
  work_.assign(logits.begin(), logits.end());
  apply_penalties(work_, params, history);
  const double u = rng.next_double();  // always exactly one draw per token
  int32_t token_id = 0;
  if (params.greedy()) {
    token_id = argmax(work_);
  } else {
    // The walk inverse_cdf makes over distribution(work_, params, kById), without building it.
    const double inv_total = 1.0 / kept_in_order(work_, params, CandidateOrder::kById);
    token_id = walk_cdf(
        kept_.size(), [&](size_t i) { return kept_prob(kept_[i], inv_total); },
        [&](size_t i) { return kept_[i].token_id; }, u);
  }
  return score(logits, token_id, params);
}

SampleResult Sampler::score(std::span<const float> logits, int32_t token_id,
                            const SamplingParams& params) {
  ARBOR_CHECK(token_id >= 0 && static_cast<size_t>(token_id) < logits.size())
      << "token id " << token_id << " outside vocabulary of " << logits.size();
  SampleResult result;
  result.token_id = token_id;
  if (params.logprobs) compute_logprobs(logits, *params.logprobs, result);
  return result;
}

PromptLogprob Sampler::score_prompt(std::span<const float> logits, int32_t token_id,
                                   int32_t num_top) {
  ARBOR_CHECK(token_id >= 0 && static_cast<size_t>(token_id) < logits.size())
      << "token id " << token_id << " outside vocabulary of " << logits.size();
  SampleResult scored;
  scored.token_id = token_id;
  compute_logprobs(logits, num_top, scored);
  const float x = logits[static_cast<size_t>(token_id)];
  const auto rank = std::count_if(logits.begin(), logits.end(), [x](float y) { return y >= x; });
  return PromptLogprob{.token_id = token_id,
                       .logprob = scored.logprob,
                       .rank = static_cast<int32_t>(rank),
                       .top = std::move(scored.top_logprobs)};
}

void fill_sparse_row(std::span<const int32_t> ids, std::span<const float> logits,
                     std::span<float> row) {
  ARBOR_CHECK_EQ(ids.size(), logits.size());
  std::fill(row.begin(), row.end(), -std::numeric_limits<float>::infinity());
  for (size_t j = 0; j < ids.size(); ++j) {
    ARBOR_CHECK(ids[j] >= 0 && static_cast<size_t>(ids[j]) < row.size())
        << "candidate id " << ids[j] << " outside vocabulary of " << row.size();
    row[static_cast<size_t>(ids[j])] = logits[j];
  }
}

int32_t inverse_cdf(std::span<const Candidate> dist, double u) {
  auto by_id = [](const Candidate& a, const Candidate& b) { return a.token_id < b.token_id; };
  std::vector<Candidate> sorted_copy;
  if (!std::is_sorted(dist.begin(), dist.end(), by_id)) {
    sorted_copy.assign(dist.begin(), dist.end());
    std::sort(sorted_copy.begin(), sorted_copy.end(), by_id);
    dist = sorted_copy;
  }
  return walk_cdf(
      dist.size(), [&](size_t i) { return dist[i].prob; },
      [&](size_t i) { return dist[i].token_id; }, u);
}

}  // namespace arbor::sampling
