// Chat templates: renders an OpenAI-style message list into the prompt text a model was trained on,
// with the model's own `tokenizer.chat_template` (a Jinja template, see jinja.h) or one of the
// built-in templates that `--chat-template NAME` selects.
//
// The template sees the variables transformers' apply_chat_template passes: `messages` (the
// OpenAI message objects as given: role, content, name, tool_calls, tool_call_id,
// reasoning_content, any other field), `add_generation_prompt`, `bos_token`, `eos_token`, `tools`
// and `documents` (none unless given), plus ChatRenderOptions::extra (which overrides any of them,
// e.g. enable_thinking), and the functions raise_exception and strftime_now. Rendering matches
// Python's jinja2 in transformers' environment byte for byte on the real templates of
// shared/templates (tests/chat/template_reference_test.cc; docs/tool_calling.md).
//
// Thread safety: a ChatTemplate is immutable after parse(); render() may be called from any thread,
// concurrently.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "chat/jinja.h"

namespace arbor::chat {

// One OpenAI chat message, for callers that build conversations in code. The template sees the
// fields that are set, in this order (render_json passes any other field too).
struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", ...
  // A string, null, or an array of parts ([{"type": "text", "text": ...}, ...]).
  nlohmann::ordered_json content = "";
  std::optional<std::string> name;  // OpenAI's optional participant name
  // An assistant's calls: [{"id", "type": "function", "function": {"name", "arguments"}}] with
  // arguments a JSON object (as Hugging Face templates expect) or text; null when none.
  nlohmann::ordered_json tool_calls = nullptr;
  std::optional<std::string> tool_call_id;       // a tool result's call id
  std::optional<std::string> reasoning_content;  // an assistant's thinking text
};

// The message as the OpenAI JSON object the template sees.
nlohmann::ordered_json chat_message_json(const ChatMessage& m);

// Messages and extra variables nested deeper than this are rejected (kInvalidArgument) before
// rendering, so client JSON cannot drive the recursive value code into a stack overflow.
inline constexpr int kMaxJsonDepth = 64;

// How array content ([{"type": "text", "text": ...}, ...]) reaches the template.
enum class ContentParts : uint8_t {
  // As given, a list, as transformers passes it: templates that iterate parts see them, templates
  // that expect a string fail or print the list, exactly as in Python.
  kAsGiven,
  // Joined into one string first (flatten_message_content), so that any template can show it;
  // the server's choice. Parts other than text are kInvalidArgument.
  kFlattenText,
};

struct ChatRenderOptions {
  // Append the header that starts the assistant's turn.
  bool add_generation_prompt = true;
  // The tokenizer's special tokens as text ("<s>", "<|begin_of_text|>"); empty when it has none.
  std::string bos_token;
  std::string eos_token;
  // More template variables (an object), e.g. {"tools": [...], "enable_thinking": false}; keys
  // replace the defaults above. `tojson` prints object keys in this object's order, so keep the
  // client's order (parse requests as ordered_json) to match transformers' rendering of tools.
  // Nesting deeper than kMaxJsonDepth is rejected.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  ContentParts content_parts = ContentParts::kAsGiven;
  jinja::RenderLimits limits;
  // The instant strftime_now() shows (Unix seconds, local time zone); nullopt: the current time.
  std::optional<int64_t> now_unix_seconds;
};

// OpenAI message content: a string, null (empty), or an array of parts of which the
// {"type": "text", "text": ...} ones are concatenated in order. Other part types (images, audio)
// are kInvalidArgument: arbor serves text models.
Result<std::string> flatten_message_content(const nlohmann::json& content);

// Converts an OpenAI `messages` array into ChatMessages (role, content as given, name,
// tool_calls, tool_call_id, reasoning_content; other fields are dropped). Errors name the
// offending field: "messages[2].role must be a string".
Result<std::vector<ChatMessage>> parse_chat_messages(const nlohmann::json& messages);

class ChatTemplate {
 public:
  // Parses a Jinja chat template; syntax errors carry line and column.
  static Result<ChatTemplate> parse(std::string source);

  // Renders `messages`. A template's raise_exception(msg) is kInvalidArgument with message `msg`
  // (e.g. "Conversation roles must alternate user/assistant/user/assistant/...").
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             const ChatRenderOptions& opts) const;

  // Renders an OpenAI `messages` array as given: every field of a message (tool_calls, name,
  // reasoning_content, ...) reaches the template; array content as opts.content_parts says.
  // Errors name the message index.
  // Pass ordered_json to keep the client's key order inside messages (tool call arguments).
  Result<std::string> render_json(const nlohmann::json& messages,
                                  const ChatRenderOptions& opts) const;
  Result<std::string> render_json(const nlohmann::ordered_json& messages,
                                  const ChatRenderOptions& opts) const;

  const std::string& source() const { return source_; }

 private:
  ChatTemplate(std::string source, jinja::Template tmpl)
      : source_(std::move(source)), tmpl_(std::move(tmpl)) {}
  template <typename Json>
  Result<std::string> render_json_impl(const Json& messages, const ChatRenderOptions& opts) const;
  Result<std::string> render_values(jinja::ValueList messages, const ChatRenderOptions& opts) const;
  std::string source_;
  jinja::Template tmpl_;
};

// Names accepted by builtin_chat_template, in a stable order:
// llama2, llama3, qwen2, chatml, mistral, zephyr, phi3.
std::vector<std::string_view> builtin_chat_template_names();

// The Jinja source of a built-in template: the chat_template of the reference model's
// tokenizer_config.json (see builtin_templates.cc). nullopt for an unknown name.
std::optional<std::string_view> builtin_chat_template_source(std::string_view name);

// A built-in template by name; kNotFound listing the valid names otherwise.
Result<ChatTemplate> builtin_chat_template(std::string_view name);

// Guesses the family of a template source from its special markers: one of the built-in names,
// or "unknown".
std::string detect_template_family(std::string_view source);

// The chat-related fields of a Hugging Face tokenizer_config.json.
struct TokenizerChatConfig {
  std::optional<std::string> chat_template;  // absent when the config has none
  std::string bos_token;
  std::string eos_token;
};

// Reads chat_template (a string, or a list of {name, template} where "default" is used), and
// bos_token / eos_token (a string or an {"content": ...} object) from a tokenizer_config.json.
Result<TokenizerChatConfig> read_tokenizer_chat_config(const nlohmann::json& config);

}  // namespace arbor::chat
