#include "chat/chat_template.h"

#include <utility>

namespace arbor::chat {
namespace {

// A special token in tokenizer_config.json is a string or an AddedToken object {"content": ...}.
std::string token_text(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

// Iterative, so that checking a hostile document cannot itself overflow the stack.
template <typename Json>
bool too_deep(const Json& root, int max_depth) {
  std::vector<std::pair<const Json*, int>> stack = {{&root, 1}};
  while (!stack.empty()) {
    auto [j, depth] = stack.back();
    stack.pop_back();
    if (!j->is_structured()) continue;
    if (depth > max_depth) return true;
    for (const auto& child : *j) stack.emplace_back(&child, depth + 1);
  }
  return false;
}

using ojson = nlohmann::ordered_json;

// An optional string field of message i: absent or null gives nullopt.
Result<std::optional<std::string>> optional_string(const nlohmann::json& m, const char* key,
                                                   size_t i) {
  if (!m.contains(key) || m[key].is_null()) return std::optional<std::string>();
  if (!m[key].is_string()) return invalid_argument("messages[", i, "].", key, " must be a string");
  return std::optional<std::string>(m[key].get<std::string>());
}

}  // namespace

ojson chat_message_json(const ChatMessage& m) {
  ojson j = ojson::object();
  j["role"] = m.role;
  j["content"] = m.content;
  if (m.name) j["name"] = *m.name;
  if (!m.tool_calls.is_null()) j["tool_calls"] = m.tool_calls;
  if (m.tool_call_id) j["tool_call_id"] = *m.tool_call_id;
  if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
  return j;
}

Result<std::string> flatten_message_content(const nlohmann::json& content) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return invalid_argument("message content must be a string or an array of parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const nlohmann::json& part = content[i];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return invalid_argument("content[", i, "] must be an object with a string 'type'");
    }
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      return invalid_argument("content[", i, "] has type '", type, "'; only 'text' is supported");
    if (!part.contains("text") || !part["text"].is_string()) {
      return invalid_argument("content[", i, "] of type 'text' needs a string 'text'");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

Result<std::vector<ChatMessage>> parse_chat_messages(const nlohmann::json& messages) {
  if (!messages.is_array()) return invalid_argument("messages must be an array");
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    if (!m.is_object()) return invalid_argument("messages[", i, "] must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      return invalid_argument("messages[", i, "].role must be a string");
    ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    msg.content = m.contains("content") ? ojson(m["content"]) : ojson(nullptr);
    if (!msg.content.is_null() && !msg.content.is_string() && !msg.content.is_array())
      return invalid_argument("messages[", i, "].content must be a string, null or an array");
    ARBOR_ASSIGN_OR_RETURN(msg.name, optional_string(m, "name", i));
    ARBOR_ASSIGN_OR_RETURN(msg.tool_call_id, optional_string(m, "tool_call_id", i));
    ARBOR_ASSIGN_OR_RETURN(msg.reasoning_content, optional_string(m, "reasoning_content", i));
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array())
        return invalid_argument("messages[", i, "].tool_calls must be an array");
      msg.tool_calls = ojson(m["tool_calls"]);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

Result<ChatTemplate> ChatTemplate::parse(std::string source) {
  ARBOR_ASSIGN_OR_RETURN(jinja::Template tmpl, jinja::Template::parse(source));
  return ChatTemplate(std::move(source), std::move(tmpl));
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         const ChatRenderOptions& opts) const {
  ojson list = ojson::array();
  for (const ChatMessage& m : messages) list.push_back(chat_message_json(m));
  return render_json_impl(list, opts);
}

Result<std::string> ChatTemplate::render_json(const nlohmann::json& messages,
                                              const ChatRenderOptions& opts) const {
  return render_json_impl(messages, opts);
}

Result<std::string> ChatTemplate::render_json(const nlohmann::ordered_json& messages,
                                              const ChatRenderOptions& opts) const {
  return render_json_impl(messages, opts);
}

template <typename Json>
Result<std::string> ChatTemplate::render_json_impl(const Json& messages,
                                                   const ChatRenderOptions& opts) const {
  if (!messages.is_array()) return invalid_argument("messages must be an array");
  if (too_deep(messages, kMaxJsonDepth))
    return invalid_argument("messages nest deeper than ", kMaxJsonDepth, " levels");
  jinja::ValueList list;
  list.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];  // not nlohmann::json: that copy would sort the keys
    if (!m.is_object()) return invalid_argument("messages[", i, "] must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      return invalid_argument("messages[", i, "].role must be a string");
    jinja::Value v = jinja::Value::from_json(m);
    const bool flatten = opts.content_parts == ContentParts::kFlattenText;
    if (flatten && m.contains("content") && m["content"].is_array()) {
      Result<std::string> text = flatten_message_content(nlohmann::json(m["content"]));
      if (!text.ok()) return text.status().with_context(str_cat("messages[", i, "]"));
      v.set("content", jinja::Value(std::move(text).value()));
    }
    list.push_back(std::move(v));
  }
  return render_values(std::move(list), opts);
}

Result<std::string> ChatTemplate::render_values(jinja::ValueList list,
                                                const ChatRenderOptions& opts) const {
  jinja::Value globals = jinja::Value::dict({
      {"messages", jinja::Value::list(std::move(list))},
      {"add_generation_prompt", jinja::Value(opts.add_generation_prompt)},
      {"bos_token", jinja::Value(opts.bos_token)},
      {"eos_token", jinja::Value(opts.eos_token)},
      {"tools", jinja::Value::none()},
      {"documents", jinja::Value::none()},
  });
  if (!opts.extra.is_null() && !opts.extra.is_object()) {
    return invalid_argument("chat template extra variables must be a JSON object");
  }
  if (too_deep(opts.extra, kMaxJsonDepth)) {
    return invalid_argument("chat template extra variables nest deeper than ", kMaxJsonDepth,
                            " levels");
  }
  if (opts.extra.is_object()) {
    for (auto it = opts.extra.begin(); it != opts.extra.end(); ++it) {
      globals.set(it.key(), jinja::Value::from_json(*it));
    }
  }
  jinja::RenderEnvironment env;
  env.now_unix_seconds = opts.now_unix_seconds;
  return tmpl_.render(globals, opts.limits, env);
}

Result<ChatTemplate> builtin_chat_template(std::string_view name) {
  std::optional<std::string_view> source = builtin_chat_template_source(name);
  if (!source) {
    std::string names;
    for (std::string_view n : builtin_chat_template_names())
      names += (names.empty() ? "" : ", ") + std::string(n);
    return not_found("unknown chat template '", name, "'; built-in templates are: ", names);
  }
  return ChatTemplate::parse(std::string(*source));
}

std::string detect_template_family(std::string_view source) {
  auto has = [&](std::string_view s) { return source.find(s) != std::string_view::npos; };
  if (has("<|start_header_id|>")) return "llama3";
  if (has("<<SYS>>")) return "llama2";
  if (has("<|im_start|>")) return has("You are a helpful assistant") ? "qwen2" : "chatml";
  if (has("[INST]")) return "mistral";
  if (has("<|user|>") && has("<|end|>")) return "phi3";
  if (has("<|user|>") && has("<|assistant|>")) return "zephyr";
  return "unknown";
}

Result<TokenizerChatConfig> read_tokenizer_chat_config(const nlohmann::json& config) {
  if (!config.is_object()) return invalid_argument("tokenizer_config.json must be a JSON object");
  TokenizerChatConfig out;
  if (config.contains("bos_token")) out.bos_token = token_text(config["bos_token"]);
  if (config.contains("eos_token")) out.eos_token = token_text(config["eos_token"]);
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return out;
  const nlohmann::json& t = config["chat_template"];
  if (t.is_string()) {
    out.chat_template = t.get<std::string>();
    return out;
  }
  if (!t.is_array())
    return invalid_argument("tokenizer_config.json chat_template must be a string or a list");
  for (const nlohmann::json& entry : t) {
    const bool is_default = entry.is_object() && entry.contains("name") &&
                            entry["name"].is_string() &&
                            entry["name"].get<std::string>() == "default";
    if (is_default && entry.contains("template") && entry["template"].is_string()) {
      out.chat_template = entry["template"].get<std::string>();
      return out;
    }
  }
  return invalid_argument(
      "tokenizer_config.json chat_template list has no template named 'default'");
}

}  // namespace arbor::chat
