// The Responses API's answer (/v1/responses, responses_api.h): the response object, or its
// stream of events, built from one choice's engine events.
//
// Output items, in the order they appear (chat_output.h's OutputParts): a reasoning item
// {"type": "reasoning", "id": "rs_...", "summary": [], "content": [{"type": "reasoning_text",
// "text"}]} for a thinking model's reasoning, a message {"type": "message", "id": "msg_...",
// "role": "assistant", "content": [{"type": "output_text", "text", "annotations": []}]}, and a
// {"type": "function_call", "id": "fc_...", "call_id": "call_...", "name", "arguments"} per call.
//
// Events (each `event: <type>` with data {"type", "sequence_number" (0, 1, ...), ...}):
//   response.created, response.in_progress                      (status "in_progress")
//   per item:  response.output_item.added
//              reasoning: response.content_part.added, response.reasoning_text.delta...,
//                         response.reasoning_text.done, response.content_part.done
//              message:   response.content_part.added, response.output_text.delta...,
//                         response.output_text.done, response.content_part.done
//              call:      response.function_call_arguments.delta...,
//                         response.function_call_arguments.done
//              response.output_item.done
//   response.completed | response.incomplete (max_output_tokens) | response.cancelled
// An engine error after the stream started: an `error` event, then response.failed.
// The non-streamed response is built by the same code from the same engine events, so it equals
// the streamed one's final response.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api_common.h"
#include "server/chat_output.h"

namespace arbor::server {

class ResponseStore;

struct ResponsesOutputOptions {
  bool stream = false;
  std::string model;          // the served name
  ChatOutputOptions output;   // how the text is read
  // Request fields the response object repeats (instructions, max_output_tokens,
  // parallel_tool_calls, previous_response_id, store, temperature, text, tool_choice, tools,
  // top_p, metadata, user); absent ones get OpenAI's defaults.
  nlohmann::json echo = nlohmann::json::object();
  // Where the response is kept when it completes (nullptr: it is not, `store: false`), with the
  // conversation it ends: `conversation` (chat messages, instructions excluded) + its output.
  ResponseStore* store = nullptr;
  nlohmann::ordered_json conversation = nlohmann::ordered_json::array();
};

std::unique_ptr<ResponseBuilder> make_responses_builder(ResponsesOutputOptions options);

}  // namespace arbor::server
