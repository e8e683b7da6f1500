// A tiny speculative-decoding world for the rejection sampler's tests: a target and a draft
// "model" (logits as a deterministic pseudo-random function of the context), the request's
// sampling params and history, and the proposers (a model draft drawn from q, or a one-hot
// draft that is a fixed function of the prefix), and EnumeratingDraws, the DrawSource that
// runs a procedure once per outcome of its random choices (shared with the tree tests).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sampling/rejection_sampler.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"

namespace arbor::sampling::spec_test {

enum class Rule { kModel, kOneHot, kSampleAndCompare };

inline const char* rule_name(Rule rule) {
  switch (rule) {
    case Rule::kModel:
      return "model draft";
    case Rule::kOneHot:
      return "one-hot standard";
    case Rule::kSampleAndCompare:
      return "sample-and-compare";
  }
  return "?";
}

// Logits [vocab] as a function of (seed, context): N(0, scale) from a generator seeded by a hash
// of both; `tie_grid` > 0 rounds them to multiples of it (ties at the top-k / top-p cut).
// mask_seed > 0: a grammar's mask (structured output) on top: about a third of the tokens,
// chosen by a hash of (mask_seed, context, token), get -inf, never all of them.
struct ToyModel {
  uint64_t seed = 0;
  float scale = 1.5f;
  float tie_grid = 0.0f;
  uint64_t mask_seed = 0;

  std::vector<float> logits(int vocab, std::span<const int32_t> context) const {
    uint64_t h = seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
    for (int32_t t : context) h = (h ^ static_cast<uint64_t>(t + 1)) * 0xff51afd7ed558ccdULL;
    std::mt19937_64 gen(h ^ (h >> 29));
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> out(static_cast<size_t>(vocab));
    for (float& x : out) {
      x = normal(gen);
      if (tie_grid > 0.0f) x = std::round(x / tie_grid) * tie_grid;
    }
    if (mask_seed > 0) {
      uint64_t m = mask_seed * 0xd6e8feb86659fd93ULL;
      for (int32_t t : context) m = (m ^ static_cast<uint64_t>(t + 7)) * 0x9e3779b97f4a7c15ULL;
      const auto keep = static_cast<int>((m >> 17) % static_cast<uint64_t>(vocab));
      for (int t = 0; t < vocab; ++t) {
        const uint64_t h = (m ^ static_cast<uint64_t>(t + 1)) * 0xff51afd7ed558ccdULL;
        if (t != keep && (h >> 33) % 3 == 0) {
          out[static_cast<size_t>(t)] = -std::numeric_limits<float>::infinity();
        }
      }
    }
    return out;
  }
};

// One configuration. position = prompt.size() + outputs.size(): the absolute position of d_0.
struct SpecSetup {
  std::string name;
  int vocab = 5;
  int k = 2;
  SamplingParams params;        // the request's: the target's p goes through them
  SamplingParams draft_params;  // what the model proposer's q goes through
  ToyModel target_model{1};
  ToyModel draft_model{2};
  std::vector<int32_t> prompt = {0, 1, 1};
  std::vector<int32_t> outputs = {2};
  CandidateOrder order = CandidateOrder::kById;  // how p and q are listed

  int64_t position() const { return static_cast<int64_t>(prompt.size() + outputs.size()); }
};

// p, q and the one-hot drafts of a SpecSetup, memoised by prefix (the generated-after-outputs
// tokens d_0..d_{i-1}).
class World {
 public:
  explicit World(SpecSetup setup) : s_(std::move(setup)) {}
  const SpecSetup& setup() const { return s_; }

  std::vector<float> target_logits(std::span<const int32_t> prefix) const {
    return s_.target_model.logits(s_.vocab, context(prefix));
  }

  // The target's distribution after the request's transforms, history = prompt + outputs +
  // prefix: exactly what Sampler::sample draws from there.
  const std::vector<Candidate>& p(std::span<const int32_t> prefix) {
    return memo(p_, prefix, [&] {
      return transformed(s_.target_model, s_.params, prefix);
    });
  }
  const std::vector<Candidate>& q(std::span<const int32_t> prefix) {
    return memo(q_, prefix, [&] {
      return transformed(s_.draft_model, s_.draft_params, prefix);
    });
  }
  // A fixed function of the prefix mixing the interesting cases: a token outside p's support
  // (when there is one), p's most likely token, or an arbitrary one.
  int32_t one_hot_draft(std::span<const int32_t> prefix) {
    const uint64_t h = code(prefix) * 0x9e3779b97f4a7c15ULL >> 40;
    const std::vector<Candidate>& dist = p(prefix);
    if (h % 3 == 0 && dist.size() < static_cast<size_t>(s_.vocab)) {
      for (int32_t t = 0; t < s_.vocab; ++t) {
        if (prob_of(dist, t) == 0.0) return t;
      }
    }
    if (h % 3 == 1) {
      const Candidate* best = &dist[0];
      for (const Candidate& c : dist) {
        if (c.prob > best->prob) best = &c;
      }
      return best->token_id;
    }
    return static_cast<int32_t>(h % static_cast<uint64_t>(s_.vocab));
  }

  TokenHistory history(std::span<const int32_t> prefix, std::vector<int32_t>& storage) const {
    storage = s_.outputs;
    storage.insert(storage.end(), prefix.begin(), prefix.end());
    return {s_.prompt, storage};
  }

 private:
  std::vector<int32_t> context(std::span<const int32_t> prefix) const {
    std::vector<int32_t> c = s_.prompt;
    c.insert(c.end(), s_.outputs.begin(), s_.outputs.end());
    c.insert(c.end(), prefix.begin(), prefix.end());
    return c;
  }
  uint64_t code(std::span<const int32_t> prefix) const {
    uint64_t c = 1;
    for (int32_t t : prefix) {
      c = c * static_cast<uint64_t>(s_.vocab + 1) + static_cast<uint64_t>(t + 1);
    }
    return c;
  }
  std::vector<Candidate> transformed(const ToyModel& model, const SamplingParams& params,
                                     std::span<const int32_t> prefix) {
    std::vector<float> logits = model.logits(s_.vocab, context(prefix));
    std::vector<int32_t> storage;
    sampler_.apply_penalties(logits, params, history(prefix, storage));
    return sampler_.distribution(logits, params, s_.order);
  }
  template <typename Make>
  const std::vector<Candidate>& memo(std::unordered_map<uint64_t, std::vector<Candidate>>& m,
                                     std::span<const int32_t> prefix, Make make) {
    const uint64_t key = code(prefix);
    auto it = m.find(key);
    if (it == m.end()) it = m.emplace(key, make()).first;
    return it->second;
  }

  SpecSetup s_;
  Sampler sampler_;
  std::unordered_map<uint64_t, std::vector<Candidate>> p_, q_;
};

// The chain view of verification these tests enumerate: a chain of k drafts is the width-1
// TokenTree, verified by the one RejectionSampler; the types below only name its parts as the
// chain tests do (draft i = node i; row i of the target = the node before draft i).
struct DraftChain {
  int64_t position = 0;                 // absolute position of the token d_0 proposes
  std::span<const int32_t> token_ids;   // [k] d_0..d_{k-1}
  std::span<const std::vector<Candidate>> draft_probs;  // [k] q_i (model drafts only)
};

struct ChainVerdict {
  int32_t num_accepted = 0;  // d_0..d_{num_accepted-1} are emitted; in [0, k]
  int32_t next_token = 0;    // emitted after them
  bool is_bonus = false;     // num_accepted == k: next_token drawn from p_k at kSample
};

// A chain's verdict from the tree verifier's (whose path is 0, 1, ...; -1 accepted otherwise).
inline ChainVerdict as_chain_verdict(const Verdict& v) {
  for (size_t i = 0; i < v.accepted_nodes.size(); ++i) {
    if (v.accepted_nodes[i] != static_cast<int32_t>(i)) return ChainVerdict{-1, 0, false};
  }
  return ChainVerdict{v.num_accepted(), v.next_token, v.is_bonus};
}

// The target's distributions along a chain, row i after d_0..d_{i-1}, asked lazily.
class ChainDistributions {
 public:
  virtual ~ChainDistributions() = default;
  virtual std::span<const Candidate> at(int32_t i) = 0;
};

// ChainDistributions as the verifier asks for them: node n's distribution is row n + 1.
class ChainAsTree final : public TargetDistributions {
 public:
  explicit ChainAsTree(ChainDistributions& chain) : chain_(chain) {}
  std::span<const Candidate> at(int32_t node) override { return chain_.at(node + 1); }

 private:
  ChainDistributions& chain_;
};

// A tree target's distributions along a chain (row i = node i - 1).
class NodesAsChain final : public ChainDistributions {
 public:
  explicit NodesAsChain(TargetDistributions& nodes) : nodes_(nodes) {}
  std::span<const Candidate> at(int32_t i) override { return nodes_.at(i - 1); }

 private:
  TargetDistributions& nodes_;
};

// ChainDistributions over a World for one draft chain; checks the laziness contract.
class ChainTarget final : public ChainDistributions {
 public:
  ChainTarget(World& world, std::span<const int32_t> drafts) : world_(world), drafts_(drafts) {}
  std::span<const Candidate> at(int32_t i) override {
    if (i != num_calls_ || i > static_cast<int32_t>(drafts_.size())) contract_broken_ = true;
    ++num_calls_;
    const size_t n = std::min(static_cast<size_t>(std::max(i, 0)), drafts_.size());
    return world_.p(drafts_.first(n));
  }
  int32_t num_calls() const { return num_calls_; }
  bool contract_broken() const { return contract_broken_; }

 private:
  World& world_;
  std::span<const int32_t> drafts_;
  int32_t num_calls_ = 0;
  bool contract_broken_ = false;
};

// The sampler under test, as a parameter so tests can also run deliberately broken ones.
using Verifier = std::function<ChainVerdict(const DraftChain&, ChainDistributions&,
                                            DrawSource&)>;

// The chain as the executor verifies it: a TokenTree (model drafts: each node its own q group;
// one-hot drafts: one-hot nodes), the stochastic rule or sample-and-compare.
inline Verifier real_verifier(Rule rule) {
  auto sampler = std::make_shared<RejectionSampler>();
  return [sampler, rule](const DraftChain& chain, ChainDistributions& target,
                         DrawSource& draws) {
    const TokenTree tree = rule == Rule::kModel
                               ? TokenTree::from_chain(chain.token_ids, chain.draft_probs)
                               : TokenTree::from_chain(chain.token_ids);
    ChainAsTree nodes(target);
    const Verdict v = rule == Rule::kSampleAndCompare
                          ? sampler->verify_sample_and_compare(tree, chain.position, nodes, draws)
                          : sampler->verify(tree, chain.position, nodes, draws,
                                            SiblingDraws::kWithReplacement);
    return as_chain_verdict(v);
  };
}

// One speculative step: propose (model drafts drawn from q at the kDraft sites), verify.
struct Step {
  std::vector<int32_t> drafts;
  ChainVerdict verdict;
  std::vector<int32_t> emitted;  // accepted drafts + the next token
  int32_t target_calls = 0;
  bool contract_broken = false;
};

inline Step run_step(World& world, Rule rule, const Verifier& verify, DrawSource& draws) {
  const SpecSetup& s = world.setup();
  Step step;
  std::vector<std::vector<Candidate>> qs;
  for (int i = 0; i < s.k; ++i) {
    if (rule == Rule::kModel) {
      qs.push_back(world.q(step.drafts));
      step.drafts.push_back(draws.categorical(qs.back(), s.position() + i, RngStream::kDraft));
    } else {
      step.drafts.push_back(world.one_hot_draft(step.drafts));
    }
  }
  ChainTarget target(world, step.drafts);
  const DraftChain chain{s.position(), step.drafts, qs};
  step.verdict = verify(chain, target, draws);
  const ChainVerdict& v = step.verdict;
  step.contract_broken = target.contract_broken() || v.num_accepted < 0 ||
                         v.num_accepted > s.k || v.is_bonus != (v.num_accepted == s.k);
  step.target_calls = target.num_calls();
  if (!step.contract_broken) {
    step.emitted.assign(step.drafts.begin(), step.drafts.begin() + v.num_accepted);
    step.emitted.push_back(v.next_token);
  }
  return step;
}

// A DrawSource that explores every outcome: each run of the procedure follows one path of
// choices; next_path() moves to the next one (depth first). Outcomes of probability 0 are not
// explored. Also checks that no draw site is used twice in one run (the real source would give
// the same uniform twice) and that runs are deterministic (same choices, same options).
class EnumeratingDraws final : public DrawSource {
 public:
  void begin_path() {
    depth_ = 0;
    prob_ = 1.0;
    sites_.clear();
  }
  // False when every path has been run.
  bool next_path() {
    path_.resize(depth_);
    while (!path_.empty() && path_.back().index + 1 == path_.back().arity) path_.pop_back();
    if (path_.empty()) return false;
    ++path_.back().index;
    return true;
  }
  double path_prob() const { return prob_; }
  bool site_reused() const { return site_reused_; }
  bool nondeterministic() const { return nondeterministic_; }

  bool bernoulli(double prob, int64_t position, RngStream stream) override {
    note_site(position, stream);
    if (!(prob > 0.0)) return false;
    if (prob >= 1.0) return true;
    return choose({prob, 1.0 - prob}) == 0;
  }
  int32_t categorical(std::span<const Candidate> dist, int64_t position,
                      RngStream stream) override {
    note_site(position, stream);
    double total = 0.0;
    for (const Candidate& c : dist) total += c.prob > 0.0 ? c.prob : 0.0;
    std::vector<double> probs;
    std::vector<int32_t> ids;
    for (const Candidate& c : dist) {
      if (c.prob > 0.0) {
        probs.push_back(c.prob / total);
        ids.push_back(c.token_id);
      }
    }
    return ids[choose(probs)];
  }

 private:
  struct Choice {
    size_t index;
    size_t arity;
  };
  size_t choose(const std::vector<double>& probs) {
    if (depth_ == path_.size()) path_.push_back({0, probs.size()});
    const Choice& c = path_[depth_++];
    if (c.arity != probs.size()) nondeterministic_ = true;
    prob_ *= probs[std::min(c.index, probs.size() - 1)];
    return std::min(c.index, probs.size() - 1);
  }
  void note_site(int64_t position, RngStream stream) {
    if (!sites_.insert({position, static_cast<uint32_t>(stream)}).second) site_reused_ = true;
  }

  std::vector<Choice> path_;
  size_t depth_ = 0;
  double prob_ = 1.0;
  std::set<std::pair<int64_t, uint32_t>> sites_;
  bool site_reused_ = false;
  bool nondeterministic_ = false;
};

}  // namespace arbor::sampling::spec_test
