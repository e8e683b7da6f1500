// Tree verification is lossless (rejection_sampler.h, docs/sampling.md "Tree verification").
//
// Exact: for small vocabularies and trees (V <= 8, depth <= 3, width <= 3), every outcome of
// every random choice — the proposer's draws of the sampled nodes (with or without replacement)
// and the verifier's coins and recovered / bonus draws — is enumerated with its probability.
// The emitted tokens, extended to depth + 1 tokens by plain sampling from the target, must have
// the target's sequential joint distribution (so the first emitted token, and the first two,
// have the target's law) to 1e-9. Trees: sampled (a draft model's q), one-hot (model-free, a
// fixed function of the path, repeats and tokens outside p included), and both merged into one
// tree. Verifying a tree with the wrong rule fails the same check.
//
// Statistical: 65,536 seeded trials per configuration with CounterDrawSource.
// Chains: a width-1 tree gets the chain sampler's verdict, seed for seed.
// Greedy: every token assignment of small shapes against a naive longest-path search.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sampling/rejection_sampler.h"
#include "sampling/token_tree.h"
#include "spec_world.h"

namespace arbor::sampling::spec_test {
namespace {

// How the proposer drafts: per parent depth d, sampled[d] children drawn from q at every node
// of the sampled tree, one_hot[d] fixed children at every node of the one-hot tree; the two
// trees merged into one (the sampled one first unless one_hot_first).
struct TreeSetup {
  SpecSetup world;  // vocab, target and draft models and params, prompt, outputs (k unused)
  std::vector<int> sampled;
  std::vector<int> one_hot;
  bool one_hot_first = false;

  int depth() const { return static_cast<int>(std::max(sampled.size(), one_hot.size())); }
};

const char* variant_name(SiblingDraws s) {
  return s == SiblingDraws::kWithReplacement ? "with replacement" : "without replacement";
}

// The m-th fixed child of a path: World's one-hot draft (a token outside p, p's argmax or an
// arbitrary one) for m = 0, then hashed tokens (repeats of earlier children possible).
int32_t one_hot_child(World& w, const std::vector<int32_t>& path, int m) {
  if (m == 0) return w.one_hot_draft(path);
  uint64_t h = 0x51ed27 + static_cast<uint64_t>(m) * 0x9e3779b97f4a7c15ULL;
  for (int32_t t : path) h = (h ^ static_cast<uint64_t>(t + 7)) * 0xff51afd7ed558ccdULL;
  return static_cast<int32_t>((h >> 33) % static_cast<uint64_t>(w.setup().vocab));
}

TokenTree draft_tree(World& w, const TreeSetup& ts, SiblingDraws sibling_draws,
                     DrawSource& draws) {
  const int64_t position = w.setup().position();
  TokenTree sampled, fixed;
  std::vector<int32_t> level = {TokenTree::kRoot}, fixed_level = {TokenTree::kRoot};
  for (int d = 0; d < ts.depth(); ++d) {
    std::vector<int32_t> next, fixed_next;
    int32_t draw_index = 0;
    const int count = d < static_cast<int>(ts.sampled.size()) ? ts.sampled[d] : 0;
    for (int32_t u : level) {
      if (count == 0) break;
      const int32_t first = sampled.num_nodes();
      const int32_t added = append_sampled_children(sampled, u, w.q(sampled.path_tokens(u)),
                                                    count, sibling_draws, position, draw_index,
                                                    draws);
      for (int32_t i = first; i < first + added; ++i) next.push_back(i);
    }
    const int width = d < static_cast<int>(ts.one_hot.size()) ? ts.one_hot[d] : 0;
    for (int32_t u : fixed_level) {
      const std::vector<int32_t> path = fixed.path_tokens(u);
      for (int m = 0; m < width; ++m) fixed_next.push_back(fixed.add_node(u, one_hot_child(w, path, m)));
    }
    level = next;
    fixed_level = fixed_next;
  }
  TokenTree& first = ts.one_hot_first ? fixed : sampled;
  first.merge(ts.one_hot_first ? sampled : fixed);
  return first;
}

// TargetDistributions over a World; checks the laziness contract (each node at most once,
// the root first, then children of the previous node; greedy: children of any earlier node).
class WorldTreeTarget final : public TargetDistributions {
 public:
  WorldTreeTarget(World& w, const TokenTree& tree, bool one_path)
      : w_(w), tree_(tree), one_path_(one_path) {}
  std::span<const Candidate> at(int32_t node) override {
    if (called_.empty()) {
      broken_ |= node != TokenTree::kRoot;
    } else {
      broken_ |= node < 0 || node >= tree_.num_nodes() || called_.count(node) > 0;
      if (!broken_) {
        const int32_t parent = tree_.node(node).parent;
        broken_ |= one_path_ ? parent != last_ : called_.count(parent) == 0;
      }
    }
    called_.insert(node);
    last_ = node;
    if (broken_) node = TokenTree::kRoot;
    return w_.p(tree_.path_tokens(node));
  }
  bool contract_broken() const { return broken_; }

 private:
  World& w_;
  const TokenTree& tree_;
  bool one_path_;
  std::set<int32_t> called_;
  int32_t last_ = TokenTree::kRoot;
  bool broken_ = false;
};

// A verdict is a path from a child of the root; is_bonus iff its end has no children.
bool verdict_ok(const TokenTree& tree, const Verdict& v) {
  int32_t parent = TokenTree::kRoot;
  for (int32_t n : v.accepted_nodes) {
    if (n < 0 || n >= tree.num_nodes() || tree.node(n).parent != parent) return false;
    parent = n;
  }
  return v.is_bonus == tree.children(parent).empty();
}

std::vector<int32_t> emitted_tokens(const TokenTree& tree, const Verdict& v) {
  std::vector<int32_t> out;
  for (int32_t n : v.accepted_nodes) out.push_back(tree.node(n).token_id);
  out.push_back(v.next_token);
  return out;
}

size_t seq_index(const std::vector<int32_t>& seq, int vocab) {
  size_t index = 0;
  for (int32_t t : seq) index = index * static_cast<size_t>(vocab) + static_cast<size_t>(t);
  return index;
}

// Adds `mass` spread over every extension of seq to `length` tokens by plain target sampling.
void add_extended(World& w, std::vector<int32_t>& seq, size_t length, double mass,
                  std::vector<double>& joint) {
  if (seq.size() == length) {
    joint[seq_index(seq, w.setup().vocab)] += mass;
    return;
  }
  const std::vector<Candidate> p = w.p(seq);  // a copy: the recursion may rehash the memo
  double total = 0.0;
  for (const Candidate& c : p) total += c.prob;
  for (const Candidate& c : p) {
    seq.push_back(c.token_id);
    add_extended(w, seq, length, mass * c.prob / total, joint);
    seq.pop_back();
  }
}

std::vector<double> target_joint(World& w, size_t length) {
  std::vector<double> joint(static_cast<size_t>(std::pow(w.setup().vocab, length) + 0.5), 0.0);
  std::vector<int32_t> seq;
  add_extended(w, seq, length, 1.0, joint);
  return joint;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double out = 0.0;
  for (size_t i = 0; i < a.size(); ++i) out = std::max(out, std::fabs(a[i] - b[i]));
  return out;
}

struct TreeEnumerated {
  std::vector<double> joint;  // emitted tokens extended to depth + 1
  double total = 0.0;
  double mean_accepted = 0.0;
  size_t paths = 0;
  bool contract_broken = false;
  bool site_reused = false;
  bool nondeterministic = false;
};

// `draft_as` is how the proposer draws, `verify_as` the rule the verifier assumes; with
// `sample_and_compare` the verifier uses that rule instead (which needs no q).
TreeEnumerated enumerate_tree(World& w, const TreeSetup& ts, SiblingDraws draft_as,
                              SiblingDraws verify_as, bool sample_and_compare = false) {
  RejectionSampler sampler;
  EnumeratingDraws draws;
  std::map<std::vector<int32_t>, double> emitted;
  TreeEnumerated e;
  do {
    draws.begin_path();
    const TokenTree tree = draft_tree(w, ts, draft_as, draws);
    WorldTreeTarget target(w, tree, /*one_path=*/true);
    const Verdict v =
        sample_and_compare
            ? sampler.verify_sample_and_compare(tree, w.setup().position(), target, draws)
            : sampler.verify(tree, w.setup().position(), target, draws, verify_as);
    e.contract_broken |= target.contract_broken() || !verdict_ok(tree, v);
    emitted[emitted_tokens(tree, v)] += draws.path_prob();
    e.total += draws.path_prob();
    e.mean_accepted += draws.path_prob() * v.num_accepted();
    ++e.paths;
  } while (draws.next_path());
  e.site_reused = draws.site_reused();
  e.nondeterministic = draws.nondeterministic();
  const size_t length = static_cast<size_t>(ts.depth() + 1);
  e.joint.assign(static_cast<size_t>(std::pow(w.setup().vocab, length) + 0.5), 0.0);
  for (const auto& [seq, mass] : emitted) {
    if (seq.size() > length) {
      e.contract_broken = true;
      continue;
    }
    std::vector<int32_t> s = seq;
    add_extended(w, s, length, mass, e.joint);
  }
  return e;
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

TreeSetup make_tree_setup(const char* name, int vocab, SamplingParams target,
                          SamplingParams draft, std::vector<int> sampled,
                          std::vector<int> one_hot, bool one_hot_first = false) {
  TreeSetup t;
  t.world.name = name;
  t.world.vocab = vocab;
  t.world.params = std::move(target);
  t.world.draft_params = std::move(draft);
  const auto salt = static_cast<uint64_t>(vocab * 100 + sampled.size() * 10 + one_hot.size());
  t.world.target_model.seed = 3000 + salt;
  t.world.draft_model.seed = 4000 + salt;
  t.sampled = std::move(sampled);
  t.one_hot = std::move(one_hot);
  t.one_hot_first = one_hot_first;
  return t;
}

// Sampled (SpecInfer / Sequoia) trees, one-hot (model-free) trees, merged ones; temperature,
// filters (tokens outside q or outside p), penalties (p depends on the path), a greedy target.
std::vector<TreeSetup> exact_tree_setups() {
  std::vector<TreeSetup> out;
  out.push_back(make_tree_setup("sampled 3, T=1, draft T=1", 8, params(1.0f), params(1.0f),
                                {3}, {}));
  out.push_back(make_tree_setup("sampled 2x2, T=0.7, draft T=1.3", 5, params(0.7f),
                                params(1.3f), {2, 2}, {}));
  out.push_back(make_tree_setup("sampled 2x1x1, top_k=3, draft top_k=2", 4, params(1.0f, 3),
                                params(1.0f, 2), {2, 1, 1}, {}));
  out.push_back(make_tree_setup("sampled 3x1, penalties + top_p=0.95, draft T=1.3", 4,
                                with_penalties(params(1.0f, 0, 0.95f)),
                                with_penalties(params(1.3f)), {3, 1}, {}));
  out.push_back(make_tree_setup("sampled 2x2, min_p=0.2, draft T=1.6 (outside p)", 5,
                                params(1.0f, 0, 1.0f, 0.2f), params(1.6f), {2, 2}, {}));
  out.push_back(make_tree_setup("one-hot 3x2x1, T=1", 8, params(1.0f), params(1.0f), {},
                                {3, 2, 1}));
  out.push_back(make_tree_setup("one-hot 3x3x2, penalties + top_k=4", 6,
                                with_penalties(params(0.9f, 4)), params(1.0f), {}, {3, 3, 2}));
  out.push_back(make_tree_setup("sampled 2x1 + one-hot 2x1x1 merged, T=0.8", 5, params(0.8f),
                                params(1.0f), {2, 1}, {2, 1, 1}));
  out.push_back(make_tree_setup("one-hot 1x2 + sampled 2x2 merged, one-hot first", 4,
                                params(1.0f), params(1.2f), {2, 2}, {1, 2}, true));
  out.push_back(make_tree_setup("greedy target, sampled 2x2 + one-hot 1x1", 5, params(0.0f),
                                params(1.0f), {2, 2}, {1, 1}));
  return out;
}

// Every setup and sibling-draw variant, enumerated with `sample_and_compare` or the matching
// multi-step rule, must reproduce the target's joint law to 1e-9 with every contract kept.
void expect_every_setup_exact(bool sample_and_compare) {
  std::printf("%-20s%-52s %-20s %9s %8s %10s\n", sample_and_compare ? "sample-and-compare " : "",
              "setup", "variant", "paths", "E[acc]", "max err");
  for (const TreeSetup& setup : exact_tree_setups()) {
    for (SiblingDraws sd : {SiblingDraws::kWithReplacement, SiblingDraws::kWithoutReplacement}) {
      World w(setup.world);
      const TreeEnumerated e = enumerate_tree(w, setup, sd, sd, sample_and_compare);
      const std::string what = setup.world.name + " / " + variant_name(sd);
      EXPECT_FALSE(e.contract_broken) << what;
      EXPECT_FALSE(e.site_reused) << what;
      EXPECT_FALSE(e.nondeterministic) << what;
      EXPECT_NEAR(e.total, 1.0, 1e-12) << what;
      const double err =
          max_abs_diff(e.joint, target_joint(w, static_cast<size_t>(setup.depth() + 1)));
      EXPECT_LT(err, 1e-9) << what;
      std::printf("%-20s%-52s %-20s %9zu %8.4f %10.2e\n", "", setup.world.name.c_str(),
                  variant_name(sd), e.paths, e.mean_accepted, err);
    }
  }
}

TEST(TreeExactTest, EveryVariantReproducesTheTargetByEnumeration) {
  expect_every_setup_exact(/*sample_and_compare=*/false);
}

// Sample-and-compare (the rule the engine verifies trees with) is exact whatever the tree:
// drawn siblings with or without replacement, chosen ones, merged trees, a greedy target.
TEST(TreeExactTest, SampleAndCompareReproducesTheTargetByEnumeration) {
  expect_every_setup_exact(/*sample_and_compare=*/true);
}

// The rules are not interchangeable: verifying sampled siblings with the other variant's q_i
// is biased, and so is a model's q on siblings that were chosen (top-k), not drawn.
TEST(TreeExactTest, TheWrongRuleFailsTheEnumerationCheck) {
  const TreeSetup setup =
      make_tree_setup("sampled 3, T=1, draft T=1", 4, params(1.0f), params(1.0f), {3}, {});
  World w(setup.world);
  const std::vector<double> want = target_joint(w, 2);
  const double swapped_a = max_abs_diff(
      enumerate_tree(w, setup, SiblingDraws::kWithReplacement, SiblingDraws::kWithoutReplacement)
          .joint,
      want);
  const double swapped_b = max_abs_diff(
      enumerate_tree(w, setup, SiblingDraws::kWithoutReplacement, SiblingDraws::kWithReplacement)
          .joint,
      want);
  std::printf("drawn with, verified without replacement: error %.3e\n", swapped_a);
  std::printf("drawn without, verified with replacement: error %.3e\n", swapped_b);
  EXPECT_GT(swapped_a, 1e-3);
  EXPECT_GT(swapped_b, 1e-3);

  // The top-2 tokens of q as children labelled "drawn from q": no randomness in the draft.
  RejectionSampler sampler;
  for (SiblingDraws sd : {SiblingDraws::kWithReplacement, SiblingDraws::kWithoutReplacement}) {
    TokenTree tree;
    std::vector<Candidate> q = w.q({});
    const int32_t g = tree.add_draft_dist(q);
    std::sort(q.begin(), q.end(), [](const Candidate& a, const Candidate& b) {
      return a.prob != b.prob ? a.prob > b.prob : a.token_id < b.token_id;
    });
    for (int i = 0; i < 2; ++i) tree.add_node(-1, q[i].token_id, q[i].prob, g);
    std::vector<double> first(static_cast<size_t>(setup.world.vocab), 0.0);
    EnumeratingDraws draws;
    do {
      draws.begin_path();
      WorldTreeTarget target(w, tree, true);
      const Verdict v = sampler.verify(tree, w.setup().position(), target, draws, sd);
      first[static_cast<size_t>(emitted_tokens(tree, v)[0])] += draws.path_prob();
    } while (draws.next_path());
    const std::vector<double> p = [&] {
      std::vector<double> d(static_cast<size_t>(setup.world.vocab), 0.0);
      for (const Candidate& c : w.p({})) d[static_cast<size_t>(c.token_id)] = c.prob;
      return d;
    }();
    const double err = max_abs_diff(first, p);
    std::printf("top-2 children verified with the model's q (%s): error %.3e\n",
                variant_name(sd), err);
    EXPECT_GT(err, 1e-3);
    // The same tree as one-hot nodes is exact.
    TokenTree onehot;
    for (int i = 0; i < 2; ++i) onehot.add_node(-1, q[i].token_id, q[i].prob);
    std::fill(first.begin(), first.end(), 0.0);
    draws = EnumeratingDraws();
    do {
      draws.begin_path();
      WorldTreeTarget target(w, onehot, true);
      const Verdict v = sampler.verify(onehot, w.setup().position(), target, draws, sd);
      first[static_cast<size_t>(emitted_tokens(onehot, v)[0])] += draws.path_prob();
    } while (draws.next_path());
    EXPECT_LT(max_abs_diff(first, p), 1e-12);
  }
}

// ---- Statistical: the real draws. ----

void statistical_tree_check(const TreeSetup& setup, SiblingDraws sd, int trials,
                            uint64_t seed_base) {
  World w(setup.world);
  const size_t length = static_cast<size_t>(setup.depth() + 1);
  const std::vector<double> expected = target_joint(w, length);
  std::vector<double> counts(expected.size(), 0.0);
  RejectionSampler sampler;
  double accepted = 0.0;
  for (int t = 0; t < trials; ++t) {
    const uint64_t seed = seed_base + static_cast<uint64_t>(t);
    CounterDrawSource draws(seed);
    const TokenTree tree = draft_tree(w, setup, sd, draws);
    WorldTreeTarget target(w, tree, true);
    const Verdict v = sampler.verify(tree, setup.world.position(), target, draws, sd);
    ASSERT_TRUE(verdict_ok(tree, v) && !target.contract_broken()) << "seed " << seed;
    std::vector<int32_t> seq = emitted_tokens(tree, v);
    ASSERT_LE(seq.size(), length) << "seed " << seed;
    while (seq.size() < length) {
      const int64_t position = setup.world.position() + static_cast<int64_t>(seq.size());
      seq.push_back(draws.categorical(w.p(seq), position, RngStream::kSample));
    }
    counts[seq_index(seq, setup.world.vocab)] += 1.0;
    accepted += v.num_accepted();
  }
  const double n = trials;
  for (size_t b = 0; b < counts.size(); ++b) {
    const double e = expected[b];
    const double sigma = std::sqrt(n * e * (1.0 - e));
    EXPECT_LE(std::fabs(counts[b] - n * e), 6.0 * sigma + 5.0)
        << setup.world.name << " / " << variant_name(sd) << ": bin " << b << " count "
        << counts[b] << " expected " << n * e << " (seeds from " << seed_base << ")";
  }
  std::printf("%-52s %-20s mean accepted %.4f\n", setup.world.name.c_str(), variant_name(sd),
              accepted / n);
}

TEST(TreeStatisticalTest, SeededTrialsMatchTheTargetWithinSixSigma) {
  constexpr int kTrials = 65536;
  const std::vector<TreeSetup> setups = exact_tree_setups();
  uint64_t seed_base = 0;
  for (size_t i : {0u, 1u, 6u, 7u}) {
    for (SiblingDraws sd : {SiblingDraws::kWithReplacement, SiblingDraws::kWithoutReplacement}) {
      statistical_tree_check(setups[i], sd, kTrials, seed_base);
      seed_base += 1'000'000;
    }
  }
}

// ---- Chains: a width-1 tree is the chain sampler. ----

TEST(TreeChainTest, AWidthOneTreeGetsTheChainVerdictSeedForSeed) {
  SpecSetup setup;
  setup.name = "chain k=3";
  setup.vocab = 6;
  setup.k = 3;
  setup.params = with_penalties(params(0.9f, 4));
  setup.draft_params = params(1.2f);
  World w(setup);
  RejectionSampler tree_sampler;
  int accepted = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    for (Rule rule : {Rule::kModel, Rule::kOneHot}) {
      CounterDrawSource draws(seed);
      const Step chain = run_step(w, rule, real_verifier(rule), draws);
      std::vector<std::vector<Candidate>> qs;
      for (size_t i = 0; rule == Rule::kModel && i < chain.drafts.size(); ++i) {
        qs.push_back(w.q(std::span<const int32_t>(chain.drafts).first(i)));
      }
      const TokenTree tree = rule == Rule::kModel ? TokenTree::from_chain(chain.drafts, qs)
                                                  : TokenTree::from_chain(chain.drafts);
      for (SiblingDraws sd :
           {SiblingDraws::kWithReplacement, SiblingDraws::kWithoutReplacement}) {
        WorldTreeTarget target(w, tree, true);
        const Verdict v = tree_sampler.verify(tree, setup.position(), target, draws, sd);
        ASSERT_EQ(v.num_accepted(), chain.verdict.num_accepted) << "seed " << seed;
        ASSERT_EQ(v.next_token, chain.verdict.next_token) << "seed " << seed;
        ASSERT_EQ(v.is_bonus, chain.verdict.is_bonus) << "seed " << seed;
      }
      accepted += chain.verdict.num_accepted;
    }
  }
  EXPECT_GT(accepted, 500);
}

// ---- The executor's path: rows by slot, penalties along each path. ----

TEST(LogitsTargetTest, RowsBySlotGiveTheSameVerdicts) {
  const TreeSetup setup = exact_tree_setups()[7];  // merged, penalties-free T=0.8
  TreeSetup penalised = setup;
  penalised.world.params = with_penalties(params(0.8f, 4));
  World w(penalised.world);
  RejectionSampler sampler;
  Sampler row_sampler;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    for (SiblingDraws sd : {SiblingDraws::kWithReplacement, SiblingDraws::kWithoutReplacement}) {
      CounterDrawSource draws(seed);
      const TokenTree tree = draft_tree(w, penalised, sd, draws);
      WorldTreeTarget reference_target(w, tree, true);
      const Verdict reference =
          sampler.verify(tree, penalised.world.position(), reference_target, draws, sd);
      std::vector<float> logits;
      for (int32_t node = TokenTree::kRoot; node < tree.num_nodes(); ++node) {
        const std::vector<float> row = w.target_logits(tree.path_tokens(node));
        logits.insert(logits.end(), row.begin(), row.end());
      }
      LogitsTarget target(row_sampler, {logits, penalised.world.vocab,
                                            &penalised.world.params,
                                            {penalised.world.prompt, penalised.world.outputs},
                                            &tree});
      const Verdict v = sampler.verify(tree, penalised.world.position(), target, draws, sd);
      EXPECT_EQ(v.accepted_nodes, reference.accepted_nodes) << "seed " << seed;
      EXPECT_EQ(v.next_token, reference.next_token) << "seed " << seed;
      EXPECT_EQ(v.is_bonus, reference.is_bonus) << "seed " << seed;
    }
  }
}

// ---- Greedy rows that stay on the device: only their argmax comes back. ----

// Rows with few distinct values (many ties) and the argmax naively: the lowest id of the maximum.
std::vector<float> tied_rows(std::mt19937& rng, int32_t num_rows, int32_t vocab,
                             std::vector<int32_t>& argmax) {
  std::uniform_int_distribution<int> level(0, 2);
  std::vector<float> rows(static_cast<size_t>(num_rows) * vocab);
  argmax.assign(static_cast<size_t>(num_rows), 0);
  for (int32_t r = 0; r < num_rows; ++r) {
    for (int32_t t = 0; t < vocab; ++t) {
      float& v = rows[static_cast<size_t>(r) * vocab + t];
      v = static_cast<float>(level(rng)) - 0.5f * static_cast<float>(r % 3);
      if (v > rows[static_cast<size_t>(r) * vocab + argmax[r]]) argmax[r] = t;
    }
  }
  return rows;
}

TEST(ArgmaxTargetTest, GreedyVerdictsEqualTheLogitsTargetsOnChainsAndTrees) {
  constexpr int32_t kVocab = 6;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler row_sampler;
  RejectionSampler chains;
  RejectionSampler trees;
  std::mt19937 rng(20261125);
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  int accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int32_t k = trial % 6;
    std::vector<int32_t> argmax;
    const std::vector<float> rows = tied_rows(rng, k + 1, kVocab, argmax);
    // Drafts that often follow the argmax, so that chains get accepted too.
    std::vector<int32_t> drafts(static_cast<size_t>(k)), parents(static_cast<size_t>(k));
    for (int32_t i = 0; i < k; ++i) {
      drafts[i] = token(rng) < 3 ? argmax[i] : token(rng);
      parents[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(i + 1)) - 1;  // root..i-1
    }
    const std::vector<int32_t> none;
    CounterDrawSource draws(static_cast<uint64_t>(trial));
    const TokenTree chain = TokenTree::from_chain(drafts);
    LogitsTarget by_logits(row_sampler, {rows, kVocab, &greedy, {none, none}, &chain});
    ArgmaxTarget by_argmax(argmax);
    const ChainVerdict want =
        as_chain_verdict(chains.verify_sample_and_compare(chain, 5, by_logits, draws));
    const ChainVerdict got =
        as_chain_verdict(chains.verify_sample_and_compare(chain, 5, by_argmax, draws));
    ASSERT_EQ(got.num_accepted, want.num_accepted) << "trial " << trial;
    ASSERT_EQ(got.next_token, want.next_token) << "trial " << trial;
    ASSERT_EQ(got.is_bonus, want.is_bonus) << "trial " << trial;
    accepted += want.num_accepted;
    // The same rows as a tree's slots (distinct sibling tokens: a tree's rule).
    std::vector<int32_t> tree_tokens = drafts;
    for (int32_t i = 0; i < k; ++i) {
      const auto taken = [&](int32_t t) {
        for (int32_t j = 0; j < i; ++j) {
          if (parents[j] == parents[i] && tree_tokens[j] == t) return true;
        }
        return false;
      };
      while (taken(tree_tokens[i])) tree_tokens[i] = (tree_tokens[i] + 1) % kVocab;
    }
    const TokenTree tree = TokenTree::from_parents(tree_tokens, parents);
    LogitsTarget tree_logits(row_sampler, {rows, kVocab, &greedy, {none, none}, &tree});
    ArgmaxTarget tree_argmax(argmax);
    const Verdict tw = trees.verify_sample_and_compare(tree, 5, tree_logits, draws);
    const Verdict tg = trees.verify_sample_and_compare(tree, 5, tree_argmax, draws);
    ASSERT_EQ(tg.accepted_nodes, tw.accepted_nodes) << "trial " << trial;
    ASSERT_EQ(tg.next_token, tw.next_token) << "trial " << trial;
    ASSERT_EQ(tg.is_bonus, tw.is_bonus) << "trial " << trial;
  }
  EXPECT_GT(accepted, 500);  // the comparison covers accepted drafts, not only first rejections
}

// ---- Greedy. ----

struct GreedyReference {
  std::vector<int32_t> path;
  int32_t next = 0;
  bool bonus = false;
};

// The first node in DFS preorder (children in order) of maximal depth among nodes whose every
// token is the argmax at its parent; the root when none.
GreedyReference naive_greedy(World& w, const TokenTree& tree) {
  auto argmax_at = [&](int32_t node) { return argmax_token(w.p(tree.path_tokens(node))); };
  int32_t best = TokenTree::kRoot;
  std::vector<int32_t> preorder;
  auto visit = [&](auto&& self, int32_t node) -> void {
    preorder.push_back(node);
    for (int32_t c : tree.children(node)) self(self, c);
  };
  visit(visit, TokenTree::kRoot);
  for (int32_t node : preorder) {
    if (node == TokenTree::kRoot) continue;
    bool consistent = true;
    for (int32_t n : tree.path_to(node)) {
      consistent &= tree.node(n).token_id == argmax_at(tree.node(n).parent);
    }
    if (consistent && tree.depth(node) > tree.depth(best)) best = node;
  }
  return {tree.path_to(best), argmax_at(best), tree.children(best).empty()};
}

// Every token assignment (vocab 3) of a few shapes; the greedy verdict against the naive
// search; and, where siblings are distinct, both stochastic variants give the same verdict
// under a greedy target for any seed.
TEST(TreeGreedyTest, LongestArgmaxPathOnEveryAssignmentOfSmallShapes) {
  const std::vector<std::vector<int32_t>> shapes = {
      {-1, -1, 0, 0, 1, 1},       // binary, depth 2
      {-1, 0, 1, -1, 3, 4},       // two chains of 3
      {-1, -1, -1, 0, 1, 2, 3},   // width 3, then chains
      {-1, 0, 0, 1, 2, 3},        // depth 4 through two branches
  };
  for (float temperature : {0.0f, 1.0f}) {  // the greedy rule on a greedy or sampled target
    SpecSetup s;
    s.vocab = 3;
    s.params = params(temperature);
    s.target_model.seed = 99;
    World w(s);
    RejectionSampler sampler;
    int checked = 0, long_paths = 0;
    for (const std::vector<int32_t>& parents : shapes) {
      const size_t n = parents.size();
      size_t assignments = 1;
      for (size_t i = 0; i < n; ++i) assignments *= 3;
      for (size_t a = 0; a < assignments; ++a) {
        TokenTree tree;
        size_t code = a;
        for (size_t i = 0; i < n; ++i, code /= 3) {
          tree.add_node(parents[i], static_cast<int32_t>(code % 3));
        }
        WorldTreeTarget target(w, tree, /*one_path=*/false);
        const Verdict v = sampler.verify_greedy(tree, target);
        const GreedyReference ref = naive_greedy(w, tree);
        ASSERT_FALSE(target.contract_broken());
        ASSERT_EQ(v.accepted_nodes, ref.path) << "shape " << checked << " assignment " << a;
        ASSERT_EQ(v.next_token, ref.next);
        ASSERT_EQ(v.is_bonus, ref.bonus);
        long_paths += v.num_accepted() >= 2;
        if (temperature != 0.0f) continue;
        bool distinct = true;
        for (int32_t u = TokenTree::kRoot; u < tree.num_nodes(); ++u) {
          std::set<int32_t> tokens;
          for (int32_t c : tree.children(u)) distinct &= tokens.insert(tree.node(c).token_id).second;
        }
        if (!distinct) continue;
        for (SiblingDraws sd :
             {SiblingDraws::kWithReplacement, SiblingDraws::kWithoutReplacement}) {
          CounterDrawSource draws(a);
          WorldTreeTarget t2(w, tree, true);
          const Verdict sv = sampler.verify(tree, 10, t2, draws, sd);
          ASSERT_EQ(sv.accepted_nodes, ref.path);
          ASSERT_EQ(sv.next_token, ref.next);
        }
      }
      ++checked;
    }
    EXPECT_GT(long_paths, 50);
    std::printf("temperature %.0f: %d shapes, %d verdicts with >= 2 accepted\n", temperature,
                checked, long_paths);
  }
}

}  // namespace
}  // namespace arbor::sampling::spec_test
