#include "server/chat_renderer.h"

#include <filesystem>

#include "base/log.h"
#include "base/mapped_file.h"
#include "chat/chat_template.h"
#include "chat/tool_prompt.h"

namespace arbor::server {

namespace {

class TemplateChatRenderer : public ChatRenderer {
 public:
  TemplateChatRenderer(chat::ChatTemplate tmpl, const tokenizer::Tokenizer& tok,
                       std::optional<chat::ToolCallFormat> tool_format)
      : tmpl_(std::move(tmpl)), tools_(chat::detect_tool_support(tmpl_.source())) {
    if (tok.bos_id() >= 0) bos_ = tok.token_text(tok.bos_id());
    if (tok.eos_id() >= 0) eos_ = tok.token_text(tok.eos_id());
    if (tool_format) {
      tools_.format = *tool_format;
      tools_.reason = "--tool-call-parser";
    }
    ARBOR_LOG(kInfo) << "tool calling: " << chat::tool_call_format_name(tools_.format)
                     << " format (" << tools_.reason << ")";
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
    if (tools_.renders_tools && !extras.tools.is_null()) o.extra["tools"] = extras.tools;
    return tmpl_.render_json(prepared, o);
  }

  const chat::TemplateToolSupport& tool_support() const override { return tools_; }

 private:
  chat::ChatTemplate tmpl_;
  chat::TemplateToolSupport tools_;
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

}  // namespace

Result<std::unique_ptr<ChatRenderer>> make_chat_renderer(
    const tokenizer::Tokenizer& tokenizer, const std::string& name_or_path,
    std::optional<chat::ToolCallFormat> tool_format) {
  if (!name_or_path.empty()) {
    ARBOR_ASSIGN_OR_RETURN(chat::ChatTemplate t, load_named(name_or_path));
    return std::unique_ptr<ChatRenderer>(
        new TemplateChatRenderer(std::move(t), tokenizer, tool_format));
  }
  if (tokenizer.chat_template().empty()) return std::unique_ptr<ChatRenderer>();
  Result<chat::ChatTemplate> t = chat::ChatTemplate::parse(tokenizer.chat_template());
  if (!t.ok()) {
    // Completions still work; chat requests answer 400 naming --chat-template.
    ARBOR_LOG(kWarn) << "the model's chat template does not parse (" << t.status().message()
                     << "); chat is disabled unless --chat-template is given";
    return std::unique_ptr<ChatRenderer>();
  }
  return std::unique_ptr<ChatRenderer>(
      new TemplateChatRenderer(std::move(t).value(), tokenizer, tool_format));
}

}  // namespace arbor::server
