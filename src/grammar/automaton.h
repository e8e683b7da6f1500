// A grammar compiled to a byte-level pushdown automaton: one DFA per rule, whose edges consume
// a byte or call another rule. A parse position is a state of some rule's DFA; a parse stack is
// that position plus, below it, the return states of the rules that called it (matcher.h).
//
// Layout (docs/structured_output.md, "The automaton"):
//   states are numbered globally; rule r owns [rule_begin[r], rule_begin[r + 1]) and starts at
//   rule_begin[r];
//   next[s * 256 + b]   the state after byte b in state s (same rule), or -1;
//   calls[s]            (callee rule, return state): enter the callee; when it completes, go on
//                       in the return state;
//   is_final[s]         the rule may complete in s (and return to its caller).
// Code-point classes become UTF-8 byte sequences, so the automaton only accepts valid UTF-8.
//
// compile() refuses grammars the matcher cannot run: left recursion (a rule that can reach a
// call to itself without consuming a byte), rules that can never complete, and automata above
// the state limit (a regex like (a|b)*a(a|b){30} determinises to 2^31 states).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"

namespace arbor::grammar {

inline constexpr int32_t kMaxAutomatonStates = 20000;

struct RuleCall {
  int32_t rule = 0;
  int32_t return_state = 0;
};

struct Automaton {
  std::vector<int32_t> rule_begin;           // [num_rules + 1]
  std::vector<int32_t> rule_of;              // [num_states]
  std::vector<int32_t> next;                 // [num_states * 256]
  std::vector<uint8_t> is_final;             // [num_states]
  std::vector<uint8_t> has_bytes;            // [num_states] some byte edge leaves the state
  std::vector<std::vector<RuleCall>> calls;  // [num_states]
  std::vector<std::string> rule_names;       // [num_rules]
  int32_t root_rule = 0;

  int32_t num_states() const { return static_cast<int32_t>(rule_of.size()); }
  int32_t start(int32_t rule) const { return rule_begin[static_cast<size_t>(rule)]; }
  int32_t step(int32_t state, uint8_t byte) const {
    return next[static_cast<size_t>(state) * 256 + byte];
  }
};

Result<Automaton> compile(const Grammar& grammar);

// parse_gbnf() then compile().
Result<Automaton> compile_gbnf(std::string_view text);

}  // namespace arbor::grammar
