#include "server/messages_api.h"

#include "server/chat_prompt.h"
#include "server/messages_output.h"
#include "server/request_fields.h"
#include "server/tool_calling_api.h"

namespace arbor::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

ApiError bad(const std::string& field, std::string_view what) {
  return invalid_param(field, str_cat("'", field, "' ", what));
}


// Text blocks ([{"type": "text", "text"}]) or a string, as chat content (text parts).
std::optional<ApiError> text_content(const ojson& content, const std::string& where, ojson* out) {
  if (content.is_string()) {
    *out = content;
    return std::nullopt;
  }
  if (!content.is_array()) return bad(where, "must be a string or a list of text blocks");
  *out = ojson::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& b = content[j];
    const std::string at = str_cat(where, "[", j, "]");
    if (!b.is_object() || b.value("type", ojson()) != "text") {
      return bad(at, "must be a text block ({\"type\": \"text\", \"text\": ...})");
    }
    ARBOR_API_TRY(require_string(b, "text", at));
    out->push_back({{"type", "text"}, {"text", b["text"]}});
  }
  return std::nullopt;
}

// One Anthropic message as chat messages: a user message's tool results become tool messages
// (before its text); an assistant message's thinking becomes reasoning_content and its tool_use
// blocks tool_calls.
class MessageReader {
 public:
  explicit MessageReader(ojson* out) : out_(out) {}

  std::optional<ApiError> read(const ojson& m, size_t i) {
    const std::string where = str_cat("messages[", i, "]");
    if (!m.is_object()) return bad(where, "must be an object");
    const ojson role = m.value("role", ojson());
    if (role != "user" && role != "assistant") return bad(str_cat(where, ".role"), "must be user or assistant");
    if (!m.contains("content")) return bad(str_cat(where, ".content"), "is required");
    const ojson& content = m["content"];
    user_ = role == "user";
    message_ = {{"role", role}, {"content", ojson::array()}};
    if (content.is_string()) {
      message_["content"] = content;
    } else if (content.is_array()) {
      for (size_t j = 0; j < content.size(); ++j) {
        ARBOR_API_TRY(block(content[j], str_cat(where, ".content[", j, "]")));
      }
    } else {
      return bad(str_cat(where, ".content"), "must be a string or a list of content blocks");
    }
    const bool empty_content = message_["content"].is_array() && message_["content"].empty();
    if (!user_ && empty_content) message_["content"] = nullptr;
    if (!user_ || !empty_content || tool_results_ == 0) out_->push_back(std::move(message_));
    return std::nullopt;
  }

 private:
  std::optional<ApiError> block(const ojson& b, const std::string& at) {
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) {
      return bad(at, "must be an object with a string 'type'");
    }
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      ARBOR_API_TRY(require_string(b, "text", at));
      message_["content"].push_back({{"type", "text"}, {"text", b["text"]}});
      return std::nullopt;
    }
    if (user_ && type == "tool_result") return tool_result(b, at);
    if (!user_ && type == "tool_use") return tool_use(b, at);
    if (!user_ && type == "thinking") {
      ARBOR_API_TRY(require_string(b, "thinking", at));
      const std::string before = message_.value("reasoning_content", "");
      message_["reasoning_content"] = before + b["thinking"].get<std::string>();
      return std::nullopt;
    }
    return bad(str_cat(at, ".type"),
               str_cat("is '", type, "': supported blocks are text, tool_result (user), ",
                       "tool_use and thinking (assistant); images, documents, redacted thinking "
                       "and server tool blocks are not"));
  }

  std::optional<ApiError> tool_result(const ojson& b, const std::string& at) {
    ARBOR_API_TRY(require_string(b, "tool_use_id", at));
    ojson content = "";
    if (present(b, "content")) ARBOR_API_TRY(text_content(b["content"], str_cat(at, ".content"), &content));
    if (present(b, "is_error")) {
      if (!b["is_error"].is_boolean()) return bad(str_cat(at, ".is_error"), "must be a boolean");
      // The model learns that the call failed the only way a chat template can tell it.
      if (b["is_error"].get<bool>()) {
        ojson parts = ojson::array({{{"type", "text"}, {"text", "Error: "}}});
        if (content.is_string()) {
          parts.push_back({{"type", "text"}, {"text", content}});
        } else {
          for (const ojson& p : content) parts.push_back(p);
        }
        content = std::move(parts);
      }
    }
    out_->push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", content}});
    ++tool_results_;
    return std::nullopt;
  }

  std::optional<ApiError> tool_use(const ojson& b, const std::string& at) {
    ARBOR_API_TRY(require_string(b, "id", at));
    ARBOR_API_TRY(require_string(b, "name", at));
    if (!b.contains("input") || !b["input"].is_object()) return bad(str_cat(at, ".input"), "must be an object");
    if (!message_.contains("tool_calls")) message_["tool_calls"] = ojson::array();
    message_["tool_calls"].push_back(
        {{"id", b["id"]},
         {"type", "function"},
         {"function", {{"name", b["name"]}, {"arguments", b["input"].dump()}}}});
    return std::nullopt;
  }

  ojson* out_;
  ojson message_;
  bool user_ = false;
  int tool_results_ = 0;  // of the message being read
};

std::optional<ApiError> read_messages(const ojson& body, ojson* out) {
  if (present(body, "system")) {
    ojson system;
    ARBOR_API_TRY(text_content(body["system"], "system", &system));
    out->push_back({{"role", "system"}, {"content", std::move(system)}});
  }
  if (!present(body, "messages")) return bad("messages", "is required");
  const ojson& messages = body["messages"];
  if (!messages.is_array()) return bad("messages", "must be a list");
  if (messages.empty()) return bad("messages", "is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    MessageReader reader(out);
    ARBOR_API_TRY(reader.read(messages[i], i));
  }
  // Anthropic continues a final assistant message; the chat template would close it and open a
  // new turn instead, so the request is refused rather than answered differently.
  if (messages.back().value("role", ojson()) == "assistant") {
    return bad(str_cat("messages[", messages.size() - 1, "].role"),
               "is assistant: prefilling the reply (continuing a final assistant message) is "
               "not supported");
  }
  return std::nullopt;
}

// Anthropic tools ({"name", "description"?, "input_schema"}) in the chat shape.
std::optional<ApiError> anthropic_tools(const ojson& body, ojson* out) {
  if (!present(body, "tools")) return std::nullopt;
  const ojson& tools = body["tools"];
  if (!tools.is_array()) return bad("tools", "must be a list");
  *out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = str_cat("tools[", i, "]");
    if (!t.is_object()) return bad(where, "must be an object");
    if (present(t, "type") && t["type"] != "custom") {
      return bad(str_cat(where, ".type"),
                 str_cat("is ", t["type"].dump(), ": only custom tools (name, description, "
                         "input_schema) are supported; Anthropic's server tools (bash, "
                         "text_editor, web_search, computer, code_execution, ...) are not"));
    }
    if (!t.value("name", ojson()).is_string() || !valid_function_name(t["name"].get<std::string>())) {
      return bad(str_cat(where, ".name"), "must be 1-64 characters of a-z, A-Z, 0-9, _ and -");
    }
    if (!t.contains("input_schema") || !t["input_schema"].is_object()) {
      return bad(str_cat(where, ".input_schema"), "must be a JSON Schema object");
    }
    if (present(t, "description") && !t["description"].is_string()) {
      return bad(str_cat(where, ".description"), "must be a string");
    }
    ojson f{{"name", t["name"]}};
    if (present(t, "description")) f["description"] = t["description"];
    f["parameters"] = t["input_schema"];
    out->push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return std::nullopt;
}

// tool_choice {"type": auto | any | tool | none, "name", "disable_parallel_tool_use"} in chat
// terms (auto, required, a named function, none; parallel_tool_calls).
std::optional<ApiError> anthropic_tool_choice(const ojson& body, ojson* chat) {
  if (!present(body, "tool_choice")) return std::nullopt;
  const ojson& c = body["tool_choice"];
  if (!c.is_object()) return bad("tool_choice", "must be an object with a 'type'");
  const ojson type = c.value("type", ojson());
  if (type == "auto") {
    (*chat)["tool_choice"] = "auto";
  } else if (type == "any") {
    (*chat)["tool_choice"] = "required";
  } else if (type == "none") {
    (*chat)["tool_choice"] = "none";
  } else if (type == "tool") {
    if (!c.value("name", ojson()).is_string()) return bad("tool_choice.name", "must be a string");
    (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
  } else {
    return bad("tool_choice.type", "must be auto, any, tool or none");
  }
  if (present(c, "disable_parallel_tool_use")) {
    if (!c["disable_parallel_tool_use"].is_boolean()) {
      return bad("tool_choice.disable_parallel_tool_use", "must be a boolean");
    }
    (*chat)["parallel_tool_calls"] = !c["disable_parallel_tool_use"].get<bool>();
  }
  return std::nullopt;
}

enum class Thinking { kDefault, kEnabled, kDisabled };

std::optional<ApiError> read_thinking(const ojson& body, Thinking* out, int64_t* budget) {
  if (!present(body, "thinking")) return std::nullopt;
  const ojson& t = body["thinking"];
  if (!t.is_object()) return bad("thinking", "must be an object");
  const ojson type = t.value("type", ojson());
  if (type == "disabled") {
    *out = Thinking::kDisabled;
    return std::nullopt;
  }
  if (type != "enabled") return bad("thinking.type", "must be enabled or disabled");
  *out = Thinking::kEnabled;
  const ojson b = t.value("budget_tokens", ojson());
  if (!b.is_number_integer() || b.get<int64_t>() < 1024) {
    return bad("thinking.budget_tokens", "must be an integer >= 1024 with thinking enabled");
  }
  *budget = b.get<int64_t>();
  return std::nullopt;
}

// What /v1/messages and count_tokens render: the chat messages, the tools and the template's
// thinking switch.
struct MessagesPrompt {
  ojson messages = ojson::array();
  ToolRequest tools;
  ChatPromptExtras extras;
  Thinking thinking = Thinking::kDefault;
  int64_t budget = 0;
};

std::optional<ApiError> read_prompt(const ojson& body, MessagesPrompt* p) {
  ARBOR_API_TRY(read_messages(body, &p->messages));
  ojson chat{{"tools", nullptr}, {"tool_choice", nullptr}, {"parallel_tool_calls", nullptr}};
  ARBOR_API_TRY(anthropic_tools(body, &chat["tools"]));
  ARBOR_API_TRY(anthropic_tool_choice(body, &chat));
  if (chat["tools"].is_null() && chat["tool_choice"] == "auto") {
    chat["tool_choice"] = nullptr;  // asks nothing without tools
  }
  ARBOR_API_TRY(read_tools(json(chat), chat, &p->tools));
  p->extras.tools = p->tools.tools;
  ARBOR_API_TRY(read_thinking(body, &p->thinking, &p->budget));
  if (p->thinking != Thinking::kDefault) {
    p->extras.template_kwargs = {{"enable_thinking", p->thinking == Thinking::kEnabled}};
  }
  return std::nullopt;
}

std::optional<ApiError> read_max_tokens(const json& body, const ModelInfo& model,
                                        const MessagesPrompt& p, engine::GenerateRequest* r) {
  if (!body.contains("max_tokens") || body["max_tokens"].is_null()) {
    return bad("max_tokens", "is required");
  }
  ARBOR_API_TRY(read_int32(body, "max_tokens", 1, model.context_length, &r->max_tokens));
  ARBOR_API_TRY(check_lengths(model, r->prompt_token_ids.size(), true, "max_tokens",
                              &r->max_tokens));
  if (p.thinking == Thinking::kEnabled && p.budget >= r->max_tokens) {
    return bad("thinking.budget_tokens", str_cat("is ", p.budget, ", must be less than "
                                                 "max_tokens (", r->max_tokens, ")"));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> prepare_messages(const json& body, const ModelInfo& model,
                                         PreparedRequest* out) {
  ARBOR_API_TRY(check_model(body, model));
  ARBOR_API_TRY(check_request_fields(body, RequestRoute::kMessages));
  MessagesPrompt p;
  ARBOR_API_TRY(read_prompt(ordered_body(body, out->raw_body), &p));
  ChatPrompt prompt;
  ARBOR_API_TRY(render_chat_prompt(model, p.messages, p.extras, "messages", &prompt));
  engine::GenerateRequest& r = out->request;
  r.prompt_token_ids = std::move(prompt.token_ids);
  ARBOR_API_TRY(read_max_tokens(body, model, p, &r));
  ARBOR_API_TRY(read_sampling(body, model, &r.sampling));
  ARBOR_API_TRY(read_scheduling(body, model, &r));
  ARBOR_API_TRY(read_stop(body, "stop_sequences", kMaxStopStrings, &r.stop));
  MessagesOutputOptions o;
  ARBOR_API_TRY(constrain_chat_output(model, p.tools, prompt.text, &r, &o.output));
  ARBOR_API_TRY(read_bool(body, "stream", &o.stream));
  const Status valid = r.sampling.validate(model.vocab_size);
  if (!valid.ok()) return error_from_status(valid);
  o.model = model.name;
  o.show_thinking = p.thinking != Thinking::kDisabled;
  o.input_tokens = static_cast<int64_t>(r.prompt_token_ids.size());
  out->builder = make_messages_builder(std::move(o));
  return std::nullopt;
}

std::optional<ApiError> count_message_tokens(const json& body, std::string_view raw_body,
                                             const ModelInfo& model, std::string* answer) {
  ARBOR_API_TRY(check_model(body, model));
  ARBOR_API_TRY(check_request_fields(body, RequestRoute::kCountTokens));
  MessagesPrompt p;
  ARBOR_API_TRY(read_prompt(ordered_body(body, raw_body), &p));
  ChatPrompt prompt;
  ARBOR_API_TRY(render_chat_prompt(model, p.messages, p.extras, "messages", &prompt));
  *answer = dump_json(json{{"input_tokens", prompt.token_ids.size()}});
  return std::nullopt;
}

}  // namespace arbor::server
