// OutputGrammar: a request's structured-output constraint as the executor applies it, token by
// token: a GrammarState, optionally behind a thinking block (GrammarSpec::thinking).
//
// Without thinking it is the GrammarState. With thinking, each token's bytes go through a
// ThinkingScanner (thinking.h) first, and only the bytes it classifies as content reach the
// grammar, so the grammar constrains exactly the content the server returns:
//   * inside the block every token is allowed (the thinking is sampled freely), except one that
//     would close the block and continue with content the grammar refuses in the same token;
//     an end-of-generation id is allowed there too (the output then has no content);
//   * before a possible START (ThinkingStart::kMaybe) a token is allowed when it continues START
//     (or whitespace before it), or when the content it makes the output begin with is allowed
//     by the grammar; tokens that write nothing (control tokens) are not;
//   * after END, whitespace and the template's content_open are skipped, then the grammar
//     applies as it would from the first token.
// Whitespace before START and around content_open is bounded (kMaxSpaceAroundMarkers bytes),
// as a grammar bounds its own whitespace: a model that would rather write something the grammar
// refuses cannot stall there forever.
// The scanner's state is part of what accept() records, so rollback() and masks of speculative
// rows (chains and trees) see the same phase a plain decode would: verification stays lossless.
//
// A token that continues a marker is allowed without looking further: the vocabulary must be able
// to spell the rest of it (byte-level and byte-fallback vocabularies can), or the request may
// reach a state that no token continues (mask() is then empty, and the executor fails it).
//
// Masks of the non-content phases depend only on the thinking spec and the scanner's state (the
// grammar has accepted nothing yet), so each is computed once (a vocabulary scan) and kept in the
// CompiledGrammar, shared by every request with the same grammar and markers.
//
// Thread-safety: none; engine thread only. Not copyable or movable (the scanner points into it).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar_spec.h"
#include "grammar/thinking.h"
#include "grammar/token_masks.h"

namespace arbor::grammar {

inline constexpr size_t kMaxSpaceAroundMarkers = 8;

class OutputGrammar {
 public:
  OutputGrammar(std::shared_ptr<CompiledGrammar> grammar, std::optional<ThinkingSpec> thinking);
  OutputGrammar(const OutputGrammar&) = delete;
  OutputGrammar& operator=(const OutputGrammar&) = delete;

  // Whether `token` is allowed now (no change).
  bool allows(int32_t token);
  // Consumes `token`; false (nothing changed) when it is not allowed.
  bool accept(int32_t token);
  // Undoes the last n accept() calls (n <= num_accepted(), CHECKed).
  void rollback(size_t n);
  size_t num_accepted() const;
  // The allowed tokens now ([vocab] bits). Valid until the next call on this object or on the
  // grammar's CompiledGrammar.
  const TokenBitmask& mask();
  // The phase of the thinking block (kContent without thinking).
  ThinkingScanner::Phase phase() const;

 private:
  struct Step {
    ThinkingScanner before;  // the scanner before the token
    uint8_t inner_accepts;   // GrammarState entries the token added (0-2)
    bool ended_before;
  };
  bool gated() const { return scanner_.has_value() && scanner_->phase() != ThinkingScanner::Phase::kContent; }
  bool is_end(int32_t token) const;
  // The token's text as the server's detokenizer writes it ("" for other control tokens).
  std::string_view token_bytes(int32_t token) const;
  // accept() before the content: returns the GrammarState entries added, or -1 (refused).
  int accept_gated(int32_t token);
  void build_gated_mask(TokenBitmask& out);

  GrammarState inner_;
  std::optional<ThinkingSpec> thinking_;
  std::optional<ThinkingScanner> scanner_;
  std::vector<Step> history_;
  bool ended_ = false;  // an end id was accepted inside the block: only end ids follow
  TokenBitmask end_mask_;
  std::string spec_key_;  // the thinking spec, as a prefix of the CompiledGrammar's mask keys
};

}  // namespace arbor::grammar
