#include "server/api_common.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>

#include "base/log.h"
#include "server/models_api.h"

namespace arbor::server {

using nlohmann::json;

namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::binary:
    case json::value_t::discarded: return "a value";
  }
  return "a value";
}

ApiError wrong_type(const char* name, const char* expected, const json& v) {
  return invalid_param(name, str_cat("'", name, "' must be ", expected, ", got ", type_name(v)));
}

const json* field(const json& o, const char* name) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

// nlohmann's parser and destructor recurse per nesting level, so a deep body ("[[[[...") would
// overflow the stack. Requests never need much depth: reject it before parsing.
constexpr int kMaxJsonDepth = 64;

int json_depth(std::string_view body) {
  int depth = 0;
  int max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > kMaxJsonDepth) break;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

std::optional<ApiError> parse_json_object(std::string_view body, json* out) {
  if (body.empty()) return malformed_body("the request body is empty; expected a JSON object");
  if (json_depth(body) > kMaxJsonDepth) {
    return malformed_body(str_cat("the request body nests deeper than ", kMaxJsonDepth, " levels"));
  }
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // nlohmann reports where parsing stopped ("at line 1, column 9: ...").
    return malformed_body(str_cat("the request body is not valid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return malformed_body(str_cat("the request body must be a JSON object, got ", type_name(j)));
  }
  *out = std::move(j);
  return std::nullopt;
}

bool present(const nlohmann::ordered_json& o, const char* key) {
  return o.contains(key) && !o[key].is_null();
}

std::optional<ApiError> require_string(const nlohmann::ordered_json& o, const char* key,
                                       std::string_view where) {
  if (o.contains(key) && o[key].is_string()) return std::nullopt;
  const std::string field = str_cat(where, ".", key);
  return invalid_param(field, str_cat("'", field, "' must be a string"));
}

std::optional<ApiError> read_bool(const json& o, const char* name, bool* out) {
  const json* v = field(o, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return wrong_type(name, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

json speculation_usage_json(const engine::Usage& u) {
  return {{"draft_tokens", u.draft_tokens},
          {"accepted_tokens", u.accepted_draft_tokens},
          {"acceptance_rate", u.draft_tokens > 0 ? static_cast<double>(u.accepted_draft_tokens) /
                                                       static_cast<double>(u.draft_tokens)
                                                 : 0.0}};
}

std::optional<ApiError> read_speculation(const json& o, const ModelInfo& m,
                                         sched::SpecRequest* out) {
  const json* v = field(o, "speculation");
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return wrong_type("speculation", "an object", *v);
  for (const auto& [key, value] : v->items()) {
    if (key != "mode" && key != "k" && key != "tree_nodes") {
      return invalid_param(str_cat("speculation.", key),
                           str_cat("'speculation.", key,
                                   "' is not a field of 'speculation' (fields: mode, k, tree_nodes)"));
    }
  }
  if (const json* mode = field(*v, "mode"); mode != nullptr) {
    const std::string name = mode->is_string() ? mode->get<std::string>() : "";
    if (name == "off") {
      out->mode = sched::SpecMode::kOff;
    } else if (name == "auto") {
      out->mode = sched::SpecMode::kAuto;
    } else if (name == "fixed") {
      out->mode = sched::SpecMode::kFixed;
    } else {
      return invalid_param("speculation.mode",
                           str_cat("'speculation.mode' is ", mode->dump(),
                                   ", must be \"off\", \"auto\" or \"fixed\""));
    }
  }
  if (const json* k = field(*v, "k"); k != nullptr) {
    if (!k->is_number_integer()) return wrong_type("speculation.k", "an integer", *k);
    const int64_t kv = k->get<int64_t>();
    const int64_t hi = std::max(m.max_spec_tokens, 1);
    if (kv < 1 || kv > hi) {
      return invalid_param("speculation.k", str_cat("'speculation.k' is ", kv, ", must be in [1, ",
                                                    hi, "] (the server's --spec-k)"));
    }
    out->k = static_cast<int32_t>(kv);
  }
  if (const json* t = field(*v, "tree_nodes"); t != nullptr) {
    if (!t->is_number_integer()) return wrong_type("speculation.tree_nodes", "an integer", *t);
    const int64_t tv = t->get<int64_t>();
    if (tv < 0 || tv > m.max_tree_nodes) {
      return invalid_param(
          "speculation.tree_nodes",
          m.max_tree_nodes == 0
              ? str_cat("'speculation.tree_nodes' is ", tv,
                        ", but this server speculates with chains only (start it with "
                        "--spec-tree-budget N for token trees)")
              : str_cat("'speculation.tree_nodes' is ", tv, ", must be in [0, ",
                        m.max_tree_nodes, "] (the server's --spec-tree-budget; 0 = a chain)"));
    }
    out->tree_nodes = static_cast<int32_t>(tv);
  }
  if (out->mode == sched::SpecMode::kFixed) {
    if (m.max_spec_tokens == 0) {
      return invalid_param("speculation.mode",
                           "'speculation.mode' is \"fixed\", but this server runs without "
                           "speculation (start it with --spec)");
    }
    if (out->k == 0) {
      return invalid_param("speculation.k", "'speculation.k' is required with mode \"fixed\"");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> read_int(const json& o, const char* name, int64_t lo, int64_t hi,
                                 int64_t* out) {
  const json* v = field(o, name);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return invalid_param(name, str_cat("'", name, "' is ", v->get<uint64_t>(),
                                       ", must be at most ", hi));
  }
  if (!v->is_number_integer()) return wrong_type(name, "an integer", *v);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) {
    return invalid_param(name, str_cat("'", name, "' is ", x, ", must be in [", lo, ", ", hi,
                                       "]"));
  }
  *out = x;
  return std::nullopt;
}

std::optional<ApiError> read_int32(const json& o, const char* name, int64_t lo, int64_t hi,
                                   int32_t* out) {
  int64_t x = *out;
  ARBOR_API_TRY(read_int(o, name, lo, hi, &x));
  *out = static_cast<int32_t>(x);
  return std::nullopt;
}

std::optional<ApiError> read_float(const json& o, const char* name, double lo, double hi,
                                   bool lo_open, float* out) {
  const json* v = field(o, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return wrong_type(name, "a number", *v);
  const double x = v->get<double>();
  const bool below = lo_open ? !(x > lo) : !(x >= lo);
  if (!std::isfinite(x) || below || x > hi) {
    return invalid_param(name, str_cat("'", name, "' is ", x, ", must be in ",
                                       lo_open ? "(" : "[", lo, ", ", hi, "]"));
  }
  *out = static_cast<float>(x);
  return std::nullopt;
}

std::optional<ApiError> read_string(const json& o, const char* name, std::string* out) {
  const json* v = field(o, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return wrong_type(name, "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> read_stop(const json& o, const char* name, size_t max,
                                  std::vector<std::string>* out) {
  const json* v = field(o, name);
  if (v == nullptr) return std::nullopt;
  std::vector<std::string> stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) return wrong_type(name, "a string or an array of strings", s);
      stops.push_back(s.get<std::string>());
    }
  } else {
    return wrong_type(name, "a string or an array of strings", *v);
  }
  if (stops.size() > max) {
    return invalid_param(name, str_cat("'", name, "' has ", stops.size(),
                                       " strings, at most ", max, " are allowed"));
  }
  for (const std::string& s : stops) {
    if (s.empty()) return invalid_param(name, str_cat("'", name, "' has an empty string"));
  }
  *out = std::move(stops);
  return std::nullopt;
}

std::optional<ApiError> check_model(const json& o, const ModelInfo& model) {
  const json* v = field(o, "model");
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return wrong_type("model", "a string", *v);
  const std::string name = v->get<std::string>();
  if (is_served_name(model, name) || name == model.path) return std::nullopt;
  if (!model.accept_any_model_name) return unknown_model(model, name);
  ARBOR_LOG(kDebug) << "unknown model '" << name << "' served as '" << model.name
                    << "' (--accept-any-model-name)";
  return std::nullopt;
}

std::optional<ApiError> check_lengths(const ModelInfo& model, size_t num_prompt_tokens,
                                      bool explicit_max, const char* max_name,
                                      int32_t* max_tokens) {
  const int64_t ctx = model.context_length;
  const int64_t len = static_cast<int64_t>(num_prompt_tokens);
  if (len >= ctx) {
    ApiError e = invalid_param("prompt", str_cat("the prompt has ", len,
                                                 " tokens, the maximum context length is ", ctx,
                                                 " (at least one token must be generated)"));
    e.code = "context_length_exceeded";
    return e;
  }
  if (!explicit_max) {
    *max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, ctx - len));
    return std::nullopt;
  }
  if (len + *max_tokens > ctx) {
    ApiError e = invalid_param(max_name, str_cat("the prompt has ", len, " tokens and '", max_name,
                                                 "' is ", *max_tokens, ": ", len + *max_tokens,
                                                 " exceeds the maximum context length of ", ctx));
    e.code = "context_length_exceeded";
    return e;
  }
  return std::nullopt;
}

std::optional<ApiError> read_token_ids(const json& array, const char* name,
                                       const ModelInfo& model, std::vector<int32_t>* out) {
  out->clear();
  for (const json& t : array) {
    if (!t.is_number_integer()) return wrong_type(name, "an array of token ids", t);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= model.vocab_size) {
      return invalid_param(name, str_cat("token id ", id, " in '", name, "' is outside [0, ",
                                         model.vocab_size, ")"));
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

namespace {

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

constexpr int64_t kMaxPriority = 1'000'000;

}  // namespace

std::optional<ApiError> read_sampling(const json& b, const ModelInfo& m,
                                      sampling::SamplingParams* out) {
  sampling::SamplingParams& s = *out;
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
  return std::nullopt;
}

std::optional<ApiError> read_scheduling(const json& b, const ModelInfo& m,
                                        engine::GenerateRequest* r) {
  ARBOR_API_TRY(read_speculation(b, m, &r->speculation));
  // vLLM's field: lower values are served (and kept from preemption) first. Without the
  // priority policy it would change nothing, so anything but 0 is refused, as vLLM does.
  ARBOR_API_TRY(read_int32(b, "priority", -kMaxPriority, kMaxPriority, &r->priority));
  if (r->priority != 0 && !m.priority_scheduling) {
    return invalid_param("priority", "'priority' needs a server started with "
                                     "--scheduling-policy priority (lower values go first)");
  }
  // The session a router keeps on one replica: OpenAI's `user`, Anthropic's metadata.user_id
  // (the X-Session-Id header, read by the server, takes precedence).
  if (b.contains("user") && b["user"].is_string()) {
    r->session = b["user"].get<std::string>();
  } else if (b.contains("metadata") && b["metadata"].is_object() &&
             b["metadata"].contains("user_id") && b["metadata"]["user_id"].is_string()) {
    r->session = b["metadata"]["user_id"].get<std::string>();
  }
  return std::nullopt;
}

std::string random_id(std::string_view prefix) {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(counter.fetch_add(1) * 0x9e3779b97f4a7c15ull));
  return str_cat(prefix, buf);
}

std::string finish_reason_string(const std::optional<sched::FinishReason>& reason) {
  if (!reason) return "";
  return std::string(sched::finish_reason_name(*reason));
}

std::string_view serve_task_name(ServeTask task) {
  switch (task) {
    case ServeTask::kGenerate: return "generate";
    case ServeTask::kEmbed: return "embed";
    case ServeTask::kRerank: return "rerank";
  }
  return "?";
}

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_data(const json& j) { return str_cat("data: ", dump_json(j), "\n\n"); }

}  // namespace arbor::server
