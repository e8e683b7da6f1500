// Reading a chat model's output back, for every chat-shaped route (/v1/chat/completions,
// /v1/responses, /v1/messages): a thinking model's reasoning split from the answer
// (chat/reasoning.h), and the answer's tool calls parsed (chat/tool_calls.h). The one place
// that decides what of the output is reasoning, content and calls; each route only writes the
// result in its own shape (reasoning_content / reasoning items / thinking blocks, tool_calls /
// function_call items / tool_use blocks).
//
// Thread-safety: read_chat_output is pure; a ChatOutputStreamer belongs to one choice.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/harmony.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "grammar/thinking.h"

namespace arbor::server {

// How a request's output is read (set when the request is prepared, chat_prompt.h).
struct ChatOutputOptions {
  // The output is read for tool calls (tool_choice other than none).
  struct ToolParsing {
    chat::ToolCallFormat format = chat::ToolCallFormat::kHermes;
    std::vector<std::string> names;  // the request's functions; calls of others are content
    chat::ToolParamTypes types;      // their parameters' types (formats with untyped values)
    bool single = false;             // parallel calls off: calls after the first are dropped
  };
  std::optional<ToolParsing> tools;
  // A thinking model: the output is split into reasoning and content (calls are read from the
  // content only).
  struct ReasoningParsing {
    const chat::ReasoningSyntax* syntax = nullptr;  // the renderer's; outlives the request
    grammar::ThinkingStart start = grammar::ThinkingStart::kMaybe;
  };
  std::optional<ReasoningParsing> reasoning;
  // gpt-oss's harmony format (chat/harmony.h): the output is read whole as harmony messages,
  // reasoning and calls included (set instead of tools and reasoning).
  struct HarmonyParsing {
    bool reasoning = true;           // the analysis channel is reasoning (else content)
    std::vector<std::string> names;  // the request's functions (empty: no calls are read)
    bool single = false;             // parallel calls off: calls after the first are dropped
  };
  std::optional<HarmonyParsing> harmony;

  // Anything to read: without any the output is all content, as generated.
  bool active() const { return tools.has_value() || reasoning.has_value() || harmony.has_value(); }
};

// One choice's whole output, read.
struct ChatOutput {
  std::string reasoning;                    // "" when none
  std::string content;                      // the text outside the thinking and the calls
  std::vector<chat::ParsedToolCall> calls;  // in order
};
ChatOutput read_chat_output(const ChatOutputOptions& options, std::string_view text);

// The same reading for a growing output: feed() returns what is new since the last call. The
// concatenations of the steps' reasoning and content, and each call's argument pieces, equal
// read_chat_output() of the whole text (held-back bytes, such as a partial marker, come in a
// later step, at the latest in the final one).
class ChatOutputStreamer {
 public:
  // `options` must outlive the streamer.
  explicit ChatOutputStreamer(const ChatOutputOptions& options);
  ChatOutputStreamer(const ChatOutputStreamer&) = delete;
  ChatOutputStreamer& operator=(const ChatOutputStreamer&) = delete;

  struct Step {
    std::string reasoning;
    std::string content;
    std::vector<chat::ToolCallDelta> calls;  // in call order; a call's first delta names it
  };
  // text: more output; final: it has ended (nothing may be fed afterwards).
  Step feed(std::string_view text, bool final);

 private:
  const ChatOutputOptions& options_;
  std::unique_ptr<chat::ReasoningSplitter> splitter_;
  std::optional<chat::ToolCallStreamer> tools_;
  std::optional<chat::HarmonyStreamer> harmony_;
  std::string text_;  // harmony: the output so far
  std::string content_;  // with tools: the content so far (after the reasoning)
};

// The parts of a choice's output in the order they appear, one open at a time: the reasoning,
// the text, each tool call. It is the shape of both the Responses API's output items and
// Anthropic's content blocks, decided here once; the listener writes them in its API's words.
// A part of another kind (or another call) closes the open one; text that follows a call is a
// new text part.
enum class OutputPart { kReasoning, kText, kToolCall };

class OutputPartListener {
 public:
  virtual ~OutputPartListener() = default;
  // A part begins. kToolCall: `call` is the call's first delta (index, name); else nullptr.
  virtual void part_open(OutputPart part, const chat::ToolCallDelta* call) = 0;
  // More of the open part: reasoning or text, or the call's argument text.
  virtual void part_delta(OutputPart part, std::string_view text) = 0;
  virtual void part_close(OutputPart part) = 0;
};

class OutputParts {
 public:
  // Sends `step` (of a ChatOutputStreamer) to the listener as parts.
  void apply(const ChatOutputStreamer::Step& step, OutputPartListener& listener);
  // The output ended: closes the open part.
  void close(OutputPartListener& listener);
  std::optional<OutputPart> open_part() const { return open_; }

 private:
  void enter(OutputPart part, const chat::ToolCallDelta* call, OutputPartListener& listener);

  std::optional<OutputPart> open_;
  int32_t open_call_ = -1;  // kToolCall: the open call's index
};

}  // namespace arbor::server
