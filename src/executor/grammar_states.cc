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

Status GrammarStates::mask_chain(grammar::OutputGrammar& g, std::span<const int32_t> drafts,
                                 std::span<float> rows) {
  const size_t vocab = rows.size() / (drafts.size() + 1);
  size_t accepted = 0;
  Status status;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    status = mask_row(g, rows.subspan(i * vocab, vocab));
    if (!status.ok() || i == drafts.size() || !g.accept(drafts[i])) break;
    ++accepted;
  }
  g.rollback(accepted);
  return status;
}

Status GrammarStates::mask_tree(grammar::OutputGrammar& g, std::span<const int32_t> drafts,
                                std::span<const int32_t> parents, std::span<float> rows) {
  const size_t vocab = rows.size() / (drafts.size() + 1);
  ARBOR_RETURN_IF_ERROR(mask_row(g, rows.first(vocab)));
  std::vector<int32_t> path;
  for (size_t i = 0; i < drafts.size(); ++i) {
    path.clear();
    for (int32_t n = static_cast<int32_t>(i); n != step::kDraftRoot; n = parents[static_cast<size_t>(n)]) {
      path.push_back(drafts[static_cast<size_t>(n)]);
    }
    size_t accepted = 0;
    for (auto t = path.rbegin(); t != path.rend() && g.accept(*t); ++t) ++accepted;
    Status status;
    if (accepted == path.size()) status = mask_row(g, rows.subspan((i + 1) * vocab, vocab));
    g.rollback(accepted);
    ARBOR_RETURN_IF_ERROR(status);
  }
  return ok_status();
}

size_t GrammarStates::valid_prefix(grammar::OutputGrammar& g, std::span<const int32_t> extra,
                                   std::span<const int32_t> drafts) {
  size_t accepted = 0, valid = 0;
  bool ok = true;
  for (int32_t t : extra) {
    if (!(ok = g.accept(t))) break;
    ++accepted;
  }
  for (size_t i = 0; ok && i < drafts.size() && g.accept(drafts[i]); ++i) {
    ++accepted;
    ++valid;
  }
  g.rollback(accepted);
  return valid;
}

}  // namespace arbor::executor
