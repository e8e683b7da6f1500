#include "grammar/output_grammar.h"

#include <algorithm>

#include "base/check.h"

namespace arbor::grammar {

using Phase = ThinkingScanner::Phase;

OutputGrammar::OutputGrammar(std::shared_ptr<CompiledGrammar> grammar,
                             std::optional<ThinkingSpec> thinking)
    : inner_(std::move(grammar)), thinking_(std::move(thinking)),
      end_mask_(inner_.compiled().vocab().size()) {
  for (int32_t e : inner_.compiled().vocab().end_ids()) end_mask_.set(e);
  if (!thinking_) return;
  scanner_.emplace(thinking_->markers, thinking_->start);
  // Every field, length-prefixed, so that different specs never share a key.
  const auto add = [this](std::string_view s) {
    spec_key_ += std::to_string(s.size());
    spec_key_ += ':';
    spec_key_ += s;
  };
  add("thinking");
  add(thinking_->markers.start);
  add(thinking_->markers.end);
  add(thinking_->markers.content_open);
  add(thinking_->start == ThinkingStart::kOpen ? "open" : "maybe");
  for (const ThinkingSpec::ControlText& c : thinking_->control_texts) {
    add(std::to_string(c.id));
    add(c.text);
  }
}

bool OutputGrammar::is_end(int32_t token) const {
  const std::span<const int32_t> ends = inner_.compiled().vocab().end_ids();
  return std::binary_search(ends.begin(), ends.end(), token);
}

std::string_view OutputGrammar::token_bytes(int32_t token) const {
  for (const ThinkingSpec::ControlText& c : thinking_->control_texts) {
    if (c.id == token) return c.text;
  }
  return inner_.compiled().vocab().bytes(token);
}

namespace {

bool too_much_space(const ThinkingScanner& s) {
  return (s.phase() == Phase::kPrefix || s.phase() == Phase::kAfterEnd) &&
         s.space() > kMaxSpaceAroundMarkers;
}

}  // namespace

Phase OutputGrammar::phase() const { return scanner_ ? scanner_->phase() : Phase::kContent; }

size_t OutputGrammar::num_accepted() const {
  return scanner_ ? history_.size() : inner_.num_accepted();
}

bool OutputGrammar::allows(int32_t token) {
  if (!accept(token)) return false;
  rollback(1);
  return true;
}

bool OutputGrammar::accept(int32_t token) {
  if (!scanner_) return inner_.accept(token);
  if (token < 0 || token >= inner_.compiled().vocab().size()) return false;
  Step step{.before = *scanner_, .inner_accepts = 0, .ended_before = ended_};
  if (!gated()) {
    if (!inner_.accept(token)) return false;
    step.inner_accepts = 1;
  } else {
    const int added = accept_gated(token);
    if (added < 0) return false;
    step.inner_accepts = static_cast<uint8_t>(added);
  }
  history_.push_back(std::move(step));
  return true;
}

int OutputGrammar::accept_gated(int32_t token) {
  if (ended_) return is_end(token) ? 0 : -1;
  ThinkingScanner next = *scanner_;
  ThinkingScanner::Out out;
  const bool end = is_end(token);
  if (end && next.phase() == Phase::kThinking) {
    ended_ = true;  // the output ends inside the block: no content
    return 0;
  }
  if (end) {
    next.finish(out);  // the held bytes (whitespace, a partial marker) are the whole content
  } else {
    const std::string_view bytes = token_bytes(token);
    if (bytes.empty()) return next.phase() == Phase::kThinking ? 0 : -1;
    next.feed(bytes, out);
    if (too_much_space(next)) return -1;
  }
  int added = 0;
  if (!out.content.empty()) {
    if (!inner_.accept_bytes(out.content)) return -1;
    added = 1;
  }
  if (end) {
    if (!inner_.accept(token)) {
      inner_.rollback(static_cast<size_t>(added));
      return -1;
    }
    ++added;
  }
  *scanner_ = std::move(next);
  return added;
}

void OutputGrammar::rollback(size_t n) {
  if (!scanner_) {
    inner_.rollback(n);
    return;
  }
  ARBOR_CHECK_LE(n, history_.size());
  for (size_t i = 0; i < n; ++i) {
    Step& step = history_.back();
    inner_.rollback(step.inner_accepts);
    *scanner_ = std::move(step.before);
    ended_ = step.ended_before;
    history_.pop_back();
  }
}

const TokenBitmask& OutputGrammar::mask() {
  if (!gated()) return inner_.mask();
  if (ended_) return end_mask_;
  std::string key = spec_key_ + scanner_->key();
  CompiledGrammar& g = inner_.compiled();
  if (const TokenBitmask* m = g.keyed_mask(key)) return *m;
  TokenBitmask m(g.vocab().size());
  build_gated_mask(m);
  return g.keyed_insert(std::move(key), std::move(m));
}

// Before the content the grammar has accepted nothing, so whether a token is allowed depends
// only on the scanner's state: what the token's bytes do to it, and whether the content it
// starts (if any) is a valid beginning for the grammar.
void OutputGrammar::build_gated_mask(TokenBitmask& mask) {
  ARBOR_CHECK_EQ(inner_.num_accepted(), 0u);
  const TokenVocabulary& v = inner_.compiled().vocab();
  const bool thinking = scanner_->phase() == Phase::kThinking;
  const char end_last = thinking_->markers.end.back();
  std::optional<TokenBitmask> first;  // the grammar's first-token mask, computed when needed
  ThinkingScanner::Out out;
  for (int32_t t = 0; t < v.size(); ++t) {
    if (is_end(t)) continue;
    const std::string_view bytes = token_bytes(t);
    // Inside the block, only a token with the end marker's last byte can close it.
    if (bytes.empty() || (thinking && bytes.find(end_last) == std::string_view::npos)) {
      if (thinking) mask.set(t);
      continue;
    }
    // A first byte that starts the content at once makes the whole token content: the grammar's
    // first-token mask decides (a control token's marker text is not in that mask's view).
    const bool grammar_view = bytes.data() == v.bytes(t).data();
    if (grammar_view && scanner_->passes_through(bytes.front())) {
      if (!first) first = inner_.mask();
      if (first->test(t)) mask.set(t);
      continue;
    }
    ThinkingScanner next = *scanner_;
    out.reasoning.clear();
    out.content.clear();
    next.feed(bytes, out);
    bool ok = false;
    if (out.content.empty()) {
      ok = !too_much_space(next);
    } else if (out.content == v.bytes(t)) {
      if (!first) first = inner_.mask();
      ok = first->test(t);
    } else {
      ok = inner_.accepts_bytes(out.content);
    }
    if (ok) mask.set(t);
  }
  for (int32_t e : v.end_ids()) {
    if (thinking) {
      mask.set(e);
      continue;
    }
    ThinkingScanner next = *scanner_;
    out.content.clear();
    next.finish(out);
    if (out.content.empty()) {
      if (inner_.can_end()) mask.set(e);
    } else if (inner_.accept_bytes(out.content)) {
      if (inner_.can_end()) mask.set(e);
      inner_.rollback(1);
    }
  }
}

}  // namespace arbor::grammar
