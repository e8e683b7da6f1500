// Helpers for the unit tests of /v1/responses and /v1/messages (agents_*_test.cc): a served
// model made of Qwen 3's tokenizer and chat template (shared/tokenizers/hf/qwen3: it renders
// tools, writes hermes <tool_call> blocks and thinks in <think>), without an engine; request
// preparation through the routes' own functions, and engine events fed to their builders.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/api_common.h"
#include "server/openai_api.h"
#include "server/response_store.h"

namespace arbor::server::testing {

// A ModelInfo over Qwen 3's tokenizer (loaded once per process; a missing file fails the test)
// and its template, or `chat_template` (a builtin name) with `reasoning_format` (as
// --reasoning-format), with its own ResponseStore. context_length 4096.
struct QwenModel {
  explicit QwenModel(ResponseStoreOptions store_options = {}, const std::string& chat_template = "",
                     const std::string& reasoning_format = "auto");
  bool ok() const { return info.tokenizer != nullptr && info.chat != nullptr; }
  ResponseStore store;
  std::unique_ptr<ChatRenderer> chat;
  ModelInfo info;
};

using PrepareFn = std::optional<ApiError> (*)(const nlohmann::json&, const ModelInfo&,
                                              PreparedRequest*);

struct Prepared {
  std::optional<ApiError> error;
  PreparedRequest request;
};
// Runs `prepare` on `body` (given to it as raw text too, as the server does).
Prepared prepare(PrepareFn prepare, const nlohmann::json& body, const ModelInfo& model);
// The same from the body's text (its key order kept, as a client's).
Prepared prepare_raw(PrepareFn prepare, const std::string& raw, const ModelInfo& model);

// An engine event: `text` with `num_tokens` token ids (value 1), ending the sample when `stop`.
engine::StreamEvent text_event(const std::string& text, int num_tokens = 1,
                               std::optional<sched::StopKind> stop = std::nullopt,
                               const std::string& stop_string = "");
// The final event with usage.
engine::StreamEvent final_event(int64_t prompt_tokens, int64_t completion_tokens);

// Feeds `events` (then `final_event`) to the builder; the bytes it returned, concatenated.
std::string run_builder(ResponseBuilder& builder, const std::vector<engine::StreamEvent>& events,
                        const engine::StreamEvent& final);

// One server-sent event.
struct SseEvent {
  std::string event;    // the `event:` line ("" when none)
  nlohmann::json data;  // the parsed `data:` line
};
std::vector<SseEvent> parse_sse(const std::string& bytes);

}  // namespace arbor::server::testing
