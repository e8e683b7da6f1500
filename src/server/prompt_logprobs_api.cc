#include "server/prompt_logprobs_api.h"

#include <algorithm>
#include <string>

#include "sampling/sampling_params.h"
#include "server/api_common.h"

namespace arbor::server {

using nlohmann::json;

std::optional<ApiError> read_prompt_logprobs(const json& body, std::optional<int32_t>* out) {
  int32_t n = -1;
  ARBOR_API_TRY(read_int32(body, "prompt_logprobs", 0, sampling::kMaxLogprobs, &n));
  if (n >= 0) *out = n;
  return std::nullopt;
}

json vllm_prompt_logprobs_json(const engine::PromptLogprobs& entries, int32_t n,
                               const tokenizer::Tokenizer& tokenizer) {
  json list = json::array({nullptr});
  for (const sampling::PromptLogprob& e : entries) {
    json d = json::object();
    d[std::to_string(e.token_id)] = {{"logprob", e.logprob},
                                     {"rank", e.rank},
                                     {"decoded_token", tokenizer.token_to_piece(e.token_id)}};
    // As vLLM: the alternatives get ranks 1..n, and overwrite the prompt token's entry when it
    // is among them (the same values unless it ties with a more likely token).
    const size_t top = std::min(e.top.size(), static_cast<size_t>(std::max(n, 0)));
    for (size_t j = 0; j < top; ++j) {
      d[std::to_string(e.top[j].token_id)] = {
          {"logprob", e.top[j].logprob},
          {"rank", static_cast<int64_t>(j) + 1},
          {"decoded_token", tokenizer.token_to_piece(e.top[j].token_id)}};
    }
    list.push_back(std::move(d));
  }
  return list;
}

size_t append_echo_logprobs(json& logprobs, std::span<const int32_t> prompt_ids,
                            const engine::PromptLogprobs& entries, int32_t n,
                            const tokenizer::Tokenizer& tokenizer, std::string_view echo_text) {
  // Offsets into the echoed text: the pieces' running length, less what decoding drops in front
  // (BOS, a SentencePiece leading space) when the pieces end with the text; else clamped to it.
  std::string joined;
  for (int32_t id : prompt_ids) joined += tokenizer.token_to_piece(id);
  const bool suffix = joined.size() >= echo_text.size() &&
                      std::string_view(joined).substr(joined.size() - echo_text.size()) == echo_text;
  const size_t dropped = suffix ? joined.size() - echo_text.size() : 0;
  size_t at = 0;
  for (size_t p = 0; p < prompt_ids.size(); ++p) {
    const std::string& piece = tokenizer.token_to_piece(prompt_ids[p]);
    logprobs["tokens"].push_back(piece);
    logprobs["text_offset"].push_back(std::min(at > dropped ? at - dropped : 0, echo_text.size()));
    at += piece.size();
    if (p == 0 || p - 1 >= entries.size()) {
      logprobs["token_logprobs"].push_back(nullptr);
      logprobs["top_logprobs"].push_back(nullptr);
      continue;
    }
    const sampling::PromptLogprob& e = entries[p - 1];
    logprobs["token_logprobs"].push_back(e.logprob);
    json top = json::object();
    const size_t k = std::min(e.top.size(), static_cast<size_t>(std::max(n, 0)));
    for (size_t j = 0; j < k; ++j) top[tokenizer.token_to_piece(e.top[j].token_id)] = e.top[j].logprob;
    // OpenAI always lists the token itself (unless a more likely token has the same text).
    if (!top.contains(piece)) top[piece] = e.logprob;
    logprobs["top_logprobs"].push_back(std::move(top));
  }
  return echo_text.size();
}

json tgi_prefill_json(std::span<const int32_t> prompt_ids, const engine::PromptLogprobs& entries,
                      const tokenizer::Tokenizer& tokenizer) {
  json prefill = json::array();
  for (size_t p = 0; p < prompt_ids.size(); ++p) {
    json logprob = p == 0 || p - 1 >= entries.size() ? json(nullptr) : json(entries[p - 1].logprob);
    prefill.push_back({{"id", prompt_ids[p]},
                       {"text", tokenizer.token_to_piece(prompt_ids[p])},
                       {"logprob", std::move(logprob)}});
  }
  return prefill;
}

}  // namespace arbor::server
