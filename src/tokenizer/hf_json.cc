// Tokenizer from a Hugging Face tokenizer.json (+ tokenizer_config.json). nlohmann::json
// exceptions are caught here and become Status values.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/mapped_file.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace arbor::tokenizer {

using internal::ModelKind;
using internal::TokenType;
using internal::Vocab;
using nlohmann::json;

namespace {

constexpr const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

// llama.cpp adds BOS by default for Llama 3 style pre-tokenizers.
bool pre_adds_bos(const std::string& pre_name) {
  auto spec = internal::bpe_pre_tokenizer(pre_name);
  return spec.ok() && spec->add_bos;
}

// The member `key` of `obj`, or a null json when absent (no copy, unlike json::value).
const json& member(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  const auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

// tokenizer.json nodes are either null, a single component, or a "Sequence" of them.
std::vector<const json*> flatten(const json& node, const char* list_key) {
  std::vector<const json*> out;
  if (node.is_null()) return out;
  if (node.value("type", "") == "Sequence") {
    for (const json& child : node.at(list_key)) {
      for (const json* c : flatten(child, list_key)) out.push_back(c);
    }
  } else {
    out.push_back(&node);
  }
  return out;
}

// Escapes a literal for use as a PCRE2 pattern.
std::string regex_quote(const std::string& s) { return "\\Q" + s + "\\E"; }

Status read_normalizer(const json& root, Vocab& v) {
  for (const json* n : flatten(member(root, "normalizer"), "normalizers")) {
    const std::string type = n->value("type", "");
    if (type == "Prepend" && n->value("prepend", "") == internal::kSpaceMarker) {
      v.add_space_prefix = true;
    } else if (type == "Replace" && n->at("pattern").value("String", "") == " " &&
               n->value("content", "") == internal::kSpaceMarker) {
      v.escape_whitespace = true;
    } else if (type == "NFC") {
      continue;  // text is used as given (documented in tokenizer.h)
    } else {
      return unimplemented("normalizer '", type, "' is not supported");
    }
  }
  return ok_status();
}

Status read_pre_tokenizer(const json& root, Vocab& v) {
  for (const json* p : flatten(member(root, "pre_tokenizer"), "pretokenizers")) {
    const std::string type = p->value("type", "");
    if (type == "Split") {
      const json& pattern = p->at("pattern");
      if (p->value("behavior", "") != "Isolated" || p->value("invert", false)) {
        return unimplemented("Split pre-tokenizer behaviour '", p->value("behavior", ""),
                             "' (invert ", p->value("invert", false), ") is not supported");
      }
      v.pre_regexes.push_back(pattern.contains("Regex")
                                  ? pattern.at("Regex").get<std::string>()
                                  : regex_quote(pattern.at("String").get<std::string>()));
    } else if (type == "ByteLevel") {
      if (p->value("add_prefix_space", false)) {
        return unimplemented("ByteLevel pre-tokenizer with add_prefix_space is not supported");
      }
      v.byte_level = true;
      if (p->value("use_regex", true)) v.pre_regexes.push_back(kGpt2Regex);
    } else {
      return unimplemented("pre-tokenizer '", type, "' is not supported");
    }
  }
  return ok_status();
}

Status read_merges(const json& model, Vocab& v) {
  const json& merges = member(model, "merges");
  if (merges.is_null()) return ok_status();
  for (const json& m : merges) {
    if (m.is_array() && m.size() == 2) {
      v.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      continue;
    }
    std::string left, right;
    if (!m.is_string() || !internal::split_merge(m.get<std::string>(), left, right)) {
      return data_loss("merge entry ", m.dump(), " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    v.merges.emplace_back(std::move(left), std::move(right));
  }
  return ok_status();
}

bool is_byte_token(const std::string& s) {
  return s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>(s[3])) &&
         std::isxdigit(static_cast<unsigned char>(s[4]));
}

// Fills tokens/types from model.vocab and added_tokens; ids may leave holes (kept unused).
Status read_tokens(const json& root, Vocab& v) {
  const json& model = root.at("model");
  if (!model.at("vocab").is_object()) return data_loss("model.vocab is not an object");
  const json& added_or_null = member(root, "added_tokens");
  static const json kEmptyArray = json::array();
  const json& added = added_or_null.is_null() ? kEmptyArray : added_or_null;
  int64_t size = 0;
  for (const auto& [text, id] : model.at("vocab").items()) size = std::max(size, id.get<int64_t>() + 1);
  for (const json& a : added) size = std::max(size, a.at("id").get<int64_t>() + 1);
  if (size <= 0 || size > INT32_MAX) return data_loss("vocabulary size ", size, " is invalid");
  v.tokens.assign(size, "");
  v.types.assign(size, TokenType::kUnused);
  for (const auto& [text, id] : model.at("vocab").items()) {
    const int64_t i = id.get<int64_t>();
    if (i < 0) return data_loss("token '", text, "' has negative id ", i);
    v.tokens[i] = text;
    v.types[i] = v.byte_fallback && is_byte_token(text) ? TokenType::kByte : TokenType::kNormal;
  }
  for (const json& a : added) {
    const int64_t i = a.at("id").get<int64_t>();
    if (i < 0) return data_loss("added token has negative id ", i);
    v.tokens[i] = a.at("content").get<std::string>();
    v.types[i] = a.value("special", false) ? TokenType::kControl : TokenType::kUserDefined;
    v.lstrip.resize(size, 0);
    v.rstrip.resize(size, 0);
    v.lstrip[i] = a.value("lstrip", false);
    v.rstrip[i] = a.value("rstrip", false);
  }
  for (int64_t i = 0; i < size; ++i) {
    if (v.tokens[i].empty()) v.tokens[i] = str_cat("[UNUSED_", i, "]");
  }
  return ok_status();
}

// A token named in tokenizer_config.json: a string or {"content": ...}.
int32_t config_token(const Vocab& v, const json& config, const char* key) {
  if (!config.contains(key)) return -2;  // not mentioned
  const json& t = config.at(key);
  if (t.is_string()) return v.find(t.get<std::string>());
  if (t.is_object() && t.contains("content")) return v.find(t.at("content").get<std::string>());
  return -1;
}

void read_post_processor(const json& root, Vocab& v) {
  const json& post = member(root, "post_processor");
  if (post.is_null() || post.value("type", "") != "TemplateProcessing") return;
  const json& single = post.at("single");
  if (single.empty()) return;
  auto special_id = [&](const json& item) -> int32_t {
    if (!item.contains("SpecialToken")) return -1;
    return v.find(item.at("SpecialToken").at("id").get<std::string>());
  };
  if (int32_t id = special_id(single.front()); id >= 0) v.bos_id = id, v.add_bos = true;
  if (single.size() > 1) {
    if (int32_t id = special_id(single.back()); id >= 0) v.eos_id = id, v.add_eos = true;
  }
}

void read_config(const json& config, Vocab& v, std::string& chat_template) {
  const std::pair<const char*, int32_t*> keys[] = {
      {"bos_token", &v.bos_id}, {"eos_token", &v.eos_id},
      {"unk_token", &v.unk_id}, {"pad_token", &v.pad_id}};
  for (const auto& [key, id] : keys) {
    const int32_t found = config_token(v, config, key);
    if (found != -2) *id = found;
  }
  if (config.contains("add_bos_token") && config.at("add_bos_token").is_boolean()) {
    v.add_bos = config.at("add_bos_token").get<bool>();
  } else if (pre_adds_bos(v.pre_name) && v.bos_id >= 0) {
    v.add_bos = true;  // llama.cpp's rule for Llama 3 style pre-tokenizers
  }
  if (config.contains("add_eos_token") && config.at("add_eos_token").is_boolean()) {
    v.add_eos = config.at("add_eos_token").get<bool>();
  }
  if (config.contains("chat_template") && config.at("chat_template").is_string()) {
    chat_template = config.at("chat_template").get<std::string>();
  }
}

Status parse_root(const json& root, Vocab& v) {
  const json& model = root.at("model");
  const std::string type = model.value("type", "");
  if (type != "BPE") return unimplemented("model type '", type, "' is not supported (only BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model.at(key).is_string() && !model.at(key).get<std::string>().empty()) {
      return unimplemented("BPE ", key, " is not supported");
    }
  }
  v.kind = ModelKind::kBpe;
  v.byte_fallback = model.value("byte_fallback", false);
  v.ignore_merges = model.value("ignore_merges", false);
  ARBOR_RETURN_IF_ERROR(read_tokens(root, v));
  ARBOR_RETURN_IF_ERROR(read_merges(model, v));
  ARBOR_RETURN_IF_ERROR(read_normalizer(root, v));
  ARBOR_RETURN_IF_ERROR(read_pre_tokenizer(root, v));
  v.pre_name = v.byte_level ? internal::pre_name_for_patterns(v.pre_regexes) : "default";
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    v.unk_id = v.find(model.at("unk_token").get<std::string>());
    if (v.unk_id >= 0 && v.types[v.unk_id] == TokenType::kControl) {
      v.types[v.unk_id] = TokenType::kUnknown;
    }
  }
  read_post_processor(root, v);
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_json(const std::string& path) {
  ARBOR_ASSIGN_OR_RETURN(std::string text, read_file(path));
  auto v = std::make_unique<Vocab>();
  std::string chat_template;
  try {
    const json root = json::parse(text);
    // The token map is needed to resolve names in the config, so build it early.
    Status st = parse_root(root, *v);
    if (!st.ok()) return st.with_context(path);
    for (int32_t i = 0; i < v->size(); ++i) v->token_to_id.emplace(v->tokens[i], i);
    const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(config_path)) {
      ARBOR_ASSIGN_OR_RETURN(std::string config_text, read_file(config_path.string()));
      read_config(json::parse(config_text), *v, chat_template);
    } else if (pre_adds_bos(v->pre_name) && v->bos_id >= 0) {
      v->add_bos = true;
    }
  } catch (const json::exception& e) {
    return data_loss(path, ": malformed tokenizer JSON: ", e.what());
  }
  return build(std::move(v), path, std::move(chat_template));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const auto json_path = std::filesystem::path(path) / "tokenizer.json";
    if (!std::filesystem::exists(json_path, ec)) {
      return not_found(path, " is a directory without tokenizer.json");
    }
    return from_hf_json(json_path.string());
  }
  ARBOR_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  const auto bytes = mapped.bytes();
  if (bytes.size() >= 4 && std::equal(bytes.begin(), bytes.begin() + 4, "GGUF")) {
    ARBOR_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::open(path));
    return from_gguf(file);
  }
  return from_hf_json(path);
}

}  // namespace arbor::tokenizer
