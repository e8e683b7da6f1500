// compile(): each rule's expression becomes a Thompson NFA over bytes (code-point classes split
// into UTF-8 byte-range sequences), then a DFA by subset construction in which a call of rule R
// is one more kind of edge. Then the checks that keep the matcher finite.
#include "grammar/automaton.h"

#include <algorithm>
#include <map>

namespace arbor::grammar {
namespace {

struct ByteEdge {
  uint8_t lo = 0;
  uint8_t hi = 0;
  int32_t to = 0;
};

struct NfaNode {
  std::vector<int32_t> eps;
  std::vector<ByteEdge> bytes;
  std::vector<RuleCall> calls;  // return_state: an NFA node here
};

class NfaBuilder {
 public:
  explicit NfaBuilder(std::vector<NfaNode>& nodes) : nodes_(nodes) {}

  int32_t add() {
    nodes_.emplace_back();
    return static_cast<int32_t>(nodes_.size()) - 1;
  }
  void eps(int32_t from, int32_t to) { nodes_[static_cast<size_t>(from)].eps.push_back(to); }
  void byte(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
    nodes_[static_cast<size_t>(from)].bytes.push_back({lo, hi, to});
  }

  Result<int32_t> build(const Expr& e, int32_t start) {
    if (nodes_.size() > static_cast<size_t>(kMaxAutomatonStates) * 4) {
      return invalid_argument("grammar is too large: more than ", kMaxAutomatonStates * 4,
                              " automaton nodes (large repetition counts multiply)");
    }
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        return start;
      case Expr::Kind::kLiteral: {
        int32_t cur = start;
        for (char c : e.literal) {
          const int32_t n = add();
          byte(cur, static_cast<uint8_t>(c), static_cast<uint8_t>(c), n);
          cur = n;
        }
        return cur;
      }
      case Expr::Kind::kClass: {
        const int32_t end = add();
        for (const CodepointRange& r : normalise_class(e.ranges, e.negated)) {
          add_codepoints(r.lo, r.hi, start, end);
        }
        return end;
      }
      case Expr::Kind::kRule: {
        const int32_t end = add();
        nodes_[static_cast<size_t>(start)].calls.push_back({e.rule, end});
        return end;
      }
      case Expr::Kind::kSeq: {
        int32_t cur = start;
        for (const Expr& c : e.children) {
          ARBOR_ASSIGN_OR_RETURN(cur, build(c, cur));
        }
        return cur;
      }
      case Expr::Kind::kAlt: {
        const int32_t end = add();
        for (const Expr& c : e.children) {
          const int32_t s = add();
          eps(start, s);
          ARBOR_ASSIGN_OR_RETURN(const int32_t x, build(c, s));
          eps(x, end);
        }
        return end;
      }
      case Expr::Kind::kRepeat:
        return build_repeat(e, start);
    }
    return start;
  }

 private:
  Result<int32_t> build_repeat(const Expr& e, int32_t start) {
    const Expr& child = e.children[0];
    int32_t cur = start;
    for (int32_t i = 0; i < e.min; ++i) {
      const int32_t s = add();
      eps(cur, s);
      ARBOR_ASSIGN_OR_RETURN(cur, build(child, s));
    }
    if (e.max < 0) {
      const int32_t loop = add();
      eps(cur, loop);
      ARBOR_ASSIGN_OR_RETURN(const int32_t x, build(child, loop));
      eps(x, loop);
      return loop;
    }
    // Optional copies nest (a (a (a)?)?)?, so that n optional copies cost n states, not 2^n.
    const int32_t end = add();
    eps(cur, end);
    for (int32_t i = e.min; i < e.max; ++i) {
      const int32_t s = add();
      eps(cur, s);
      ARBOR_ASSIGN_OR_RETURN(cur, build(child, s));
      eps(cur, end);
    }
    return end;
  }

  // UTF-8 encodings of [lo, hi] (no surrogates) as byte-range sequences from `from` to `to`:
  // split the range until every piece has one encoded length and its bytes vary independently.
  void add_codepoints(uint32_t lo, uint32_t hi, int32_t from, int32_t to) {
    static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodepoint};
    for (uint32_t end : kLengthEnds) {
      if (lo <= end && hi > end) {
        add_codepoints(lo, end, from, to);
        add_codepoints(end + 1, hi, from, to);
        return;
      }
    }
    const int len = hi <= 0x7F ? 1 : hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < len; ++i) {
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          add_codepoints(lo, lo | m, from, to);
          add_codepoints((lo | m) + 1, hi, from, to);
          return;
        }
        if ((hi & m) != m) {
          add_codepoints(lo, (hi & ~m) - 1, from, to);
          add_codepoints(hi & ~m, hi, from, to);
          return;
        }
      }
    }
    std::string a, b;
    append_utf8(lo, a);
    append_utf8(hi, b);
    int32_t cur = from;
    for (size_t i = 0; i < a.size(); ++i) {
      const int32_t n = i + 1 == a.size() ? to : add();
      byte(cur, static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]), n);
      cur = n;
    }
  }

  std::vector<NfaNode>& nodes_;
};

// One rule's DFA with local state ids; calls' return states are local too.
struct RuleDfa {
  std::vector<std::vector<int32_t>> next;  // [states][256]
  std::vector<uint8_t> is_final;
  std::vector<std::vector<RuleCall>> calls;
};

class SubsetBuilder {
 public:
  SubsetBuilder(const std::vector<NfaNode>& nfa, int32_t accept) : nfa_(nfa), accept_(accept) {}

  Result<RuleDfa> run(int32_t start, int32_t budget) {
    RuleDfa dfa;
    std::vector<std::vector<int32_t>> sets;
    std::map<std::vector<int32_t>, int32_t> ids;
    auto intern = [&](std::vector<int32_t> set) -> int32_t {
      set = closure(std::move(set));
      const auto [it, inserted] = ids.emplace(set, static_cast<int32_t>(sets.size()));
      if (inserted) sets.push_back(std::move(set));
      return it->second;
    };
    intern({start});
    for (size_t s = 0; s < sets.size(); ++s) {
      if (static_cast<int32_t>(sets.size()) > budget) {
        return invalid_argument("grammar is too complex: its automaton has more than ",
                                kMaxAutomatonStates, " states");
      }
      const std::vector<int32_t> set = sets[s];
      std::vector<int32_t> next(256, -1);
      std::vector<std::vector<int32_t>> by_byte(256);
      std::map<int32_t, std::vector<int32_t>> by_rule;
      bool final = false;
      for (int32_t n : set) {
        final = final || n == accept_;
        for (const ByteEdge& e : nfa_[static_cast<size_t>(n)].bytes) {
          for (int b = e.lo; b <= e.hi; ++b) by_byte[static_cast<size_t>(b)].push_back(e.to);
        }
        for (const RuleCall& c : nfa_[static_cast<size_t>(n)].calls) {
          by_rule[c.rule].push_back(c.return_state);
        }
      }
      std::map<std::vector<int32_t>, int32_t> seen_targets;  // bytes with equal target sets
      for (int b = 0; b < 256; ++b) {
        std::vector<int32_t>& t = by_byte[static_cast<size_t>(b)];
        if (t.empty()) continue;
        std::sort(t.begin(), t.end());
        t.erase(std::unique(t.begin(), t.end()), t.end());
        const auto it = seen_targets.find(t);
        next[static_cast<size_t>(b)] = it != seen_targets.end() ? it->second : intern(t);
        seen_targets.emplace(t, next[static_cast<size_t>(b)]);
      }
      std::vector<RuleCall> calls;
      for (auto& [rule, targets] : by_rule) calls.push_back({rule, intern(targets)});
      dfa.next.push_back(std::move(next));
      dfa.is_final.push_back(final ? 1 : 0);
      dfa.calls.push_back(std::move(calls));
    }
    return dfa;
  }

 private:
  std::vector<int32_t> closure(std::vector<int32_t> set) {
    std::vector<int32_t> stack = set;
    std::vector<uint8_t>& seen = seen_;
    seen.assign(nfa_.size(), 0);
    for (int32_t n : set) seen[static_cast<size_t>(n)] = 1;
    while (!stack.empty()) {
      const int32_t n = stack.back();
      stack.pop_back();
      for (int32_t m : nfa_[static_cast<size_t>(n)].eps) {
        if (seen[static_cast<size_t>(m)]) continue;
        seen[static_cast<size_t>(m)] = 1;
        set.push_back(m);
        stack.push_back(m);
      }
    }
    // Keep the nodes that matter: those with edges, and the accept node.
    std::vector<int32_t> kept;
    for (int32_t n : set) {
      const NfaNode& node = nfa_[static_cast<size_t>(n)];
      if (n == accept_ || !node.bytes.empty() || !node.calls.empty()) kept.push_back(n);
    }
    std::sort(kept.begin(), kept.end());
    kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
    return kept;
  }

  const std::vector<NfaNode>& nfa_;
  int32_t accept_;
  std::vector<uint8_t> seen_;
};

// Rules from which a final state is reachable (bytes, and calls of rules in the set).
std::vector<uint8_t> fixpoint(const Automaton& a, bool bytes_allowed) {
  const size_t num_rules = a.rule_names.size();
  std::vector<uint8_t> in(num_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < num_rules; ++r) {
      if (in[r]) continue;
      std::vector<int32_t> stack = {a.rule_begin[r]};
      std::vector<uint8_t> seen(static_cast<size_t>(a.rule_begin[r + 1] - a.rule_begin[r]), 0);
      seen[0] = 1;
      while (!stack.empty() && !in[r]) {
        const int32_t s = stack.back();
        stack.pop_back();
        if (a.is_final[static_cast<size_t>(s)]) {
          in[r] = 1;
          break;
        }
        auto visit = [&](int32_t t) {
          uint8_t& v = seen[static_cast<size_t>(t - a.rule_begin[r])];
          if (!v) {
            v = 1;
            stack.push_back(t);
          }
        };
        if (bytes_allowed) {
          for (int b = 0; b < 256; ++b) {
            const int32_t t = a.step(s, static_cast<uint8_t>(b));
            if (t >= 0) visit(t);
          }
        }
        for (const RuleCall& c : a.calls[static_cast<size_t>(s)]) {
          if (in[static_cast<size_t>(c.rule)]) visit(c.return_state);
        }
      }
      changed = changed || in[r];
    }
  }
  return in;
}

// Rules the root can reach through calls.
std::vector<uint8_t> reachable_rules(const Automaton& a) {
  std::vector<uint8_t> seen(a.rule_names.size(), 0);
  std::vector<int32_t> stack = {a.root_rule};
  seen[static_cast<size_t>(a.root_rule)] = 1;
  while (!stack.empty()) {
    const int32_t r = stack.back();
    stack.pop_back();
    for (int32_t s = a.rule_begin[static_cast<size_t>(r)];
         s < a.rule_begin[static_cast<size_t>(r) + 1]; ++s) {
      for (const RuleCall& c : a.calls[static_cast<size_t>(s)]) {
        if (!seen[static_cast<size_t>(c.rule)]) {
          seen[static_cast<size_t>(c.rule)] = 1;
          stack.push_back(c.rule);
        }
      }
    }
  }
  return seen;
}

// Left recursion: rule r calls rule R "first" when a call of R leaves a state reachable from r's
// start through calls of nullable rules only. A cycle of first calls would make the matcher
// push forever without consuming a byte.
Status check_left_recursion(const Automaton& a, const std::vector<uint8_t>& nullable,
                            const std::vector<uint8_t>& reachable) {
  const size_t num_rules = a.rule_names.size();
  std::vector<std::vector<int32_t>> first(num_rules);
  for (size_t r = 0; r < num_rules; ++r) {
    std::vector<int32_t> stack = {a.rule_begin[r]};
    std::vector<uint8_t> seen(static_cast<size_t>(a.rule_begin[r + 1] - a.rule_begin[r]), 0);
    seen[0] = 1;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      for (const RuleCall& c : a.calls[static_cast<size_t>(s)]) {
        first[r].push_back(c.rule);
        if (!nullable[static_cast<size_t>(c.rule)]) continue;
        uint8_t& v = seen[static_cast<size_t>(c.return_state - a.rule_begin[r])];
        if (!v) {
          v = 1;
          stack.push_back(c.return_state);
        }
      }
    }
  }
  // Depth-first search for a cycle; colour 1 = on the path, 2 = done.
  std::vector<uint8_t> colour(num_rules, 0);
  std::vector<std::pair<int32_t, size_t>> path;
  for (size_t r0 = 0; r0 < num_rules; ++r0) {
    if (!reachable[r0] || colour[r0]) continue;
    path.push_back({static_cast<int32_t>(r0), 0});
    colour[r0] = 1;
    while (!path.empty()) {
      auto& [r, i] = path.back();
      const auto& out = first[static_cast<size_t>(r)];
      if (i == out.size()) {
        colour[static_cast<size_t>(r)] = 2;
        path.pop_back();
        continue;
      }
      const int32_t next = out[i++];
      if (colour[static_cast<size_t>(next)] == 1) {
        return invalid_argument("grammar: rule '", a.rule_names[static_cast<size_t>(next)],
                                "' is left-recursive (it can reach itself without matching a "
                                "character); rewrite it with repetition, e.g. x ::= y (\",\" y)*");
      }
      if (colour[static_cast<size_t>(next)] == 0) {
        colour[static_cast<size_t>(next)] = 1;
        path.push_back({next, 0});
      }
    }
  }
  return ok_status();
}

}  // namespace

Result<Automaton> compile(const Grammar& grammar) {
  Automaton a;
  a.root_rule = grammar.root;
  std::vector<RuleDfa> dfas;
  int32_t total = 0;
  for (const Rule& rule : grammar.rules) {
    std::vector<NfaNode> nfa;
    NfaBuilder builder(nfa);
    const int32_t start = builder.add();
    ARBOR_ASSIGN_OR_RETURN(const int32_t accept, builder.build(rule.body, start));
    SubsetBuilder subsets(nfa, accept);
    ARBOR_ASSIGN_OR_RETURN(RuleDfa dfa, subsets.run(start, kMaxAutomatonStates - total));
    total += static_cast<int32_t>(dfa.is_final.size());
    a.rule_names.push_back(rule.name);
    dfas.push_back(std::move(dfa));
  }
  a.rule_begin.push_back(0);
  for (const RuleDfa& d : dfas) {
    a.rule_begin.push_back(a.rule_begin.back() + static_cast<int32_t>(d.is_final.size()));
  }
  a.next.assign(static_cast<size_t>(total) * 256, -1);
  for (size_t r = 0; r < dfas.size(); ++r) {
    const int32_t base = a.rule_begin[r];
    for (size_t s = 0; s < dfas[r].is_final.size(); ++s) {
      const auto g = static_cast<size_t>(base) + s;
      bool bytes = false;
      for (int b = 0; b < 256; ++b) {
        const int32_t t = dfas[r].next[s][static_cast<size_t>(b)];
        if (t < 0) continue;
        a.next[g * 256 + static_cast<size_t>(b)] = base + t;
        bytes = true;
      }
      std::vector<RuleCall> calls;
      for (const RuleCall& c : dfas[r].calls[s]) calls.push_back({c.rule, base + c.return_state});
      a.rule_of.push_back(static_cast<int32_t>(r));
      a.is_final.push_back(dfas[r].is_final[s]);
      a.has_bytes.push_back(bytes ? 1 : 0);
      a.calls.push_back(std::move(calls));
    }
  }
  const std::vector<uint8_t> reachable = reachable_rules(a);
  const std::vector<uint8_t> productive = fixpoint(a, true);
  for (size_t r = 0; r < reachable.size(); ++r) {
    if (reachable[r] && !productive[r]) {
      return invalid_argument("grammar: rule '", a.rule_names[r],
                              "' can never complete (every alternative recurses forever)");
    }
  }
  ARBOR_RETURN_IF_ERROR(check_left_recursion(a, fixpoint(a, false), reachable));
  return a;
}

Result<Automaton> compile_gbnf(std::string_view text) {
  ARBOR_ASSIGN_OR_RETURN(const Grammar g, parse_gbnf(text));
  return compile(g);
}

}  // namespace arbor::grammar
