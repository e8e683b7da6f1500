#include "server/tgi_api.h"
#include "server/prompt_logprobs_api.h"
#include "server/structured_output_api.h"

#include <algorithm>

namespace arbor::server {

using nlohmann::json;

namespace {

constexpr size_t kMaxStopSequences = 16;

class TgiBuilder : public ResponseBuilder {
 public:
  // prompt_ids: non-empty for decoder_input_details (details.prefill lists them).
  TgiBuilder(const ModelInfo& model, bool stream, bool details, std::string prefix,
             std::vector<int32_t> prompt_ids)
      : tok_(*model.tokenizer), stream_(stream), details_(details), prefix_(std::move(prefix)),
        prompt_ids_(std::move(prompt_ids)) {}

  bool streaming() const override { return stream_; }
  ApiFlavor flavor() const override { return ApiFlavor::kTgi; }

  std::string on_event(const engine::StreamEvent& ev) override {
    if (ev.index != 0) return "";
    if (ev.prompt_logprobs != nullptr) prompt_logprobs_ = ev.prompt_logprobs;
    std::string out;
    for (size_t i = 0; i < ev.token_ids.size(); ++i) {
      const bool last = i + 1 == ev.token_ids.size();
      const std::string text = last ? ev.text : "";
      json tok = token_json(ev.token_ids[i], i < ev.logprobs.size() ? ev.logprobs[i].logprob : 0.0,
                            text);
      text_ += text;
      tokens_.push_back(tok);
      if (!stream_) continue;
      json e{{"index", tokens_.size() - 1}, {"token", tok}, {"generated_text", nullptr},
             {"details", nullptr}};
      if (last && ev.stop_reason) {
        e["generated_text"] = prefix_ + text_;
        e["details"] = {{"finish_reason", finish_reason(ev.stop_reason)},
                        {"generated_tokens", tokens_.size()},
                        {"seed", nullptr}};
      }
      out += sse_data(e);
    }
    if (ev.token_ids.empty()) text_ += ev.text;
    if (ev.stop_reason) finish_ = ev.stop_reason;
    return out;
  }

  std::string on_final(const engine::StreamEvent& ev) override {
    if (stream_) return "";
    json j{{"generated_text", prefix_ + text_}};
    if (details_) {
      j["details"] = {{"finish_reason", finish_reason(finish_)},
                      {"generated_tokens", tokens_.size()},
                      {"seed", nullptr},
                      {"prefill", prompt_logprobs_ == nullptr
                                      ? json::array()
                                      : tgi_prefill_json(prompt_ids_, *prompt_logprobs_, tok_)},
                      {"tokens", tokens_}};
      if (ev.usage.draft_tokens > 0) j["details"]["speculation"] = speculation_usage_json(ev.usage);
    }
    return dump_json(j);
  }

  std::string on_stream_error(const ApiError& error) override {
    return str_cat("data: ", error_body(error, ApiFlavor::kTgi), "\n\n");
  }

 private:
  json token_json(int32_t id, double logprob, const std::string& text) const {
    return {{"id", id}, {"text", text}, {"logprob", logprob}, {"special", tok_.is_special(id)}};
  }

  // TGI's names for the engine's StopReason.
  static std::string finish_reason(const std::optional<sched::StopReason>& r) {
    if (!r) return "length";
    switch (r->kind) {
      case sched::StopKind::kEos: return "eos_token";
      case sched::StopKind::kStopToken:
      case sched::StopKind::kStopString: return "stop_sequence";
      case sched::StopKind::kMaxTokens:
      case sched::StopKind::kMaxModelLen: return "length";
      case sched::StopKind::kAbort: return "abort";
    }
    return "length";
  }

  const tokenizer::Tokenizer& tok_;
  bool stream_;
  bool details_;
  std::string prefix_;  // return_full_text: the input
  std::string text_;
  json tokens_ = json::array();
  std::optional<sched::StopReason> finish_;
  std::vector<int32_t> prompt_ids_;
  std::shared_ptr<const engine::PromptLogprobs> prompt_logprobs_;
};

std::optional<ApiError> read_tgi_sampling(const json& p, const ModelInfo& m,
                                          engine::GenerateRequest* r) {
  sampling::SamplingParams& s = r->sampling;
  bool do_sample = false;
  ARBOR_API_TRY(read_bool(p, "do_sample", &do_sample));
  s.temperature = do_sample ? 1.0f : 0.0f;
  const bool has_temp = p.contains("temperature") && !p["temperature"].is_null();
  ARBOR_API_TRY(read_float(p, "temperature", 0.0, sampling::kMaxTemperature, true, &s.temperature));
  ARBOR_API_TRY(read_int32(p, "top_k", 1, m.vocab_size, &s.top_k));
  ARBOR_API_TRY(read_float(p, "top_p", 0.0, 1.0, true, &s.top_p));
  if (!do_sample && !has_temp && (s.top_k > 0 || s.top_p < 1.0f)) s.temperature = 1.0f;
  ARBOR_API_TRY(read_float(p, "repetition_penalty", 0.0, sampling::kMaxRepetitionPenalty, true,
                           &s.repetition_penalty));
  ARBOR_API_TRY(read_float(p, "frequency_penalty", -sampling::kMaxAbsPenalty,
                           sampling::kMaxAbsPenalty, false, &s.frequency_penalty));
  if (p.contains("seed") && !p["seed"].is_null()) {
    int64_t seed = 0;
    ARBOR_API_TRY(read_int(p, "seed", 0, INT64_MAX, &seed));
    s.seed = static_cast<uint64_t>(seed);
  }
  // Every other parameter is refused by name, never ignored (request_fields.h's rule).
  static constexpr std::string_view kRead[] = {
      "do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "frequency_penalty",
      "seed", "grammar", "decoder_input_details", "truncate", "max_new_tokens", "speculation",
      "best_of", "stop", "ignore_eos", "details", "return_full_text"};
  for (const auto& [key, value] : p.items()) {
    if (value.is_null() || std::find(std::begin(kRead), std::end(kRead), key) != std::end(kRead)) {
      continue;
    }
    const bool known = key == "typical_p" || key == "top_n_tokens" || key == "adapter_id" ||
                       key == "watermark";
    if (known && !(key == "watermark" && value == false)) {
      return invalid_param(key, str_cat("'", key, "' is not supported"));
    }
    if (!known) return invalid_param(key, str_cat("unknown parameter '", key, "'"));
  }
  for (const char* unsupported : {"typical_p", "top_n_tokens", "adapter_id"}) {
    if (p.contains(unsupported) && !p[unsupported].is_null()) {
      return invalid_param(unsupported, str_cat("'", unsupported, "' is not supported"));
    }
  }
  s.logprobs = 0;  // every token reports its logprob
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> prepare_tgi(const json& body, const ModelInfo& model, bool stream,
                                    PreparedRequest* out) {
  auto in = body.find("inputs");
  if (in == body.end() || !in->is_string()) {
    return invalid_param("inputs", "'inputs' is required and must be a string");
  }
  const std::string inputs = in->get<std::string>();
  if (inputs.empty()) return invalid_param("inputs", "'inputs' is empty");
  json p = json::object();
  if (body.contains("parameters") && !body["parameters"].is_null()) {
    p = body["parameters"];
    if (!p.is_object()) return invalid_param("parameters", "'parameters' must be an object");
  }
  engine::GenerateRequest& r = out->request;
  r.prompt_token_ids = model.tokenizer->encode(inputs);
  int32_t truncate = 0;
  ARBOR_API_TRY(read_int32(p, "truncate", 1, model.context_length, &truncate));
  if (truncate > 0 && static_cast<int32_t>(r.prompt_token_ids.size()) > truncate) {
    r.prompt_token_ids.erase(r.prompt_token_ids.begin(), r.prompt_token_ids.end() - truncate);
  }
  r.max_tokens = 20;
  const bool explicit_max = p.contains("max_new_tokens") && !p["max_new_tokens"].is_null();
  ARBOR_API_TRY(read_int32(p, "max_new_tokens", 1, model.context_length, &r.max_tokens));
  ARBOR_API_TRY(check_lengths(model, r.prompt_token_ids.size(), explicit_max, "max_new_tokens",
                              &r.max_tokens));
  ARBOR_API_TRY(read_tgi_sampling(p, model, &r));
  ARBOR_API_TRY(read_tgi_grammar(p, out->raw_body, &r.sampling.grammar));
  ARBOR_API_TRY(read_speculation(p, model, &r.speculation));
  ARBOR_API_TRY(read_int32(p, "best_of", 1, model.max_n, &r.best_of));
  if (r.best_of > 1 && stream) {
    return invalid_param("best_of", "'best_of' > 1 is not supported with streaming");
  }
  ARBOR_API_TRY(read_stop(p, "stop", kMaxStopSequences, &r.stop));
  // The engine's stop rules (engine/stop_rules.h) end the sample at EOS and BOS; ignore_eos (an
  // arbor extension, as in the OpenAI routes) turns both off.
  ARBOR_API_TRY(read_bool(p, "ignore_eos", &r.ignore_eos));
  bool details = false;
  bool full_text = false;
  ARBOR_API_TRY(read_bool(p, "details", &details));
  ARBOR_API_TRY(read_bool(p, "return_full_text", &full_text));
  // decoder_input_details: the prompt's logprobs in details.prefill (non-streaming, as TGI).
  bool prefill_details = false;
  ARBOR_API_TRY(read_bool(p, "decoder_input_details", &prefill_details));
  if (prefill_details && stream) {
    return invalid_param("decoder_input_details",
                         "'decoder_input_details' is not supported when streaming tokens");
  }
  std::vector<int32_t> prompt_ids;
  if (prefill_details && details) {
    r.sampling.prompt_logprobs = 0;
    prompt_ids = r.prompt_token_ids;
  }
  const Status valid = r.sampling.validate(model.vocab_size);
  if (!valid.ok()) return error_from_status(valid);
  out->builder = std::make_unique<TgiBuilder>(model, stream, details, full_text ? inputs : "",
                                              std::move(prompt_ids));
  return std::nullopt;
}

std::string tgi_info_json(const ModelInfo& model, int32_t max_concurrent_requests) {
  json j{{"model_id", model.name},
         {"model_sha", nullptr},
         // The Hugging Face pipeline of the task (TEI answers the latter two).
         {"model_pipeline_tag", model.task == ServeTask::kEmbed    ? "feature-extraction"
                                : model.task == ServeTask::kRerank ? "text-classification"
                                                                   : "text-generation"},
         {"model_device_type", "cpu"},
         {"max_concurrent_requests", max_concurrent_requests},
         {"max_best_of", model.max_n},
         {"max_stop_sequences", kMaxStopSequences},
         {"max_input_tokens", model.context_length - 1},
         {"max_total_tokens", model.context_length},
         {"validation_workers", 1},
         {"router", "arbor"},
         {"version", "0.1.0"}};
  return dump_json(j);
}

}  // namespace arbor::server
