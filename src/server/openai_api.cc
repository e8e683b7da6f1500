#include "server/openai_api.h"
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

constexpr size_t kMaxStopStrings = 16;

std::string new_id(std::string_view prefix) {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(counter.fetch_add(1) * 0x9e3779b97f4a7c15ull));
  return str_cat(prefix, buf);
}

std::optional<ApiError> read_logit_bias(const json& b, const ModelInfo& m,
                                        sampling::SamplingParams* s) {
  auto it = b.find("logit_bias");
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) {
    return invalid_param("logit_bias", "'logit_bias' must be an object of token id -> bias");
  }
  for (const auto& [key, value] : it->items()) {
    char* end = nullptr;
    errno = 0;
    const long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id >= m.vocab_size) {
      return invalid_param("logit_bias", str_cat("'logit_bias' key '", key, "' is not a token id in [0, ",
                                                 m.vocab_size, ")"));
    }
    if (!value.is_number() || !(std::abs(value.get<double>()) <= sampling::kMaxAbsLogitBias)) {
      return invalid_param("logit_bias", str_cat("'logit_bias' value for token ", key,
                                                 " must be a number in [-",
                                                 sampling::kMaxAbsLogitBias, ", ",
                                                 sampling::kMaxAbsLogitBias, "]"));
    }
    s->logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
  return std::nullopt;
}

// Sampling, n/best_of, stop and ignore_eos: the fields both endpoints share.
constexpr int64_t kMaxPriority = 1'000'000;

std::optional<ApiError> read_common(const json& b, const ModelInfo& m, engine::GenerateRequest* r) {
  sampling::SamplingParams& s = r->sampling;
  ARBOR_API_TRY(read_float(b, "temperature", 0.0, sampling::kMaxTemperature, false, &s.temperature));
  ARBOR_API_TRY(read_float(b, "top_p", 0.0, 1.0, true, &s.top_p));
  ARBOR_API_TRY(read_int32(b, "top_k", -1, m.vocab_size, &s.top_k));
  ARBOR_API_TRY(read_float(b, "min_p", 0.0, 1.0, false, &s.min_p));
  ARBOR_API_TRY(read_float(b, "repetition_penalty", 0.0, sampling::kMaxRepetitionPenalty, true,
                           &s.repetition_penalty));
  ARBOR_API_TRY(read_float(b, "presence_penalty", -sampling::kMaxAbsPenalty,
                           sampling::kMaxAbsPenalty, false, &s.presence_penalty));
  ARBOR_API_TRY(read_float(b, "frequency_penalty", -sampling::kMaxAbsPenalty,
                           sampling::kMaxAbsPenalty, false, &s.frequency_penalty));
  if (b.contains("seed") && !b["seed"].is_null()) {
    int64_t seed = 0;
    ARBOR_API_TRY(read_int(b, "seed", std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max(), &seed));
    s.seed = static_cast<uint64_t>(seed);
  }
  ARBOR_API_TRY(read_logit_bias(b, m, &s));
  // TGI's do_sample, which @huggingface/inference's textGeneration sends here: false is greedy
  // unless temperature, top_p or top_k ask for sampling (TGI's rule); true is OpenAI's default.
  bool do_sample = true;
  ARBOR_API_TRY(read_bool(b, "do_sample", &do_sample));
  const auto given = [&](const char* f) { return b.contains(f) && !b[f].is_null(); };
  if (!do_sample && !given("temperature") && !given("top_p") && !given("top_k")) {
    s.temperature = 0.0f;
  }
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
  ARBOR_API_TRY(read_speculation(b, m, &r->speculation));
  // vLLM's field: lower values are served (and kept from preemption) first. Without the
  // priority policy it would change nothing, so anything but 0 is refused, as vLLM does.
  ARBOR_API_TRY(read_int32(b, "priority", -kMaxPriority, kMaxPriority, &r->priority));
  if (r->priority != 0 && !m.priority_scheduling) {
    return invalid_param("priority", "'priority' needs a server started with "
                                     "--scheduling-policy priority (lower values go first)");
  }
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
  // Chat with tools (tool_choice other than none): each choice's text is read for calls.
  struct ToolParsing {
    chat::ToolCallFormat format = chat::ToolCallFormat::kHermes;
    std::vector<std::string> names;
    bool single = false;  // parallel_tool_calls false: calls after the first are dropped
  };
  std::optional<ToolParsing> tools;
  // Chat with a thinking model: each choice's text is split into reasoning_content and content
  // (tool calls are read from the content only).
  struct ReasoningParsing {
    const chat::ReasoningSyntax* syntax = nullptr;  // the renderer's; outlives the request
    grammar::ThinkingStart start = grammar::ThinkingStart::kMaybe;
  };
  std::optional<ReasoningParsing> reasoning;
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
      : o_(std::move(o)), id_(new_id(o_.chat ? "chatcmpl-" : "cmpl-")),
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
    if (o_.chat && (o_.tools || o_.reasoning)) {
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
      if (o_.chat && (o_.tools || o_.reasoning)) {
        chat::SplitText split{.reasoning = "", .content = c.text};
        if (o_.reasoning) {
          split = chat::split_reasoning(*o_.reasoning->syntax, o_.reasoning->start, c.text);
        }
        chat::ParsedToolOutput parsed{.content = std::move(split.content), .calls = {}};
        if (o_.tools) {
          parsed = chat::parse_tool_calls(o_.tools->format, parsed.content, true, o_.tools->names);
          if (o_.tools->single && parsed.calls.size() > 1) parsed.calls.resize(1);
        }
        choice["message"] = tool_message(parsed);
        if (!split.reasoning.empty()) choice["message"]["reasoning_content"] = split.reasoning;
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
    std::optional<chat::ToolCallStreamer> tool_streamer;  // streamed chat with tools
    std::unique_ptr<chat::ReasoningSplitter> splitter;     // streamed chat with reasoning
    std::string content;  // streamed chat with tools: the content so far (after the reasoning)
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
      m["tool_calls"].push_back({{"id", new_id("call_")},
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
    chat::SplitText split{.reasoning = "", .content = ev.text};
    if (o_.reasoning) {
      if (!c.splitter) {
        c.splitter = std::make_unique<chat::ReasoningSplitter>(*o_.reasoning->syntax,
                                                               o_.reasoning->start);
      }
      split = c.splitter->feed(ev.text, done);
    }
    json delta = json::object();
    if (!split.reasoning.empty()) delta["reasoning_content"] = std::move(split.reasoning);
    if (o_.tools) {
      add_tool_deltas(split.content, done, c, delta);
    } else if (!split.content.empty()) {
      delta["content"] = std::move(split.content);
    }
    const bool has_logprobs = o_.logprobs && !ev.logprobs.empty();
    const bool with_prompt = first && o_.prompt_logprobs;
    if (delta.empty() && !has_logprobs && !done && !with_prompt) return "";
    const json lp = o_.logprobs ? logprobs_json(c, ev.logprobs, false) : json(nullptr);
    const json reason = done ? json(tool_finish_reason(ev.finish_reason(), c.num_calls)) : json();
    json j = chunk(ev.index, std::move(delta), lp, reason);
    if (with_prompt) add_prompt_logprobs(j, c);
    return sse_data(j);
  }

  void add_tool_deltas(std::string_view content, bool done, Choice& c, json& delta) {
    if (!c.tool_streamer) c.tool_streamer.emplace(o_.tools->format, o_.tools->names);
    c.content += content;
    const chat::ToolCallStreamer::Step step = c.tool_streamer->update(c.content, done);
    if (!step.content.empty()) delta["content"] = step.content;
    json calls = json::array();
    for (const chat::ToolCallDelta& d : step.calls) {
      if (o_.tools->single && d.index > 0) continue;
      json e{{"index", d.index}};
      if (d.first) {
        ++c.num_calls;
        e["id"] = new_id("call_");
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
  ARBOR_API_TRY(check_request_fields(body, OpenAiRoute::kCompletions));
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
std::optional<ApiError> literal_content_ranges(const ojson& body, const ChatPromptExtras& extras,
                                               const ModelInfo& model, const std::string& prompt,
                                               std::vector<std::pair<size_t, size_t>>* out) {
  ojson messages = body["messages"];
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
      "messages", "a message contains the text of a control token (such as '<|im_end|>'), which "
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

// The body with the client's key order: tools and tool-call arguments reach the template as
// written (transformers renders them in that order too).
ojson ordered_body(const json& body, std::string_view raw_body) {
  if (!raw_body.empty()) {
    ojson o = ojson::parse(raw_body, nullptr, false);
    if (o.is_object()) return o;
  }
  return ojson(body);
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

// tool_choice required or named: the grammar that makes the output calls.
std::optional<ApiError> force_tool_calls(const ToolRequest& tools, const ModelInfo& model,
                                         sampling::SamplingParams* s) {
  if (s->grammar) {
    return invalid_param("tool_choice", "'tool_choice' \"required\" or a named function "
                                        "cannot be combined with another output constraint "
                                        "(response_format, structured_outputs, guided_*, "
                                        "grammar, json_schema)");
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
                    engine::GenerateRequest& r, BuilderOptions& o) {
  const chat::ReasoningSyntax& syntax = *model.chat->reasoning();
  o.reasoning = BuilderOptions::ReasoningParsing{.syntax = &syntax, .start = start};
  std::vector<grammar::ThinkingSpec::ControlText> controls = control_markers(model, syntax);
  for (const auto& c : controls) r.keep_special_ids.push_back(c.id);
  if (r.sampling.grammar) {
    r.sampling.grammar->thinking = grammar::ThinkingSpec{
        .markers = syntax.markers, .start = start, .control_texts = std::move(controls)};
  }
}

}  // namespace

std::optional<ApiError> prepare_chat(const json& body, const ModelInfo& model,
                                     PreparedRequest* out) {
  ARBOR_API_TRY(check_model(body, model));
  ARBOR_API_TRY(check_messages(body));
  ARBOR_API_TRY(check_request_fields(body, OpenAiRoute::kChat));
  if (model.chat == nullptr) {
    return invalid_param("messages", "the model has no chat template; start the server with "
                                     "--chat-template NAME");
  }
  const ojson ordered = ordered_body(body, out->raw_body);
  ToolRequest tools;
  ARBOR_API_TRY(read_tools(body, ordered, &tools));
  ChatPromptExtras extras;
  ARBOR_API_TRY(read_bool(body, "add_generation_prompt", &extras.add_generation_prompt));
  ARBOR_API_TRY(read_template_kwargs(ordered, &extras.template_kwargs));
  extras.tools = tools.tools;
  Result<std::string> prompt = model.chat->render(ordered["messages"], extras);
  if (!prompt.ok()) return error_from_status(prompt.status(), "messages");
  engine::GenerateRequest& r = out->request;
  tokenizer::EncodeOptions enc;
  enc.add_bos = false;  // the template writes BOS itself (as vLLM: no special tokens added)
  enc.parse_special = true;
  if (!model.allow_special_in_content) {
    ARBOR_API_TRY(literal_content_ranges(ordered, extras, model, *prompt, &enc.literal_ranges));
  }
  r.prompt_token_ids = model.tokenizer->encode(*prompt, enc);
  if (r.prompt_token_ids.empty()) return invalid_param("messages", "the rendered chat prompt is empty");
  ARBOR_API_TRY(truncate_prompt(body, model, &r.prompt_token_ids));
  ARBOR_API_TRY(read_max_tokens(body, model, r.prompt_token_ids.size(), &r));
  ARBOR_API_TRY(read_common(body, model, &r));
  ARBOR_API_TRY(read_structured_output(body, out->raw_body, &r.sampling.grammar));
  if (tools.forces_calls()) ARBOR_API_TRY(force_tool_calls(tools, model, &r.sampling));
  BuilderOptions o;
  o.chat = true;
  o.model = model.name;
  o.tokenizer = model.tokenizer;
  o.n = r.n;
  if (const auto start = thinking_start(model, *prompt)) read_reasoning(model, *start, r, o);
  if (tools.parses_calls()) {
    o.tools.emplace();
    o.tools->format = model.chat->tool_support().format;
    o.tools->names = tools.names;
    o.tools->single = !tools.parallel;
  }
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
