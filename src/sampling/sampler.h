// Turns one logits row into one token, following SamplingParams (see sampling_params.h for the
// order of the steps).
//
// A Sampler is scratch space, not request state: one per engine thread, reused for every row of
// every request. Request state (the Rng, the token history) is passed in, so the result for a
// request never depends on the batch around it. Not thread-safe.
//
// Cost per call, V = vocab size: O(V) for the copy, penalties (O(history) more), argmax, min_p
// and temperature; top_k <= 1024 adds O(V) comparisons with a heap of k (larger k: nth_element);
// top_p without top_k sorts only a growing best-first prefix (256, 1024, ... candidates) until it
// holds top_p of the mass; plain temperature sampling draws from the whole row without sorting.
// The draw walks the kept tokens in id order (inverse_cdf), so filtered sets are put in id order
// first (a sort of k, or one O(V) counting pass for large top_p sets).
// Logprobs add one log-sum-exp pass and an O(V) top-n scan. Figures: docs/sampling.md.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sampling/rng.h"
#include "sampling/sampling_params.h"

namespace arbor::sampling {

// The tokens penalties look at. Ids must be inside the vocabulary (CHECKed).
struct TokenHistory {
  std::span<const int32_t> prompt_ids;  // [num_prompt_tokens]
  std::span<const int32_t> output_ids;  // [num_generated_tokens]
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token_id = 0;
  // log_softmax(raw logits)[token_id]; 0 when params.logprobs is nullopt.
  float logprob = 0.0f;
  // The params.logprobs most likely tokens under log_softmax(raw logits), by decreasing logprob,
  // ties by increasing id. Empty when params.logprobs is nullopt or 0.
  std::vector<TokenLogprob> top_logprobs;
};

// One prompt token's score (SamplingParams::prompt_logprobs).
struct PromptLogprob {
  int32_t token_id = 0;   // the prompt token scored
  float logprob = 0.0f;   // log_softmax(raw logits)[token_id]
  // vLLM's rank: how many tokens have a logit >= the token's (1 = the most likely; ties with
  // other tokens count against it). In [1, vocab_size].
  int32_t rank = 1;
  std::vector<TokenLogprob> top;  // [n] the n most likely, as SampleResult::top_logprobs
};

// One token of a sparse distribution (the kept tokens of a row, a residual). Double so that the
// arithmetic of rejection sampling on top of it is exact to ~1e-15, not to float rounding.
struct Candidate {
  int32_t token_id = 0;
  double prob = 0.0;  // distribution(): renormalised over the kept candidates
};

// The order distribution() lists candidates in.
enum class CandidateOrder {
  kByProbability,  // decreasing score (so non-increasing prob), ties by increasing id
  kById,           // increasing id: no sort beyond what the filters need (cheapest)
};

// The inverse-CDF draw every sample makes: walk `dist` in increasing token id, summing prob in
// double; total = that sum; pick the first token whose running sum exceeds u * total. Entries
// with prob <= 0 are never picked; if rounding leaves u * total past the last sum, the last
// positive entry is picked. dist: [n] distinct ids, any order (a copy is sorted by id when it
// is not in id order), total > 0 (CHECKed). u in [0, 1). O(n), O(n log n) when unsorted.
// P(token) = prob / total up to the 2^-53 grain of u.
int32_t inverse_cdf(std::span<const Candidate> dist, double u);

// The row Sampler sees of a logits row of which only its k best candidates are known (they came
// from the device: model::ForwardOps::top_k_rows): row = -inf except row[ids[j]] = logits[j].
// ids: [k] distinct, in range (CHECKed); logits: [k]; row: [vocab_size].
//
// Why sample() and distribution() then give what the whole row gives, for params with top_k in
// [1, k], temperature > 0 and nothing that reads other entries (no logit_bias, penalties,
// grammar or logprobs), when the candidates are the row's k first in Sampler's order (score
// descending, id ascending, score = (x - max) * (1 / temperature) as select_candidates computes
// it), the order top_k_rows ranks by:
//  * the maximum is the same: the best candidate holds it (score 0, and only the maximum's
//    value gives 0 unless x - max underflows to 0 after scaling: logits a subnormal apart);
//  * so every candidate's score is the same float, and every -inf entry scores -inf;
//  * min_p keeps the tokens scoring >= log(min_p): a prefix of Sampler's order, so its top_k
//    survivors are the order's first top_k among them; those are candidates, and the -inf
//    entries rank after every candidate of finite score (a -inf score weighs 0 and leaves);
//  * the kept set, hence its order, its summed mass (the same sequence of float weights),
//    top_p's prefix and each probability, and the inverse-CDF walk over u are the same.
// Tested against whole rows with ties, near-ties that one score merges, min_p and top_p.
void fill_sparse_row(std::span<const int32_t> ids, std::span<const float> logits,
                     std::span<float> row);

class Sampler {
 public:
  // logits: [vocab_size] raw; params must have passed validate(logits.size()).
  // Draws exactly one value u = rng.next_double() (greedy too), and returns
  //   inverse_cdf(distribution(apply_penalties(logits, params, history), params), u)
  // token for token (tested), with logprobs as score() gives them. For counter-based sampling
  // pass Rng::at(seed, position, RngStream::kSample).
  SampleResult sample(std::span<const float> logits, const SamplingParams& params,
                      const TokenHistory& history, Rng& rng);

  // What sample() reports about `token_id` when the token was chosen elsewhere (e.g. by the
  // rejection sampler): logprob and top_logprobs from log_softmax of the raw logits, gated by
  // params.logprobs exactly as in sample(). logits: [vocab_size] raw; token_id in range
  // (CHECKed). O(vocab) when logprobs are asked, O(1) otherwise.
  SampleResult score(std::span<const float> logits, int32_t token_id,
                     const SamplingParams& params);

  // A prompt token's score from the raw logits row [vocab_size] that predicts it: logprob and
  // top (num_top >= 0) exactly as score() computes them (same arithmetic, so a token scored
  // here and the same token sampled from the same row get the same float), plus its rank.
  // token_id in range (CHECKed). O(vocab).
  PromptLogprob score_prompt(std::span<const float> logits, int32_t token_id, int32_t num_top);

  // Step 1-3: logit_bias, repetition, presence and frequency penalties, in place.
  // logits: [vocab_size].
  void apply_penalties(std::span<float> logits, const SamplingParams& params,
                       const TokenHistory& history);

  // Steps 4-5 on already-penalised logits [vocab_size]: exactly the distribution sample()
  // draws from. The kept tokens with prob > 0, prob = exp(score) * (1 / sum over the kept set,
  // in double); greedy params give the argmax (ties to the lowest id) with probability 1. Order as
  // asked; the set and the probabilities do not depend on it. Used by rejection sampling.
  std::vector<Candidate> distribution(std::span<const float> logits,
                                      const SamplingParams& params,
                                      CandidateOrder order = CandidateOrder::kByProbability);

 private:
  struct Scored {
    float score;   // (logit - row maximum) / temperature
    float weight;  // exp(score), the unnormalised probability
    int32_t token_id;
  };
  static bool before(const Scored& a, const Scored& b);
  // A kept token's probability; the one expression both distribution() and sample() use.
  static double kept_prob(const Scored& c, double inv_total) {
    return static_cast<double>(c.weight) * inv_total;
  }
  void collect_all(std::span<const float> logits, float max_logit, float inv_t, float min_score);
  void collect_top_k(std::span<const float> logits, float max_logit, float inv_t,
                     float min_score, size_t k);
  // Fills kept_ with the survivors of min_p, top_k and top_p; returns their total unnormalised
  // mass (sum of exp(score)). kept_ is sorted (score desc, id asc) unless `sorted` is false.
  double select_candidates(std::span<const float> logits, const SamplingParams& params,
                           bool& sorted);
  double top_p_prefix(const SamplingParams& params, double total_mass);
  // kept_ = the kept set of penalised `logits` in `order`, weights filled; returns their mass.
  double kept_in_order(std::span<const float> logits, const SamplingParams& params,
                       CandidateOrder order);
  void sort_kept_by_id(size_t vocab);
  void compute_logprobs(std::span<const float> logits, int32_t num_top, SampleResult& result);

  std::vector<float> work_;          // [vocab_size] penalised logits
  std::vector<uint32_t> counts_;     // [vocab_size] generated-token counts, zero between calls
  std::vector<uint8_t> seen_;        // [vocab_size] prompt/generated flag, zero between calls
  std::vector<int32_t> touched_;     // ids set in counts_ / seen_
  std::vector<Scored> kept_;         // candidate scratch
  std::vector<int32_t> slot_;        // [vocab_size] kept_ index of a token or -1 (id sort)
  std::vector<Scored> by_id_;        // id-sort scratch
};

}  // namespace arbor::sampling
