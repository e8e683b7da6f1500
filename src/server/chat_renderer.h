// The chat template behind POST /v1/chat/completions: the model's tokenizer.chat_template, or
// the one named by `arbor serve --chat-template`.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "chat/tool_calls.h"
#include "server/openai_api.h"
#include "tokenizer/tokenizer.h"

namespace arbor::server {

// `name_or_path`: "" = the tokenizer's own template; otherwise a builtin template name or a
// file holding a Jinja template. Returns nullptr when there is no template at all (chat requests
// then answer 400 naming --chat-template). Errors: an unknown name or a template that does not
// parse. tool_format: --tool-call-parser (nullopt: detected from the template, see
// chat::detect_tool_support); the decision is logged at info. The tokenizer must outlive the
// renderer.
Result<std::unique_ptr<ChatRenderer>> make_chat_renderer(
    const tokenizer::Tokenizer& tokenizer, const std::string& name_or_path,
    std::optional<chat::ToolCallFormat> tool_format = std::nullopt);

}  // namespace arbor::server
