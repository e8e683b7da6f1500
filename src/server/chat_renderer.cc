#include "server/chat_renderer.h"

#include <filesystem>

#include "base/log.h"
#include "base/mapped_file.h"
#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "chat/tool_prompt.h"

namespace arbor::server {

namespace {

class TemplateChatRenderer : public ChatRenderer {
 public:
  TemplateChatRenderer(chat::ChatTemplate tmpl, const tokenizer::Tokenizer& tok,
                       std::optional<chat::ToolCallFormat> tool_format,
                       chat::ReasoningDetection reasoning)
      : tmpl_(std::move(tmpl)), tools_(chat::detect_tool_support(tmpl_.source())),
        reasoning_(std::move(reasoning)) {
    if (tok.bos_id() >= 0) bos_ = tok.token_text(tok.bos_id());
    if (tok.eos_id() >= 0) eos_ = tok.token_text(tok.eos_id());
    if (tool_format) {
      tools_.format = *tool_format;
      tools_.reason = "--tool-call-parser";
    }
    ARBOR_LOG(kInfo) << "tool calling: " << chat::tool_call_format_name(tools_.format)
                     << " format (" << tools_.reason << ")";
    if (reasoning_.syntax) {
      const grammar::ThinkingMarkers& m = reasoning_.syntax->markers;
      ARBOR_LOG(kInfo) << "reasoning: " << reasoning_.syntax->name << " format ("
                       << (m.start.empty() ? "" : m.start) << "..." << m.end << " becomes "
                       << "reasoning_content; " << reasoning_.reason << ")";
    } else {
      ARBOR_LOG(kInfo) << "reasoning: none, the output is all content (" << reasoning_.reason
                       << ")";
    }
  }

  Result<std::string> render(const nlohmann::ordered_json& messages,
                             const ChatPromptExtras& extras) const override {
    ARBOR_ASSIGN_OR_RETURN(nlohmann::ordered_json prepared,
                           chat::template_messages(messages, extras.tools, tools_.renders_tools));
    chat::ChatRenderOptions o;
    o.add_generation_prompt = extras.add_generation_prompt;
    o.content_parts = chat::ContentParts::kFlattenText;  // any template can show text parts
    o.bos_token = bos_;
    o.eos_token = eos_;
    if (extras.template_kwargs.is_object()) o.extra = extras.template_kwargs;
    map_thinking_switch(o.extra);
    if (tools_.renders_tools && !extras.tools.is_null()) o.extra["tools"] = extras.tools;
    return tmpl_.render_json(prepared, o);
  }

  const chat::TemplateToolSupport& tool_support() const override { return tools_; }
  const std::optional<chat::ReasoningSyntax>& reasoning() const override {
    return reasoning_.syntax;
  }
  bool reads_variable(std::string_view variable) const override {
    return tmpl_.source().find(variable) != std::string_view::npos;
  }

 private:
  // Templates that switch thinking with another variable (Granite 3.3 reads `thinking`) see the
  // client's enable_thinking under that name too.
  void map_thinking_switch(nlohmann::ordered_json& extra) const {
    const std::string& var = reasoning_.switch_variable;
    if (var.empty() || var == "enable_thinking" || !extra.contains("enable_thinking") ||
        extra.contains(var)) {
      return;
    }
    extra[var] = extra["enable_thinking"];
  }

  chat::ChatTemplate tmpl_;
  chat::TemplateToolSupport tools_;
  chat::ReasoningDetection reasoning_;
  std::string bos_;
  std::string eos_;
};

Result<chat::ChatTemplate> load_named(const std::string& name_or_path) {
  if (chat::builtin_chat_template_source(name_or_path)) return chat::builtin_chat_template(name_or_path);
  if (std::filesystem::is_regular_file(name_or_path)) {
    ARBOR_ASSIGN_OR_RETURN(std::string source, read_file(name_or_path));
    Result<chat::ChatTemplate> t = chat::ChatTemplate::parse(std::move(source));
    if (!t.ok()) return t.status().with_context(name_or_path);
    return t;
  }
  std::string names;
  for (std::string_view n : chat::builtin_chat_template_names()) names += str_cat(names.empty() ? "" : ", ", n);
  return not_found("--chat-template '", name_or_path, "' is neither a builtin (", names,
                   ") nor a file");
}

// --reasoning-format against the template's source.
Result<chat::ReasoningDetection> reasoning_for(std::string_view format, std::string_view source) {
  chat::ReasoningDetection d = chat::detect_reasoning(source);
  if (format == "auto") return d;
  d.syntax.reset();
  if (format == "none") {
    d.reason = "--reasoning-format none";
    return d;
  }
  d.syntax = chat::reasoning_syntax(format);
  if (!d.syntax) {
    std::string names = "none, auto";
    for (std::string_view n : chat::reasoning_syntax_names()) names += str_cat(", ", n);
    return invalid_argument("--reasoning-format '", format, "' is not one of ", names);
  }
  d.reason = "--reasoning-format";
  return d;
}

Result<std::unique_ptr<ChatRenderer>> make_renderer(
    chat::ChatTemplate t, const tokenizer::Tokenizer& tokenizer,
    std::optional<chat::ToolCallFormat> tool_format, std::string_view reasoning_format) {
  ARBOR_ASSIGN_OR_RETURN(chat::ReasoningDetection reasoning,
                         reasoning_for(reasoning_format, t.source()));
  return std::unique_ptr<ChatRenderer>(
      new TemplateChatRenderer(std::move(t), tokenizer, tool_format, std::move(reasoning)));
}

}  // namespace

Result<std::unique_ptr<ChatRenderer>> make_chat_renderer(
    const tokenizer::Tokenizer& tokenizer, const std::string& name_or_path,
    std::optional<chat::ToolCallFormat> tool_format, std::string_view reasoning_format) {
  if (!name_or_path.empty()) {
    ARBOR_ASSIGN_OR_RETURN(chat::ChatTemplate t, load_named(name_or_path));
    return make_renderer(std::move(t), tokenizer, tool_format, reasoning_format);
  }
  if (tokenizer.chat_template().empty()) {
    ARBOR_LOG(kWarn) << "the model has no chat template; /v1/chat/completions uses the built-in '"
                     << kFallbackChatTemplate << "' template (choose another with --chat-template "
                     << "NAME or FILE)";
    ARBOR_ASSIGN_OR_RETURN(chat::ChatTemplate t, chat::builtin_chat_template(kFallbackChatTemplate));
    return make_renderer(std::move(t), tokenizer, tool_format, reasoning_format);
  }
  Result<chat::ChatTemplate> t = chat::ChatTemplate::parse(tokenizer.chat_template());
  if (!t.ok()) {
    // Completions still work; chat requests answer 400 naming --chat-template.
    ARBOR_LOG(kWarn) << "the model's chat template does not parse (" << t.status().message()
                     << "); chat is disabled unless --chat-template is given";
    return std::unique_ptr<ChatRenderer>();
  }
  return make_renderer(std::move(t).value(), tokenizer, tool_format, reasoning_format);
}

}  // namespace arbor::server
