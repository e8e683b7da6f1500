#include "chat/reasoning.h"

#include <regex>

namespace arbor::chat {

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

struct Row {
  std::string_view name;
  std::string_view start, end, content_open, content_close;
};

// The syntaxes with their fixed markers (apriel's start depends on the template).
const Row kRows[] = {
    {"think", "<think>", "</think>", "", ""},
    {"seed", "<seed:think>", "</seed:think>", "", ""},
    {"mistral", "[THINK]", "[/THINK]", "", ""},
    {"gemma4", "<|channel>thought", "<channel|>", "", ""},
    {"apriel", "Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]", "", "[END FINAL RESPONSE]"},
    {"granite", "<think>", "</think>", "<response>", "</response>"},
    // Markers for the record (logs, --reasoning-format harmony): the output is read whole as
    // harmony messages (harmony.h), never by ReasoningSplitter.
    {"harmony", "<|channel|>analysis<|message|>", "<|end|>", "", ""},
};

ReasoningSyntax from_row(const Row& r) {
  ReasoningSyntax s;
  s.name = r.name;
  s.markers.start = r.start;
  s.markers.end = r.end;
  s.markers.content_open = r.content_open;
  s.content_close = r.content_close;
  return s;
}

// "enable_thinking", "thinking" (used as a variable in a test), or "".
std::string switch_variable(std::string_view source) {
  if (source.find("enable_thinking") != std::string_view::npos) return "enable_thinking";
  static const std::regex kThinkingVar(
      R"((\b(if|elif|not|and|or)\s+thinking\b)|(\bthinking\s+is\s+(defined|not|true|false|sameas)\b))");
  const std::string s(source);
  if (std::regex_search(s, kThinkingVar)) return "thinking";
  return "";
}

}  // namespace

std::vector<std::string_view> reasoning_syntax_names() {
  std::vector<std::string_view> names;
  for (const Row& r : kRows) names.push_back(r.name);
  return names;
}

std::optional<ReasoningSyntax> reasoning_syntax(std::string_view name) {
  for (const Row& r : kRows) {
    if (r.name == name) return from_row(r);
  }
  return std::nullopt;
}

ReasoningDetection detect_reasoning(std::string_view src) {
  ReasoningDetection d;
  d.switch_variable = switch_variable(src);
  const auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
  const auto found = [&](std::string_view name, std::string reason) {
    d.syntax = reasoning_syntax(name);
    d.reason = std::move(reason);
    return d;
  };
  if (has("<|channel|>analysis") || has("<|channel|>final")) {
    return found("harmony", "the template writes gpt-oss's harmony channels: analysis becomes "
                            "reasoning_content, final content");
  }
  if (has("<seed:think>")) return found("seed", "the template writes <seed:think>");
  if (has("[THINK]")) return found("mistral", "the template writes [THINK]");
  if (has("<|channel>thought")) return found("gemma4", "the template writes <|channel>thought");
  if (has("[BEGIN FINAL RESPONSE]")) {
    found("apriel", "the template writes [BEGIN FINAL RESPONSE]");
    if (!has(d.syntax->markers.start)) d.syntax->markers.start.clear();
    if (!has(d.syntax->content_close)) d.syntax->content_close.clear();
    return d;
  }
  if (has("<think>") || has("</think>")) {
    if (has("<|start_of_role|>") && has("<response>")) {
      return found("granite", "the template writes <think> and <response> (Granite)");
    }
    return found("think", has("<think>") ? "the template writes <think>"
                                         : "the template reads </think>");
  }
  d.reason = "the template writes no thinking markers";
  return d;
}

PromptThinking prompt_thinking(const ReasoningSyntax& syntax, std::string_view prompt) {
  const std::string_view tail = rtrim(prompt);
  if (tail.ends_with(syntax.markers.end)) return PromptThinking::kClosed;
  if (syntax.markers.start.empty()) return PromptThinking::kOpen;
  return tail.ends_with(syntax.markers.start) ? PromptThinking::kOpen : PromptThinking::kMaybe;
}

ReasoningSplitter::ReasoningSplitter(const ReasoningSyntax& syntax, grammar::ThinkingStart start)
    : syntax_(&syntax), scanner_(syntax.markers, start) {}

SplitText ReasoningSplitter::feed(std::string_view text, bool final) {
  grammar::ThinkingScanner::Out out;
  scanner_.feed(text, out);
  if (final) scanner_.finish(out);
  SplitText split;
  const bool block_over = final || scanner_.phase() != grammar::ThinkingScanner::Phase::kThinking;
  take_reasoning(out.reasoning, block_over, split);
  take_content(out.content, final, split);
  return split;
}

// Leading whitespace is dropped; trailing whitespace is held until more reasoning follows and
// dropped when the block ends.
void ReasoningSplitter::take_reasoning(std::string_view bytes, bool block_over, SplitText& out) {
  for (char c : bytes) {
    if (!reasoning_started_ && is_space(c)) continue;
    reasoning_started_ = true;
    if (is_space(c)) {
      reasoning_space_ += c;
      continue;
    }
    out.reasoning += reasoning_space_;
    reasoning_space_.clear();
    out.reasoning += c;
  }
  if (block_over) reasoning_space_.clear();
}

// After a block, the content's end may be the syntax's closing wrapper: hold back what may
// still be it (a prefix of content_close, or content_close and whitespace).
void ReasoningSplitter::take_content(std::string_view bytes, bool final, SplitText& out) {
  const std::string& close = syntax_->content_close;
  if (close.empty() || !scanner_.opened()) {
    out.content += content_held_;
    content_held_.clear();
    out.content += bytes;
    return;
  }
  content_held_ += bytes;
  const std::string_view all = content_held_;
  const std::string_view body = rtrim(all);
  size_t keep = all.size();  // bytes of content_held_ emitted now
  if (body.ends_with(close)) {
    keep = body.size() - close.size();
  } else if (!final) {
    for (size_t len = std::min(all.size(), close.size() - 1); len > 0; --len) {
      if (std::string_view(close).starts_with(all.substr(all.size() - len))) {
        keep = all.size() - len;
        break;
      }
    }
  }
  out.content.append(all.substr(0, keep));
  content_held_.erase(0, keep);
  if (final) content_held_.clear();
}

SplitText split_reasoning(const ReasoningSyntax& syntax, grammar::ThinkingStart start,
                          std::string_view text) {
  ReasoningSplitter splitter(syntax, start);
  return splitter.feed(text, true);
}

}  // namespace arbor::chat
