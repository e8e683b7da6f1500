// GrammarStates: the structured-output state of every running request that has a grammar, for
// an executor that samples on the host (docs/structured_output.md, "In the executor").
//
// A request's GrammarState follows its committed output: sync() accepts the tokens committed
// since the last call (so preemption, forks and resumption replay them from the request's
// tokens), and callers that look ahead (masking draft rows) roll back what they accepted.
// Compiled grammars are shared by every request with the same spec (an LRU of
// kMaxCompiledGrammars), so their per-state token sets and mask cache serve them all. A spec with
// a thinking block (GrammarSpec::thinking) gets an OutputGrammar that lets the block through
// unconstrained; its phase is part of the state, so drafts are masked and verified with it.
//
// Threading: the engine thread only.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "executor/request_states.h"
#include "grammar/grammar_spec.h"
#include "grammar/output_grammar.h"
#include "grammar/token_masks.h"
#include "sampling/token_tree.h"
#include "tokenizer/tokenizer.h"

namespace arbor::executor {

inline constexpr size_t kMaxCompiledGrammars = 64;

// The bytes each token adds to an output, as the server's detokenizer writes them: control and
// unknown tokens write nothing (a grammar never allows them); end-of-generation ids are
// allowed once a grammar can complete.
std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary(const tokenizer::Tokenizer& t);

class GrammarStates {
 public:
  void set_vocabulary(std::shared_ptr<const grammar::TokenVocabulary> vocab) {
    vocab_ = std::move(vocab);
  }
  bool has_vocabulary() const { return vocab_ != nullptr; }

  // The request's grammar (and thinking gate), having accepted every committed output token of `st`; nullptr when
  // the request has no grammar. Errors: no vocabulary was set, the spec does not compile, or a
  // committed token is not allowed by the grammar (kInternal: the executor produced it).
  Result<grammar::OutputGrammar*> sync(step::RequestId id, const RequestState& st);
  void forget(step::RequestId id) { states_.erase(id); }
  size_t size() const { return states_.size(); }

  // Masks a draft tree's logits rows ([tree.num_slots() * vocab]): row 0 with the grammar after
  // the committed tokens, row 1 + i after draft i's path. Rows of paths the grammar refuses are
  // left as they are (verification never reads them: it rejects the refused draft first).
  // kFailedPrecondition when the grammar allows no token at a row it masks. Nothing is left
  // accepted.
  static Status mask_drafts(grammar::OutputGrammar& g, const sampling::TokenTree& tree,
                            std::span<float> rows);
  // keep[i] = 1 when the grammar accepts `extra` (tokens not yet committed: the ones this step
  // emits) followed by draft i's whole path. [tree.num_nodes()]. Nothing is left accepted.
  static std::vector<uint8_t> valid_drafts(grammar::OutputGrammar& g,
                                           std::span<const int32_t> extra,
                                           const sampling::TokenTree& tree);

 private:
  Result<std::shared_ptr<grammar::CompiledGrammar>> compiled(const grammar::GrammarSpec& spec);

  struct Entry {
    std::unique_ptr<grammar::OutputGrammar> state;
    std::string key;  // the spec's cache key
  };
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
  std::unordered_map<step::RequestId, Entry> states_;
  // Most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<grammar::CompiledGrammar>>> compiled_;
};

}  // namespace arbor::executor
