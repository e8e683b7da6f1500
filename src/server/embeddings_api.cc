#include "server/embeddings_api.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

namespace arbor::server {

using nlohmann::json;

const char kQwen3RerankTemplate[] =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n";

namespace {

// Every field of `body` is read by the route or is metadata (`user`); otherwise a 400 naming it.
std::optional<ApiError> check_fields(const json& body, std::span<const std::string_view> read,
                                     std::string_view route) {
  for (const auto& [key, value] : body.items()) {
    if (value.is_null() || key == "user") continue;
    if (std::find(read.begin(), read.end(), key) != read.end()) continue;
    return invalid_param(key, str_cat("unknown field '", key, "' for ", route,
                                      "; arbor refuses fields it does not read rather than "
                                      "ignore them (docs/server.md, \"Fields\")"));
  }
  return std::nullopt;
}

std::optional<ApiError> check_count(const ModelInfo& m, size_t n, const char* what,
                                    const char* param) {
  if (n <= static_cast<size_t>(m.max_pooling_inputs)) return std::nullopt;
  return invalid_param(param, str_cat("'", param, "' has ", n, " ", what, ", at most ",
                                      m.max_pooling_inputs,
                                      " are allowed per request (min(2048, --max-waiting-requests))"));
}

// One input's length against the context limit (the whole input is one sequence).
std::optional<ApiError> check_length(const ModelInfo& m, size_t num_tokens,
                                     const std::string& name, const char* param) {
  if (num_tokens <= static_cast<size_t>(m.context_length)) return std::nullopt;
  ApiError e = invalid_param(param, str_cat(name, " has ", num_tokens, " tokens, the maximum is ",
                                            m.context_length, " (max_model_len)"));
  e.code = "context_length_exceeded";
  return e;
}

// One element of `input`: a non-empty string (tokenised as llama.cpp does: the vocabulary's
// BOS/EOS, control tokens parsed) or a non-empty list of token ids.
std::optional<ApiError> read_input(const json& v, const ModelInfo& m, const std::string& name,
                                   std::vector<int32_t>* ids) {
  if (v.is_string()) {
    const std::string text = v.get<std::string>();
    if (text.empty()) return invalid_param("input", str_cat(name, " is an empty string"));
    tokenizer::EncodeOptions enc;
    enc.parse_special = true;
    *ids = m.tokenizer->encode(text, enc);
    if (ids->empty()) return invalid_param("input", str_cat(name, " encodes to no tokens"));
  } else {
    if (v.empty()) return invalid_param("input", str_cat(name, " is an empty list"));
    ARBOR_API_TRY(read_token_ids(v, "input", m, ids));
  }
  return check_length(m, ids->size(), name, "input");
}

// `input`: a string, a list of token ids, or a list of strings or of token-id lists.
std::optional<ApiError> read_inputs(const json& b, const ModelInfo& m,
                                    std::vector<std::vector<int32_t>>* inputs) {
  auto it = b.find("input");
  if (it == b.end() || it->is_null()) return invalid_param("input", "'input' is required");
  const json& in = *it;
  const char* shape = "'input' must be a string, a list of strings, a list of token ids or a "
                      "list of token-id lists";
  if (in.is_string()) {
    inputs->resize(1);
    return read_input(in, m, "'input'", &(*inputs)[0]);
  }
  if (!in.is_array()) return invalid_param("input", shape);
  if (in.empty()) return invalid_param("input", "'input' is an empty list");
  if (in[0].is_number()) {
    inputs->resize(1);
    return read_input(in, m, "'input'", &(*inputs)[0]);
  }
  ARBOR_API_TRY(check_count(m, in.size(), "inputs", "input"));
  const bool strings = in[0].is_string();
  inputs->resize(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (strings ? !in[i].is_string() : !in[i].is_array()) {
      return invalid_param("input", str_cat(shape, "; 'input[", i, "]' is not like 'input[0]'"));
    }
    ARBOR_API_TRY(read_input(in[i], m, str_cat("'input[", i, "]'"), &(*inputs)[i]));
  }
  return std::nullopt;
}

class EmbeddingsBuilder : public ResponseBuilder {
 public:
  EmbeddingsBuilder(std::string model, size_t n, bool base64, int32_t dimensions)
      : model_(std::move(model)), vectors_(n), base64_(base64), dimensions_(dimensions) {}
  bool streaming() const override { return false; }
  ApiFlavor flavor() const override { return ApiFlavor::kOpenAi; }
  std::string on_event(const engine::StreamEvent& ev) override {
    if (ev.index >= 0 && static_cast<size_t>(ev.index) < vectors_.size() && !ev.pooled.empty()) {
      vectors_[static_cast<size_t>(ev.index)] = normalised_embedding(ev.pooled, dimensions_);
    }
    return "";
  }
  std::string on_final(const engine::StreamEvent& ev) override {
    json data = json::array();
    for (size_t i = 0; i < vectors_.size(); ++i) {
      json e{{"object", "embedding"}, {"index", i}};
      if (base64_) {
        e["embedding"] = base64_floats(vectors_[i]);
      } else {
        e["embedding"] = vectors_[i];
      }
      data.push_back(std::move(e));
    }
    return dump_json(json{{"object", "list"},
                          {"data", std::move(data)},
                          {"model", model_},
                          {"usage", {{"prompt_tokens", ev.usage.prompt_tokens},
                                     {"total_tokens", ev.usage.prompt_tokens}}}});
  }
  std::string on_stream_error(const ApiError& error) override { return ""; }

 private:
  std::string model_;
  std::vector<std::vector<float>> vectors_;  // [inputs]
  bool base64_;
  int32_t dimensions_;
};

class RerankBuilder : public ResponseBuilder {
 public:
  RerankBuilder(std::string model, std::vector<std::string> documents, int32_t top_n,
                bool return_documents)
      : model_(std::move(model)),
        documents_(std::move(documents)),
        scores_(documents_.size(), 0.0f),
        top_n_(top_n),
        return_documents_(return_documents) {}
  bool streaming() const override { return false; }
  ApiFlavor flavor() const override { return ApiFlavor::kOpenAi; }
  void set_request_id(std::string_view request_id) override { id_ = str_cat("rerank-", request_id); }
  std::string response_id() const override { return id_; }
  std::string on_event(const engine::StreamEvent& ev) override {
    if (ev.index >= 0 && static_cast<size_t>(ev.index) < scores_.size() && !ev.pooled.empty()) {
      scores_[static_cast<size_t>(ev.index)] = ev.pooled[0];
    }
    return "";
  }
  std::string on_final(const engine::StreamEvent& ev) override {
    std::vector<size_t> order(scores_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return scores_[a] > scores_[b]; });
    order.resize(std::min(order.size(), static_cast<size_t>(top_n_)));
    json results = json::array();
    for (size_t i : order) {
      json r{{"index", i}, {"relevance_score", scores_[i]}};
      if (return_documents_) r["document"] = {{"text", documents_[i]}};
      results.push_back(std::move(r));
    }
    return dump_json(json{{"id", id_},
                          {"object", "list"},
                          {"model", model_},
                          {"results", std::move(results)},
                          {"usage", {{"prompt_tokens", ev.usage.prompt_tokens},
                                     {"total_tokens", ev.usage.prompt_tokens}}}});
  }
  std::string on_stream_error(const ApiError& error) override { return ""; }

 private:
  std::string model_;
  std::vector<std::string> documents_;
  std::vector<float> scores_;  // [documents] the rank head's first class
  int32_t top_n_;
  bool return_documents_;
  std::string id_;
};

// One engine request per prompt, all pooling with the server's pooling.
void fill_requests(const ModelInfo& m, std::vector<std::vector<int32_t>> prompts,
                   PreparedRequest* out) {
  out->request.prompt_token_ids = std::move(prompts[0]);
  out->request.pooling = m.pooling;
  out->more_prompts.assign(std::make_move_iterator(prompts.begin() + 1),
                           std::make_move_iterator(prompts.end()));
}

// `tmpl` with {query} and {document} replaced in one pass (a query holding "{document}" stays
// as written).
std::string render_rerank(const std::string& tmpl, const std::string& query,
                          const std::string& document) {
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    if (tmpl.compare(i, 7, "{query}") == 0) {
      out += query;
      i += 7;
    } else if (tmpl.compare(i, 10, "{document}") == 0) {
      out += document;
      i += 10;
    } else {
      out += tmpl[i++];
    }
  }
  return out;
}

// A (query, document) pair's tokens, as llama-server's format_prompt_rerank makes them.
std::vector<int32_t> rerank_tokens(const ModelInfo& m, const std::string& query,
                                   const std::string& document) {
  const tokenizer::Tokenizer& tok = *m.tokenizer;
  if (!m.rerank_template.empty()) {
    tokenizer::EncodeOptions enc{.add_bos = false, .add_eos = false, .parse_special = true};
    return tok.encode(render_rerank(m.rerank_template, query, document), enc);
  }
  const tokenizer::EncodeOptions plain{.add_bos = false, .add_eos = false};
  std::vector<int32_t> ids;
  if (tok.add_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  for (const std::string* text : {&query, &document}) {
    const std::vector<int32_t> part = tok.encode(*text, plain);
    ids.insert(ids.end(), part.begin(), part.end());
    if (tok.add_eos() && tok.eos_id() >= 0) ids.push_back(tok.eos_id());
  }
  return ids;
}

std::optional<ApiError> read_documents(const json& b, const ModelInfo& m,
                                       std::vector<std::string>* docs) {
  auto it = b.find("documents");
  if (it == b.end() || it->is_null()) {
    return invalid_param("documents", "'documents' is required: a non-empty list of strings");
  }
  if (!it->is_array() || it->empty()) {
    return invalid_param("documents", "'documents' must be a non-empty list of strings");
  }
  ARBOR_API_TRY(check_count(m, it->size(), "documents", "documents"));
  for (size_t i = 0; i < it->size(); ++i) {
    const json& d = (*it)[i];
    // Jina's and Cohere's {"text": ...} objects, or plain strings.
    const json* text = d.is_object() && d.contains("text") && d.size() == 1 ? &d["text"] : &d;
    if (!text->is_string()) {
      return invalid_param("documents", str_cat("'documents[", i, "]' must be a string"));
    }
    docs->push_back(text->get<std::string>());
  }
  return std::nullopt;
}

}  // namespace

std::vector<float> normalised_embedding(std::span<const float> pooled, int32_t dimensions) {
  const size_t n = dimensions > 0 ? std::min(pooled.size(), static_cast<size_t>(dimensions))
                                  : pooled.size();
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(pooled[i]) * pooled[i];
  const double norm = std::sqrt(sum);
  const double inv = norm > 0.0 ? 1.0 / norm : 0.0;
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(pooled[i] * inv);
  return out;
}

std::string base64_floats(std::span<const float> values) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());  // x86 and ARM: little-endian
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t b0 = bytes[i];
    const uint32_t b1 = i + 1 < bytes.size() ? bytes[i + 1] : 0;
    const uint32_t b2 = i + 2 < bytes.size() ? bytes[i + 2] : 0;
    const uint32_t v = (b0 << 16) | (b1 << 8) | b2;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

ApiError route_of_other_task(const ModelInfo& m, ServeTask needed, std::string_view route) {
  const std::string running = str_cat("this server runs --task ", serve_task_name(m.task));
  switch (needed) {
    case ServeTask::kGenerate:
      return task_not_served(str_cat(
          route, " generates text; ", running, " (",
          m.task == ServeTask::kEmbed ? "POST /v1/embeddings" : "POST /v1/rerank",
          "): start arbor serve without --task (or --task generate) to generate"));
    case ServeTask::kEmbed:
      return task_not_served(str_cat(route, " needs --task embed (pooling from the file's ",
                                     "<arch>.pooling_type or --pooling mean|cls|last); ", running));
    case ServeTask::kRerank:
      return task_not_served(str_cat(
          route, " needs --task rerank and a model with a rank head (cls.output.weight, or a "
                 "Qwen3-Reranker's \"yes\" and \"no\" tokens); ", running));
  }
  return task_not_served(running);
}

std::optional<ApiError> prepare_embeddings(const json& body, const ModelInfo& model,
                                           PreparedRequest* out) {
  if (model.task != ServeTask::kEmbed) {
    return route_of_other_task(model, ServeTask::kEmbed, "/v1/embeddings");
  }
  static constexpr std::string_view kRead[] = {"model", "input", "encoding_format", "dimensions"};
  ARBOR_API_TRY(check_fields(body, kRead, "/v1/embeddings"));
  ARBOR_API_TRY(check_model(body, model));
  std::string format = "float";
  ARBOR_API_TRY(read_string(body, "encoding_format", &format));
  if (format != "float" && format != "base64") {
    return invalid_param("encoding_format", str_cat("'encoding_format' is '", format,
                                                    "', must be 'float' or 'base64'"));
  }
  int32_t dimensions = 0;
  ARBOR_API_TRY(read_int32(body, "dimensions", 1, model.embedding_dim, &dimensions));
  std::vector<std::vector<int32_t>> inputs;
  ARBOR_API_TRY(read_inputs(body, model, &inputs));
  out->builder = std::make_unique<EmbeddingsBuilder>(model.name, inputs.size(),
                                                     format == "base64", dimensions);
  fill_requests(model, std::move(inputs), out);
  return std::nullopt;
}

std::optional<ApiError> prepare_rerank(const json& body, const ModelInfo& model,
                                       PreparedRequest* out) {
  if (model.task != ServeTask::kRerank) {
    return route_of_other_task(model, ServeTask::kRerank, "/v1/rerank");
  }
  static constexpr std::string_view kRead[] = {"model", "query", "documents", "top_n",
                                               "return_documents"};
  ARBOR_API_TRY(check_fields(body, kRead, "/v1/rerank"));
  ARBOR_API_TRY(check_model(body, model));
  std::string query;
  ARBOR_API_TRY(read_string(body, "query", &query));
  if (query.empty()) return invalid_param("query", "'query' is required: a non-empty string");
  std::vector<std::string> docs;
  ARBOR_API_TRY(read_documents(body, model, &docs));
  int32_t top_n = static_cast<int32_t>(docs.size());
  ARBOR_API_TRY(read_int32(body, "top_n", 1, std::numeric_limits<int32_t>::max(), &top_n));
  bool return_documents = false;
  ARBOR_API_TRY(read_bool(body, "return_documents", &return_documents));
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < docs.size(); ++i) {
    prompts.push_back(rerank_tokens(model, query, docs[i]));
    if (prompts.back().empty()) {
      return invalid_param("documents", str_cat("'documents[", i, "]' with the query encodes "
                                                "to no tokens"));
    }
    ARBOR_API_TRY(check_length(model, prompts.back().size(),
                               str_cat("'documents[", i, "]' with the query"), "documents"));
  }
  out->builder =
      std::make_unique<RerankBuilder>(model.name, std::move(docs), top_n, return_documents);
  fill_requests(model, std::move(prompts), out);
  return std::nullopt;
}

}  // namespace arbor::server
