#include "server/chat_renderer.h"

#include <filesystem>

#include "base/log.h"
#include "base/mapped_file.h"
#include "chat/chat_template.h"

namespace arbor::server {

namespace {

class TemplateChatRenderer : public ChatRenderer {
 public:
  TemplateChatRenderer(chat::ChatTemplate tmpl, const tokenizer::Tokenizer& tok)
      : tmpl_(std::move(tmpl)) {
    if (tok.bos_id() >= 0) bos_ = tok.token_text(tok.bos_id());
    if (tok.eos_id() >= 0) eos_ = tok.token_text(tok.eos_id());
  }

  Result<std::string> render(const nlohmann::json& messages,
                             bool add_generation_prompt) const override {
    ARBOR_ASSIGN_OR_RETURN(std::vector<chat::ChatMessage> parsed, chat::parse_chat_messages(messages));
    chat::ChatRenderOptions o;
    o.add_generation_prompt = add_generation_prompt;
    o.bos_token = bos_;
    o.eos_token = eos_;
    return tmpl_.render(parsed, o);
  }

 private:
  chat::ChatTemplate tmpl_;
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

Result<std::unique_ptr<ChatRenderer>> make_chat_renderer(const tokenizer::Tokenizer& tokenizer,
                                                         const std::string& name_or_path) {
  if (!name_or_path.empty()) {
    ARBOR_ASSIGN_OR_RETURN(chat::ChatTemplate t, load_named(name_or_path));
    return std::unique_ptr<ChatRenderer>(new TemplateChatRenderer(std::move(t), tokenizer));
  }
  if (tokenizer.chat_template().empty()) return std::unique_ptr<ChatRenderer>();
  Result<chat::ChatTemplate> t = chat::ChatTemplate::parse(tokenizer.chat_template());
  if (!t.ok()) {
    // Completions still work; chat requests answer 400 naming --chat-template.
    ARBOR_LOG(kWarn) << "the model's chat template does not parse (" << t.status().message()
                     << "); chat is disabled unless --chat-template is given";
    return std::unique_ptr<ChatRenderer>();
  }
  return std::unique_ptr<ChatRenderer>(new TemplateChatRenderer(std::move(t).value(), tokenizer));
}

}  // namespace arbor::server
