#include "server/openai_api.h"
#include "server/chat_prompt.h"
#include "server/prompt_logprobs_api.h"
#include "server/request_fields.h"
#include "server/structured_output_api.h"
#include "server/tool_calling_api.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <set>

#include "base/log.h"

namespace arbor::server {

using nlohmann::json;

namespace {

// n/best_of, stop, min_tokens and ignore_eos besides the shared sampling and scheduling
// fields: what both endpoints read.
std::optional<ApiError> read_common(const json& b, const ModelInfo& m, engine::GenerateRequest* r) {
  sampling::SamplingParams& s = r->sampling;
  ARBOR_API_TRY(read_sampling(b, m, &s));
  ARBOR_API_TRY(read_int32(b, "n", 1, m.max_n, &r->n));
  ARBOR_API_TRY(read_int32(b, "best_of", 1, m.max_n, &r->best_of));
  if (r->best_of != 0 && r->best_of < r->n) {
    return invalid_param("best_of", str_cat("'best_of' is ", r->best_of, ", must be >= n (",
                                            r->n, ")"));
  }
  if (r->max_tokens == 0 && (r->n > 1 || r->best_of > 1)) {
    return invalid_param("max_tokens", str_cat("'max_tokens' is 0 with n = ", r->n, " and best_of = ",
                                               r->best_of, ": a request that generates nothing "
                                               "has one choice"));
  }
  ARBOR_API_TRY(read_scheduling(b, m, r));
  ARBOR_API_TRY(read_stop(b, "stop", kMaxStopStrings, &r->stop));
  // vLLM's min_tokens: EOS and stop ids are held back until this many tokens are generated.
  // read_max_tokens() has run: r->max_tokens is final.
  ARBOR_API_TRY(read_int32(b, "min_tokens", 0, m.context_length, &s.min_tokens));
  if (s.min_tokens > r->max_tokens) {
    return invalid_param("min_tokens", str_cat("'min_tokens' is ", s.min_tokens,
                                               ", more than max_tokens (", r->max_tokens, ")"));
  }
  // The engine's stop rules (engine/stop_rules.h) end the sample at EOS and BOS; ignore_eos
  // turns both off.
  ARBOR_API_TRY(read_bool(b, "ignore_eos", &r->ignore_eos));
  return std::nullopt;
}

// max_tokens (or max_completion_tokens), then the context-length check.
std::optional<ApiError> read_max_tokens(const json& b, const ModelInfo& m, size_t num_prompt,
                                        engine::GenerateRequest* r) {
  const char* name = "max_tokens";
  if (b.contains("max_completion_tokens") && !b["max_completion_tokens"].is_null()) {
    name = "max_completion_tokens";
  }
  const bool explicit_max = b.contains(name) && !b[name].is_null();
  r->max_tokens = 16;
  // 0: score the prompt only (echo, prompt_logprobs), as lm-evaluation-harness asks.
  ARBOR_API_TRY(read_int32(b, name, 0, m.context_length, &r->max_tokens));
  return check_lengths(m, num_prompt, explicit_max, name, &r->max_tokens);
}

std::optional<ApiError> read_stream(const json& b, bool* stream, bool* include_usage) {
  ARBOR_API_TRY(read_bool(b, "stream", stream));
  auto it = b.find("stream_options");
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return invalid_param("stream_options", "'stream_options' must be an object");
  if (!*stream) {
    return invalid_param("stream_options", "'stream_options' is only allowed when 'stream' is true");
  }
  return read_bool(*it, "include_usage", include_usage);
}

constexpr size_t kMaxBatchPrompts = 64;

std::optional<ApiError> read_one_prompt(const json& p, const ModelInfo& m,
                                        std::vector<int32_t>* ids) {
  if (p.is_string()) {
    const std::string text = p.get<std::string>();
    if (text.empty()) return invalid_param("prompt", "'prompt' is empty");
    *ids = m.tokenizer->encode(text);
    if (ids->empty()) return invalid_param("prompt", "'prompt' encodes to no tokens");
    return std::nullopt;
  }
  if (!p.is_array()) {
    return invalid_param("prompt", "'prompt' must be a string, a list of strings, a list of "
                                   "token ids or a list of such lists");
  }
  if (p.empty()) return invalid_param("prompt", "'prompt' is empty");
  return read_token_ids(p, "prompt", m, ids);
}

// A string, a list of token ids, or a batch: a list of strings or of token-id lists.
std::optional<ApiError> read_prompts(const json& b, const ModelInfo& m,
                                     std::vector<std::vector<int32_t>>* prompts) {
  auto it = b.find("prompt");
  if (it == b.end() || it->is_null()) return invalid_param("prompt", "'prompt' is required");
  const json& p = *it;
  const bool batch = p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array());
  if (!batch) {
    prompts->resize(1);
    return read_one_prompt(p, m, &(*prompts)[0]);
  }
  if (p.size() > kMaxBatchPrompts) {
    return invalid_param("prompt", str_cat("'prompt' has ", p.size(), " prompts, at most ",
                                           kMaxBatchPrompts, " are allowed"));
  }
  prompts->resize(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].is_string() && !p[i].is_array()) {
      return invalid_param("prompt", "a batch 'prompt' must hold only strings or only lists");
    }
    ARBOR_API_TRY(read_one_prompt(p[i], m, &(*prompts)[i]));
  }
  return std::nullopt;
}

std::optional<ApiError> truncate_prompt(const json& b, const ModelInfo& m, std::vector<int32_t>* ids) {
  int32_t keep = 0;
  ARBOR_API_TRY(read_int32(b, "truncate_prompt_tokens", 1, m.context_length, &keep));
  if (keep > 0 && static_cast<int32_t>(ids->size()) > keep) {
    ids->erase(ids->begin(), ids->end() - keep);
  }
  return std::nullopt;
}

}  // namespace

namespace {

struct BuilderOptions {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int32_t n = 1;
  int32_t num_prompts = 1;          // choices: num_prompts * n
  std::vector<std::string> echo;    // completions: per prompt, text put before its choices
  // Chat with tools (tool_choice other than none) or a thinking model: each choice's text is
  // read for reasoning_content and tool calls (chat_output.h).
  ChatOutputOptions output;
  // completions echo + logprobs: per prompt, its token ids (their logprobs lead the choice's)
  std::vector<std::vector<int32_t>> echo_ids;
  int32_t logprobs_n = 0;           // completions: alternatives per token
  std::optional<int32_t> prompt_logprobs;  // vLLM's prompt_logprobs: alternatives per position
  std::string model;
  const tokenizer::Tokenizer* tokenizer = nullptr;
};

// Builds completion and chat-completion bodies and chunks, for n choices.
class OpenAiBuilder : public ResponseBuilder {
 public:
  explicit OpenAiBuilder(BuilderOptions o)
      : o_(std::move(o)), id_(random_id(o_.chat ? "chatcmpl-" : "cmpl-")),
        created_(std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()),
        choices_(static_cast<size_t>(o_.n) * o_.num_prompts) {
    for (size_t i = 0; i < choices_.size(); ++i) {
      choices_[i].text = echo_of(i);
      choices_[i].echo_size = choices_[i].text.size();
    }
  }

  bool streaming() const override { return o_.stream; }
  ApiFlavor flavor() const override { return ApiFlavor::kOpenAi; }

  std::string on_event(const engine::StreamEvent& ev) override {
    if (ev.index < 0 || ev.index >= static_cast<int32_t>(choices_.size())) return "";
    Choice& c = choices_[static_cast<size_t>(ev.index)];
    if (ev.prompt_logprobs != nullptr) c.prompt_logprobs = ev.prompt_logprobs;
    if (!o_.stream) {
      c.text += ev.text;
      c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      c.finish = ev.finish_reason();
      return "";
    }
    std::string out;
    if (o_.chat && !c.started) {
      out += sse_data(chunk(ev.index, {{"role", "assistant"}, {"content", ""}}, nullptr,
                            nullptr));
    }
    if (o_.chat && o_.output.active()) {
      const bool first = !c.started;
      c.started = true;
      return out + split_event(ev, c, first);
    }
    std::string text = ev.text;
    const bool first = !c.started;
    if (!o_.chat && first) text = echo_of(ev.index) + text;
    c.started = true;
    if (text.empty() && ev.token_ids.empty() && !ev.finish_reason()) return out;
    // The echo's chunk leads with the prompt's logprobs.
    const json lp = o_.logprobs ? logprobs_json(c, ev.logprobs, first) : json(nullptr);
    const json reason = ev.finish_reason() ? json(finish_reason_string(ev.finish_reason())) : json();
    json delta = o_.chat ? json{{"content", text}} : json(text);
    if (o_.chat && text.empty() && ev.finish_reason()) delta = json::object();
    json j = chunk(ev.index, delta, lp, reason);
    if (first && o_.prompt_logprobs) add_prompt_logprobs(j, c);
    return out + sse_data(j);
  }

  std::string on_final(const engine::StreamEvent& ev) override {
    const json usage = usage_json(ev.usage);
    if (o_.stream) {
      std::string out;
      if (o_.include_usage) {
        json j = envelope();
        j["choices"] = json::array();
        j["usage"] = usage;
        out += sse_data(j);
      }
      return out + "data: [DONE]\n\n";
    }
    json j = envelope();
    j["choices"] = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      json choice{{"index", i}, {"finish_reason", finish_reason_string(c.finish)}};
      if (o_.chat && o_.output.active()) {
        ChatOutput read = read_chat_output(o_.output, c.text);
        chat::ParsedToolOutput parsed{.content = std::move(read.content),
                                      .calls = std::move(read.calls)};
        choice["message"] = tool_message(parsed);
        if (!read.reasoning.empty()) choice["message"]["reasoning_content"] = read.reasoning;
        choice["finish_reason"] = tool_finish_reason(c.finish, parsed.calls.size());
      } else if (o_.chat) {
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      } else {
        choice["text"] = c.text;
      }
      choice["logprobs"] = o_.logprobs ? logprobs_json(c, c.logprobs, true) : json(nullptr);
      j["choices"].push_back(std::move(choice));
    }
    if (o_.prompt_logprobs && !choices_.empty()) add_prompt_logprobs(j, choices_[0]);
    j["usage"] = usage;
    return dump_json(j);
  }

  std::string on_stream_error(const ApiError& error) override {
    return sse_data(json::parse(error_body(error, ApiFlavor::kOpenAi))) + "data: [DONE]\n\n";
  }

  void set_request_id(std::string_view request_id) override {
    id_ = str_cat(o_.chat ? "chatcmpl-" : "cmpl-", request_id);
  }
  std::string response_id() const override { return id_; }

 private:
  struct Choice {
    std::string text;
    std::unique_ptr<ChatOutputStreamer> reader;           // streamed chat with tools/reasoning
    int32_t num_calls = 0;                                // tool calls streamed
    std::vector<engine::TokenLogprobs> logprobs;
    std::optional<sched::FinishReason> finish;
    std::shared_ptr<const engine::PromptLogprobs> prompt_logprobs;
    bool started = false;
    size_t text_offset = 0;  // completions logprobs: offset of the next token's text
    size_t echo_size = 0;
  };

  json envelope() const {
    return {{"id", id_},
            {"object", o_.chat ? (o_.stream ? "chat.completion.chunk" : "chat.completion")
                               : "text_completion"},
            {"created", created_},
            {"model", o_.model}};
  }

  json chunk(int32_t index, json delta, json logprobs, json reason) const {
    json j = envelope();
    json choice{{"index", index}, {"logprobs", std::move(logprobs)},
                {"finish_reason", std::move(reason)}};
    choice[o_.chat ? "delta" : "text"] = std::move(delta);
    j["choices"] = json::array({std::move(choice)});
    return j;
  }

  static json usage_json(const engine::Usage& u) {
    json j{{"prompt_tokens", u.prompt_tokens},
           {"completion_tokens", u.completion_tokens},
           {"total_tokens", u.prompt_tokens + u.completion_tokens}};
    if (u.cached_tokens > 0) j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
    if (u.draft_tokens > 0) j["speculation"] = speculation_usage_json(u);
    return j;
  }

  // OpenAI's "tool_calls" when the model stopped after making calls.
  static std::string tool_finish_reason(const std::optional<sched::FinishReason>& finish,
                                        size_t num_calls) {
    if (num_calls > 0 && finish == sched::FinishReason::kStop) return "tool_calls";
    return finish_reason_string(finish);
  }

  static json tool_message(const chat::ParsedToolOutput& parsed) {
    json m{{"role", "assistant"}, {"content", parsed.content}};
    if (parsed.calls.empty()) return m;
    if (parsed.content.empty()) m["content"] = nullptr;
    m["tool_calls"] = json::array();
    for (const chat::ParsedToolCall& call : parsed.calls) {
      m["tool_calls"].push_back({{"id", random_id("call_")},
                                 {"type", "function"},
                                 {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    return m;
  }

  // A streamed event of a chat with reasoning or tools: the event's text split into reasoning
  // and content (chat::ReasoningSplitter), and the content's tool-call deltas from the parse of
  // the content so far (chat::ToolCallStreamer), so that the deltas add up to the non-streamed
  // message. `first`: the choice's first event, whose chunk carries vLLM's prompt_logprobs.
  std::string split_event(const engine::StreamEvent& ev, Choice& c, bool first) {
    const bool done = ev.finish_reason().has_value();
    if (!c.reader) c.reader = std::make_unique<ChatOutputStreamer>(o_.output);
    ChatOutputStreamer::Step step = c.reader->feed(ev.text, done);
    json delta = json::object();
    if (!step.reasoning.empty()) delta["reasoning_content"] = std::move(step.reasoning);
    if (!step.content.empty()) delta["content"] = std::move(step.content);
    add_tool_deltas(step.calls, c, delta);
    const bool has_logprobs = o_.logprobs && !ev.logprobs.empty();
    const bool with_prompt = first && o_.prompt_logprobs;
    if (delta.empty() && !has_logprobs && !done && !with_prompt) return "";
    const json lp = o_.logprobs ? logprobs_json(c, ev.logprobs, false) : json(nullptr);
    const json reason = done ? json(tool_finish_reason(ev.finish_reason(), c.num_calls)) : json();
    json j = chunk(ev.index, std::move(delta), lp, reason);
    if (with_prompt) add_prompt_logprobs(j, c);
    return sse_data(j);
  }

  void add_tool_deltas(const std::vector<chat::ToolCallDelta>& deltas, Choice& c, json& delta) {
    json calls = json::array();
    for (const chat::ToolCallDelta& d : deltas) {
      json e{{"index", d.index}};
      if (d.first) {
        ++c.num_calls;
        e["id"] = random_id("call_");
        e["type"] = "function";
        e["function"] = {{"name", d.name}, {"arguments", d.arguments}};
      } else {
        e["function"] = {{"arguments", d.arguments}};
      }
      calls.push_back(std::move(e));
    }
    if (!calls.empty()) delta["tool_calls"] = std::move(calls);
  }

  std::string echo_of(size_t choice) const {
    const size_t p = choice / static_cast<size_t>(o_.n);
    return p < o_.echo.size() ? o_.echo[p] : "";
  }

  std::string piece(int32_t id) const { return o_.tokenizer->token_to_piece(id); }

  // vLLM's prompt_logprobs: per completions choice (the choice's own prompt), top level for chat
  // (one prompt). `j` is a body or a chunk whose choices hold c's (the first for chat).
  void add_prompt_logprobs(json& j, const Choice& c) const {
    if (o_.chat) {
      j["prompt_logprobs"] = c.prompt_logprobs == nullptr
                                 ? json(nullptr)
                                 : vllm_prompt_logprobs_json(*c.prompt_logprobs, *o_.prompt_logprobs,
                                                             *o_.tokenizer);
      return;
    }
    for (json& choice : j["choices"]) {
      const Choice& ci = choices_[choice["index"].get<size_t>()];
      choice["prompt_logprobs"] =
          ci.prompt_logprobs == nullptr
              ? json(nullptr)
              : vllm_prompt_logprobs_json(*ci.prompt_logprobs, *o_.prompt_logprobs, *o_.tokenizer);
    }
  }

  // `with_prompt`: completions with echo begin with the prompt's tokens (the first chunk of a
  // stream, or the whole body).
  json logprobs_json(Choice& c, const std::vector<engine::TokenLogprobs>& lps,
                     bool with_prompt) const {
    if (o_.chat) {
      json content = json::array();
      for (const auto& t : lps) {
        json top = json::array();
        for (const auto& a : t.top) top.push_back(chat_token(a.token_id, a.logprob));
        json e = chat_token(t.token_id, t.logprob);
        e["top_logprobs"] = std::move(top);
        content.push_back(std::move(e));
      }
      return {{"content", std::move(content)}};
    }
    json j{{"tokens", json::array()}, {"token_logprobs", json::array()},
           {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    if (c.text_offset == 0) c.text_offset = c.echo_size;
    const size_t p = static_cast<size_t>(&c - choices_.data()) / static_cast<size_t>(o_.n);
    if (with_prompt && p < o_.echo_ids.size() && c.prompt_logprobs != nullptr) {
      append_echo_logprobs(j, o_.echo_ids[p], *c.prompt_logprobs, o_.logprobs_n, *o_.tokenizer,
                           o_.echo[p]);
    }
    for (const auto& t : lps) {
      j["tokens"].push_back(piece(t.token_id));
      j["token_logprobs"].push_back(t.logprob);
      json top = json::object();
      for (const auto& a : t.top) top[piece(a.token_id)] = a.logprob;
      // OpenAI always lists the chosen token too (unless a more likely one has its text).
      if (!top.contains(piece(t.token_id))) top[piece(t.token_id)] = t.logprob;
      j["top_logprobs"].push_back(std::move(top));
      j["text_offset"].push_back(c.text_offset);
      c.text_offset += piece(t.token_id).size();
    }
    return j;
  }

  json chat_token(int32_t id, float logprob) const {
    const std::string p = piece(id);
    std::vector<int> bytes;
    for (unsigned char ch : p) bytes.push_back(ch);
    return {{"token", p}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
  }

  BuilderOptions o_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
};

}  // namespace

std::optional<ApiError> prepare_completion(const json& body, const ModelInfo& model,
                                           PreparedRequest* out) {
  ARBOR_API_TRY(check_model(body, model));
  ARBOR_API_TRY(check_request_fields(body, RequestRoute::kCompletions));
  engine::GenerateRequest& r = out->request;
  std::vector<std::vector<int32_t>> prompts;
  ARBOR_API_TRY(read_prompts(body, model, &prompts));
  size_t longest = 0;
  for (auto& ids : prompts) {
    ARBOR_API_TRY(truncate_prompt(body, model, &ids));
    longest = std::max(longest, ids.size());
  }
  ARBOR_API_TRY(read_max_tokens(body, model, longest, &r));
  ARBOR_API_TRY(read_common(body, model, &r));
  ARBOR_API_TRY(read_structured_output(body, out->raw_body, &r.sampling.grammar));
  if (body.contains("suffix") && !body["suffix"].is_null()) {
    return invalid_param("suffix", "'suffix' is not supported");
  }
  BuilderOptions o;
  o.model = model.name;
  o.tokenizer = model.tokenizer;
  o.n = r.n;
  o.num_prompts = static_cast<int32_t>(prompts.size());
  int32_t logprobs = -1;
  ARBOR_API_TRY(read_int32(body, "logprobs", 0, sampling::kMaxLogprobs, &logprobs));
  if (logprobs >= 0) {
    r.sampling.logprobs = logprobs;
    o.logprobs = true;
  }
  bool echo = false;
  ARBOR_API_TRY(read_bool(body, "echo", &echo));
  ARBOR_API_TRY(read_prompt_logprobs(body, &o.prompt_logprobs));
  o.logprobs_n = std::max(logprobs, 0);
  // Echo with logprobs scores the prompt too: as many alternatives as either asks.
  std::optional<int32_t> scored = o.prompt_logprobs;
  if (echo && o.logprobs) {
    scored = std::max(scored.value_or(0), logprobs);
    o.echo_ids = prompts;
  }
  r.sampling.prompt_logprobs = scored;
  for (const auto& ids : prompts) o.echo.push_back(echo ? model.tokenizer->decode(ids) : "");
  ARBOR_API_TRY(read_stream(body, &o.stream, &o.include_usage));
  const Status valid = r.sampling.validate(model.vocab_size);
  if (!valid.ok()) return error_from_status(valid);
  r.prompt_token_ids = std::move(prompts[0]);
  out->more_prompts.assign(std::make_move_iterator(prompts.begin() + 1),
                           std::make_move_iterator(prompts.end()));
  out->builder = std::make_unique<OpenAiBuilder>(std::move(o));
  return std::nullopt;
}

namespace {

// An assistant message's tool_calls: [{"id"?, "type": "function", "function": {"name",
// "arguments"}}], arguments being JSON text as OpenAI sends them.
std::optional<ApiError> check_tool_calls(const json& m, const std::string& where) {
  auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null()) return std::nullopt;
  if (m["role"] != "assistant") {
    return invalid_param("messages", str_cat(where, ".tool_calls is only for assistant messages"));
  }
  if (!calls->is_array()) return invalid_param("messages", str_cat(where, ".tool_calls must be an array"));
  for (size_t j = 0; j < calls->size(); ++j) {
    const json& c = (*calls)[j];
    const bool ok = c.is_object() && c.contains("function") && c["function"].is_object() &&
                    c["function"].contains("name") && c["function"]["name"].is_string() &&
                    c["function"].contains("arguments") && c["function"]["arguments"].is_string();
    if (!ok) {
      return invalid_param("messages", str_cat(where, ".tool_calls[", j, "] must be {\"type\": "
                                               "\"function\", \"function\": {\"name\": string, "
                                               "\"arguments\": string}}"));
    }
  }
  return std::nullopt;
}

std::optional<ApiError> check_messages(const json& body) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return invalid_param("messages", "'messages' is required");
  if (!it->is_array()) return invalid_param("messages", "'messages' must be an array");
  if (it->empty()) return invalid_param("messages", "'messages' is empty");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = str_cat("messages[", i, "]");
    if (!m.is_object()) return invalid_param("messages", str_cat(where, " must be an object"));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return invalid_param("messages", str_cat(where, ".role must be a string"));
    }
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer") {
      return invalid_param("messages", str_cat(where, ".role '", r,
                                               "' is not system, developer, user, assistant or tool"));
    }
    auto content = m.find("content");
    const bool ok_content = content != m.end() && (content->is_string() || content->is_array() ||
                                                   (content->is_null() && r == "assistant"));
    if (!ok_content) {
      return invalid_param("messages", str_cat(where, ".content must be a string or an array of parts"));
    }
    ARBOR_API_TRY(check_tool_calls(m, where));
    auto reasoning = m.find("reasoning_content");
    if (reasoning != m.end() && !reasoning->is_null() &&
        (!reasoning->is_string() || r != "assistant")) {
      return invalid_param("messages", str_cat(where, ".reasoning_content must be a string, on an "
                                               "assistant message"));
    }
    if (r == "tool") {
      auto id = m.find("tool_call_id");
      if (id != m.end() && !id->is_null() && !id->is_string()) {
        return invalid_param("messages", str_cat(where, ".tool_call_id must be a string"));
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> prepare_chat(const json& body, const ModelInfo& model,
                                     PreparedRequest* out) {
  ARBOR_API_TRY(check_model(body, model));
  ARBOR_API_TRY(check_messages(body));
  ARBOR_API_TRY(check_request_fields(body, RequestRoute::kChat));
  const nlohmann::ordered_json ordered = ordered_body(body, out->raw_body);
  ToolRequest tools;
  ARBOR_API_TRY(read_tools(body, ordered, &tools));
  ChatPromptExtras extras;
  ARBOR_API_TRY(read_bool(body, "add_generation_prompt", &extras.add_generation_prompt));
  ARBOR_API_TRY(read_template_kwargs(ordered, &extras.template_kwargs));
  ARBOR_API_TRY(read_reasoning_effort(body, model, &extras));
  extras.tools = tools.tools;
  ChatPrompt prompt;
  ARBOR_API_TRY(render_chat_prompt(model, ordered["messages"], extras, "messages", &prompt));
  engine::GenerateRequest& r = out->request;
  r.prompt_token_ids = std::move(prompt.token_ids);
  ARBOR_API_TRY(truncate_prompt(body, model, &r.prompt_token_ids));
  ARBOR_API_TRY(read_max_tokens(body, model, r.prompt_token_ids.size(), &r));
  ARBOR_API_TRY(read_common(body, model, &r));
  ARBOR_API_TRY(read_structured_output(body, out->raw_body, &r.sampling.grammar));
  BuilderOptions o;
  o.chat = true;
  o.model = model.name;
  o.tokenizer = model.tokenizer;
  o.n = r.n;
  ARBOR_API_TRY(constrain_chat_output(model, tools, prompt.text, &r, &o.output));
  ARBOR_API_TRY(read_bool(body, "logprobs", &o.logprobs));
  int32_t top = 0;
  ARBOR_API_TRY(read_int32(body, "top_logprobs", 0, sampling::kMaxLogprobs, &top));
  if (top > 0 && !o.logprobs) {
    return invalid_param("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
  }
  if (o.logprobs) r.sampling.logprobs = top;
  ARBOR_API_TRY(read_prompt_logprobs(body, &o.prompt_logprobs));
  r.sampling.prompt_logprobs = o.prompt_logprobs;
  ARBOR_API_TRY(read_stream(body, &o.stream, &o.include_usage));
  const Status valid = r.sampling.validate(model.vocab_size);
  if (!valid.ok()) return error_from_status(valid);
  out->builder = std::make_unique<OpenAiBuilder>(std::move(o));
  return std::nullopt;
}

}  // namespace arbor::server
