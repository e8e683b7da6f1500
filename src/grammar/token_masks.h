// Token masks: which tokens of a vocabulary a grammar allows next.
//
// A token is allowed when all of its bytes can be consumed from the current stack set (or it
// ends generation and the grammar's root can complete). Checking every token at every step
// would cost a vocabulary scan; instead, as xgrammar does, for every automaton state s that can
// be a stack top we precompute, once per grammar (lazily, the first time s is a top):
//   accepted[s]   tokens whose bytes are consumed without completing s's rule: allowed
//                 whatever the stack below s holds (context-independent);
//   uncertain[s]  tokens that need s's rule to complete partway and the caller to go on
//                 with the rest: at run time the caller's real stack checks each distinct
//                 rest once (a few hundred short strings, not thousands of tokens);
// every other token is rejected. The mask of a stack set is the union over its tops; whole
// masks are cached by the stack set's content (Matcher::state_key), so a step that revisits a
// state costs a hash lookup. Tokens are walked in byte order, sharing the work of common
// prefixes (a failed prefix skips every token that starts with it).
// Design and figures: docs/structured_output.md.
//
// Thread-safety: a TokenVocabulary is immutable. A CompiledGrammar caches as it goes: use it
// from one thread (the engine thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/matcher.h"

namespace arbor::grammar {

// The bytes every token produces in the output text.
class TokenVocabulary {
 public:
  // bytes: [vocab_size] a token's bytes; "" for a token a grammar never allows (control and
  // unknown tokens). end_ids: the end-of-generation ids, allowed once the grammar can complete.
  // An output's text is the concatenation of its tokens' bytes (the server's detokenizer is
  // primed with the prompt, so no first-piece space is dropped).
  TokenVocabulary(std::vector<std::string> bytes, std::vector<int32_t> end_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  std::string_view bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  std::span<const int32_t> end_ids() const { return end_ids_; }

  // Tokens with bytes, sorted by them, and each one's common-prefix length with the previous.
  std::span<const int32_t> sorted() const { return sorted_; }
  std::span<const int32_t> sorted_lcp() const { return lcp_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> end_ids_;
  std::vector<int32_t> sorted_, lcp_;
};

// One bit per token: [ceil(vocab_size / 64)] words, bit i of word w is token 64 w + i.
class TokenBitmask {
 public:
  explicit TokenBitmask(int32_t vocab_size = 0)
      : size_(vocab_size), words_(static_cast<size_t>((vocab_size + 63) / 64), 0) {}
  void set(int32_t id) { words_[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); }
  bool test(int32_t id) const { return (words_[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; }
  void clear() { std::fill(words_.begin(), words_.end(), 0); }
  TokenBitmask& operator|=(const TokenBitmask& o);
  int32_t count() const;
  bool none() const;
  int32_t size() const { return size_; }
  std::span<const uint64_t> words() const { return words_; }

 private:
  int32_t size_;
  std::vector<uint64_t> words_;
};

// Sets logits[i] = -inf for every token not in `mask`. logits: [mask.size()].
void apply_mask(const TokenBitmask& mask, std::span<float> logits);

struct MaskStats {
  int64_t masks = 0;              // fill_mask() calls
  int64_t cache_hits = 0;         // answered from the state cache
  int64_t states_built = 0;       // automaton states whose accepted/uncertain sets were built
  int64_t uncertain_checked = 0;   // token remainders checked against a caller's stack
};

// A grammar's automaton bound to a vocabulary, with the per-state token sets and the mask cache.
class CompiledGrammar {
 public:
  CompiledGrammar(std::shared_ptr<const Automaton> automaton,
                  std::shared_ptr<const TokenVocabulary> vocab);

  const std::shared_ptr<const Automaton>& automaton() const { return automaton_; }
  const TokenVocabulary& vocab() const { return *vocab_; }

  // The tokens allowed after what `matcher` has consumed. End ids are allowed when the root can
  // complete. Returns a reference into the cache, valid until the next call.
  const TokenBitmask& mask(Matcher& matcher);
  const MaskStats& stats() const { return stats_; }

  // Masks that depend on more than a matcher's state, under a caller's key (OutputGrammar's:
  // its thinking markers and scanner state), shared by every request of this grammar. nullptr
  // when absent. A pointer stays valid until the next keyed_insert().
  const TokenBitmask* keyed_mask(const std::string& key) const;
  const TokenBitmask& keyed_insert(std::string key, TokenBitmask mask);

 private:
  struct StateTokens {
    bool built = false;
    TokenBitmask accepted;
    // Uncertain tokens: the state's rule can complete after some of their bytes, and the rest
    // must then be taken by the caller. rests: the distinct remainders, sorted ([num_rests],
    // views into the vocabulary), rest_lcp their common prefixes, and rest_tokens
    // [rest_begin[i], rest_begin[i + 1]) the tokens with remainder i.
    std::vector<std::string_view> rests;
    std::vector<int32_t> rest_lcp;
    std::vector<int32_t> rest_begin;  // [num_rests + 1]
    std::vector<int32_t> rest_tokens;
  };
  void build_state(int32_t state);
  void compute(Matcher& matcher, TokenBitmask& out);

  std::shared_ptr<const Automaton> automaton_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::vector<StateTokens> states_;  // [num_states]
  StackArena scratch_arena_;
  StackStepper stepper_;
  std::unordered_map<std::string, TokenBitmask> cache_;
  std::unordered_map<std::string, TokenBitmask> keyed_;
  TokenBitmask result_;
  MaskStats stats_;
};

// A request's grammar: its matcher plus the token-level rules (end of generation).
class GrammarState {
 public:
  explicit GrammarState(std::shared_ptr<CompiledGrammar> grammar);

  // Whether `token` is allowed now.
  bool allows(int32_t token);
  // Consumes `token`; false (nothing changed) when it is not allowed. An end id is accepted when
  // the grammar can complete, and ends the grammar: only end ids are allowed after it.
  bool accept(int32_t token);
  // Consumes raw text as one accepted entry (undone by rollback(1)), not a token: the
  // thinking gate's content that began inside a token. False (nothing changed) when the grammar
  // refuses it or has ended.
  bool accept_bytes(std::string_view bytes);
  // Whether `bytes` could be accepted now (no change).
  bool accepts_bytes(std::string_view bytes);
  // The text so far is in the grammar's language.
  bool can_end() const { return matcher_.can_end(); }
  // Undoes the last n accept() / accept_bytes() calls.
  void rollback(size_t n);
  size_t num_accepted() const { return tokens_.size(); }
  // The allowed tokens now. Valid until the next call on this grammar's CompiledGrammar.
  const TokenBitmask& mask();
  bool ended() const { return !tokens_.empty() && tokens_.back().ended; }
  CompiledGrammar& compiled() { return *grammar_; }
  const CompiledGrammar& compiled() const { return *grammar_; }

 private:
  struct Accepted {
    bool ended;  // an end id (no bytes consumed)
  };
  std::shared_ptr<CompiledGrammar> grammar_;
  Matcher matcher_;
  std::vector<Accepted> tokens_;
  TokenBitmask ended_mask_;
};

}  // namespace arbor::grammar
