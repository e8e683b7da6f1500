// SuffixTrie: a depth-limited, path-compressed trie over every suffix of a FIFO of token
// sequences, each node counting the suffixes that pass through or end at it. The structure
// SuffixDecoding (Oliaro et al.) speculates from; docs/proposers.md has the picture.
//
// What it holds. For each retained sequence S and each start i, the suffix
// S[i, i + min(D, |S| - i)) is a path from the root (D = max_depth). For a string s, |s| <= D,
//   count(s) = the number of pairs (sequence S, start i) with S[i, i + |s|) == s,
// i.e. the occurrences of s in the retained sequences. A continuation's empirical probability is
// count(s + t) / count(s). Strings longer than D are not indexed.
//
// Shape. Edges carry runs of tokens (path compression); a node sits where the trie branches,
// where a suffix ends, and at every leaf, so the count is the same along an edge and the shape
// is a function of the retained sequences alone (canonical: no node has exactly one child with
// an equal count). Hence at most 2 * num_tokens + 1 nodes. An edge's tokens are not copied: a
// node refers to a run in the newest sequence that passes through it, and because sequences
// leave oldest first, a node whose reference would dangle has count 0 and is gone.
//
// Building. One sequence at a time is open; append(t) extends each of its (at most D) suffixes
// still shorter than D by t, in O(1) amortized each: walk into the child, split an edge where the
// suffix now ends inside it, fold a node that became redundant. Suffixes never cross sequences.
//
// Costs: append O(D) amortized (a leaf that only this suffix reaches grows in place, the common
// case for fresh text); remove_oldest_sequence O(|S| * D) plus a rescan of the children of nodes
// whose most frequent child lost count; find O(|s|); greedy continuation O(tokens).
// Memory: about 44 bytes per node plus 16-64 bytes per child-map entry (one per non-root node)
// plus 4 bytes per retained token: below 250 bytes per retained token.
//
// Threading: none (the owner's thread). Ownership: owns its nodes and a copy of its sequences.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "spec/flat_map.h"

namespace arbor::spec {

class SuffixTrie {
 public:
  static constexpr int32_t kRoot = 0;

  // A place in the trie: on node's edge, `up` tokens above its bottom (0: at the node itself,
  // up < the edge's length). The string it spells is the node's string minus `up` tokens.
  struct Position {
    int32_t node = kRoot;
    int32_t up = 0;
  };

  // max_depth >= 1: the longest indexed string.
  explicit SuffixTrie(int32_t max_depth);

  int32_t max_depth() const { return max_depth_; }
  int32_t num_sequences() const { return static_cast<int32_t>(sequences_.size()); }
  int64_t num_tokens() const { return num_tokens_; }  // over the retained sequences
  int32_t num_nodes() const;                          // live nodes, root included
  size_t memory_bytes() const;                        // what the trie allocated

  // --- Building ---
  // Starts a new (newest) sequence. Precondition: none open.
  void open_sequence();
  // Appends a token (>= 0) to the open sequence. O(max_depth) amortized.
  void append(int32_t token);
  // Ends the open sequence; its last suffixes stay shorter than max_depth.
  void close_sequence();
  bool has_open_sequence() const { return open_; }
  // The open sequence's tokens. Precondition: one is open.
  std::span<const int32_t> open_tokens() const;
  // Removes the oldest sequence and all its suffixes. Precondition: it is closed.
  // O(its length * max_depth), plus O(fanout) per node whose most frequent child lost count.
  void remove_oldest_sequence();

  // --- Querying ---
  // Where s ends, or nullopt when count(s) == 0 or |s| > max_depth. Precondition: s non-empty.
  // O(|s|).
  std::optional<Position> find(std::span<const int32_t> s) const;
  int32_t count(Position p) const { return nodes_[p.node].count; }
  // count(s) as defined above (0 when absent). O(|s|).
  int32_t count(std::span<const int32_t> s) const;
  // The place of the open sequence's last m tokens, m in [1, min(max_depth, its length)]. O(1).
  Position open_suffix(int32_t m) const;

  // Greedy continuation from p: repeatedly take the most frequent next token (ties: the smaller
  // token id) while the path probability prob *= count(next) / count(current) stays >=
  // min_prob, for at most max_tokens tokens (and never past max_depth). out = the tokens,
  // returns the sum of the path probabilities after each token (the expected number of accepted
  // tokens if the counts were the truth). O(max_tokens).
  double continue_greedy(Position p, int32_t max_tokens, double min_prob,
                         std::vector<int32_t>& out) const;

  // Aborts on a broken structural invariant (counts, canonical shape, child map, edge labels,
  // most frequent child). For tests. O(num_nodes * max_depth + fanout).
  void check_invariants() const;

 private:
  static constexpr int32_t kNone = -1;
  static constexpr int32_t kStale = -2;  // best_child needs a rescan
  struct Node {
    int32_t parent = kNone;
    int32_t count = 0;          // 0 only for the root of an empty trie and for free nodes
    int32_t depth = 0;          // length of the node's string
    int32_t len = 0;            // edge length: the last `len` tokens of the string (root: 0)
    uint32_t ref_sequence = 0;  // the edge's tokens: sequence(ref_sequence)[ref_pos, + len)
    int32_t ref_pos = 0;
    int32_t first_child = kNone;
    int32_t next_sibling = kNone;
    int32_t prev_sibling = kNone;
    int32_t num_children = 0;
    int32_t best_child = kNone;  // most frequent child (ties: smaller first token), or kStale
  };

  static uint64_t child_key(int32_t node, int32_t token) {
    return (static_cast<uint64_t>(node) << 32) | static_cast<uint32_t>(token);
  }
  const std::vector<int32_t>& sequence(uint32_t id) const {
    return sequences_[static_cast<uint32_t>(id - front_sequence_id_)];
  }
  // Token j (0-based) of node's edge.
  int32_t edge_token(int32_t node, int32_t j) const {
    const Node& n = nodes_[node];
    return sequence(n.ref_sequence)[n.ref_pos + j];
  }
  int32_t child(int32_t node, int32_t token) const {
    const int32_t* c = children_.find(child_key(node, token));
    return c == nullptr ? kNone : *c;
  }
  bool better(int32_t a, int32_t b) const;  // a is a more frequent child than b

  int32_t allocate_node();
  void free_node(int32_t node);
  void add_child(int32_t parent, int32_t node);
  void remove_child(int32_t parent, int32_t node);
  void replace_child(int32_t parent, int32_t old_node, int32_t new_node);
  void child_count_grew(int32_t parent, int32_t node);
  void child_count_shrank(int32_t parent, int32_t node);
  void refresh_best_child(int32_t node);

  // Extends the suffix that ends at node u (and starts at `pos - depth(u)` of the open
  // sequence `sequence_id`) by the token at pos; returns the node where it now ends.
  int32_t extend(int32_t u, int32_t token, uint32_t sequence_id, int32_t pos);
  // Splits child's edge after its first token; returns the new upper node.
  int32_t split_edge(int32_t child_node);
  // Folds u into its only child when their counts are equal (u is then redundant).
  void fold_if_redundant(int32_t u);
  void remove_suffix(const std::vector<int32_t>& tokens, int32_t start, int32_t length);

  int32_t max_depth_;
  std::vector<Node> nodes_;  // [node id]; nodes_[kRoot] is the root
  std::vector<int32_t> free_nodes_;
  FlatMap children_;                            // child_key(parent, first edge token) -> child
  std::deque<std::vector<int32_t>> sequences_;  // oldest first; the open one is the back
  uint32_t front_sequence_id_ = 0;              // id of sequences_.front(); ids wrap
  int64_t num_tokens_ = 0;
  bool open_ = false;
  // Open sequence: open_ends_[m - 1] = the node where its last m tokens end, m in
  // [1, min(max_depth, length)]. Every suffix ends at a node, never inside an edge.
  std::vector<int32_t> open_ends_;
  std::vector<int32_t> stale_;  // nodes whose best_child is kStale
  std::vector<int32_t> path_;   // scratch for remove_suffix
};

}  // namespace arbor::spec
