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

// One token of the distribution a non-greedy sample draws from.
struct Candidate {
  int32_t token_id = 0;
  float prob = 0.0f;  // renormalised over the kept candidates
};

class Sampler {
 public:
  // logits: [vocab_size]; params must have passed validate(logits.size()).
  // Draws exactly one value from `rng`.
  SampleResult sample(std::span<const float> logits, const SamplingParams& params,
                      const TokenHistory& history, Rng& rng);

  // Step 1-3: logit_bias, repetition, presence and frequency penalties, in place.
  // logits: [vocab_size].
  void apply_penalties(std::span<float> logits, const SamplingParams& params,
                       const TokenHistory& history);

  // Steps 4-5 on already-penalised logits [vocab_size]: the kept tokens with their renormalised
  // probabilities, by decreasing probability then increasing id. Greedy params give the argmax
  // with probability 1. (For tests and for rejection sampling, which needs the distribution.)
  std::vector<Candidate> distribution(std::span<const float> logits,
                                      const SamplingParams& params);

 private:
  struct Scored {
    float score;   // (logit - row maximum) / temperature
    float weight;  // exp(score), the unnormalised probability
    int32_t token_id;
  };
  static bool before(const Scored& a, const Scored& b);
  void collect_all(std::span<const float> logits, float max_logit, float inv_t, float min_score);
  void collect_top_k(std::span<const float> logits, float max_logit, float inv_t,
                     float min_score, size_t k);
  // Fills kept_ with the survivors of min_p, top_k and top_p; returns their total unnormalised
  // mass (sum of exp(score)). kept_ is sorted (score desc, id asc) unless `sorted` is false.
  double select_candidates(std::span<const float> logits, const SamplingParams& params,
                           bool& sorted);
  double top_p_prefix(const SamplingParams& params, double total_mass);
  void compute_logprobs(std::span<const float> logits, int32_t num_top, SampleResult& result);

  std::vector<float> work_;          // [vocab_size] penalised logits
  std::vector<uint32_t> counts_;     // [vocab_size] generated-token counts, zero between calls
  std::vector<uint8_t> seen_;        // [vocab_size] prompt/generated flag, zero between calls
  std::vector<int32_t> touched_;     // ids set in counts_ / seen_
  std::vector<Scored> kept_;         // candidate scratch
};

}  // namespace arbor::sampling
