#include "server/request_fields.h"

#include <algorithm>
#include <span>
#include <string>

#include "base/status.h"

namespace arbor::server {
namespace {

using json = nlohmann::json;
using Names = std::span<const std::string_view>;

// Read by both OpenAI completion routes (read_common, read_max_tokens, read_structured_output,
// read_speculation).
constexpr std::string_view kShared[] = {
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "best_of",
    "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "stream",
    "stream_options", "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens",
    "priority", "speculation", "truncate_prompt_tokens", "response_format", "structured_outputs",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "grammar", "json_schema",
    "do_sample", "prompt_logprobs"};
constexpr std::string_view kCompletionsOnly[] = {"prompt", "echo"};
constexpr std::string_view kChatOnly[] = {"messages", "top_logprobs", "add_generation_prompt",
                                          "tools", "tool_choice", "parallel_tool_calls",
                                          "chat_template_kwargs", "reasoning_effort"};
// /v1/responses (responses_api.h); the sampling extensions as on chat (read_sampling).
constexpr std::string_view kResponses[] = {
    "model", "input", "instructions", "previous_response_id", "store", "tools", "tool_choice",
    "parallel_tool_calls", "text", "max_output_tokens", "temperature", "top_p", "stream",
    "seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
    "speculation", "priority", "chat_template_kwargs"};
// /v1/messages (messages_api.h); seed and the other sampling extensions as on chat.
constexpr std::string_view kMessages[] = {
    "model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature",
    "top_p", "top_k", "tools", "tool_choice", "thinking", "seed", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "speculation", "priority"};
constexpr std::string_view kCountTokens[] = {"model", "messages", "system", "tools",
                                             "tool_choice", "thinking"};

// Ask nothing of the output.
constexpr std::string_view kOpenAiMetadata[] = {"user", "metadata", "safety_identifier",
                                                "prompt_cache_key"};
constexpr std::string_view kAnthropicMetadata[] = {"metadata"};

// Fields of the OpenAI, vLLM and Anthropic APIs that arbor does not implement, and what they
// are for.
struct Missing {
  std::string_view field;
  std::string_view what;
};
constexpr Missing kOpenAiMissing[] = {
    {"functions", "function calling"},
    {"function_call", "function calling"},
    {"audio", "audio output"},
    {"modalities", "audio output"},
    {"prediction", "predicted outputs"},
    {"verbosity", "reasoning models"},
    {"web_search_options", "web search"},
    {"suffix", "insertion"},
    {"use_beam_search", "beam search"},
    {"length_penalty", "beam search"},
    {"stop_token_ids", "stop token ids"},
    {"include_stop_str_in_output", "keeping the stop string"},
    {"skip_special_tokens", "printing special tokens"},
    {"spaces_between_special_tokens", "printing special tokens"},
    {"allowed_token_ids", "allowed token lists"},
    {"bad_words", "bad words"},
    {"continue_final_message", "continuing the final message"},
    {"add_special_tokens", "choosing special tokens"},
    {"documents", "RAG documents"},
    {"chat_template", "per-request chat templates"},
    {"mm_processor_kwargs", "multi-modal inputs"},
    {"logits_processors", "custom logits processors"},
    {"return_tokens_as_token_ids", "token-id logprobs"},
    {"return_token_ids", "token ids in the answer"},
    {"request_id", "client request ids in the body (send the X-Request-Id header)"},
    {"cache_salt", "cache salts"},
    {"kv_transfer_params", "KV transfer"},
    {"vllm_xargs", "vLLM extra arguments"},
    {"guided_whitespace_pattern", "whitespace patterns"},
    {"guided_decoding_backend", "choosing a structured-output backend"},
};
constexpr Missing kResponsesMissing[] = {
    {"background", "background responses"},
    {"conversation", "stored conversations; send previous_response_id or the whole input"},
    {"prompt", "stored prompt templates"},
    {"reasoning", "reasoning effort and summaries; chat_template_kwargs can switch a template's "
                  "thinking"},
    {"include", "included extras such as encrypted reasoning or logprobs"},
    {"top_logprobs", "logprobs"},
    {"max_tool_calls", "a tool-call budget"},
    {"truncation", "truncating the conversation to fit (only \"disabled\")"},
    {"stream_options", "stream options"},
    {"service_tier", "service tiers other than auto and default"},
    {"context_management", "context management"},
};
constexpr Missing kMessagesMissing[] = {
    {"container", "code-execution containers"},
    {"mcp_servers", "MCP servers"},
    {"context_management", "context management"},
    {"service_tier", "service tiers other than auto and standard_only"},
    {"output_format", "structured output"},
    {"top_logprobs", "logprobs"},
};

struct RouteFields {
  Names read;
  Names read_too;  // a second list (the OpenAI routes: their own fields besides kShared)
  Names metadata;
  std::span<const Missing> missing;
  std::string_view name;
};

RouteFields fields_of(RequestRoute route) {
  switch (route) {
    case RequestRoute::kCompletions:
      return {kShared, kCompletionsOnly, kOpenAiMetadata, kOpenAiMissing, "/v1/completions"};
    case RequestRoute::kChat:
      return {kShared, kChatOnly, kOpenAiMetadata, kOpenAiMissing, "/v1/chat/completions"};
    case RequestRoute::kResponses:
      return {kResponses, {}, kOpenAiMetadata, kResponsesMissing, "/v1/responses"};
    case RequestRoute::kMessages:
      return {kMessages, {}, kAnthropicMetadata, kMessagesMissing, "/v1/messages"};
    case RequestRoute::kCountTokens:
      return {kCountTokens, {}, kAnthropicMetadata, kMessagesMissing,
              "/v1/messages/count_tokens"};
  }
  return {};
}

bool contains(Names list, std::string_view s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

bool is_empty_value(const json& v) {
  return (v.is_array() || v.is_object()) && v.empty();
}

// A field that asks for what arbor does anyway.
bool no_op(RequestRoute route, std::string_view field, const json& value, const json& body) {
  const bool has_tools = body.contains("tools") && !body["tools"].is_null();
  switch (route) {
    case RequestRoute::kCompletions:
    case RequestRoute::kChat:
      if (field == "store") return value.is_boolean() && !value.get<bool>();
      if (field == "service_tier") {
        return value.is_string() && (value == "auto" || value == "default");
      }
      // (on chat, the tool fields are read)
      if (field == "parallel_tool_calls") return value.is_boolean() && !has_tools;
      if (field == "tool_choice") return value == "none" && !has_tools;
      return false;
    case RequestRoute::kResponses:
      if (field == "service_tier") {
        return value.is_string() && (value == "auto" || value == "default");
      }
      if (field == "background") return value.is_boolean() && !value.get<bool>();
      if (field == "truncation") return value == "disabled";
      // No reasoning options, no extras, no stream options asked.
      if (field == "include" || field == "stream_options" || field == "reasoning") {
        if (is_empty_value(value)) return true;
        return value.is_object() && std::all_of(value.begin(), value.end(), [](const json& v) {
                 return v.is_null() || (v.is_boolean() && !v.get<bool>());
               });
      }
      return false;
    case RequestRoute::kMessages:
    case RequestRoute::kCountTokens:
      if (field == "service_tier") {
        return value.is_string() && (value == "auto" || value == "standard_only");
      }
      if (field == "mcp_servers") return is_empty_value(value);
      return false;
  }
  return false;
}

}  // namespace

std::optional<ApiError> check_request_fields(const json& body, RequestRoute route) {
  const RouteFields f = fields_of(route);
  for (const auto& [key, value] : body.items()) {
    if (value.is_null() || contains(f.read, key) || contains(f.read_too, key) ||
        contains(f.metadata, key)) {
      continue;
    }
    if (no_op(route, key, value, body)) continue;
    for (const Missing& m : f.missing) {
      if (m.field == key) {
        return invalid_param(key, str_cat("'", key, "' is not supported (", m.what,
                                          "); arbor refuses it rather than ignore it"));
      }
    }
    if (key == "store" || key == "service_tier" || key == "parallel_tool_calls") {
      return invalid_param(key, str_cat("'", key, "' = ", value.dump(), " is not supported"));
    }
    if (route == RequestRoute::kCompletions && contains(kChatOnly, key)) {
      return invalid_param(key, str_cat("'", key, "' is a /v1/chat/completions field"));
    }
    if (route == RequestRoute::kChat && contains(kCompletionsOnly, key)) {
      return invalid_param(key, str_cat("'", key, "' is a /v1/completions field"));
    }
    if (route == RequestRoute::kCountTokens && contains(kMessages, key)) {
      return invalid_param(key, str_cat("'", key, "' is a /v1/messages field; counting tokens "
                                                  "reads model, messages, system, tools, "
                                                  "tool_choice and thinking"));
    }
    return invalid_param(key, str_cat("unknown field '", key, "' on ", f.name,
                                      "; arbor refuses fields it does not read rather than "
                                      "ignore them (docs/server.md, \"Fields\")"));
  }
  return std::nullopt;
}

std::vector<std::string_view> read_fields(RequestRoute route) {
  const RouteFields f = fields_of(route);
  std::vector<std::string_view> out(f.read.begin(), f.read.end());
  out.insert(out.end(), f.read_too.begin(), f.read_too.end());
  return out;
}

}  // namespace arbor::server
