#include "spec/suffix_trie.h"

#include <algorithm>
#include <utility>

#include "base/check.h"

namespace arbor::spec {

SuffixTrie::SuffixTrie(int32_t max_depth) : max_depth_(max_depth) {
  ARBOR_CHECK_GE(max_depth, 1);
  nodes_.emplace_back();  // the root
}

int32_t SuffixTrie::num_nodes() const {
  return static_cast<int32_t>(nodes_.size() - free_nodes_.size());
}

size_t SuffixTrie::memory_bytes() const {
  size_t bytes = nodes_.capacity() * sizeof(Node) + children_.memory_bytes();
  for (const std::vector<int32_t>& s : sequences_) bytes += s.capacity() * sizeof(int32_t);
  bytes += (free_nodes_.capacity() + open_ends_.capacity() + stale_.capacity() + path_.capacity()) *
           sizeof(int32_t);
  return bytes;
}

// --- Node bookkeeping ---

bool SuffixTrie::better(int32_t a, int32_t b) const {
  if (nodes_[a].count != nodes_[b].count) return nodes_[a].count > nodes_[b].count;
  return edge_token(a, 0) < edge_token(b, 0);
}

int32_t SuffixTrie::allocate_node() {
  if (!free_nodes_.empty()) {
    const int32_t id = free_nodes_.back();
    free_nodes_.pop_back();
    return id;
  }
  nodes_.emplace_back();
  return static_cast<int32_t>(nodes_.size() - 1);
}

void SuffixTrie::free_node(int32_t node) {
  nodes_[node] = Node{};
  free_nodes_.push_back(node);
}

void SuffixTrie::add_child(int32_t parent, int32_t node) {
  children_.insert_or_assign(child_key(parent, edge_token(node, 0)), node);
  Node& p = nodes_[parent];
  Node& n = nodes_[node];
  n.parent = parent;
  n.prev_sibling = kNone;
  n.next_sibling = p.first_child;
  if (p.first_child != kNone) nodes_[p.first_child].prev_sibling = node;
  p.first_child = node;
  ++p.num_children;
  child_count_grew(parent, node);
}

void SuffixTrie::remove_child(int32_t parent, int32_t node) {
  children_.erase(child_key(parent, edge_token(node, 0)));
  Node& p = nodes_[parent];
  const Node& n = nodes_[node];
  if (n.prev_sibling != kNone) {
    nodes_[n.prev_sibling].next_sibling = n.next_sibling;
  } else {
    p.first_child = n.next_sibling;
  }
  if (n.next_sibling != kNone) nodes_[n.next_sibling].prev_sibling = n.prev_sibling;
  --p.num_children;
  child_count_shrank(parent, node);
}

// new_node takes old_node's place among parent's children (same first edge token).
void SuffixTrie::replace_child(int32_t parent, int32_t old_node, int32_t new_node) {
  children_.insert_or_assign(child_key(parent, edge_token(new_node, 0)), new_node);
  Node& p = nodes_[parent];
  const Node& o = nodes_[old_node];
  Node& n = nodes_[new_node];
  n.parent = parent;
  n.prev_sibling = o.prev_sibling;
  n.next_sibling = o.next_sibling;
  if (o.prev_sibling != kNone) {
    nodes_[o.prev_sibling].next_sibling = new_node;
  } else {
    p.first_child = new_node;
  }
  if (o.next_sibling != kNone) nodes_[o.next_sibling].prev_sibling = new_node;
  if (p.best_child == old_node) {
    p.best_child = new_node;
  } else {
    child_count_grew(parent, new_node);
  }
}

void SuffixTrie::child_count_grew(int32_t parent, int32_t node) {
  const int32_t best = nodes_[parent].best_child;
  if (best == kStale) return;
  if (best == kNone || (best != node && better(node, best))) nodes_[parent].best_child = node;
}

void SuffixTrie::child_count_shrank(int32_t parent, int32_t node) {
  Node& p = nodes_[parent];
  if (p.best_child != node) return;
  p.best_child = kStale;
  stale_.push_back(parent);
}

void SuffixTrie::refresh_best_child(int32_t node) {
  int32_t best = kNone;
  for (int32_t c = nodes_[node].first_child; c != kNone; c = nodes_[c].next_sibling) {
    if (best == kNone || better(c, best)) best = c;
  }
  nodes_[node].best_child = best;
}

// --- Building ---

void SuffixTrie::open_sequence() {
  ARBOR_CHECK(!open_) << "a sequence is already open";
  sequences_.emplace_back();
  open_ = true;
  open_ends_.clear();
}

void SuffixTrie::close_sequence() {
  ARBOR_CHECK(open_);
  open_ = false;
  open_ends_.clear();
}

std::span<const int32_t> SuffixTrie::open_tokens() const {
  ARBOR_CHECK(open_);
  return sequences_.back();
}

void SuffixTrie::append(int32_t token) {
  ARBOR_CHECK(open_) << "append without an open sequence";
  ARBOR_CHECK_GE(token, 0);
  std::vector<int32_t>& seq = sequences_.back();
  const auto pos = static_cast<int32_t>(seq.size());
  seq.push_back(token);
  ++num_tokens_;
  const uint32_t sequence_id = front_sequence_id_ + static_cast<uint32_t>(sequences_.size() - 1);
  const int32_t num_ends = std::min(max_depth_, pos + 1);
  if (static_cast<int32_t>(open_ends_.size()) < num_ends) open_ends_.push_back(kRoot);
  // Longest first, so no two suffixes ever end at the same node; the suffix of length
  // max_depth (if any) is finished and drops out.
  for (int32_t m = num_ends - 1; m >= 1; --m) {
    open_ends_[m] = extend(open_ends_[m - 1], token, sequence_id, pos);
  }
  ++nodes_[kRoot].count;
  open_ends_[0] = extend(kRoot, token, sequence_id, pos);
}

int32_t SuffixTrie::extend(int32_t u, int32_t token, uint32_t sequence_id, int32_t pos) {
  if (u != kRoot && nodes_[u].num_children == 0 && nodes_[u].count == 1) {
    // Only this suffix reaches the leaf u, so u's edge is a run of this sequence ending at pos:
    // grow it in place (what adding a child and folding u into it would give).
    ARBOR_DCHECK(nodes_[u].ref_sequence == sequence_id && nodes_[u].ref_pos + nodes_[u].len == pos);
    ++nodes_[u].len;
    ++nodes_[u].depth;
    return u;
  }
  const int32_t c = child(u, token);
  int32_t e;
  if (c == kNone) {
    e = allocate_node();
    Node& n = nodes_[e];
    n.count = 1;
    n.depth = nodes_[u].depth + 1;
    n.len = 1;
    n.ref_sequence = sequence_id;
    n.ref_pos = pos;
    add_child(u, e);
  } else {
    // The suffix now ends one token into c's edge: a node must sit there.
    e = nodes_[c].len == 1 ? c : split_edge(c);
    Node& n = nodes_[e];
    ++n.count;
    n.ref_sequence = sequence_id;  // the newest sequence through e
    n.ref_pos = pos;
    child_count_grew(u, e);
  }
  fold_if_redundant(u);
  return e;
}

int32_t SuffixTrie::split_edge(int32_t child_node) {
  const int32_t w = allocate_node();
  const int32_t u = nodes_[child_node].parent;
  {
    Node& upper = nodes_[w];
    const Node& lower = nodes_[child_node];
    upper.count = lower.count;
    upper.depth = nodes_[u].depth + 1;
    upper.len = 1;
    upper.ref_sequence = lower.ref_sequence;
    upper.ref_pos = lower.ref_pos;
  }
  replace_child(u, child_node, w);
  Node& lower = nodes_[child_node];
  --lower.len;
  ++lower.ref_pos;
  lower.prev_sibling = lower.next_sibling = kNone;
  add_child(w, child_node);
  return w;
}

void SuffixTrie::fold_if_redundant(int32_t u) {
  if (u == kRoot) return;
  const Node& n = nodes_[u];
  if (n.num_children != 1 || nodes_[n.first_child].count != n.count) return;
  // No suffix ends at u and all go on to its only child y: y absorbs u's edge. y's reference
  // is a suffix through y, hence through u, so the tokens before it are u's edge.
  const int32_t y = n.first_child;
  children_.erase(child_key(u, edge_token(y, 0)));
  nodes_[y].len += n.len;
  nodes_[y].ref_pos -= n.len;
  replace_child(n.parent, u, y);
  free_node(u);
}

void SuffixTrie::remove_oldest_sequence() {
  ARBOR_CHECK(!sequences_.empty()) << "no sequence to remove";
  ARBOR_CHECK(!(open_ && sequences_.size() == 1)) << "the oldest sequence is still open";
  const std::vector<int32_t>& seq = sequences_.front();
  const auto n = static_cast<int32_t>(seq.size());
  for (int32_t i = 0; i < n; ++i) remove_suffix(seq, i, std::min(max_depth_, n - i));
  // No node was allocated since they went stale, so a freed one reads count 0.
  for (int32_t node : stale_) {
    if (node == kRoot || nodes_[node].count > 0) refresh_best_child(node);
  }
  stale_.clear();
  num_tokens_ -= n;
  sequences_.pop_front();
  ++front_sequence_id_;
}

void SuffixTrie::remove_suffix(const std::vector<int32_t>& tokens, int32_t start, int32_t length) {
  path_.clear();
  int32_t v = kRoot;
  int32_t depth = 0;
  while (depth < length) {
    v = child(v, tokens[start + depth]);
    ARBOR_CHECK_NE(v, kNone) << "suffix at " << start << " is not in the trie";
    path_.push_back(v);
    depth += nodes_[v].len;
  }
  ARBOR_CHECK_EQ(depth, length) << "a suffix must end at a node";
  --nodes_[kRoot].count;
  for (size_t j = path_.size(); j-- > 0;) {
    const int32_t x = path_[j];
    const int32_t parent = nodes_[x].parent;
    if (--nodes_[x].count == 0) {
      ARBOR_CHECK_EQ(nodes_[x].num_children, 0);
      remove_child(parent, x);
      free_node(x);
    } else {
      child_count_shrank(parent, x);
    }
  }
  // Bottom up: folding x into its child leaves x's parent (the next one) to be checked.
  for (size_t j = path_.size(); j-- > 0;) {
    if (nodes_[path_[j]].count > 0) fold_if_redundant(path_[j]);
  }
}

// --- Querying ---

std::optional<SuffixTrie::Position> SuffixTrie::find(std::span<const int32_t> s) const {
  ARBOR_CHECK(!s.empty());
  if (s.size() > static_cast<size_t>(max_depth_)) return std::nullopt;
  int32_t v = kRoot;
  size_t i = 0;
  while (true) {
    const int32_t c = child(v, s[i]);
    if (c == kNone) return std::nullopt;
    const int32_t len = nodes_[c].len;
    const auto take = static_cast<int32_t>(std::min<size_t>(len, s.size() - i));
    for (int32_t j = 1; j < take; ++j) {
      if (edge_token(c, j) != s[i + j]) return std::nullopt;
    }
    i += take;
    if (i == s.size()) return Position{c, len - take};
    v = c;
  }
}

int32_t SuffixTrie::count(std::span<const int32_t> s) const {
  const std::optional<Position> p = find(s);
  return p ? count(*p) : 0;
}

SuffixTrie::Position SuffixTrie::open_suffix(int32_t m) const {
  ARBOR_CHECK(open_ && 1 <= m && m <= static_cast<int32_t>(open_ends_.size()))
      << "open_suffix(" << m << ") with " << open_ends_.size() << " open suffixes";
  return Position{open_ends_[m - 1], 0};
}

double SuffixTrie::continue_greedy(Position p, int32_t max_tokens, double min_prob,
                                   std::vector<int32_t>& out) const {
  out.clear();
  double prob = 1.0;
  double score = 0.0;
  while (static_cast<int32_t>(out.size()) < max_tokens) {
    int32_t token;
    double ratio;
    Position next;
    if (p.up > 0) {  // inside an edge: one way on, same count
      token = edge_token(p.node, nodes_[p.node].len - p.up);
      ratio = 1.0;
      next = Position{p.node, p.up - 1};
    } else {
      const int32_t b = nodes_[p.node].best_child;
      ARBOR_DCHECK(b != kStale);
      if (b == kNone) break;
      token = edge_token(b, 0);
      ratio = static_cast<double>(nodes_[b].count) / static_cast<double>(nodes_[p.node].count);
      next = Position{b, nodes_[b].len - 1};
    }
    if (prob * ratio < min_prob) break;
    prob *= ratio;
    score += prob;
    out.push_back(token);
    p = next;
  }
  return score;
}

void SuffixTrie::check_invariants() const {
  ARBOR_CHECK_EQ(nodes_[kRoot].count, num_tokens_) << "root count: one per suffix";
  ARBOR_CHECK(stale_.empty());
  int64_t live = 0;
  std::vector<std::pair<int32_t, std::vector<int32_t>>> stack{{kRoot, {}}};
  while (!stack.empty()) {
    auto [v, str] = std::move(stack.back());
    stack.pop_back();
    ++live;
    const Node& n = nodes_[v];
    int64_t child_sum = 0;
    int32_t num = 0;
    int32_t best = kNone;
    int32_t prev = kNone;
    for (int32_t c = n.first_child; c != kNone; c = nodes_[c].next_sibling) {
      const Node& nc = nodes_[c];
      ARBOR_CHECK_EQ(nc.parent, v);
      ARBOR_CHECK_EQ(nc.prev_sibling, prev);
      ARBOR_CHECK(nc.len >= 1 && nc.count >= 1);
      ARBOR_CHECK_EQ(nc.depth, n.depth + nc.len);
      ARBOR_CHECK_LE(nc.depth, max_depth_);
      const uint32_t index = nc.ref_sequence - front_sequence_id_;
      ARBOR_CHECK_LT(index, sequences_.size()) << "edge refers to a removed sequence";
      const std::vector<int32_t>& seq = sequences_[index];
      ARBOR_CHECK(nc.ref_pos >= n.depth && nc.ref_pos + nc.len <= static_cast<int32_t>(seq.size()));
      ARBOR_CHECK(std::equal(str.begin(), str.end(), seq.begin() + (nc.ref_pos - n.depth)))
          << "edge reference does not continue its parent's string";
      ARBOR_CHECK_EQ(child(v, edge_token(c, 0)), c);
      child_sum += nc.count;
      ++num;
      if (best == kNone || better(c, best)) best = c;
      std::vector<int32_t> child_str = str;
      child_str.insert(child_str.end(), seq.begin() + nc.ref_pos,
                       seq.begin() + nc.ref_pos + nc.len);
      stack.emplace_back(c, std::move(child_str));
      prev = c;
    }
    ARBOR_CHECK_EQ(num, n.num_children);
    ARBOR_CHECK_LE(child_sum, n.count);
    ARBOR_CHECK_EQ(n.best_child, best);
    ARBOR_CHECK(v == kRoot || !(num == 1 && child_sum == n.count)) << "redundant node " << v;
  }
  ARBOR_CHECK_EQ(live, num_nodes());
  ARBOR_CHECK_EQ(static_cast<int64_t>(children_.size()), live - 1);
  if (!open_) return;
  const std::vector<int32_t>& seq = sequences_.back();
  ARBOR_CHECK_EQ(open_ends_.size(), std::min<size_t>(max_depth_, seq.size()));
  for (size_t m = 1; m <= open_ends_.size(); ++m) {
    const std::optional<Position> p = find(std::span<const int32_t>(seq).subspan(seq.size() - m));
    ARBOR_CHECK(p && p->node == open_ends_[m - 1] && p->up == 0) << "open suffix " << m;
  }
}

}  // namespace arbor::spec
