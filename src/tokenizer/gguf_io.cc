// Tokenizer <-> GGUF `tokenizer.ggml.*` metadata, following llama.cpp's llama_vocab::load.
#include <algorithm>
#include <cctype>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace arbor::tokenizer {

using internal::ModelKind;
using internal::TokenType;
using internal::Vocab;

namespace {

constexpr const char* kModelKey = "tokenizer.ggml.model";
constexpr const char* kPreKey = "tokenizer.ggml.pre";
constexpr const char* kTokensKey = "tokenizer.ggml.tokens";
constexpr const char* kScoresKey = "tokenizer.ggml.scores";
constexpr const char* kTypesKey = "tokenizer.ggml.token_type";
constexpr const char* kMergesKey = "tokenizer.ggml.merges";
constexpr const char* kChatTemplateKey = "tokenizer.chat_template";
// arbor's own key: the pre-tokenizer regexes of a tokenizer.json whose pre-tokenizer llama.cpp
// has no name for (tokenizer.ggml.pre is then "default").
constexpr const char* kPreRegexesKey = "tokenizer.arbor.pre_regexes";
// arbor's own keys: added tokens that swallow whitespace on their left / right (tokenizer.json's
// lstrip / rstrip), which llama.cpp only knows by model name.
constexpr const char* kLstripKey = "tokenizer.arbor.lstrip_ids";
constexpr const char* kRstripKey = "tokenizer.arbor.rstrip_ids";
constexpr uint32_t kNoToken = 0xFFFFFFFFu;

// Reads an optional key: absent is fine, present with a bad type is an error.
template <typename T>
Status read_optional(const Result<T>& r, T& out) {
  if (r.ok()) {
    out = r.value();
    return ok_status();
  }
  return r.status().code() == StatusCode::kNotFound ? ok_status() : r.status();
}

Status read_special_ids(const gguf::GgufFile& f, Vocab& v) {
  const std::pair<const char*, int32_t*> keys[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos_id},     {"tokenizer.ggml.eos_token_id", &v.eos_id},
      {"tokenizer.ggml.unknown_token_id", &v.unk_id}, {"tokenizer.ggml.padding_token_id", &v.pad_id},
      {"tokenizer.ggml.eot_token_id", &v.eot_id},     {"tokenizer.ggml.eom_token_id", &v.eom_id},
  };
  for (const auto& [key, id] : keys) {
    if (*id >= v.size()) *id = -1;  // a default outside the vocabulary
    auto r = f.get_i64(key);
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kNotFound) continue;
      return r.status();
    }
    // -1 (0xFFFFFFFF as converters write it) means "none" and unsets the token; llama.cpp
    // would keep its default instead (1 or 11), which no file can then undo. Any other id
    // outside the vocabulary cannot be right: the file is refused.
    if (*r == -1 || *r == 0xFFFFFFFFll) {
      *id = -1;
    } else if (*r < 0 || *r >= v.size()) {
      return invalid_argument(f.name(), ": ", key, " = ", *r, " is outside the vocabulary of ",
                              v.size(), " tokens");
    } else {
      *id = static_cast<int32_t>(*r);
    }
  }
  return ok_status();
}

Status read_types(const gguf::GgufFile& f, Vocab& v) {
  std::vector<int32_t> types;
  ARBOR_RETURN_IF_ERROR(read_optional(f.get_i32_array(kTypesKey), types));
  if (types.empty()) return ok_status();
  if (types.size() < v.tokens.size()) {
    return data_loss(f.name(), ": ", kTypesKey, " has ", types.size(), " entries for ",
                     v.tokens.size(), " tokens");
  }
  v.types.resize(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t t = types[i];
    v.types[i] = t >= 0 && t <= 6 ? static_cast<TokenType>(t) : TokenType::kUndefined;
  }
  return ok_status();
}

Status read_merges(const gguf::GgufFile& f, Vocab& v, bool required) {
  auto merges = f.get_string_array(kMergesKey);
  if (!merges.ok()) {
    if (merges.status().code() == StatusCode::kNotFound && !required) return ok_status();
    return merges.status();
  }
  v.merges.reserve(merges->size());
  std::string left, right;
  for (const std::string& m : *merges) {
    if (!internal::split_merge(m, left, right)) {
      return data_loss(f.name(), ": ", kMergesKey, " entry '", m, "' is not \"left right\"");
    }
    v.merges.emplace_back(left, right);
  }
  return ok_status();
}

Status configure_model(const gguf::GgufFile& f, const std::string& model, Vocab& v) {
  if (model == "llama") {
    v.kind = ModelKind::kSpm;
    v.bos_id = 1, v.eos_id = 2, v.unk_id = 0;
    v.add_space_prefix = v.escape_whitespace = v.add_bos = true;
    v.pre_name = "default";
    // arbor's export of a BPE tokenizer.json with a SentencePiece-style normaliser carries its
    // merges: run exact BPE then (llama.cpp ignores them and merges by score).
    ARBOR_RETURN_IF_ERROR(read_merges(f, v, false));
    if (!v.merges.empty()) v.kind = ModelKind::kBpe, v.byte_fallback = true;
    return ok_status();
  }
  if (model != "gpt2") {
    return unimplemented(f.name(), ": tokenizer model '", model,
                         "' is not supported (supported: llama, gpt2)");
  }
  v.kind = ModelKind::kBpe;
  v.byte_level = true;
  v.bos_id = v.eos_id = 11;  // llama.cpp's defaults for gpt2 vocabularies
  ARBOR_RETURN_IF_ERROR(read_merges(f, v, true));
  ARBOR_RETURN_IF_ERROR(read_optional(f.get_string(kPreKey), v.pre_name));
  // arbor's own patterns (an exported tokenizer.json) replace the named ones; the name still
  // sets the flags when arbor knows it.
  ARBOR_RETURN_IF_ERROR(read_optional(f.get_string_array(kPreRegexesKey), v.pre_regexes));
  auto spec = internal::bpe_pre_tokenizer(v.pre_name);
  if (spec.ok()) {
    if (v.pre_regexes.empty()) v.pre_regexes = spec->patterns;
    v.ignore_merges = spec->ignore_merges;
    v.add_bos = spec->add_bos;
    if (spec->no_default_bos) v.bos_id = -1;
  } else if (v.pre_regexes.empty()) {
    return spec.status().with_context(f.name());
  }
  if (v.pre_name.empty()) v.pre_name = "default";
  return ok_status();
}

Status read_strip_ids(const gguf::GgufFile& f, Vocab& v) {
  for (const auto& [key, flags] : {std::pair{kLstripKey, &v.lstrip}, std::pair{kRstripKey, &v.rstrip}}) {
    std::vector<int32_t> ids;
    ARBOR_RETURN_IF_ERROR(read_optional(f.get_i32_array(key), ids));
    flags->resize(v.tokens.size(), 0);
    for (int32_t id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= v.tokens.size()) {
        return data_loss(f.name(), ": ", key, " holds id ", id, " outside the vocabulary (",
                         v.tokens.size(), " tokens)");
      }
      (*flags)[id] = 1;
    }
  }
  return ok_status();
}

// llama.cpp marks Phi-3's special tokens rstrip by model name; do the same.
void apply_name_quirks(const gguf::GgufFile& f, Vocab& v) {
  auto name = f.get_string("general.name");
  if (!name.ok()) return;
  std::string lower = *name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.find("phi-3") == std::string::npos && lower.find("phi3") == std::string::npos) return;
  v.rstrip.resize(v.tokens.size(), 0);
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const TokenType t = v.types[i];
    const bool special = t == TokenType::kControl || t == TokenType::kUserDefined ||
                         t == TokenType::kUnknown;
    const std::string& s = v.tokens[i];
    if ((special || s == "</s>") && s != "<unk>" && s != "<s>" && s != "<|endoftext|>") {
      v.rstrip[i] = 1;
    }
  }
}

// Converters that lack SentencePiece scores (llama.cpp's LlamaHfVocab for a BPE tokenizer.json)
// write the same score for every token, which leaves llama.cpp's score-driven merging to take
// pairs left to right. Such vocabularies list tokens in merge order, so -id restores the BPE
// priority: the pair forming the earliest-learned token merges first. (Deliberate deviation
// from llama.cpp, which encodes TinyStories-656K's GGUF differently from its tokenizer.json.)
void repair_flat_scores(Vocab& v) {
  if (v.kind != ModelKind::kSpm || v.scores.empty()) return;
  bool seen = false, flat = true;
  float first = 0.0f;
  for (size_t i = 0; i < v.tokens.size() && flat; ++i) {
    if (v.types[i] != TokenType::kNormal) continue;
    if (!seen) first = v.scores[i], seen = true;
    flat = v.scores[i] == first;
  }
  if (!seen || !flat) return;
  for (size_t i = 0; i < v.tokens.size(); ++i) v.scores[i] = -static_cast<float>(i);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::GgufFile& f) {
  auto v = std::make_unique<Vocab>();
  ARBOR_ASSIGN_OR_RETURN(std::string model, f.get_string(kModelKey));
  ARBOR_ASSIGN_OR_RETURN(v->tokens, f.get_string_array(kTokensKey));
  ARBOR_RETURN_IF_ERROR(configure_model(f, model, *v));
  ARBOR_RETURN_IF_ERROR(read_optional(f.get_f32_array(kScoresKey), v->scores));
  if (!v->scores.empty() && v->scores.size() < v->tokens.size()) {
    return data_loss(f.name(), ": ", kScoresKey, " has ", v->scores.size(), " entries for ",
                     v->tokens.size(), " tokens");
  }
  v->scores.resize(v->scores.empty() ? 0 : v->tokens.size());
  ARBOR_RETURN_IF_ERROR(read_types(f, *v));
  if (v->types.empty()) v->types.assign(v->tokens.size(), TokenType::kNormal);
  repair_flat_scores(*v);
  ARBOR_RETURN_IF_ERROR(read_special_ids(f, *v));
  ARBOR_RETURN_IF_ERROR(read_optional(f.get_bool("tokenizer.ggml.add_bos_token"), v->add_bos));
  ARBOR_RETURN_IF_ERROR(read_optional(f.get_bool("tokenizer.ggml.add_eos_token"), v->add_eos));
  ARBOR_RETURN_IF_ERROR(
      read_optional(f.get_bool("tokenizer.ggml.add_space_prefix"), v->add_space_prefix));
  ARBOR_RETURN_IF_ERROR(read_strip_ids(f, *v));
  apply_name_quirks(f, *v);
  std::string chat_template;
  ARBOR_RETURN_IF_ERROR(read_optional(f.get_string(kChatTemplateKey), chat_template));
  return build(std::move(v), f.name(), std::move(chat_template));
}

namespace {

// Scores for SentencePiece-style vocabularies that only have BPE merges: a token made by an
// earlier merge scores higher, so llama.cpp's score-driven merging approximates the ranks.
std::vector<float> scores_from_merges(const Vocab& v) {
  std::vector<float> scores(v.tokens.size());
  const auto n = static_cast<float>(v.merges.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -n - static_cast<float>(i);
  std::string joined;
  for (size_t rank = v.merges.size(); rank-- > 0;) {
    joined.assign(v.merges[rank].first).append(v.merges[rank].second);
    const int32_t id = v.find(joined);
    if (id >= 0) scores[id] = -static_cast<float>(rank);
  }
  for (size_t i = 0; i < scores.size(); ++i) {
    if (v.types[i] != TokenType::kNormal) scores[i] = 0.0f;
  }
  return scores;
}

void write_strip_ids(const Vocab& v, std::vector<gguf::KeyValue>& kv) {
  for (const auto& [key, flags] : {std::pair{kLstripKey, &v.lstrip}, std::pair{kRstripKey, &v.rstrip}}) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < flags->size(); ++i) {
      if ((*flags)[i]) ids.push_back(static_cast<int32_t>(i));
    }
    if (!ids.empty()) kv.push_back({key, gguf::Value::i32_array(ids)});
  }
}

}  // namespace

std::vector<gguf::KeyValue> Tokenizer::to_gguf_metadata() const {
  const Vocab& v = *vocab_;
  using gguf::Value;
  std::vector<gguf::KeyValue> kv;
  const bool gpt2 = model_name() == "gpt2";
  kv.push_back({kModelKey, Value::str(model_name())});
  const bool named_pre = gpt2 && !v.pre_name.empty();
  kv.push_back({kPreKey, Value::str(named_pre ? v.pre_name : "default")});
  if (gpt2 && !named_pre) kv.push_back({kPreRegexesKey, Value::string_array(v.pre_regexes)});
  kv.push_back({kTokensKey, Value::string_array(v.tokens)});
  if (!gpt2) {
    const bool need_scores = v.kind == ModelKind::kBpe;
    kv.push_back({kScoresKey, Value::f32_array(need_scores ? scores_from_merges(v) : v.scores)});
  }
  std::vector<int32_t> types(v.types.size());
  std::transform(v.types.begin(), v.types.end(), types.begin(),
                 [](TokenType t) { return static_cast<int32_t>(t); });
  kv.push_back({kTypesKey, Value::i32_array(types)});
  if (!v.merges.empty()) {
    std::vector<std::string> merges;
    merges.reserve(v.merges.size());
    for (const auto& [l, r] : v.merges) merges.push_back(l + " " + r);
    kv.push_back({kMergesKey, Value::string_array(merges)});
  }
  const std::pair<const char*, int32_t> ids[] = {
      {"tokenizer.ggml.bos_token_id", v.bos_id},     {"tokenizer.ggml.eos_token_id", v.eos_id},
      {"tokenizer.ggml.unknown_token_id", v.unk_id}, {"tokenizer.ggml.padding_token_id", v.pad_id},
  };
  for (const auto& [key, id] : ids) {
    kv.push_back({key, Value::u32(id >= 0 ? static_cast<uint32_t>(id) : kNoToken)});
  }
  write_strip_ids(v, kv);
  kv.push_back({"tokenizer.ggml.add_bos_token", Value::boolean(v.add_bos)});
  kv.push_back({"tokenizer.ggml.add_eos_token", Value::boolean(v.add_eos)});
  if (!gpt2) {
    kv.push_back({"tokenizer.ggml.add_space_prefix", Value::boolean(v.add_space_prefix)});
  }
  if (!chat_template_.empty()) kv.push_back({kChatTemplateKey, Value::str(chat_template_)});
  return kv;
}

}  // namespace arbor::tokenizer
