#include "convert/hf_tokenizer.h"

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "base/status.h"

namespace arbor::convert {

namespace {

using gguf::KeyValue;
using gguf::Value;
using Json = nlohmann::json;

constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenUserDefined = 4;
constexpr int32_t kTokenUnused = 5;
constexpr int32_t kTokenByte = 6;
constexpr float kHfTokenScore = -1000.0f;  // LlamaHfVocab.get_token_score

struct AddedToken {
  std::string content;
  bool special = false;
};

struct ParsedTokenizer {
  bool byte_fallback = false;
  std::map<int64_t, std::string> by_id;  // base vocabulary and added tokens
  std::map<int64_t, AddedToken> added;
  std::vector<std::string> merges;  // "left right"
};

Status parse_merges(const Json& model, std::vector<std::string>* out) {
  const auto it = model.find("merges");
  if (it == model.end()) return ok_status();
  if (!it->is_array()) return data_loss("tokenizer.json: model.merges is not an array");
  for (const auto& m : *it) {
    if (m.is_string()) {
      out->push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out->push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      return data_loss("tokenizer.json: merge ", out->size(), " is ", m.dump(),
                       ", not \"a b\" or [\"a\", \"b\"]");
    }
  }
  return ok_status();
}

Status parse_added(const Json& root, ParsedTokenizer* p) {
  const auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return ok_status();
  if (!it->is_array()) return data_loss("tokenizer.json: added_tokens is not an array");
  for (const auto& a : *it) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string()) {
      return data_loss("tokenizer.json: added token ", a.dump(), " lacks an integer id or content");
    }
    const int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id >= (int64_t{1} << 24))
      return data_loss("tokenizer.json: added token id ", id, " out of range");
    AddedToken t{a["content"].get<std::string>(), a.value("special", false)};
    p->by_id[id] = t.content;
    p->added[id] = std::move(t);
  }
  return ok_status();
}

Result<ParsedTokenizer> parse_tokenizer_json(const std::string& text) {
  const Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return data_loss("tokenizer.json: not a JSON object");
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object())
    return data_loss("tokenizer.json: missing \"model\" object");
  const std::string type = model->value("type", "");
  if (type != "BPE") {
    return unimplemented("tokenizer.json: model type '", type, "' is not supported (only BPE)");
  }
  ParsedTokenizer p;
  const auto bf = model->find("byte_fallback");
  p.byte_fallback = bf != model->end() && bf->is_boolean() && bf->get<bool>();
  const auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object())
    return data_loss("tokenizer.json: missing model.vocab object");
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= (int64_t{1} << 24)) {
      return data_loss("tokenizer.json: vocab entry '", token, "' has id ", id.dump());
    }
    p.by_id[id.get<int64_t>()] = token;
  }
  auto st = parse_added(root, &p);
  if (!st.ok()) return st;
  st = parse_merges(*model, &p.merges);
  if (!st.ok()) return st;
  if (p.by_id.empty()) return data_loss("tokenizer.json: empty vocabulary");
  return p;
}

}  // namespace

namespace {

struct SpecialIds {
  std::optional<int64_t> bos, eos, unk, pad;
  std::optional<bool> add_bos, add_eos;
  std::optional<std::string> chat_template;
};

// The id of a special token named in tokenizer_config.json (a string or {"content": ...}).
std::optional<int64_t> lookup_special(const Json& config, const char* key,
                                      const ParsedTokenizer& p) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  std::string content;
  if (it->is_string()) {
    content = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    content = (*it)["content"].get<std::string>();
  } else {
    return std::nullopt;
  }
  for (const auto& [id, t] : p.added) {
    if (t.content == content) return id;
  }
  for (const auto& [id, text] : p.by_id) {
    if (text == content) return id;
  }
  return std::nullopt;
}

Result<SpecialIds> special_ids(const HfTokenizerFiles& files, const ParsedTokenizer& p) {
  SpecialIds s;
  if (files.tokenizer_config_json) {
    const Json config = Json::parse(*files.tokenizer_config_json, nullptr, false);
    if (config.is_discarded() || !config.is_object())
      return data_loss("tokenizer_config.json: not a JSON object");
    s.bos = lookup_special(config, "bos_token", p);
    s.eos = lookup_special(config, "eos_token", p);
    s.unk = lookup_special(config, "unk_token", p);
    s.pad = lookup_special(config, "pad_token", p);
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean())
      s.add_bos = config["add_bos_token"].get<bool>();
    if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean())
      s.add_eos = config["add_eos_token"].get<bool>();
    if (config.contains("chat_template") && config["chat_template"].is_string()) {
      s.chat_template = config["chat_template"].get<std::string>();
    }
  }
  if (!s.bos) s.bos = files.config_bos_id;
  if (!s.eos) s.eos = files.config_eos_id;
  return s;
}

bool is_byte_token(const std::string& text) {
  static const std::regex kByte("<0x[0-9A-Fa-f]{2}>");
  return std::regex_match(text, kByte);
}

// Token type for id `id` (present in the vocabulary).
int32_t token_type(int64_t id, const std::string& text, const ParsedTokenizer& p,
                   const std::set<int64_t>& special) {
  if (p.byte_fallback && is_byte_token(text)) return kTokenByte;
  if (special.contains(id)) return kTokenControl;
  const auto it = p.added.find(id);
  if (it != p.added.end()) return it->second.special ? kTokenControl : kTokenUserDefined;
  return kTokenNormal;
}

void add_special_keys(const SpecialIds& s, int64_t n_vocab, std::vector<KeyValue>* kv) {
  const auto put = [&](const char* key, const std::optional<int64_t>& id) {
    if (id && *id >= 0 && *id < n_vocab)
      kv->push_back({key, Value::u32(static_cast<uint32_t>(*id))});
  };
  put("tokenizer.ggml.bos_token_id", s.bos);
  put("tokenizer.ggml.eos_token_id", s.eos);
  put("tokenizer.ggml.unknown_token_id", s.unk);
  put("tokenizer.ggml.padding_token_id", s.pad);
  if (s.add_bos) kv->push_back({"tokenizer.ggml.add_bos_token", Value::boolean(*s.add_bos)});
  if (s.add_eos) kv->push_back({"tokenizer.ggml.add_eos_token", Value::boolean(*s.add_eos)});
  if (s.chat_template) kv->push_back({"tokenizer.chat_template", Value::str(*s.chat_template)});
}

}  // namespace

namespace {

Result<std::vector<KeyValue>> hf_tokenizer_metadata_impl(const HfTokenizerFiles& files) {
  ARBOR_ASSIGN_OR_RETURN(ParsedTokenizer p, parse_tokenizer_json(files.tokenizer_json));
  ARBOR_ASSIGN_OR_RETURN(SpecialIds s, special_ids(files, p));
  const int64_t max_id = p.by_id.rbegin()->first;
  if (files.model_vocab_size > 0 && max_id >= files.model_vocab_size) {
    return data_loss("tokenizer.json: token id ", max_id,
                     " does not fit the model's vocabulary of ", files.model_vocab_size);
  }
  const int64_t n_vocab = std::max<int64_t>(max_id + 1, files.model_vocab_size);
  std::set<int64_t> special;
  for (const auto& id : {s.bos, s.eos, s.unk, s.pad}) {
    if (id) special.insert(*id);
  }
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int64_t id = 0; id < n_vocab; ++id) {
    const auto it = p.by_id.find(id);
    if (it == p.by_id.end()) {
      tokens.push_back(str_cat("[PAD", id, "]"));
      types.push_back(kTokenUnused);
    } else {
      tokens.push_back(it->second);
      types.push_back(token_type(id, it->second, p, special));
    }
    scores.push_back(kHfTokenScore);
  }
  std::vector<KeyValue> kv;
  if (p.byte_fallback) {
    kv.push_back({"tokenizer.ggml.model", Value::str("llama")});
    kv.push_back({"tokenizer.ggml.pre", Value::str("default")});
    kv.push_back({"tokenizer.ggml.tokens", Value::string_array(tokens)});
    kv.push_back({"tokenizer.ggml.scores", Value::f32_array(scores)});
    kv.push_back({"tokenizer.ggml.token_type", Value::i32_array(types)});
  } else {
    kv.push_back({"tokenizer.ggml.model", Value::str("gpt2")});
    kv.push_back({"tokenizer.ggml.pre", Value::str(files.pre_name)});
    kv.push_back({"tokenizer.ggml.tokens", Value::string_array(tokens)});
    kv.push_back({"tokenizer.ggml.token_type", Value::i32_array(types)});
    kv.push_back({"tokenizer.ggml.merges", Value::string_array(p.merges)});
  }
  add_special_keys(s, n_vocab, &kv);
  return kv;
}

}  // namespace

Result<std::vector<KeyValue>> hf_tokenizer_metadata(const HfTokenizerFiles& files) {
  // nlohmann::json throws on type mismatches the parser does not check; never let it escape.
  try {
    return hf_tokenizer_metadata_impl(files);
  } catch (const nlohmann::json::exception& e) {
    return data_loss("tokenizer.json / tokenizer_config.json: ", e.what());
  }
}

}  // namespace arbor::convert
