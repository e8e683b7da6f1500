#include "server/responses_api.h"

#include "server/chat_prompt.h"
#include "server/request_fields.h"
#include "server/response_store.h"
#include "server/responses_output.h"
#include "server/structured_output_api.h"
#include "server/tool_calling_api.h"

namespace arbor::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;


// A message's content: a string, or a list of text parts ([{"type": "input_text" |
// "output_text", "text"}]) that becomes chat text parts.
std::optional<ApiError> message_content(const ojson& content, const std::string& where,
                                        ojson* out) {
  if (content.is_string()) {
    *out = content;
    return std::nullopt;
  }
  if (!content.is_array()) {
    return invalid_param(where, str_cat("'", where, "' must be a string or a list of parts"));
  }
  *out = ojson::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& part = content[j];
    const std::string at = str_cat(where, "[", j, "]");
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return invalid_param(at, str_cat("'", at, "' must be an object with a string 'type'"));
    }
    const std::string type = part["type"].get<std::string>();
    if (type == "input_text" || type == "output_text") {
      ARBOR_API_TRY(require_string(part, "text", at));
      out->push_back({{"type", "text"}, {"text", part["text"]}});
    } else if (type == "refusal") {
      ARBOR_API_TRY(require_string(part, "refusal", at));
      out->push_back({{"type", "text"}, {"text", part["refusal"]}});
    } else {
      return invalid_param(str_cat(at, ".type"),
                           str_cat("'", at, ".type' is '", type, "': only text parts (input_text, "
                                   "output_text) are supported; images, files and audio are not"));
    }
  }
  return std::nullopt;
}

// Turns Responses input items into chat messages, in order.
class InputReader {
 public:
  explicit InputReader(ojson* messages) : messages_(messages) {}

  std::optional<ApiError> item(const ojson& it, size_t i) {
    const std::string where = str_cat("input[", i, "]");
    if (!it.is_object()) return invalid_param(where, str_cat("'", where, "' must be an object"));
    std::string type = "message";
    if (present(it, "type")) {
      if (!it["type"].is_string()) {
        return invalid_param(str_cat(where, ".type"), str_cat("'", where, ".type' must be a string"));
      }
      type = it["type"].get<std::string>();
    }
    if (type == "message") return message(it, where);
    if (type == "function_call") return function_call(it, where);
    if (type == "function_call_output") return function_call_output(it, where);
    if (type == "reasoning") return reasoning(it, where);
    return invalid_param(str_cat(where, ".type"),
                         str_cat("'", where, ".type' is '", type, "': supported items are "
                                 "message, function_call, function_call_output and reasoning"));
  }

 private:
  std::optional<ApiError> message(const ojson& it, const std::string& where) {
    const std::string role = it.value("role", ojson()).is_string() ? it["role"].get<std::string>() : "";
    if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
      return invalid_param(str_cat(where, ".role"),
                           str_cat("'", where, ".role' must be user, assistant, system or "
                                   "developer"));
    }
    if (!it.contains("content")) {
      return invalid_param(str_cat(where, ".content"), str_cat("'", where, ".content' is required"));
    }
    ojson m{{"role", role}};
    ARBOR_API_TRY(message_content(it["content"], str_cat(where, ".content"), &m["content"]));
    if (role == "assistant") take_reasoning(m);
    messages_->push_back(std::move(m));
    return std::nullopt;
  }

  std::optional<ApiError> function_call(const ojson& it, const std::string& where) {
    for (const char* key : {"call_id", "name", "arguments"}) {
      ARBOR_API_TRY(require_string(it, key, where));
    }
    ojson call{{"id", it["call_id"]},
               {"type", "function"},
               {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}};
    // Calls continue the assistant's turn (its message, or calls before them).
    if (messages_->empty() || messages_->back()["role"] != "assistant") {
      messages_->push_back({{"role", "assistant"}, {"content", nullptr}});
    }
    ojson& m = messages_->back();
    take_reasoning(m);
    if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
    m["tool_calls"].push_back(std::move(call));
    return std::nullopt;
  }

  std::optional<ApiError> function_call_output(const ojson& it, const std::string& where) {
    ARBOR_API_TRY(require_string(it, "call_id", where));
    if (!it.contains("output")) {
      return invalid_param(str_cat(where, ".output"), str_cat("'", where, ".output' is required"));
    }
    ojson content;
    ARBOR_API_TRY(message_content(it["output"], str_cat(where, ".output"), &content));
    messages_->push_back({{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", content}});
    return std::nullopt;
  }

  // A previous turn's reasoning item: its text goes with the assistant message that follows.
  std::optional<ApiError> reasoning(const ojson& it, const std::string& where) {
    if (present(it, "encrypted_content")) {
      return invalid_param(str_cat(where, ".encrypted_content"),
                           str_cat("'", where, ".encrypted_content' is not supported (arbor "
                                   "writes no encrypted reasoning)"));
    }
    const char* key = present(it, "content") ? "content" : "summary";
    if (!present(it, key)) return std::nullopt;
    const std::string field = str_cat(where, ".", key);
    if (!it[key].is_array()) return invalid_param(field, str_cat("'", field, "' must be a list"));
    for (size_t j = 0; j < it[key].size(); ++j) {
      const ojson& part = it[key][j];
      const std::string at = str_cat(field, "[", j, "]");
      if (!part.is_object()) return invalid_param(at, str_cat("'", at, "' must be an object"));
      ARBOR_API_TRY(require_string(part, "text", at));
      reasoning_ += str_cat(reasoning_.empty() ? "" : "\n", part["text"].get<std::string>());
    }
    return std::nullopt;
  }

  void take_reasoning(ojson& assistant) {
    if (reasoning_.empty() || assistant.contains("reasoning_content")) return;
    assistant["reasoning_content"] = std::exchange(reasoning_, std::string());
  }

  ojson* messages_;
  std::string reasoning_;  // of a reasoning item, waiting for its assistant message
};

std::optional<ApiError> read_input(const ojson& body, ojson* messages) {
  if (!present(body, "input")) return invalid_param("input", "'input' is required");
  const ojson& input = body["input"];
  if (input.is_string()) {
    if (input.get_ref<const std::string&>().empty()) return invalid_param("input", "'input' is empty");
    messages->push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return invalid_param("input", "'input' must be a string or a list of items");
  if (input.empty()) return invalid_param("input", "'input' is empty");
  InputReader reader(messages);
  for (size_t i = 0; i < input.size(); ++i) ARBOR_API_TRY(reader.item(input[i], i));
  return std::nullopt;
}

constexpr std::string_view kBuiltinTools =
    "built-in tools (web_search, file_search, computer_use_preview, code_interpreter, "
    "image_generation, mcp, local_shell, custom) are not";

// Responses function tools ({"type": "function", "name", ...}) in the chat shape.
std::optional<ApiError> response_tools(const ojson& body, ojson* out) {
  if (!present(body, "tools")) return std::nullopt;
  const ojson& tools = body["tools"];
  if (!tools.is_array()) return invalid_param("tools", "'tools' must be a list");
  *out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = str_cat("tools[", i, "]");
    if (!t.is_object()) return invalid_param(where, str_cat("'", where, "' must be an object"));
    const std::string type = t.value("type", ojson()).is_string() ? t["type"].get<std::string>() : "";
    if (type != "function") {
      return invalid_param(str_cat(where, ".type"),
                           str_cat("'", where, ".type' is '", type, "': only function tools "
                                   "are supported; ", kBuiltinTools));
    }
    if (!t.value("name", ojson()).is_string() || !valid_function_name(t["name"].get<std::string>())) {
      return invalid_param(str_cat(where, ".name"), str_cat("'", where, ".name' must be 1-64 "
                                                            "characters of a-z, A-Z, 0-9, _ and -"));
    }
    ojson f{{"name", t["name"]}};
    if (present(t, "description")) f["description"] = t["description"];
    if (present(t, "parameters")) f["parameters"] = t["parameters"];
    if (present(t, "strict")) f["strict"] = t["strict"];
    out->push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return std::nullopt;
}

std::optional<ApiError> response_tool_choice(const ojson& body, bool has_tools, ojson* out) {
  if (!present(body, "tool_choice")) return std::nullopt;
  const ojson& c = body["tool_choice"];
  if (c == "auto" && !has_tools) return std::nullopt;  // asks nothing without tools
  if (c.is_string()) {
    *out = c;  // none, auto, required; read_tools refuses others
    return std::nullopt;
  }
  const std::string type = c.is_object() && c.value("type", ojson()).is_string()
                               ? c["type"].get<std::string>()
                               : "";
  if (type == "function" && c.value("name", ojson()).is_string()) {
    *out = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
    return std::nullopt;
  }
  if (!type.empty() && type != "function") {
    return invalid_param("tool_choice.type",
                         str_cat("'tool_choice.type' is '", type, "': only function tools are "
                                 "supported; ", kBuiltinTools, ", nor are allowed_tools"));
  }
  return invalid_param("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" "
                                      "or {\"type\": \"function\", \"name\": ...}");
}

// tools, tool_choice and parallel_tool_calls, read as on chat (tool_calling_api.h).
std::optional<ApiError> read_response_tools(const ojson& body, ToolRequest* tools) {
  ojson chat{{"tools", nullptr}, {"tool_choice", nullptr}, {"parallel_tool_calls", nullptr}};
  ARBOR_API_TRY(response_tools(body, &chat["tools"]));
  const bool has_tools = chat["tools"].is_array() && !chat["tools"].empty();
  ARBOR_API_TRY(response_tool_choice(body, has_tools, &chat["tool_choice"]));
  if (body.contains("parallel_tool_calls")) chat["parallel_tool_calls"] = body["parallel_tool_calls"];
  return read_tools(json(chat), chat, tools);
}

// previous_response_id: the stored conversation it continues.
std::optional<ApiError> read_history(const ojson& body, const ModelInfo& model, ojson* history) {
  if (!present(body, "previous_response_id")) return std::nullopt;
  if (!body["previous_response_id"].is_string()) {
    return invalid_param("previous_response_id", "'previous_response_id' must be a string");
  }
  const std::string id = body["previous_response_id"].get<std::string>();
  ResponseStore* store = model.responses;
  if (store == nullptr || store->options().max_responses <= 0) {
    return invalid_param("previous_response_id", "'previous_response_id' needs stored "
                                                 "responses; this server keeps none "
                                                 "(--responses-max 0)");
  }
  std::optional<ojson> stored = store->get(id, ResponseStore::clock_s());
  if (!stored) {
    ApiError e = invalid_param(
        "previous_response_id",
        str_cat("previous response '", id, "' is not stored: it does not exist, was made with "
                "store: false, or is gone (this server keeps responses ", store->options().ttl_s,
                " s, at most ", store->options().max_responses, " of them and ",
                store->options().max_bytes >> 20, " MiB of conversation)"));
    e.http_status = 404;
    e.type = "not_found_error";
    e.code = "previous_response_not_found";
    return e;
  }
  *history = std::move(*stored);
  return std::nullopt;
}

// The request fields the response object repeats, with OpenAI's defaults.
json echo_fields(const json& b, bool store) {
  const auto get = [&](const char* key, json fallback) {
    return b.contains(key) && !b[key].is_null() ? b[key] : fallback;
  };
  json text_format = {{"type", "text"}};
  if (b.contains("text") && b["text"].is_object() && b["text"].contains("format") &&
      !b["text"]["format"].is_null()) {
    text_format = b["text"]["format"];
  }
  const bool tools = b.contains("tools") && b["tools"].is_array() && !b["tools"].empty();
  return {{"instructions", get("instructions", nullptr)},
          {"max_output_tokens", get("max_output_tokens", nullptr)},
          {"parallel_tool_calls", get("parallel_tool_calls", true)},
          {"previous_response_id", get("previous_response_id", nullptr)},
          {"store", store},
          {"temperature", get("temperature", 1.0)},
          {"text", {{"format", text_format}}},
          {"tool_choice", get("tool_choice", tools ? "auto" : "none")},
          {"tools", get("tools", json::array())},
          {"top_p", get("top_p", 1.0)},
          {"user", get("user", nullptr)},
          {"metadata", get("metadata", json::object())}};
}

// The conversation: instructions, the stored turns, the input. `kept`: all but the
// instructions (what a later previous_response_id continues).
std::optional<ApiError> read_conversation(const ojson& body, const ModelInfo& model,
                                          ojson* messages, ojson* kept) {
  ARBOR_API_TRY(read_history(body, model, kept));
  ARBOR_API_TRY(read_input(body, kept));
  if (present(body, "instructions")) {
    if (!body["instructions"].is_string()) {
      return invalid_param("instructions", "'instructions' must be a string");
    }
    messages->push_back({{"role", "system"}, {"content", body["instructions"]}});
  }
  for (const ojson& m : *kept) messages->push_back(m);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> prepare_responses(const json& body, const ModelInfo& model,
                                          PreparedRequest* out) {
  ARBOR_API_TRY(check_model(body, model));
  ARBOR_API_TRY(check_request_fields(body, RequestRoute::kResponses));
  const ojson ordered = ordered_body(body, out->raw_body);
  ResponsesOutputOptions o;
  ojson messages = ojson::array();
  ARBOR_API_TRY(read_conversation(ordered, model, &messages, &o.conversation));
  ToolRequest tools;
  ARBOR_API_TRY(read_response_tools(ordered, &tools));
  ChatPromptExtras extras;
  extras.tools = tools.tools;
  ARBOR_API_TRY(read_template_kwargs(ordered, &extras.template_kwargs));
  ChatPrompt prompt;
  ARBOR_API_TRY(render_chat_prompt(model, messages, extras, "input", &prompt));
  engine::GenerateRequest& r = out->request;
  r.prompt_token_ids = std::move(prompt.token_ids);
  const bool explicit_max = body.contains("max_output_tokens") && !body["max_output_tokens"].is_null();
  r.max_tokens = model.context_length;  // OpenAI's default: no limit but the context
  ARBOR_API_TRY(read_int32(body, "max_output_tokens", 1, model.context_length, &r.max_tokens));
  ARBOR_API_TRY(check_lengths(model, r.prompt_token_ids.size(), explicit_max,
                              "max_output_tokens", &r.max_tokens));
  ARBOR_API_TRY(read_sampling(body, model, &r.sampling));
  ARBOR_API_TRY(read_scheduling(body, model, &r));
  ARBOR_API_TRY(read_text_format(body, out->raw_body, &r.sampling.grammar));
  ARBOR_API_TRY(constrain_chat_output(model, tools, prompt.text, &r, &o.output));
  ARBOR_API_TRY(read_bool(body, "stream", &o.stream));
  bool store = true;
  ARBOR_API_TRY(read_bool(body, "store", &store));
  const Status valid = r.sampling.validate(model.vocab_size);
  if (!valid.ok()) return error_from_status(valid);
  o.model = model.name;
  o.echo = echo_fields(body, store);
  o.store = store ? model.responses : nullptr;
  out->builder = make_responses_builder(std::move(o));
  return std::nullopt;
}

}  // namespace arbor::server
