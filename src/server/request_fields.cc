#include "server/request_fields.h"

#include <algorithm>
#include <string>

#include "base/status.h"

namespace arbor::server {
namespace {

using json = nlohmann::json;

// Read by both routes (read_common, read_max_tokens, read_structured_output, read_speculation).
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
                                          "chat_template_kwargs"};

// Ask nothing of the output.
constexpr std::string_view kMetadata[] = {"user", "metadata", "safety_identifier",
                                          "prompt_cache_key"};

// Fields of the OpenAI and vLLM APIs that arbor does not implement, and what they are for.
struct Missing {
  std::string_view field;
  std::string_view what;
};
constexpr Missing kMissing[] = {
    {"functions", "function calling"},
    {"function_call", "function calling"},
    {"audio", "audio output"},
    {"modalities", "audio output"},
    {"prediction", "predicted outputs"},
    {"reasoning_effort", "reasoning models"},
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

bool contains(std::span<const std::string_view> list, std::string_view s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

bool reads(OpenAiRoute route, std::string_view field) {
  return contains(kShared, field) ||
         contains(route == OpenAiRoute::kChat ? std::span<const std::string_view>(kChatOnly)
                                              : std::span<const std::string_view>(kCompletionsOnly),
                  field);
}

// A field that asks for what arbor does anyway (on chat, the tool fields are read).
bool no_op(std::string_view field, const json& value, const json& body) {
  const bool has_tools = body.contains("tools") && !body["tools"].is_null();
  if (field == "store") return value.is_boolean() && !value.get<bool>();
  if (field == "service_tier") {
    return value.is_string() && (value == "auto" || value == "default");
  }
  if (field == "parallel_tool_calls") return value.is_boolean() && !has_tools;
  if (field == "tool_choice") return value == "none" && !has_tools;
  return false;
}

}  // namespace

std::optional<ApiError> check_request_fields(const json& body, OpenAiRoute route) {
  for (const auto& [key, value] : body.items()) {
    if (value.is_null() || reads(route, key) || contains(kMetadata, key)) continue;
    if (no_op(key, value, body)) continue;
    for (const Missing& m : kMissing) {
      if (m.field == key) {
        return invalid_param(key, str_cat("'", key, "' is not supported (", m.what,
                                          "); arbor refuses it rather than ignore it"));
      }
    }
    if (key == "store" || key == "service_tier" || key == "parallel_tool_calls") {
      return invalid_param(key, str_cat("'", key, "' = ", value.dump(), " is not supported"));
    }
    if (route == OpenAiRoute::kCompletions && contains(kChatOnly, key)) {
      return invalid_param(key, str_cat("'", key, "' is a /v1/chat/completions field"));
    }
    if (route == OpenAiRoute::kChat && contains(kCompletionsOnly, key)) {
      return invalid_param(key, str_cat("'", key, "' is a /v1/completions field"));
    }
    return invalid_param(key, str_cat("unknown field '", key,
                                      "'; arbor refuses fields it does not read rather than "
                                      "ignore them (docs/server.md, \"Fields\")"));
  }
  return std::nullopt;
}

std::vector<std::string_view> read_fields(OpenAiRoute route) {
  std::vector<std::string_view> out(std::begin(kShared), std::end(kShared));
  if (route == OpenAiRoute::kChat) {
    out.insert(out.end(), std::begin(kChatOnly), std::end(kChatOnly));
  } else {
    out.insert(out.end(), std::begin(kCompletionsOnly), std::end(kCompletionsOnly));
  }
  return out;
}

}  // namespace arbor::server
