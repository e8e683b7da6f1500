// Speculation is lossless: the rejection sampler's output distribution is the target's.
//
// Exact: for small vocabularies and chains, every outcome of every random choice (the model
// proposer's draws of d_i from q_i included) is enumerated with its probability; the emitted
// tokens, extended by plain sampling from the target to k+1 tokens, must have the target's
// sequential joint distribution, and the number of accepted drafts the distribution given by a
// direct recursion (P(accept d_i = x | prefix) = min(1, p(x) / q(x))), both to 1e-9. Broken
// samplers written here fail the same check.
//
// Statistical: 65,536 seeded trials per configuration with the real CounterDrawSource.
//
// Identity: sample-and-compare emits the tokens plain seeded sampling produces.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <utility>
#include <vector>

#include "sampling/rejection_sampler.h"
#include "spec_world.h"

namespace arbor::sampling::spec_test {
namespace {

// Index of a token sequence of length k+1 in [0, vocab^(k+1)).
size_t seq_index(const std::vector<int32_t>& seq, int vocab) {
  size_t index = 0;
  for (int32_t t : seq) index = index * static_cast<size_t>(vocab) + static_cast<size_t>(t);
  return index;
}

// Adds `mass` spread over every extension of `seq` to length k+1 by plain target sampling.
void add_extended(World& w, std::vector<int32_t>& seq, double mass, std::vector<double>& joint) {
  const SpecSetup& s = w.setup();
  if (seq.size() == static_cast<size_t>(s.k + 1)) {
    joint[seq_index(seq, s.vocab)] += mass;
    return;
  }
  const std::vector<Candidate> p = w.p(seq);  // copy: the recursion may rehash the memo
  double total = 0.0;
  for (const Candidate& c : p) total += c.prob;
  for (const Candidate& c : p) {
    seq.push_back(c.token_id);
    add_extended(w, seq, mass * c.prob / total, joint);
    seq.pop_back();
  }
}

size_t num_sequences(const SpecSetup& s) {
  return static_cast<size_t>(std::pow(s.vocab, s.k + 1) + 0.5);
}

// The target's sequential joint distribution over length-(k+1) sequences.
std::vector<double> target_joint(World& w) {
  std::vector<double> joint(num_sequences(w.setup()), 0.0);
  std::vector<int32_t> seq;
  add_extended(w, seq, 1.0, joint);
  return joint;
}

// dist as a dense normalised vector [vocab].
std::vector<double> dense(const std::vector<Candidate>& dist, int vocab) {
  std::vector<double> out(static_cast<size_t>(vocab), 0.0);
  double total = 0.0;
  for (const Candidate& c : dist) total += c.prob;
  for (const Candidate& c : dist) out[static_cast<size_t>(c.token_id)] = c.prob / total;
  return out;
}

// P(num_accepted = n), n in [0, k], by the direct recursion over draft prefixes.
void length_recursion(World& w, Rule rule, std::vector<int32_t>& prefix, double mass,
                      std::vector<double>& out) {
  const SpecSetup& s = w.setup();
  const size_t i = prefix.size();
  if (i == static_cast<size_t>(s.k)) {
    out[i] += mass;
    return;
  }
  const std::vector<double> p = dense(w.p(prefix), s.vocab);
  auto branch = [&](int32_t x, double draft_prob, double accept) {
    out[i] += mass * draft_prob * (1.0 - accept);
    prefix.push_back(x);
    length_recursion(w, rule, prefix, mass * draft_prob * accept, out);
    prefix.pop_back();
  };
  if (rule == Rule::kModel) {
    const std::vector<double> q = dense(w.q(prefix), s.vocab);
    for (int32_t x = 0; x < s.vocab; ++x) {
      if (q[x] > 0.0) branch(x, q[x], std::min(1.0, p[x] / q[x]));
    }
  } else {
    const int32_t d = w.one_hot_draft(prefix);
    branch(d, 1.0, p[d]);
  }
}

std::vector<double> expected_lengths(World& w, Rule rule) {
  std::vector<double> out(static_cast<size_t>(w.setup().k + 1), 0.0);
  std::vector<int32_t> prefix;
  length_recursion(w, rule, prefix, 1.0, out);
  return out;
}

struct Enumerated {
  std::vector<double> joint;
  std::vector<double> lengths;
  double total = 0.0;
  size_t paths = 0;
  bool contract_broken = false;
  bool site_reused = false;
  bool nondeterministic = false;
};

Enumerated enumerate(World& w, Rule rule, const Verifier& verify) {
  const SpecSetup& s = w.setup();
  Enumerated e;
  e.joint.assign(num_sequences(s), 0.0);
  e.lengths.assign(static_cast<size_t>(s.k + 1), 0.0);
  EnumeratingDraws draws;
  do {
    draws.begin_path();
    Step step = run_step(w, rule, verify, draws);
    ++e.paths;
    const double prob = draws.path_prob();
    e.total += prob;
    if (step.contract_broken || step.target_calls != step.verdict.num_accepted + 1) {
      e.contract_broken = true;
      continue;
    }
    e.lengths[static_cast<size_t>(step.verdict.num_accepted)] += prob;
    add_extended(w, step.emitted, prob, e.joint);
  } while (draws.next_path() && e.paths < 2'000'000);
  e.site_reused = draws.site_reused();
  e.nondeterministic = draws.nondeterministic();
  return e;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The largest deviation of `verify`'s output from the target (joint, then lengths).
std::pair<double, double> enumeration_error(const SpecSetup& setup, Rule rule,
                                            const Verifier& verify) {
  World w(setup);
  const Enumerated e = enumerate(w, rule, verify);
  EXPECT_FALSE(e.contract_broken) << setup.name;
  EXPECT_FALSE(e.site_reused) << setup.name;
  EXPECT_FALSE(e.nondeterministic) << setup.name;
  EXPECT_NEAR(e.total, 1.0, 1e-12) << setup.name;
  return {max_abs_diff(e.joint, target_joint(w)),
          max_abs_diff(e.lengths, expected_lengths(w, rule))};
}

SamplingParams params(float temperature, int32_t top_k = 0, float top_p = 1.0f,
                      float min_p = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

SamplingParams with_penalties(SamplingParams p) {
  p.repetition_penalty = 1.5f;
  p.presence_penalty = 0.7f;
  p.frequency_penalty = 0.5f;
  p.logit_bias = {{1, 0.8f}};
  return p;
}

SpecSetup make_setup(const char* name, int vocab, int k, SamplingParams target,
                 SamplingParams draft) {
  SpecSetup s;
  s.name = name;
  s.vocab = vocab;
  s.k = k;
  s.params = std::move(target);
  s.draft_params = std::move(draft);
  s.target_model.seed = 1000 + static_cast<uint64_t>(vocab * 10 + k);
  s.draft_model.seed = 2000 + static_cast<uint64_t>(vocab * 10 + k);
  return s;
}

// Target transforms x draft shapes: q with the request's own transforms, a narrower q (tokens
// outside q's support), a wider q (drafts outside p's support), a greedy draft model (one-hot
// q), q = p (every draft accepted); ties at the filters' cuts; penalties, which make p_i
// depend on d_0..d_{i-1}; both candidate orders; grammar masks (-inf logits) on p, on p and q.
std::vector<SpecSetup> exact_setups() {
  std::vector<SpecSetup> out;
  out.push_back(make_setup("plain T=1, draft T=1", 8, 3, params(1.0f), params(1.0f)));
  out.push_back(make_setup("plain T=0.7, draft T=1.2", 5, 3, params(0.7f), params(1.2f)));
  out.push_back(make_setup("T=0.6 top_k=3, draft same transforms", 8, 3, params(0.6f, 3),
                           params(0.6f, 3)));
  out.push_back(make_setup("top_p=0.7 T=1.3, draft top_k=2", 6, 3, params(1.3f, 0, 0.7f),
                           params(1.0f, 2)));
  out.push_back(make_setup("min_p=0.15, draft T=1.5 (drafts outside p)", 8, 2,
                           params(1.0f, 0, 1.0f, 0.15f), params(1.5f)));
  out.push_back(make_setup("greedy target, draft T=1", 5, 3, params(0.0f), params(1.0f)));
  out.push_back(make_setup("penalties + top_k=4, draft same transforms", 6, 3,
                           with_penalties(params(1.0f, 4)), with_penalties(params(1.0f, 4))));
  SpecSetup all = make_setup("all filters + penalties, greedy draft, by probability", 8, 3,
                         with_penalties(params(0.8f, 5, 0.85f, 0.05f)), params(0.0f));
  all.order = CandidateOrder::kByProbability;
  out.push_back(all);
  SpecSetup ties = make_setup("ties at top_k=3 / top_p=0.8 cuts, q = p", 7, 2,
                          params(1.0f, 3, 0.8f), params(1.0f, 3, 0.8f));
  ties.target_model.tie_grid = 0.5f;
  ties.draft_model = ties.target_model;
  out.push_back(ties);
  out.push_back(make_setup("vocab 2, draft T=0.5", 2, 3, params(1.0f), params(0.5f)));
  out.push_back(make_setup("k=1, min_p=0.3 + penalties, draft T=2", 3, 1,
                           with_penalties(params(0.9f, 0, 1.0f, 0.3f)), params(2.0f)));
  // Structured output: a grammar masks p (and, with a draft model that knows the grammar, q)
  // differently after every prefix.
  SpecSetup masked = make_setup("grammar mask on p and q, draft T=1.2", 6, 3, params(1.0f),
                                params(1.2f));
  masked.target_model.mask_seed = masked.draft_model.mask_seed = 11;
  out.push_back(masked);
  SpecSetup p_only = make_setup("grammar mask on p only (drafts it refuses)", 6, 3,
                                params(0.9f), params(1.0f));
  p_only.target_model.mask_seed = 12;
  out.push_back(p_only);
  SpecSetup filtered = make_setup("grammar mask + top_k=3 + penalties, masked greedy draft", 7, 3,
                                  with_penalties(params(0.8f, 3)), params(0.0f));
  filtered.target_model.mask_seed = filtered.draft_model.mask_seed = 13;
  out.push_back(filtered);
  SpecSetup greedy = make_setup("greedy masked target, masked draft T=1", 5, 3, params(0.0f),
                                params(1.0f));
  greedy.target_model.mask_seed = greedy.draft_model.mask_seed = 14;
  out.push_back(greedy);
  return out;
}

TEST(RejectionExactTest, EveryRuleReproducesTheTargetByEnumeration) {
  std::printf("%-58s %-20s %8s %8s %10s\n", "setup", "rule", "paths", "E[acc]", "max err");
  for (const SpecSetup& setup : exact_setups()) {
    for (Rule rule : {Rule::kModel, Rule::kOneHot, Rule::kSampleAndCompare}) {
      World w(setup);
      const Enumerated e = enumerate(w, rule, real_verifier(rule));
      EXPECT_FALSE(e.contract_broken) << setup.name << " / " << rule_name(rule);
      EXPECT_FALSE(e.site_reused) << setup.name << " / " << rule_name(rule);
      EXPECT_FALSE(e.nondeterministic) << setup.name << " / " << rule_name(rule);
      EXPECT_NEAR(e.total, 1.0, 1e-12) << setup.name << " / " << rule_name(rule);
      const double joint_err = max_abs_diff(e.joint, target_joint(w));
      const double length_err = max_abs_diff(e.lengths, expected_lengths(w, rule));
      EXPECT_LT(joint_err, 1e-9) << setup.name << " / " << rule_name(rule);
      EXPECT_LT(length_err, 1e-9) << setup.name << " / " << rule_name(rule);
      double mean = 0.0;
      for (size_t n = 0; n < e.lengths.size(); ++n) {
        mean += static_cast<double>(n) * e.lengths[n];
      }
      std::printf("%-58s %-20s %8zu %8.4f %10.2e\n", setup.name.c_str(), rule_name(rule),
                  e.paths, mean, std::max(joint_err, length_err));
    }
  }
}

// ---- Deliberately broken samplers: the enumeration check must reject each. ----

ChainVerdict bonus(const DraftChain& chain, ChainDistributions& target, DrawSource& draws) {
  const auto k = static_cast<int32_t>(chain.token_ids.size());
  return {k, draws.categorical(target.at(k), chain.position + k, RngStream::kSample), true};
}

// Recovers from p_i instead of the residual max(0, p_i - q_i).
ChainVerdict recover_from_p(const DraftChain& chain, ChainDistributions& target,
                            DrawSource& draws) {
  for (int32_t i = 0; i < static_cast<int32_t>(chain.token_ids.size()); ++i) {
    const std::span<const Candidate> p = target.at(i);
    const double a = acceptance_probability(p, chain.draft_probs[i], chain.token_ids[i]);
    if (draws.bernoulli(a, chain.position + i, RngStream::kAccept)) continue;
    return {i, draws.categorical(p, chain.position + i, RngStream::kRecover), false};
  }
  return bonus(chain, target, draws);
}

// Accepts a model draft with probability p(d) (the one-hot rule) instead of min(1, p/q).
ChainVerdict accept_with_p(const DraftChain& chain, ChainDistributions& target,
                           DrawSource& draws) {
  std::vector<Candidate> r;
  for (int32_t i = 0; i < static_cast<int32_t>(chain.token_ids.size()); ++i) {
    const std::span<const Candidate> p = target.at(i);
    const double a = prob_of(p, chain.token_ids[i]);
    if (draws.bernoulli(a, chain.position + i, RngStream::kAccept)) continue;
    residual(p, chain.draft_probs[i], r);
    return {i, draws.categorical(r.empty() ? p : std::span<const Candidate>(r),
                                 chain.position + i, RngStream::kRecover),
            false};
  }
  return bonus(chain, target, draws);
}

// Sample-and-compare that, after a mismatch, emits a fresh draw from p_i.
ChainVerdict resample_after_mismatch(const DraftChain& chain, ChainDistributions& target,
                                     DrawSource& draws) {
  for (int32_t i = 0; i < static_cast<int32_t>(chain.token_ids.size()); ++i) {
    const std::span<const Candidate> p = target.at(i);
    const int32_t x = draws.categorical(p, chain.position + i, RngStream::kSample);
    if (x == chain.token_ids[i]) continue;
    return {i, draws.categorical(p, chain.position + i, RngStream::kRecover), false};
  }
  return bonus(chain, target, draws);
}

TEST(RejectionExactTest, BrokenSamplersFailTheEnumerationCheck) {
  const SpecSetup setup = make_setup("plain T=1, draft T=1", 5, 3, params(1.0f), params(1.0f));
  struct Case {
    const char* name;
    Rule rule;  // the proposer it runs with
    ChainVerdict (*verify)(const DraftChain&, ChainDistributions&, DrawSource&);
  };
  const Case cases[] = {
      {"recover from p (model draft)", Rule::kModel, recover_from_p},
      {"recover from p (one-hot)", Rule::kOneHot, recover_from_p},
      {"accept with p(d) not min(1, p/q)", Rule::kModel, accept_with_p},
      {"resample after mismatch", Rule::kSampleAndCompare, resample_after_mismatch},
  };
  for (const Case& c : cases) {
    Verifier verify = c.verify;
    if (c.rule == Rule::kOneHot) {
      // One-hot chains carry no q: give the broken rule q_i = one-hot(d_i) explicitly.
      verify = [f = c.verify](const DraftChain& chain, ChainDistributions& target,
                              DrawSource& draws) {
        std::vector<std::vector<Candidate>> qs;
        for (int32_t d : chain.token_ids) qs.push_back({{d, 1.0}});
        return f({chain.position, chain.token_ids, qs}, target, draws);
      };
    }
    const auto [joint_err, length_err] = enumeration_error(setup, c.rule, verify);
    std::printf("%-36s joint error %.3e, length error %.3e\n", c.name, joint_err, length_err);
    EXPECT_GT(joint_err, 1e-3) << c.name;
  }
  // The same check passes the real samplers on this setup.
  for (Rule rule : {Rule::kModel, Rule::kOneHot, Rule::kSampleAndCompare}) {
    EXPECT_LT(enumeration_error(setup, rule, real_verifier(rule)).first, 1e-9);
  }
}

// ---- Statistical: the real draws. ----

// Runs `trials` seeded steps with CounterDrawSource (seed = seed_base + trial), extends each to
// k+1 tokens by plain sampling at the kSample sites, and checks every sequence bin and every
// accepted-length bin against its exact expectation: |count - N e| <= 6 sigma + 5 with
// sigma = sqrt(N e (1 - e)); and a pooled chi-square over each set of bins.
void statistical_check(const SpecSetup& setup, Rule rule, int trials, uint64_t seed_base) {
  World w(setup);
  const std::vector<double> joint_expected = target_joint(w);
  const std::vector<double> length_expected = expected_lengths(w, rule);
  std::vector<double> joint(joint_expected.size(), 0.0);
  std::vector<double> lengths(length_expected.size(), 0.0);
  const Verifier verify = real_verifier(rule);
  for (int t = 0; t < trials; ++t) {
    CounterDrawSource draws(seed_base + static_cast<uint64_t>(t));
    Step step = run_step(w, rule, verify, draws);
    ASSERT_FALSE(step.contract_broken) << "seed " << seed_base + static_cast<uint64_t>(t);
    std::vector<int32_t>& seq = step.emitted;
    while (seq.size() < static_cast<size_t>(setup.k + 1)) {
      const int64_t position = setup.position() + static_cast<int64_t>(seq.size());
      seq.push_back(draws.categorical(w.p(seq), position, RngStream::kSample));
    }
    joint[seq_index(seq, setup.vocab)] += 1.0;
    lengths[static_cast<size_t>(step.verdict.num_accepted)] += 1.0;
  }
  const double n = trials;
  auto check = [&](const std::vector<double>& counts, const std::vector<double>& expected,
                   const char* what) {
    for (size_t b = 0; b < counts.size(); ++b) {
      const double e = expected[b];
      const double sigma = std::sqrt(n * e * (1.0 - e));
      EXPECT_LE(std::fabs(counts[b] - n * e), 6.0 * sigma + 5.0)
          << setup.name << " / " << rule_name(rule) << ": " << what << " bin " << b
          << " count " << counts[b] << " expected " << n * e << " (seeds from " << seed_base
          << ")";
    }
    // Pearson chi-square, bins expecting fewer than 5 pooled into one; df = bins - 1. Bound
    // df + 7 sqrt(2 df) + 20: P(exceeding it) < 1e-7 for every df from 1 up. Much more power
    // than the per-bin bound against a small bias spread over many bins.
    double chi = 0.0, pooled_count = 0.0, pooled_expected = 0.0;
    int bins = 0;
    for (size_t b = 0; b < counts.size(); ++b) {
      const double e = n * expected[b];
      if (e < 5.0) {
        pooled_count += counts[b];
        pooled_expected += e;
        continue;
      }
      chi += (counts[b] - e) * (counts[b] - e) / e;
      ++bins;
    }
    if (pooled_expected > 0.0) {
      chi += (pooled_count - pooled_expected) * (pooled_count - pooled_expected) /
             pooled_expected;
      ++bins;
    }
    const double df = bins - 1;
    EXPECT_LT(chi, df + 7.0 * std::sqrt(2.0 * df) + 20.0)
        << setup.name << " / " << rule_name(rule) << ": " << what << " chi-square, df " << df;
    std::printf("  %-16s chi-square %8.1f, df %4.0f\n", what, chi, df);
  };
  std::printf("%s / %s:\n", setup.name.c_str(), rule_name(rule));
  check(joint, joint_expected, "sequences");
  check(lengths, length_expected, "accepted length");
}

TEST(RejectionStatisticalTest, SeededTrialsMatchTheTargetWithinSixSigma) {
  constexpr int kTrials = 65536;
  const std::vector<SpecSetup> setups = exact_setups();
  auto find = [&](const char* prefix) {
    for (const SpecSetup& s : setups) {
      if (s.name.rfind(prefix, 0) == 0) return s;
    }
    ADD_FAILURE() << "no setup " << prefix;
    return setups[0];
  };
  statistical_check(find("plain T=1"), Rule::kModel, kTrials, 0);
  statistical_check(find("plain T=0.7"), Rule::kModel, kTrials, 1'000'000);
  statistical_check(find("min_p=0.15"), Rule::kModel, kTrials, 2'000'000);
  statistical_check(find("penalties + top_k=4"), Rule::kModel, kTrials, 3'000'000);
  statistical_check(find("all filters"), Rule::kOneHot, kTrials, 4'000'000);
  statistical_check(find("penalties + top_k=4"), Rule::kSampleAndCompare, kTrials, 5'000'000);
  statistical_check(find("plain T=1"), Rule::kSampleAndCompare, kTrials, 6'000'000);
}

// ---- Identity with plain seeded sampling. ----

// sample-and-compare emits exactly the tokens plain decoding with Sampler::sample and the
// kSample site draws produces; the model rule's bonus token is the plain sample after its
// drafts; with a greedy target every rule emits the greedy tokens.
TEST(RejectionExactTest, SeededSpeculationEmitsThePlainSampledTokens) {
  std::vector<SpecSetup> setups;
  for (const SpecSetup& s : exact_setups()) {
    if (s.k >= 2) setups.push_back(s);
  }
  for (const SpecSetup& setup : setups) {
    World w(setup);
    Sampler sampler;
    int accepted = 0, bonuses = 0;
    const int64_t position = setup.position();
    auto plain_next = [&](const std::vector<int32_t>& prefix, uint64_t seed) {
      std::vector<int32_t> storage;
      Rng rng = Rng::at(seed, position + static_cast<int64_t>(prefix.size()),
                        RngStream::kSample);
      const std::vector<float> logits = w.target_logits(prefix);
      return sampler.sample(logits, setup.params, w.history(prefix, storage), rng).token_id;
    };
    for (uint64_t seed = 0; seed < 1000; ++seed) {
      std::vector<int32_t> plain;
      while (plain.size() < static_cast<size_t>(setup.k + 1)) {
        plain.push_back(plain_next(plain, seed));
      }

      CounterDrawSource draws(seed);
      const Step sc =
          run_step(w, Rule::kSampleAndCompare, real_verifier(Rule::kSampleAndCompare), draws);
      const std::vector<int32_t> plain_prefix(plain.begin(), plain.begin() + sc.emitted.size());
      ASSERT_EQ(sc.emitted, plain_prefix) << setup.name << " seed " << seed;
      accepted += sc.verdict.num_accepted;

      const Step model = run_step(w, Rule::kModel, real_verifier(Rule::kModel), draws);
      if (model.verdict.is_bonus) {
        ++bonuses;
        EXPECT_EQ(model.verdict.next_token, plain_next(model.drafts, seed)) << setup.name;
      }
      if (setup.params.greedy()) {
        for (Rule rule : {Rule::kModel, Rule::kOneHot}) {
          const Step s = run_step(w, rule, real_verifier(rule), draws);
          EXPECT_EQ(s.emitted,
                    std::vector<int32_t>(plain.begin(), plain.begin() + s.emitted.size()))
              << setup.name << " " << rule_name(rule);
        }
      }
    }
    // The comparison covered accepted drafts and bonus tokens, not only first-token mismatches.
    EXPECT_GT(accepted, 100) << setup.name;
    std::printf("%-58s accepted drafts %d, model-rule bonuses %d in 1000 seeds\n",
                setup.name.c_str(), accepted, bonuses);
  }
}

// The executor's path: LogitsTarget over the raw rows of a verification pass (penalties with
// the drafts in the history, inside LogitsTarget). Sample-and-compare still emits the plain
// sampled tokens, and every rule gives the verdict it gives over the test's own p_i.
TEST(RejectionExactTest, LogitsTargetOverRawRowsGivesTheSameVerdicts) {
  for (const SpecSetup& setup : exact_setups()) {
    World w(setup);
    Sampler plain_sampler, row_sampler;
    RejectionSampler sampler;
    const int64_t position = setup.position();
    for (uint64_t seed = 0; seed < 300; ++seed) {
      for (Rule rule : {Rule::kModel, Rule::kOneHot, Rule::kSampleAndCompare}) {
        CounterDrawSource draws(seed);
        const Step reference = run_step(w, rule, real_verifier(rule), draws);
        const std::vector<int32_t>& drafts = reference.drafts;
        std::vector<float> logits;
        for (size_t i = 0; i <= drafts.size(); ++i) {
          const std::vector<float> row =
              w.target_logits(std::span<const int32_t>(drafts).first(i));
          logits.insert(logits.end(), row.begin(), row.end());
        }
        const TokenTree tree = TokenTree::from_chain(drafts);
        LogitsTarget rows(row_sampler, {logits, setup.vocab, &setup.params,
                                        {setup.prompt, setup.outputs}, &tree});
        NodesAsChain target(rows);
        std::vector<std::vector<Candidate>> qs;
        if (rule == Rule::kModel) {
          for (size_t i = 0; i < drafts.size(); ++i) {
            qs.push_back(w.q(std::span<const int32_t>(drafts).first(i)));
          }
        }
        const DraftChain chain{position, drafts, qs};
        const ChainVerdict v = real_verifier(rule)(chain, target, draws);
        EXPECT_EQ(v.num_accepted, reference.verdict.num_accepted) << setup.name;
        EXPECT_EQ(v.next_token, reference.verdict.next_token) << setup.name;
        EXPECT_EQ(v.is_bonus, reference.verdict.is_bonus) << setup.name;
        if (rule != Rule::kSampleAndCompare) continue;
        // Plain decoding of the emitted positions with the kSample site draws.
        for (int32_t i = 0; i <= v.num_accepted; ++i) {
          const std::span<const int32_t> prefix(drafts.data(), static_cast<size_t>(i));
          std::vector<int32_t> storage;
          Rng rng = Rng::at(seed, position + i, RngStream::kSample);
          const std::vector<float> row = w.target_logits(prefix);
          const int32_t plain =
              plain_sampler.sample(row, setup.params, w.history(prefix, storage), rng).token_id;
          EXPECT_EQ(plain, i < v.num_accepted ? drafts[static_cast<size_t>(i)] : v.next_token)
              << setup.name << " seed " << seed << " position " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace arbor::sampling::spec_test
