#include "sampling/token_tree.h"

#include <algorithm>

#include "base/check.h"
#include "sampling/rejection_sampler.h"

namespace arbor::sampling {

TokenTree TokenTree::from_chain(std::span<const int32_t> token_ids,
                                std::span<const float> probs) {
  ARBOR_CHECK(probs.empty() || probs.size() == token_ids.size())
      << probs.size() << " probabilities for " << token_ids.size() << " tokens";
  TokenTree tree;
  int32_t parent = kRoot;
  for (size_t i = 0; i < token_ids.size(); ++i) {
    parent = tree.add_node(parent, token_ids[i], probs.empty() ? 1.0 : probs[i]);
  }
  return tree;
}

TokenTree TokenTree::from_parents(std::span<const int32_t> token_ids,
                                  std::span<const int32_t> parents,
                                  std::span<const float> probs) {
  ARBOR_CHECK(parents.size() == token_ids.size() && (probs.empty() || probs.size() == parents.size()))
      << parents.size() << " parents, " << probs.size() << " probabilities for "
      << token_ids.size() << " tokens";
  TokenTree tree;
  for (size_t i = 0; i < token_ids.size(); ++i) {
    tree.add_node(parents[i], token_ids[i], probs.empty() ? 1.0 : probs[i]);
  }
  return tree;
}

TokenTree TokenTree::prefix(int32_t n) const {
  ARBOR_CHECK(n >= 0 && n <= num_nodes()) << "prefix of " << n << " nodes of " << num_nodes();
  TokenTree tree;
  tree.draft_dists_ = draft_dists_;
  for (int32_t i = 0; i < n; ++i) {
    const TreeNode& x = nodes_[i];
    tree.add_node(x.parent, x.token_id, x.draft_prob, x.draft_dist);
  }
  return tree;
}

TokenTree TokenTree::kept(std::span<const uint8_t> keep) const {
  ARBOR_CHECK(keep.size() == nodes_.size()) << keep.size() << " flags for " << nodes_.size()
                                            << " nodes";
  TokenTree tree;
  tree.draft_dists_ = draft_dists_;
  std::vector<int32_t> index(nodes_.size(), kRoot);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const TreeNode& x = nodes_[i];
    if (!keep[i]) continue;
    if (x.parent != kRoot && index[static_cast<size_t>(x.parent)] == kRoot) continue;
    const int32_t parent = x.parent == kRoot ? kRoot : index[static_cast<size_t>(x.parent)];
    index[i] = tree.add_node(parent, x.token_id, x.draft_prob, x.draft_dist);
  }
  return tree;
}

std::vector<int32_t> TokenTree::parents() const {
  std::vector<int32_t> out(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) out[i] = nodes_[i].parent;
  return out;
}

TokenTree TokenTree::from_chain(std::span<const int32_t> token_ids,
                                std::span<const std::vector<Candidate>> draft_probs) {
  ARBOR_CHECK(draft_probs.size() == token_ids.size())
      << draft_probs.size() << " draft distributions for " << token_ids.size() << " tokens";
  TokenTree tree;
  int32_t parent = kRoot;
  for (size_t i = 0; i < token_ids.size(); ++i) {
    const int32_t dist = tree.add_draft_dist(draft_probs[i]);
    parent = tree.add_node(parent, token_ids[i], prob_of(draft_probs[i], token_ids[i]), dist);
  }
  return tree;
}

int32_t TokenTree::add_draft_dist(std::vector<Candidate> dist) {
  draft_dists_.push_back(std::move(dist));
  return num_draft_dists() - 1;
}

int32_t TokenTree::add_node(int32_t parent, int32_t token_id, double draft_prob,
                            int32_t draft_dist) {
  ARBOR_CHECK(parent >= kRoot && parent < num_nodes())
      << "parent " << parent << " of a tree with " << num_nodes() << " nodes";
  ARBOR_CHECK(draft_dist >= kOneHot && draft_dist < num_draft_dists())
      << "draft distribution " << draft_dist << " of " << num_draft_dists();
  const int32_t index = num_nodes();
  nodes_.push_back({token_id, parent, depth(parent) + 1, draft_prob, draft_dist});
  children_[static_cast<size_t>(parent + 1)].push_back(index);
  children_.emplace_back();
  return index;
}

const TreeNode& TokenTree::node(int32_t i) const {
  ARBOR_CHECK(i >= 0 && i < num_nodes()) << "node " << i << " of " << num_nodes();
  return nodes_[static_cast<size_t>(i)];
}

std::span<const int32_t> TokenTree::children(int32_t node) const {
  ARBOR_CHECK(node >= kRoot && node < num_nodes()) << "node " << node << " of " << num_nodes();
  return children_[static_cast<size_t>(node + 1)];
}

int32_t TokenTree::max_depth() const {
  int32_t out = 0;
  for (const TreeNode& n : nodes_) out = std::max(out, n.depth);
  return out;
}

std::span<const Candidate> TokenTree::draft_dist(int32_t index) const {
  ARBOR_CHECK(index >= 0 && index < num_draft_dists())
      << "draft distribution " << index << " of " << num_draft_dists();
  return draft_dists_[static_cast<size_t>(index)];
}

std::optional<int32_t> TokenTree::find_child(int32_t parent, int32_t token_id) const {
  for (int32_t c : children(parent)) {
    if (nodes_[static_cast<size_t>(c)].token_id == token_id) return c;
  }
  return std::nullopt;
}

std::vector<int32_t> TokenTree::path_to(int32_t node) const {
  std::vector<int32_t> path(static_cast<size_t>(depth(node)));
  for (int32_t n = node; n != kRoot; n = nodes_[static_cast<size_t>(n)].parent) {
    path[static_cast<size_t>(nodes_[static_cast<size_t>(n)].depth - 1)] = n;
  }
  return path;
}

std::vector<int32_t> TokenTree::path_tokens(int32_t node) const {
  std::vector<int32_t> tokens = path_to(node);
  for (int32_t& t : tokens) t = nodes_[static_cast<size_t>(t)].token_id;
  return tokens;
}

double TokenTree::path_prob(int32_t node) const {
  double prob = 1.0;
  for (int32_t n : path_to(node)) prob *= nodes_[static_cast<size_t>(n)].draft_prob;
  return prob;
}

std::vector<int32_t> TokenTree::positions(int32_t root_position) const {
  std::vector<int32_t> out(static_cast<size_t>(num_slots()), root_position);
  for (size_t i = 0; i < nodes_.size(); ++i) out[i + 1] = root_position + nodes_[i].depth;
  return out;
}

int64_t TokenTree::num_mask_bits() const {
  return static_cast<int64_t>(num_slots()) * num_slots();
}

void TokenTree::write_mask(std::span<uint8_t> bits, int64_t bit_offset) const {
  const int64_t n = num_slots();
  ARBOR_CHECK(bit_offset >= 0 &&
              bit_offset + num_mask_bits() <= static_cast<int64_t>(bits.size()) * 8)
      << "mask of " << num_mask_bits() << " bits at bit " << bit_offset << " into "
      << bits.size() << " bytes";
  auto put = [&](int64_t i, int64_t j, bool on) {
    const int64_t bit = bit_offset + i * n + j;
    const auto mask = static_cast<uint8_t>(1u << (bit & 7));
    uint8_t& byte = bits[static_cast<size_t>(bit >> 3)];
    byte = on ? static_cast<uint8_t>(byte | mask) : static_cast<uint8_t>(byte & ~mask);
  };
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) put(i, j, false);
    put(i, i, true);
    put(i, 0, true);  // the root
    for (int32_t a = i == 0 ? kRoot : nodes_[static_cast<size_t>(i - 1)].parent; a != kRoot;
         a = nodes_[static_cast<size_t>(a)].parent) {
      put(i, a + 1, true);
    }
  }
}

std::vector<uint8_t> TokenTree::packed_mask() const {
  std::vector<uint8_t> out(static_cast<size_t>((num_mask_bits() + 7) / 8), 0);
  write_mask(out, 0);
  return out;
}

std::vector<int32_t> TokenTree::merge(const TokenTree& other) {
  const int32_t dist_base = num_draft_dists();
  for (const std::vector<Candidate>& d : other.draft_dists_) add_draft_dist(d);
  std::vector<int32_t> where(static_cast<size_t>(other.num_nodes()));
  for (size_t i = 0; i < other.nodes_.size(); ++i) {
    const TreeNode& n = other.nodes_[i];
    const int32_t parent = n.parent == kRoot ? kRoot : where[static_cast<size_t>(n.parent)];
    if (n.draft_dist == kOneHot) {
      if (const std::optional<int32_t> same = find_child(parent, n.token_id)) {
        where[i] = *same;
        continue;
      }
    }
    const int32_t dist = n.draft_dist == kOneHot ? kOneHot : dist_base + n.draft_dist;
    where[i] = add_node(parent, n.token_id, n.draft_prob, dist);
  }
  return where;
}

bool operator==(const TokenTree& a, const TokenTree& b) {
  auto same_node = [](const TreeNode& x, const TreeNode& y) {
    return x.token_id == y.token_id && x.parent == y.parent && x.depth == y.depth &&
           x.draft_prob == y.draft_prob && x.draft_dist == y.draft_dist;
  };
  auto same_dist = [](const std::vector<Candidate>& x, const std::vector<Candidate>& y) {
    return std::equal(x.begin(), x.end(), y.begin(), y.end(),
                      [](const Candidate& c, const Candidate& d) {
                        return c.token_id == d.token_id && c.prob == d.prob;
                      });
  };
  return std::equal(a.nodes_.begin(), a.nodes_.end(), b.nodes_.begin(), b.nodes_.end(),
                    same_node) &&
         std::equal(a.draft_dists_.begin(), a.draft_dists_.end(), b.draft_dists_.begin(),
                    b.draft_dists_.end(), same_dist);
}

}  // namespace arbor::sampling
