#include "executor/grammar_states.h"

#include <algorithm>

namespace arbor::executor {

std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary(const tokenizer::Tokenizer& t) {
  std::vector<std::string> bytes(static_cast<size_t>(t.vocab_size()));
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    if (!t.is_special(id)) bytes[static_cast<size_t>(id)] = t.token_to_piece(id);
  }
  return std::make_shared<const grammar::TokenVocabulary>(std::move(bytes), t.eog_ids());
}

Result<std::shared_ptr<grammar::CompiledGrammar>> GrammarStates::compiled(
    const grammar::GrammarSpec& spec) {
  std::string key = spec.cache_key();
  for (auto it = compiled_.begin(); it != compiled_.end(); ++it) {
    if (it->first == key) {
      compiled_.splice(compiled_.begin(), compiled_, it);
      return compiled_.front().second;
    }
  }
  ARBOR_ASSIGN_OR_RETURN(grammar::Automaton automaton, grammar::compile_spec(spec));
  auto cg = std::make_shared<grammar::CompiledGrammar>(
      std::make_shared<const grammar::Automaton>(std::move(automaton)), vocab_);
  compiled_.emplace_front(std::move(key), cg);
  if (compiled_.size() > kMaxCompiledGrammars) compiled_.pop_back();
  return cg;
}

Result<grammar::OutputGrammar*> GrammarStates::sync(step::RequestId id, const RequestState& st) {
  if (!st.sampling.grammar.has_value()) return static_cast<grammar::OutputGrammar*>(nullptr);
  if (vocab_ == nullptr) {
    return failed_precondition("structured output needs the model's vocabulary; this executor "
                               "was built without one");
  }
  const std::span<const int32_t> outputs = st.output_ids();
  auto it = states_.find(id);
  if (it != states_.end() && it->second.state->num_accepted() > outputs.size()) {
    states_.erase(it);  // not a prefix of the outputs any more: start over
    it = states_.end();
  }
  if (it == states_.end()) {
    ARBOR_ASSIGN_OR_RETURN(std::shared_ptr<grammar::CompiledGrammar> cg,
                           compiled(*st.sampling.grammar));
    it = states_
             .emplace(id, Entry{.state = std::make_unique<grammar::OutputGrammar>(
                                    std::move(cg), st.sampling.grammar->thinking),
                                .key = st.sampling.grammar->cache_key()})
             .first;
  }
  grammar::OutputGrammar& g = *it->second.state;
  for (size_t i = g.num_accepted(); i < outputs.size(); ++i) {
    if (!g.accept(outputs[i])) {
      return internal_error("request ", id, ": committed output token ", outputs[i],
                            " (output position ", i, ") is not allowed by its grammar");
    }
  }
  return &g;
}

namespace {

Status mask_row(grammar::OutputGrammar& g, std::span<float> row) {
  const grammar::TokenBitmask& mask = g.mask();
  if (mask.none()) {
    return failed_precondition("the grammar reached a state that no token of the vocabulary "
                               "can continue (after ", g.num_accepted(), " tokens)");
  }
  grammar::apply_mask(mask, row);
  return ok_status();
}

}  // namespace

Status GrammarStates::mask_drafts(grammar::OutputGrammar& g, const sampling::TokenTree& tree,
                                  std::span<float> rows) {
  const size_t vocab = rows.size() / static_cast<size_t>(tree.num_slots());
  ARBOR_RETURN_IF_ERROR(mask_row(g, rows.first(vocab)));
  for (int32_t i = 0; i < tree.num_nodes(); ++i) {
    const std::vector<int32_t> path = tree.path_tokens(i);
    size_t accepted = 0;
    for (auto t = path.begin(); t != path.end() && g.accept(*t); ++t) ++accepted;
    Status status;
    if (accepted == path.size()) {
      status = mask_row(g, rows.subspan(static_cast<size_t>(i + 1) * vocab, vocab));
    }
    g.rollback(accepted);
    ARBOR_RETURN_IF_ERROR(status);
  }
  return ok_status();
}

std::vector<uint8_t> GrammarStates::valid_drafts(grammar::OutputGrammar& g,
                                                 std::span<const int32_t> extra,
                                                 const sampling::TokenTree& tree) {
  std::vector<uint8_t> keep(static_cast<size_t>(tree.num_nodes()), 0);
  size_t base = 0;
  for (int32_t t : extra) {
    if (!g.accept(t)) {
      g.rollback(base);
      return keep;
    }
    ++base;
  }
  for (int32_t i = 0; i < tree.num_nodes(); ++i) {
    const int32_t parent = tree.node(i).parent;
    if (parent != sampling::TokenTree::kRoot && !keep[static_cast<size_t>(parent)]) continue;
    const std::vector<int32_t> path = tree.path_tokens(i);
    size_t accepted = 0;
    for (auto t = path.begin(); t != path.end() && g.accept(*t); ++t) ++accepted;
    keep[static_cast<size_t>(i)] = accepted == path.size();
    g.rollback(accepted);
  }
  g.rollback(base);
  return keep;
}

}  // namespace arbor::executor
