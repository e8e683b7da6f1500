// Reasoning output of chat models (docs/server.md, "Reasoning"): which thinking markup a chat
// template's model writes, whether a rendered prompt has already opened (or closed) the
// thinking block, and splitting the output into OpenAI's `reasoning_content` and `content`.
//
// Syntaxes (detect_reasoning reads the template source, in this order):
//   harmony   "<|channel|>analysis" / "<|channel|>final" (gpt-oss's harmony messages): read whole
//             by chat::parse_harmony (harmony.h: analysis -> reasoning, final -> content,
//             commentary to=functions.NAME -> tool calls), never by ReasoningSplitter
//   seed      <seed:think> ... </seed:think>                           (ByteDance Seed-OSS)
//   mistral   [THINK] ... [/THINK]                                     (Magistral, Ministral 3
//             Reasoning; control tokens, kept as text for the parse)
//   gemma4    <|channel>thought ... <channel|>                          (Gemma 4)
//   apriel    [Here are my reasoning steps:] ... [BEGIN FINAL RESPONSE] content
//             [END FINAL RESPONSE]                                     (Apriel 1.5 / 1.6)
//   granite   <think> ... </think> <response> content </response>      (Granite 3.3)
//   think     <think> ... </think>          (Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3,
//             GLM-4.x, Kimi K2 Thinking, Nemotron, MiniMax-M2, ...)
//
// The split (ReasoningSplitter) reads one thinking block at the start of the output
// (grammar/thinking.h): the reasoning without its markers and without the whitespace around it,
// and the content after it without leading whitespace (and without the syntax's closing
// wrapper, content_close, at its very end). An output that does not start a block is all
// content, untouched. An output that ends inside the block (max_tokens) is all reasoning.
// Tool-call markup inside the reasoning is reasoning: tool calls are read from the content only.
//
// Pure functions and per-request objects; any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/thinking.h"

namespace arbor::chat {

struct ReasoningSyntax {
  std::string name;  // "think", "seed", "mistral", "gemma4", "apriel", "granite", "harmony"
  grammar::ThinkingMarkers markers;
  // Dropped (with trailing whitespace) when the content ends with it, after a thinking block:
  // Granite's "</response>", Apriel 1.5's "[END FINAL RESPONSE]". "" for none.
  std::string content_close;
};

struct ReasoningDetection {
  std::optional<ReasoningSyntax> syntax;  // nullopt: nothing to read (see reason)
  std::string reason;                     // for the server's log: "the template writes <think>"
  // The template variable that switches thinking on and off: "enable_thinking" (most),
  // "thinking" (Granite 3.3) or "" (none found).
  std::string switch_variable;
};

// Reads a chat template's source.
ReasoningDetection detect_reasoning(std::string_view template_source);

// The syntax names of the table above, in order (what --reasoning-format accepts besides none
// and auto).
std::vector<std::string_view> reasoning_syntax_names();
// nullopt for an unknown name.
std::optional<ReasoningSyntax> reasoning_syntax(std::string_view name);

enum class PromptThinking {
  kClosed,  // the prompt ends with the block closed ("<think>\n\n</think>\n\n": thinking off):
            // the output is all content
  kMaybe,   // the output may open a block
  kOpen,    // the prompt ends inside the block ("<think>\n"), or the syntax has no opening
            // marker: the output starts as reasoning
};
// Decided from the end of the rendered prompt (trailing whitespace ignored).
PromptThinking prompt_thinking(const ReasoningSyntax& syntax, std::string_view prompt);

struct SplitText {
  std::string reasoning;
  std::string content;
};

// Splits a growing output. Feeding it in any number of pieces gives, concatenated, the same
// reasoning and content as feeding it whole (split_reasoning). One per choice of a request.
class ReasoningSplitter {
 public:
  // `syntax` must outlive the splitter.
  ReasoningSplitter(const ReasoningSyntax& syntax, grammar::ThinkingStart start);
  ReasoningSplitter(const ReasoningSplitter&) = delete;
  ReasoningSplitter& operator=(const ReasoningSplitter&) = delete;

  // text: more output; final: the output has ended (after this call nothing more may be fed).
  // Returns the reasoning and content known now; held-back bytes (a partial marker,
  // whitespace) follow in a later call.
  SplitText feed(std::string_view text, bool final);
  // Whether a thinking block was opened.
  bool opened() const { return scanner_.opened(); }

 private:
  void take_reasoning(std::string_view bytes, bool block_over, SplitText& out);
  void take_content(std::string_view bytes, bool final, SplitText& out);

  const ReasoningSyntax* syntax_;
  grammar::ThinkingScanner scanner_;
  bool reasoning_started_ = false;
  std::string reasoning_space_;  // trailing whitespace of the reasoning, held back
  std::string content_held_;     // a possible content_close at the end of the content
};

// The whole output at once.
SplitText split_reasoning(const ReasoningSyntax& syntax, grammar::ThinkingStart start,
                          std::string_view text);

}  // namespace arbor::chat
