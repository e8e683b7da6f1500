// gpt-oss's harmony output format (docs/tool_calling.md, "Harmony"): reading a model's output
// into OpenAI's reasoning_content, content and tool_calls.
//
// After the prompt's "<|start|>assistant" the model writes one or more messages:
//   HEADER <|message|> BODY (<|end|> | <|call|> | <|return|> | the next <|start|> | the end)
// where every message but the first starts with "<|start|>ROLE", and the header names the
// channel ("<|channel|>analysis", "final", "commentary") and optionally a recipient
// ("to=functions.NAME", before or after the channel) and a content type ("<|constrain|>json",
// "json"). <|call|> and <|return|> end generation (they are end-of-generation tokens, so they
// are usually not in the text at all).
//   * analysis                          -> reasoning (bodies concatenated)
//   * a recipient "functions.NAME"      -> a tool call NAME with the body as its arguments, when
//                                          NAME is one of the request's tools; else content
//   * final, commentary without a recipient (a preamble), any other channel -> content
//   * text before any <|message|> with no harmony markup at all (a model that ignores the
//     format), once the output has ended -> content
// Bodies are kept verbatim (harmony puts no whitespace around them).
//
// parse_harmony() reads the whole output so far and is prefix-monotone, as parse_tool_calls
// (tool_calls.h): for a prefix P of T, parse(P, partial) gives reasoning and content that are
// prefixes of parse(T, final)'s, and the first calls of it with the same names and argument
// prefixes. A partial parse therefore holds back a body's tail that may be the start of a marker
// ("<|e"), and a header until its <|message|> arrives.
//
// Pure functions and per-request objects; any thread.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_calls.h"

namespace arbor::chat {

// The harmony markers whose text the output must carry to be read (control tokens in gpt-oss's
// o200k_harmony vocabulary; the server keeps their text in the output).
inline constexpr std::string_view kHarmonyMarkers[] = {
    "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|call|>",
    "<|return|>"};

struct HarmonyOutput {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> calls;  // complete: the call's message has ended
};

// Reads `text`, the output so far (final: it has ended). tool_names: the request's functions
// (empty: no call is read; a call's body is then content). reasoning: false puts the analysis
// channel into content too (--reasoning-format none).
HarmonyOutput parse_harmony(std::string_view text, bool final,
                            std::span<const std::string> tool_names, bool reasoning = true);

// Successive parses of a growing output as deltas: more reasoning, more content, new calls and
// more argument text. Everything it returns, concatenated, equals the final parse. One per
// choice of a streamed request.
class HarmonyStreamer {
 public:
  HarmonyStreamer(std::vector<std::string> tool_names, bool reasoning)
      : tool_names_(std::move(tool_names)), reasoning_(reasoning) {}

  struct Step {
    std::string reasoning;
    std::string content;
    std::vector<ToolCallDelta> calls;  // in call order
  };
  // text: the whole output so far; final: it has ended.
  Step update(std::string_view text, bool final);

 private:
  std::vector<std::string> tool_names_;
  bool reasoning_ = true;
  size_t sent_reasoning_ = 0;
  size_t sent_content_ = 0;
  std::vector<size_t> sent_args_;  // per call: argument bytes sent
};

}  // namespace arbor::chat
