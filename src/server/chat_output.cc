#include "server/chat_output.h"

#include "base/log.h"

namespace arbor::server {

ChatOutput read_chat_output(const ChatOutputOptions& o, std::string_view text) {
  ChatOutput out;
  if (o.harmony) {
    chat::HarmonyOutput h = chat::parse_harmony(text, true, o.harmony->names, o.harmony->reasoning);
    if (o.harmony->single && h.calls.size() > 1) h.calls.resize(1);
    out.reasoning = std::move(h.reasoning);
    out.content = std::move(h.content);
    out.calls = std::move(h.calls);
    return out;
  }
  chat::SplitText split{.reasoning = "", .content = std::string(text)};
  if (o.reasoning) split = chat::split_reasoning(*o.reasoning->syntax, o.reasoning->start, text);
  out.reasoning = std::move(split.reasoning);
  if (!o.tools) {
    out.content = std::move(split.content);
    return out;
  }
  chat::ParsedToolOutput parsed = chat::parse_tool_calls(o.tools->format, split.content, true,
                                                         o.tools->names, &o.tools->types);
  if (o.tools->single && parsed.calls.size() > 1) parsed.calls.resize(1);
  out.content = std::move(parsed.content);
  out.calls = std::move(parsed.calls);
  return out;
}

ChatOutputStreamer::ChatOutputStreamer(const ChatOutputOptions& options) : options_(options) {
  if (options_.reasoning) {
    splitter_ = std::make_unique<chat::ReasoningSplitter>(*options_.reasoning->syntax,
                                                          options_.reasoning->start);
  }
  if (options_.tools) {
    tools_.emplace(options_.tools->format, options_.tools->names, options_.tools->types);
  }
  if (options_.harmony) harmony_.emplace(options_.harmony->names, options_.harmony->reasoning);
}

ChatOutputStreamer::Step ChatOutputStreamer::feed(std::string_view text, bool final) {
  Step step;
  if (harmony_) {
    text_ += text;
    chat::HarmonyStreamer::Step h = harmony_->update(text_, final);
    step.reasoning = std::move(h.reasoning);
    step.content = std::move(h.content);
    for (chat::ToolCallDelta& d : h.calls) {
      if (options_.harmony->single && d.index > 0) continue;
      step.calls.push_back(std::move(d));
    }
    return step;
  }
  chat::SplitText split{.reasoning = "", .content = std::string(text)};
  if (splitter_) split = splitter_->feed(text, final);
  step.reasoning = std::move(split.reasoning);
  if (!tools_) {
    step.content = std::move(split.content);
    return step;
  }
  content_ += split.content;
  chat::ToolCallStreamer::Step calls = tools_->update(content_, final);
  step.content = std::move(calls.content);
  for (chat::ToolCallDelta& d : calls.calls) {
    if (options_.tools->single && d.index > 0) continue;
    step.calls.push_back(std::move(d));
  }
  return step;
}

void OutputParts::enter(OutputPart part, const chat::ToolCallDelta* call,
                        OutputPartListener& listener) {
  const bool same = open_ == part && (part != OutputPart::kToolCall || call == nullptr);
  if (same) return;
  close(listener);
  open_ = part;
  open_call_ = call != nullptr ? call->index : -1;
  listener.part_open(part, call);
}

// A step's pieces in text order: the reasoning (always first in the output), the rest of the
// open call's arguments, the content, then the calls that start (and their arguments).
void OutputParts::apply(const ChatOutputStreamer::Step& step, OutputPartListener& listener) {
  if (!step.reasoning.empty()) {
    enter(OutputPart::kReasoning, nullptr, listener);
    listener.part_delta(OutputPart::kReasoning, step.reasoning);
  }
  size_t next = 0;
  for (; next < step.calls.size(); ++next) {
    const chat::ToolCallDelta& d = step.calls[next];
    if (d.first || open_ != OutputPart::kToolCall || d.index != open_call_) break;
    if (!d.arguments.empty()) listener.part_delta(OutputPart::kToolCall, d.arguments);
  }
  if (!step.content.empty()) {
    enter(OutputPart::kText, nullptr, listener);
    listener.part_delta(OutputPart::kText, step.content);
  }
  for (; next < step.calls.size(); ++next) {
    const chat::ToolCallDelta& d = step.calls[next];
    if (d.first) {
      enter(OutputPart::kToolCall, &d, listener);
    } else if (open_ != OutputPart::kToolCall || d.index != open_call_) {
      // The parser finishes a call's arguments before any later text (tool_calls.h), so this
      // cannot happen; were it to, the piece has no open part to go to.
      ARBOR_LOG(kWarn) << "tool call " << d.index << " continued after another part; "
                       << d.arguments.size() << " bytes of its arguments dropped";
      continue;
    }
    if (!d.arguments.empty()) listener.part_delta(OutputPart::kToolCall, d.arguments);
  }
}

void OutputParts::close(OutputPartListener& listener) {
  if (!open_) return;
  const OutputPart part = *open_;
  open_.reset();
  open_call_ = -1;
  listener.part_close(part);
}

}  // namespace arbor::server
