// Speculative decoding's verification step (vocabulary of vLLM): given k draft tokens
// d_0..d_{k-1} for positions pos..pos+k-1 and the target model's distributions p_0..p_k for
// those positions (p_i conditioned on the prompt, the outputs and d_0..d_{i-1}), decide how
// many drafts to accept and emit one more token: a *recovered* token at the first rejection, or
// a *bonus* token from p_k when all k are accepted. The emitted tokens are distributed exactly
// as k+1 tokens sampled one by one from the target would be (docs/sampling.md, "Rejection
// sampling", has the proofs; tests/sampling enumerates them).
//
// Distributions are sparse std::vector<Candidate> as Sampler::distribution() returns them, after
// the request's own transforms (penalties, temperature, top-k / top-p / min-p) for the target,
// and whatever the proposer drew from for a draft model; each sums to 1 within rounding.
// CandidateOrder::kById is cheapest (no sorting anywhere here), any order is accepted.
//
// The decisions are written once, here; randomness comes through a DrawSource (the real one:
// CounterDrawSource; tests: one that enumerates every outcome) and target distributions through
// TargetDistributions, asked lazily because computing p_i costs an O(vocab) pass over a logits
// row: p_{i+1} is requested only when d_i was accepted.
//
// Draw sites (Rng::at(seed, position, stream)), position = absolute position of the token:
//   kDraft    a model proposer's draw of d_i from q_i (the proposer's business, not this file's)
//   kAccept   the accept coin of draft i (model rule, standard one-hot rule)
//   kRecover  the recovered token after a rejection (model rule, standard one-hot rule)
//   kSample   the bonus token; every draw of sample-and-compare. This is the site a
//             non-speculative step samples position `pos` with, and
//             CounterDrawSource::categorical(distribution(row), pos, kSample) is the token
//             Sampler::sample(row, ..., Rng::at(seed, pos, kSample)) returns (tested), so the
//             executor may make those draws with sample() (which also gives the logprobs) or
//             take the verdict's token and call Sampler::score() for them.
// No site is drawn twice in one verification (tested).
//
// Thread-safety: a RejectionSampler is scratch space like Sampler: one per engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sampling/rng.h"
#include "sampling/sampler.h"

namespace arbor::sampling {

// The randomness of one verification. Each draw names its site; a source must treat distinct
// sites as independent draws.
class DrawSource {
 public:
  virtual ~DrawSource() = default;
  // True with probability `prob`: prob <= 0 (or NaN) never, prob >= 1 always.
  virtual bool bernoulli(double prob, int64_t position, RngStream stream) = 0;
  // A token of `dist` with probability prob / (sum of the positive probs); entries with
  // prob <= 0 never. dist: distinct ids, any order, positive total (CHECKed).
  virtual int32_t categorical(std::span<const Candidate> dist, int64_t position,
                              RngStream stream) = 0;
};

// The real draws of a request with seed `seed`: site (position, stream) takes
// u = Rng::at(seed, position, stream).next_double(); bernoulli is u < prob, categorical is
// inverse_cdf(dist, u).
class CounterDrawSource final : public DrawSource {
 public:
  explicit CounterDrawSource(uint64_t seed) : seed_(seed) {}
  bool bernoulli(double prob, int64_t position, RngStream stream) override;
  int32_t categorical(std::span<const Candidate> dist, int64_t position,
                      RngStream stream) override;

 private:
  uint64_t seed_;
};

// The target model's distributions along a chain, computed on demand.
class TargetDistributions {
 public:
  virtual ~TargetDistributions() = default;
  // p_i, i in [0, k]: the target's distribution for the token at position chain.position + i,
  // after the request's transforms with history = prompt + outputs + d_0..d_{i-1}. Called at
  // most once per i, in increasing i, and only if d_0..d_{i-1} were all accepted. The span must
  // stay valid until the next call or the end of the verification.
  virtual std::span<const Candidate> at(int32_t i) = 0;
};

// TargetDistributions over the verification pass's logits, as the executor has them: p_i =
// distribution(row i after apply_penalties with history prompt + outputs + d_0..d_{i-1},
// CandidateOrder::kById). Borrows everything it is given; one per verification.
class LogitsTarget final : public TargetDistributions {
 public:
  struct Rows {
    std::span<const float> logits;      // [k + 1, vocab_size] raw rows 0..k, row-major
    int64_t vocab_size = 0;
    const SamplingParams* params = nullptr;
    TokenHistory history;               // prompt and outputs before d_0
    std::span<const int32_t> draft_ids; // [k]
  };
  LogitsTarget(Sampler& sampler, const Rows& rows);
  std::span<const Candidate> at(int32_t i) override;

 private:
  Sampler& sampler_;
  Rows rows_;
  std::vector<int32_t> outputs_;  // history.output_ids + draft_ids
  std::vector<float> row_;        // [vocab_size] the penalised row
  std::vector<Candidate> dist_;
};

// TargetDistributions of a greedy request whose transforms cannot move its argmax (no
// logit_bias, penalties, grammar or min_tokens mask): p_i = one-hot(argmax_ids[i]), which is what
// LogitsTarget gives for such a request (Sampler::distribution of greedy params is the argmax,
// ties to the lowest id, with probability 1). The argmax comes from the device
// (ForwardOps::argmax_rows), so the rows' logits need not reach the host. Borrows argmax_ids.
class ArgmaxTarget final : public TargetDistributions {
 public:
  explicit ArgmaxTarget(std::span<const int32_t> argmax_ids) : ids_(argmax_ids) {}  // [k + 1]
  std::span<const Candidate> at(int32_t i) override;

 private:
  std::span<const int32_t> ids_;
  Candidate one_;
};

struct DraftChain {
  int64_t position = 0;                 // absolute position of the token d_0 proposes
  std::span<const int32_t> token_ids;   // [k] d_0..d_{k-1}, k >= 0
  // [k] q_i, the distribution d_i was drawn from (model drafts only; the one-hot rules ignore
  // it). q_i is a function of the prefix d_0..d_{i-1}.
  std::span<const std::vector<Candidate>> draft_probs;
};

struct ChainVerdict {
  int32_t num_accepted = 0;  // d_0..d_{num_accepted-1} are emitted; in [0, k]
  int32_t next_token = 0;    // emitted after them, at position chain.position + num_accepted
  bool is_bonus = false;     // num_accepted == k: next_token drawn from p_k at kSample
};

class RejectionSampler {
 public:
  // The standard rule with a model draft (Leviathan et al. 2023, Chen et al. 2023): for
  // i = 0..k-1 accept d_i with probability acceptance_probability(p_i, q_i, d_i) (site
  // (pos+i, kAccept)); on the first rejection emit a token drawn from residual(p_i, q_i) (site
  // (pos+i, kRecover)) and stop; when all are accepted, a bonus token from p_k (site
  // (pos+k, kSample)). Degenerate cases: q_i(d_i) = 0, d_i outside q_i's support (impossible
  // when d_i was drawn from q_i): rejected. A residual without mass (only reachable then, or
  // by rounding, since a rejection has probability sum(max(0, q - p)) = the residual's mass):
  // the recovered token is drawn from p_i at the kRecover site.
  // chain.draft_probs.size() == chain.token_ids.size() (CHECKed).
  ChainVerdict verify_model_drafts(const DraftChain& chain, TargetDistributions& target,
                                   DrawSource& draws);

  // The standard rule for one-hot drafts (model-free proposers, greedy drafts):
  // verify_model_drafts with q_i = one-hot(d_i), i.e. accept d_i with probability p_i(d_i),
  // recover from p_i with d_i removed. chain.draft_probs is ignored.
  ChainVerdict verify_one_hot(const DraftChain& chain, TargetDistributions& target,
                              DrawSource& draws);

  // Sample-and-compare, for one-hot drafts: x_i = a draw from p_i at site (pos+i, kSample), the
  // draw a non-speculative step makes at that position; emit x_i; go on while x_i == d_i.
  // Same output distribution as verify_one_hot, and a seeded request's tokens are the tokens
  // it produces without speculation (given bitwise-equal logits rows). chain.draft_probs is
  // ignored. is_bonus: all k matched and next_token = x_k.
  ChainVerdict verify_sample_and_compare(const DraftChain& chain, TargetDistributions& target,
                                         DrawSource& draws);

 private:
  std::vector<Candidate> residual_;  // scratch
};

// dist(token), or 0 when the token is not listed. O(n).
double prob_of(std::span<const Candidate> dist, int32_t token_id);

// min(1, p(token) / q(token)); 0 when q(token) <= 0 (the draft cannot have come from q).
double acceptance_probability(std::span<const Candidate> p, std::span<const Candidate> q,
                              int32_t token_id);

// The tokens x of p with max(0, p(x) - q(x)) > 0 and that weight, unnormalised, in increasing
// id; tokens outside q's support keep p(x), tokens outside p's support never appear. Its mass
// sum(max(0, p - q)) equals the probability of a rejection. O(n log n), O(n) when p and q are
// in id order. Writes into `out`.
void residual(std::span<const Candidate> p, std::span<const Candidate> q,
              std::vector<Candidate>& out);

}  // namespace arbor::sampling
