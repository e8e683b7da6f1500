#include "sampling/rejection_sampler.h"

#include <algorithm>

#include "base/check.h"

namespace arbor::sampling {

namespace {

bool by_id(const Candidate& a, const Candidate& b) { return a.token_id < b.token_id; }

void assign_by_id(std::span<const Candidate> dist, std::vector<Candidate>& out) {
  out.assign(dist.begin(), dist.end());
  if (!std::is_sorted(out.begin(), out.end(), by_id)) std::sort(out.begin(), out.end(), by_id);
}

double positive_mass(std::span<const Candidate> dist) {
  double total = 0.0;
  for (const Candidate& c : dist) total += c.prob > 0.0 ? c.prob : 0.0;
  return total;
}

// out = the tokens x of w with w(x) - scale * q(x) > 0 and that weight, in increasing id. w and
// q in increasing id.
void subtract_scaled(std::span<const Candidate> w, std::span<const Candidate> q, double scale,
                     std::vector<Candidate>& out) {
  out.clear();
  size_t j = 0;
  for (const Candidate& c : w) {
    while (j < q.size() && q[j].token_id < c.token_id) ++j;
    const double q_prob = j < q.size() && q[j].token_id == c.token_id ? q[j].prob : 0.0;
    const double weight = c.prob - scale * q_prob;
    if (weight > 0.0) out.push_back({c.token_id, weight});
  }
}

// `dist` itself when it is in id order, else a sorted copy kept in `storage`.
std::span<const Candidate> in_id_order(std::span<const Candidate> dist,
                                       std::vector<Candidate>& storage) {
  if (std::is_sorted(dist.begin(), dist.end(), by_id)) return dist;
  storage.assign(dist.begin(), dist.end());
  std::sort(storage.begin(), storage.end(), by_id);
  return storage;
}

}  // namespace

bool CounterDrawSource::bernoulli(double prob, int64_t position, RngStream stream) {
  return Rng::at(seed_, position, stream).next_double() < prob;
}

int32_t CounterDrawSource::categorical(std::span<const Candidate> dist, int64_t position,
                                       RngStream stream) {
  return inverse_cdf(dist, Rng::at(seed_, position, stream).next_double());
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

int32_t argmax_token(std::span<const Candidate> dist) {
  ARBOR_CHECK(!dist.empty()) << "argmax of an empty distribution";
  const Candidate* best = &dist[0];
  for (const Candidate& c : dist) {
    if (c.prob > best->prob || (c.prob == best->prob && c.token_id < best->token_id)) best = &c;
  }
  return best->token_id;
}

LogitsTarget::LogitsTarget(Sampler& sampler, const Rows& rows)
    : sampler_(sampler), rows_(rows) {
  ARBOR_CHECK(rows.params != nullptr && rows.tree != nullptr);
  ARBOR_CHECK(rows.vocab_size > 0 &&
              rows.logits.size() == static_cast<size_t>(rows.vocab_size) *
                                        static_cast<size_t>(rows.tree->num_slots()))
      << rows.logits.size() << " logits for " << rows.tree->num_slots() << " rows of "
      << rows.vocab_size;
}

std::span<const Candidate> LogitsTarget::at(int32_t node) {
  const auto vocab = static_cast<size_t>(rows_.vocab_size);
  const std::span<const float> raw =
      rows_.logits.subspan(static_cast<size_t>(node + 1) * vocab, vocab);
  row_.assign(raw.begin(), raw.end());
  outputs_.assign(rows_.history.output_ids.begin(), rows_.history.output_ids.end());
  const std::vector<int32_t> path = rows_.tree->path_tokens(node);
  outputs_.insert(outputs_.end(), path.begin(), path.end());
  sampler_.apply_penalties(row_, *rows_.params, {rows_.history.prompt_ids, outputs_});
  dist_ = sampler_.distribution(row_, *rows_.params, CandidateOrder::kById);
  return dist_;
}

std::span<const Candidate> ArgmaxTarget::at(int32_t node) {
  const auto slot = static_cast<size_t>(node + 1);
  ARBOR_CHECK(node >= TokenTree::kRoot && slot < ids_.size()) << node;
  ARBOR_CHECK_GE(ids_[slot], 0) << "node " << node << " has no argmax";
  one_ = Candidate{.token_id = ids_[slot], .prob = 1.0};
  return {&one_, 1};
}

Verdict RejectionSampler::verify(const TokenTree& tree, int64_t position,
                                         TargetDistributions& target, DrawSource& draws,
                                         SiblingDraws sibling_draws) {
  Verdict verdict;
  int32_t node = TokenTree::kRoot;
  for (;;) {
    const int64_t at_position = position + tree.depth(node);
    const std::span<const Candidate> p = target.at(node);
    const std::span<const int32_t> children = tree.children(node);
    if (children.empty()) {
      verdict.next_token = draws.categorical(p, at_position, RngStream::kSample);
      verdict.is_bonus = true;
      return verdict;
    }
    // r = weights_ / mass; p is taken as normalised, as the chain sampler does, so a chain
    // draws with exactly its probabilities.
    assign_by_id(p, weights_);
    double mass = 1.0;
    bool descended = false;
    for (size_t i = 0; i < children.size() && !descended; ++i) {
      const TreeNode& child = tree.node(children[i]);
      // q_i = q_ / q_mass.
      const double q_mass = draft_for(tree, children, i, sibling_draws);
      const double q_prob = q_mass > 0.0 ? prob_of(q_, child.token_id) / q_mass : 0.0;
      const double accept =
          q_prob > 0.0 ? std::min(1.0, prob_of(weights_, child.token_id) / mass / q_prob) : 0.0;
      if (draws.bernoulli(accept, at_position, tree_accept_stream(static_cast<int32_t>(i)))) {
        verdict.accepted_nodes.push_back(children[i]);
        node = children[i];
        descended = true;
        continue;
      }
      if (!(q_mass > 0.0)) continue;
      subtract_scaled(weights_, q_, mass / q_mass, next_);
      const double next_mass = positive_mass(next_);
      if (!(next_mass > 0.0)) continue;  // no residual mass: see the header
      weights_.swap(next_);
      mass = next_mass;
    }
    if (descended) continue;
    verdict.next_token = draws.categorical(weights_, at_position, RngStream::kRecover);
    return verdict;
  }
}

double RejectionSampler::draft_for(const TokenTree& tree,
                                       std::span<const int32_t> children, size_t i,
                                       SiblingDraws sibling_draws) {
  const TreeNode& child = tree.node(children[i]);
  if (child.draft_dist == TokenTree::kOneHot) {
    q_.assign(1, {child.token_id, 1.0});
    return 1.0;
  }
  assign_by_id(tree.draft_dist(child.draft_dist), q_);
  if (sibling_draws == SiblingDraws::kWithReplacement) return 1.0;
  excluded_.clear();
  for (size_t j = 0; j < i; ++j) {
    const TreeNode& earlier = tree.node(children[j]);
    if (earlier.draft_dist == child.draft_dist) excluded_.push_back(earlier.token_id);
  }
  if (excluded_.empty()) return 1.0;
  std::erase_if(q_, [&](const Candidate& c) {
    return std::find(excluded_.begin(), excluded_.end(), c.token_id) != excluded_.end();
  });
  return positive_mass(q_);
}

Verdict RejectionSampler::verify_sample_and_compare(const TokenTree& tree,
                                                            int64_t position,
                                                            TargetDistributions& target,
                                                            DrawSource& draws) {
  Verdict verdict;
  int32_t node = TokenTree::kRoot;
  while (true) {
    const int32_t x =
        draws.categorical(target.at(node), position + tree.depth(node), RngStream::kSample);
    const std::optional<int32_t> child = tree.find_child(node, x);
    if (!child) {
      verdict.next_token = x;
      verdict.is_bonus = tree.children(node).empty();
      return verdict;
    }
    verdict.accepted_nodes.push_back(*child);
    node = *child;
  }
}

Verdict RejectionSampler::verify_greedy(const TokenTree& tree,
                                                TargetDistributions& target) {
  Verdict verdict;
  greedy_from(tree, TokenTree::kRoot, target, verdict);
  std::reverse(verdict.accepted_nodes.begin(), verdict.accepted_nodes.end());
  return verdict;
}

// The longest argmax-consistent path below `node`, written into `out` leaf first.
void RejectionSampler::greedy_from(const TokenTree& tree, int32_t node,
                                       TargetDistributions& target, Verdict& out) {
  const int32_t best_token = argmax_token(target.at(node));
  const std::span<const int32_t> children = tree.children(node);
  out = {{}, best_token, children.empty()};
  for (int32_t child : children) {
    if (tree.node(child).token_id != best_token) continue;
    Verdict below;
    greedy_from(tree, child, target, below);
    if (below.num_accepted() + 1 > out.num_accepted()) {
      out = std::move(below);
      out.accepted_nodes.push_back(child);
    }
  }
}

int32_t append_sampled_children(TokenTree& tree, int32_t parent, std::vector<Candidate> q,
                                int32_t count, SiblingDraws sibling_draws, int64_t position,
                                int32_t& draw_index, DrawSource& draws) {
  const int64_t at_position = position + tree.depth(parent);
  std::vector<Candidate> left = q;
  const int32_t group = tree.add_draft_dist(std::move(q));
  const std::span<const Candidate> dist = tree.draft_dist(group);
  int32_t added = 0;
  for (; added < count; ++added) {
    const std::span<const Candidate> from =
        sibling_draws == SiblingDraws::kWithReplacement ? dist : std::span<const Candidate>(left);
    if (!(positive_mass(from) > 0.0)) break;
    const int32_t token = draws.categorical(from, at_position, tree_draft_stream(draw_index++));
    tree.add_node(parent, token, prob_of(dist, token), group);
    std::erase_if(left, [&](const Candidate& c) { return c.token_id == token; });
  }
  return added;
}

}  // namespace arbor::sampling
