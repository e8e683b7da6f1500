// Anthropic's Messages answer (/v1/messages, messages_api.h): the message, or its stream of
// events, built from one choice's engine events.
//
// Content blocks, in the order they appear (chat_output.h's OutputParts): {"type": "thinking",
// "thinking", "signature": ""} for a thinking model's reasoning (left out when the request
// turned thinking off), {"type": "text", "text"}, and {"type": "tool_use", "id": "toolu_...",
// "name", "input": {...}} per call.
// stop_reason: "tool_use" (the model ended its turn after calls), "end_turn", "stop_sequence"
// (stop_sequence: the string that matched), "max_tokens"; "abort" when the engine aborted the
// request (the client left, or the server's shutdown deadline passed).
//
// Events (`event: <type>` and data {"type": <type>, ...}):
//   message_start (usage.input_tokens: the prompt's tokens), ping,
//   per block: content_block_start, content_block_delta... (thinking_delta, text_delta,
//              input_json_delta with the arguments' text), content_block_stop,
//   message_delta (stop_reason, stop_sequence, usage), message_stop.
// An engine error after the stream started: an `error` event in Anthropic's error shape.
// The non-streamed message is built by the same code from the same engine events.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "server/api_common.h"
#include "server/chat_output.h"

namespace arbor::server {

struct MessagesOutputOptions {
  bool stream = false;
  std::string model;         // the served name
  ChatOutputOptions output;  // how the text is read
  bool show_thinking = true; // false (thinking disabled): reasoning is read but not returned
  int64_t input_tokens = 0;  // the prompt's tokens, for message_start
};

std::unique_ptr<ResponseBuilder> make_messages_builder(MessagesOutputOptions options);

}  // namespace arbor::server
