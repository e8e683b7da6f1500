// The chat template behind POST /v1/chat/completions: the model's tokenizer.chat_template, or
// the one named by `arbor serve --chat-template`.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "chat/tool_calls.h"
#include "server/openai_api.h"
#include "tokenizer/tokenizer.h"

namespace arbor::server {

// The template a model without one is served with (`arbor serve` logs a warning naming it).
inline constexpr std::string_view kFallbackChatTemplate = "chatml";

// `name_or_path`: "" = the tokenizer's own template (kFallbackChatTemplate when the model has
// none); otherwise a builtin template name or a file holding a Jinja template. Returns nullptr
// when the model's own template does not parse (chat requests then answer 400 naming
// --chat-template). Errors: an unknown name, a template that does not parse, an unknown
// reasoning format. tool_format: --tool-call-parser (nullopt: detected from the template, see
// chat::detect_tool_support). reasoning_format: --reasoning-format, "none", "auto" (detected
// from the template, chat::detect_reasoning) or a syntax name (chat::reasoning_syntax_names).
// Both decisions are logged at info. The tokenizer must outlive the renderer.
Result<std::unique_ptr<ChatRenderer>> make_chat_renderer(
    const tokenizer::Tokenizer& tokenizer, const std::string& name_or_path,
    std::optional<chat::ToolCallFormat> tool_format = std::nullopt,
    std::string_view reasoning_format = "auto");

}  // namespace arbor::server
