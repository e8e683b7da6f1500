#include "server/chat_prompt.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "chat/harmony.h"
#include "grammar/grammar_spec.h"

namespace arbor::server {

namespace {

using ojson = nlohmann::ordered_json;

// The texts a user wrote in `messages` (string contents and text parts), in order.
std::vector<ojson*> content_texts(ojson& messages) {
  std::vector<ojson*> out;
  for (ojson& m : messages) {
    if (!m.is_object() || !m.contains("content")) continue;
    ojson& c = m["content"];
    if (c.is_string()) {
      out.push_back(&c);
    } else if (c.is_array()) {
      for (ojson& part : c) {
        if (part.is_object() && part.contains("text") && part["text"].is_string()) {
          out.push_back(&part["text"]);
        }
      }
    }
  }
  return out;
}

std::string_view trim_space(std::string_view v, bool left, bool right) {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (left && !v.empty() && space(v.front())) v.remove_prefix(1);
  while (right && !v.empty() && space(v.back())) v.remove_suffix(1);
  return v;
}

// Where the rendered `prompt` holds message content, so that control-token text typed there
// stays text (EncodeOptions::literal_ranges). The template is rendered again with a sentinel
// in place of each content; between the template's own pieces, the prompt must hold the content
// as written or trimmed (templates often strip it). Anything else (a template that rewrites
// content) cannot be matched safely, and a content with control-token text is then a 400.
std::optional<ApiError> literal_content_ranges(const ojson& original, const ChatPromptExtras& extras,
                                               const ModelInfo& model, std::string_view param,
                                               const std::string& prompt,
                                               std::vector<std::pair<size_t, size_t>>* out) {
  ojson messages = original;
  std::vector<ojson*> texts = content_texts(messages);
  const bool needed = std::any_of(texts.begin(), texts.end(), [&](const ojson* t) {
    return model.tokenizer->contains_control_text(t->get_ref<const std::string&>());
  });
  if (!needed) return std::nullopt;
  std::vector<std::string> contents;
  for (size_t i = 0; i < texts.size(); ++i) {
    contents.push_back(texts[i]->get<std::string>());
    *texts[i] = str_cat("\x02", i, "\x03");  // not whitespace: strip() keeps them
  }
  const ApiError refused = invalid_param(
      param, "a message contains the text of a control token (such as '<|im_end|>'), which "
                  "this chat template does not let arbor keep as plain text; start the server "
                  "with --allow-special-in-content to accept it as control tokens");
  Result<std::string> marked = model.chat->render(messages, extras);
  if (!marked.ok()) return refused;
  // marked = T0 S(i0) T1 S(i1) ... Tn: match each T exactly, each S as its content, trimmed or not.
  const std::string& m = *marked;
  size_t at = 0, pos = 0;
  for (;;) {
    const size_t open = m.find('\x02', at);
    const size_t close = open == std::string::npos ? open : m.find('\x03', open + 1);
    const size_t piece_end = close == std::string::npos ? m.size() : open;
    const std::string_view piece(m.data() + at, piece_end - at);
    if (prompt.compare(pos, piece.size(), piece) != 0) return refused;
    pos += piece.size();
    if (close == std::string::npos) break;
    const size_t i = static_cast<size_t>(std::atoll(m.c_str() + open + 1));
    if (i >= contents.size()) return refused;
    // The template's next piece, which must follow the content.
    const size_t next_open = m.find('\x02', close + 1);
    const std::string_view next(m.data() + close + 1,
                                (next_open == std::string::npos ? m.size() : next_open) -
                                    (close + 1));
    bool matched = false;
    for (const auto& [left, right] : {std::pair{false, false}, {true, true}, {true, false},
                                     {false, true}}) {
      const std::string_view c = trim_space(contents[i], left, right);
      if (prompt.compare(pos, c.size(), c) != 0) continue;
      if (prompt.compare(pos + c.size(), next.size(), next) != 0) continue;
      if (next_open == std::string::npos && pos + c.size() + next.size() != prompt.size()) continue;
      out->emplace_back(pos, pos + c.size());
      pos += c.size();
      matched = true;
      break;
    }
    if (!matched) return refused;
    at = close + 1;
  }
  if (pos != prompt.size()) return refused;
  return std::nullopt;
}

// tool_choice required or named: the grammar that makes the output calls.
std::optional<ApiError> force_tool_calls(const ToolRequest& tools, const ModelInfo& model,
                                         sampling::SamplingParams* s) {
  if (s->grammar) {
    return invalid_param("tool_choice", "'tool_choice' \"required\" or a named function "
                                        "cannot be combined with another output constraint "
                                        "(response_format, text.format, structured_outputs, "
                                        "guided_*, grammar, json_schema)");
  }
  Result<std::string> gbnf = tool_call_grammar(tools, model.chat->tool_support().format);
  if (!gbnf.ok()) return invalid_param("tools", gbnf.status().message());
  grammar::GrammarSpec spec{grammar::GrammarKind::kGbnf, std::move(gbnf).value()};
  Result<grammar::Automaton> compiled = grammar::compile_spec(spec);
  if (!compiled.ok()) {
    return invalid_param("tools", str_cat("the tools cannot be enforced: ",
                                          compiled.status().message()));
  }
  s->grammar = std::move(spec);
  return std::nullopt;
}

// Where the rendered prompt leaves the model's thinking (nullopt: no reasoning to read).
std::optional<grammar::ThinkingStart> thinking_start(const ModelInfo& model,
                                                     const std::string& prompt) {
  const std::optional<chat::ReasoningSyntax>& syntax = model.chat->reasoning();
  if (!syntax) return std::nullopt;
  switch (chat::prompt_thinking(*syntax, prompt)) {
    case chat::PromptThinking::kClosed: return std::nullopt;
    case chat::PromptThinking::kMaybe: return grammar::ThinkingStart::kMaybe;
    case chat::PromptThinking::kOpen: return grammar::ThinkingStart::kOpen;
  }
  return std::nullopt;
}

// A thinking model's markers that are control tokens ([THINK]): the events must carry their
// text, and the grammar gate reads them as it.
std::vector<grammar::ThinkingSpec::ControlText> control_markers(const ModelInfo& model,
                                                                const chat::ReasoningSyntax& s) {
  std::vector<grammar::ThinkingSpec::ControlText> out;
  for (const std::string* text : {&s.markers.start, &s.markers.end, &s.markers.content_open}) {
    if (text->empty()) continue;
    const int32_t id = model.tokenizer->token_id(*text);
    if (id >= 0 && model.tokenizer->is_special(id)) out.push_back({.id = id, .text = *text});
  }
  return out;
}

// The request reads the model's reasoning: the text is split for the response, and a grammar
// (response_format, forced tool calls) applies after the thinking block.
void read_reasoning(const ModelInfo& model, grammar::ThinkingStart start,
                    engine::GenerateRequest& r, ChatOutputOptions& o) {
  const chat::ReasoningSyntax& syntax = *model.chat->reasoning();
  o.reasoning = ChatOutputOptions::ReasoningParsing{.syntax = &syntax, .start = start};
  std::vector<grammar::ThinkingSpec::ControlText> controls = control_markers(model, syntax);
  for (const auto& c : controls) r.keep_special_ids.push_back(c.id);
  if (r.sampling.grammar) {
    r.sampling.grammar->thinking = grammar::ThinkingSpec{
        .markers = syntax.markers, .start = start, .control_texts = std::move(controls)};
  }
}

}  // namespace

// The body with the client's key order: tools and tool-call arguments reach the template as
// written (transformers renders them in that order too).
ojson ordered_body(const nlohmann::json& body, std::string_view raw_body) {
  if (!raw_body.empty()) {
    ojson o = ojson::parse(raw_body, nullptr, false);
    if (o.is_object()) return o;
  }
  return ojson(body);
}

// OpenAI's reasoning_effort ("low", "medium", "high"): the template variable of that name
// (gpt-oss's template writes "Reasoning: high" into its system message). Refused when the
// template does not read it, rather than ignored; chat_template_kwargs' value, when it sets one,
// must agree.
std::optional<ApiError> read_reasoning_effort(const nlohmann::json& body, const ModelInfo& model,
                                              ChatPromptExtras* extras) {
  auto it = body.find("reasoning_effort");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string() || (*it != "low" && *it != "medium" && *it != "high")) {
    return invalid_param("reasoning_effort",
                         "'reasoning_effort' must be \"low\", \"medium\" or \"high\"");
  }
  if (model.chat == nullptr || !model.chat->reads_variable("reasoning_effort")) {
    return invalid_param("reasoning_effort",
                         "'reasoning_effort' is not read by this model's chat template; arbor "
                         "refuses it rather than ignore it");
  }
  ojson& kwargs = extras->template_kwargs;
  if (!kwargs.is_object()) kwargs = ojson::object();
  auto set = kwargs.find("reasoning_effort");
  const std::string effort = it->get<std::string>();
  if (set != kwargs.end() && !(set->is_string() && set->get<std::string>() == effort)) {
    return invalid_param("reasoning_effort", "'reasoning_effort' differs from "
                                             "chat_template_kwargs.reasoning_effort");
  }
  kwargs["reasoning_effort"] = effort;
  return std::nullopt;
}

// vLLM's chat_template_kwargs: more template variables (e.g. {"enable_thinking": false}).
std::optional<ApiError> read_template_kwargs(const ojson& body, ojson* out) {
  auto it = body.find("chat_template_kwargs");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) {
    return invalid_param("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  }
  for (const char* key : {"messages", "tools", "add_generation_prompt"}) {
    if (it->contains(key)) {
      return invalid_param("chat_template_kwargs",
                           str_cat("'chat_template_kwargs' may not set '", key,
                                   "'; use the request field"));
    }
  }
  *out = *it;
  return std::nullopt;
}

std::optional<ApiError> render_chat_prompt(const ModelInfo& model, const ojson& messages,
                                           const ChatPromptExtras& extras, std::string_view param,
                                           ChatPrompt* out) {
  if (model.chat == nullptr) {
    return invalid_param(param, "the model has no chat template; start the server with "
                                "--chat-template NAME");
  }
  Result<std::string> prompt = model.chat->render(messages, extras);
  if (!prompt.ok()) return error_from_status(prompt.status(), param);
  tokenizer::EncodeOptions enc;
  enc.add_bos = false;  // the template writes BOS itself (as vLLM: no special tokens added)
  enc.parse_special = true;
  if (!model.allow_special_in_content) {
    ARBOR_API_TRY(literal_content_ranges(messages, extras, model, param, *prompt,
                                         &enc.literal_ranges));
  }
  out->token_ids = model.tokenizer->encode(*prompt, enc);
  if (out->token_ids.empty()) return invalid_param(param, "the rendered chat prompt is empty");
  out->text = std::move(prompt).value();
  return std::nullopt;
}

namespace {

// A model whose template writes gpt-oss's harmony messages (its channels or its calls).
bool is_harmony(const ModelInfo& model) {
  const std::optional<chat::ReasoningSyntax>& syntax = model.chat->reasoning();
  return (syntax && syntax->name == "harmony") ||
         model.chat->tool_support().format == chat::ToolCallFormat::kHarmony;
}

// The grammar gate's view of harmony (grammar/thinking.h): the analysis message is the thinking
// block, read freely; after its <|end|> the gate skips `content_open` (the next message's
// header) and the grammar applies to what follows. The output begins after the prompt's
// "<|start|>assistant"; a model that skips the analysis message is held to writing one, since
// only a prefix of START or content the grammar accepts may begin the output. Harmony's markers
// are control tokens in gpt-oss's vocabulary: the gate reads them as their text.
grammar::ThinkingSpec harmony_thinking(const ModelInfo& model, std::string content_open) {
  grammar::ThinkingSpec spec;
  spec.markers = {.start = "<|channel|>analysis<|message|>",
                  .end = "<|end|>",
                  .content_open = std::move(content_open)};
  spec.start = grammar::ThinkingStart::kMaybe;
  for (std::string_view marker : chat::kHarmonyMarkers) {
    const int32_t id = model.tokenizer->token_id(marker);
    if (id >= 0 && model.tokenizer->is_special(id)) {
      spec.control_texts.push_back({.id = id, .text = std::string(marker)});
    }
  }
  return spec;
}

// Harmony output is read whole (chat/harmony.h): its markers' text is kept in the output, the
// analysis channel is reasoning (unless --reasoning-format none), the calls are read when the
// request has tools. A grammar applies after the analysis message: structured output to the
// body of a final message, forced calls (tool_call_grammar's harmony form) to a commentary
// message addressed to one of the functions.
std::optional<ApiError> read_harmony(const ModelInfo& model, const ToolRequest& tools,
                                     engine::GenerateRequest* r, ChatOutputOptions* out) {
  if (tools.forces_calls()) {
    ARBOR_API_TRY(force_tool_calls(tools, model, &r->sampling));
    r->sampling.grammar->thinking = harmony_thinking(model, "<|start|>assistant");
  } else if (r->sampling.grammar) {
    r->sampling.grammar->thinking =
        harmony_thinking(model, "<|start|>assistant<|channel|>final<|message|>");
  }
  ChatOutputOptions::HarmonyParsing h;
  const std::optional<chat::ReasoningSyntax>& syntax = model.chat->reasoning();
  h.reasoning = syntax && syntax->name == "harmony";
  if (tools.parses_calls()) h.names = tools.names;
  h.single = !tools.parallel;
  out->harmony = std::move(h);
  for (std::string_view marker : chat::kHarmonyMarkers) {
    const int32_t id = model.tokenizer->token_id(marker);
    if (id >= 0 && model.tokenizer->is_special(id)) r->keep_special_ids.push_back(id);
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> constrain_chat_output(const ModelInfo& model, const ToolRequest& tools,
                                              const std::string& prompt,
                                              engine::GenerateRequest* r, ChatOutputOptions* out) {
  if (is_harmony(model)) return read_harmony(model, tools, r, out);
  if (tools.forces_calls()) ARBOR_API_TRY(force_tool_calls(tools, model, &r->sampling));
  if (const auto start = thinking_start(model, prompt)) read_reasoning(model, *start, *r, *out);
  if (tools.parses_calls()) {
    out->tools.emplace();
    out->tools->format = model.chat->tool_support().format;
    out->tools->names = tools.names;
    if (out->tools->format == chat::ToolCallFormat::kQwen3Coder) {
      out->tools->types = chat::tool_param_types(tools.tools);
    }
    out->tools->single = !tools.parallel;
  }
  return std::nullopt;
}

}  // namespace arbor::server
