// config.json -> HfConfig: the architecture table (class names, config-class defaults) and the
// checks that refuse what llama.cpp's GGUF cannot express.
#include <cmath>
#include <nlohmann/json.hpp>

#include "convert/hf.h"
#include "convert/hf_internal.h"

namespace arbor::convert {

namespace {

using namespace hf_internal;  // NOLINT: the converter's own helpers

struct ArchInfo {
  const char* hf_class;
  HfArch arch;
  const char* gguf_name;
};

constexpr ArchInfo kArchs[] = {
    {"LlamaForCausalLM", HfArch::kLlama, "llama"},
    {"Qwen2ForCausalLM", HfArch::kQwen2, "qwen2"},
    {"Qwen3ForCausalLM", HfArch::kQwen3, "qwen3"},
    {"Gemma2ForCausalLM", HfArch::kGemma2, "gemma2"},
    {"Gemma3ForCausalLM", HfArch::kGemma3, "gemma3"},
    {"Gemma3ForConditionalGeneration", HfArch::kGemma3, "gemma3"},
    {"Ministral3ForCausalLM", HfArch::kMistral3, "mistral3"},
    {"Mistral3ForConditionalGeneration", HfArch::kMistral3, "mistral3"},
    {"Phi3ForCausalLM", HfArch::kPhi3, "phi3"},
    {"SmolLM3ForCausalLM", HfArch::kSmolLM3, "smollm3"},
    {"Olmo2ForCausalLM", HfArch::kOlmo2, "olmo2"},
    {"GraniteForCausalLM", HfArch::kGranite, "granite"},
};

// Defaults of the transformers config class where config.json may leave a key out (llama.cpp
// reads the config through AutoConfig, so it sees these too). 0 = no default (required, or
// derived).
struct ArchDefaults {
  float rms_norm_eps = 0.0f;  // 0: required
  uint32_t head_dim = 0;      // 0: hidden_size / num_attention_heads
  float rope_theta = 10000.0f;
  uint32_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  const char* activation = "silu";
  // rope scaling types the architecture's llama.cpp graph honours
  std::vector<RopeScalingType> rope_types;
};

ArchDefaults defaults_of(HfArch arch, const std::string& model_type) {
  using R = RopeScalingType;
  switch (arch) {
    case HfArch::kLlama:
      return {.rope_types = {R::kLlama3, R::kLinear}};
    case HfArch::kQwen2:
      return {.max_position_embeddings = 32768, .rope_types = {R::kLinear, R::kYarn}};
    case HfArch::kQwen3:
      return {.rms_norm_eps = 1e-6f, .head_dim = 128, .max_position_embeddings = 32768,
              .rope_types = {R::kLinear, R::kYarn}};
    case HfArch::kGemma2:
      return {.rms_norm_eps = 1e-6f, .head_dim = 256, .max_position_embeddings = 8192,
              .tie_word_embeddings = true, .activation = "gelu_pytorch_tanh", .rope_types = {}};
    case HfArch::kGemma3:
      return {.rms_norm_eps = 1e-6f, .head_dim = 256, .rope_theta = 1e6f,
              .max_position_embeddings = 131072, .tie_word_embeddings = true, .activation = "gelu_pytorch_tanh",
              .rope_types = {R::kLinear}};
    case HfArch::kMistral3:
      return {.rms_norm_eps = 1e-5f, .head_dim = model_type == "ministral3" ? 128u : 0u,
              .rope_theta = model_type == "ministral3" ? 1e6f : 10000.0f,
              .max_position_embeddings = model_type == "ministral3" ? 262144u : 32768u,
              .rope_types = {R::kYarn, R::kLlama3, R::kLinear}};
    case HfArch::kPhi3:
      return {.rms_norm_eps = 1e-5f, .max_position_embeddings = 4096, .rope_types = {R::kLongRope}};
    case HfArch::kSmolLM3:
      return {.rms_norm_eps = 1e-6f, .rope_theta = 2e6f, .max_position_embeddings = 32768,
              .tie_word_embeddings = true,
              .rope_types = {R::kLinear, R::kYarn}};
    case HfArch::kOlmo2:
      return {.rms_norm_eps = 1e-5f, .rope_types = {R::kLinear, R::kYarn}};
    case HfArch::kGranite:
      return {.rms_norm_eps = 1e-6f, .rope_types = {R::kLlama3, R::kLinear}};
  }
  return {};
}

std::optional<int64_t> read_token_id(const Json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  // eos_token_id may be a list (Llama 3.1); the first is the end-of-sequence token.
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer())
    return (*it)[0].get<int64_t>();
  return std::nullopt;
}

Status read_arch(const Json& j, HfConfig* c, const std::string& name) {
  const auto it = j.find("architectures");
  if (it == j.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) {
    return not_found(name, ": missing required key \"architectures\" (a list of class names)");
  }
  c->hf_class = (*it)[0].get<std::string>();
  std::string supported;
  for (const auto& a : kArchs) {
    if (c->hf_class == a.hf_class) {
      c->arch = a.arch;
      return ok_status();
    }
    supported += (supported.empty() ? "" : ", ") + std::string(a.hf_class);
  }
  return unimplemented(name, ": architecture '", c->hf_class, "' is not supported (", supported,
                       ")");
}

}  // namespace

std::string_view hf_arch_name(HfArch arch) {
  for (const auto& a : kArchs) {
    if (a.arch == arch) return a.gguf_name;
  }
  return "?";
}

std::string_view rope_scaling_name(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kYarn:
      return "yarn";
    case RopeScalingType::kLongRope:
      return "longrope";
    case RopeScalingType::kLlama3:
      return "llama3";
  }
  return "?";
}

namespace {

Status read_shape(const Json& j, const ArchDefaults& d, HfConfig* c, const std::string& name) {
  ARBOR_RETURN_IF_ERROR(read_u32(j, "hidden_size", true, &c->hidden_size, name));
  ARBOR_RETURN_IF_ERROR(read_u32(j, "intermediate_size", true, &c->intermediate_size, name));
  ARBOR_RETURN_IF_ERROR(read_u32(j, "num_hidden_layers", true, &c->num_hidden_layers, name));
  ARBOR_RETURN_IF_ERROR(read_u32(j, "num_attention_heads", c->arch != HfArch::kGemma3,
                                 &c->num_attention_heads, name));
  if (c->num_attention_heads == 0) c->num_attention_heads = 8;  // Gemma3TextConfig
  c->num_key_value_heads = c->arch == HfArch::kGemma3 ? 4 : c->num_attention_heads;
  ARBOR_RETURN_IF_ERROR(
      read_u32(j, "num_key_value_heads", false, &c->num_key_value_heads, name));
  c->head_dim = d.head_dim > 0 ? d.head_dim : c->hidden_size / c->num_attention_heads;
  c->head_dim_in_config = d.head_dim > 0 || (j.contains("head_dim") && !j["head_dim"].is_null());
  ARBOR_RETURN_IF_ERROR(read_u32(j, "head_dim", false, &c->head_dim, name));
  c->max_position_embeddings = d.max_position_embeddings;
  ARBOR_RETURN_IF_ERROR(
      read_u32(j, "max_position_embeddings", false, &c->max_position_embeddings, name));
  ARBOR_RETURN_IF_ERROR(read_u32(j, "vocab_size", false, &c->vocab_size, name));
  c->rms_norm_eps = d.rms_norm_eps;
  ARBOR_RETURN_IF_ERROR(
      read_float(j, "rms_norm_eps", d.rms_norm_eps == 0.0f, &c->rms_norm_eps, name));
  c->tie_word_embeddings = read_bool(j, "tie_word_embeddings", d.tie_word_embeddings);
  return ok_status();
}

Status check_activation(const Json& j, const ArchDefaults& d, const std::string& name) {
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string() || it->get<std::string>() != d.activation) {
      return unimplemented(name, ": \"", key, "\" = ", it->dump(), " is not supported (",
                           d.activation, ")");
    }
  }
  return ok_status();
}

Status validate_config(const HfConfig& c, const std::string& name) {
  if (c.num_hidden_layers > 4096)
    return invalid_argument(name, ": num_hidden_layers ", c.num_hidden_layers, " is absurd");
  if (c.num_key_value_heads > c.num_attention_heads ||
      c.num_attention_heads % c.num_key_value_heads != 0) {
    return invalid_argument(name, ": num_attention_heads ", c.num_attention_heads,
                            " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  }
  if (c.head_dim % 2 != 0) return unimplemented(name, ": head_dim ", c.head_dim, " is odd");
  // llama.cpp derives the head size of these from hidden_size / num_attention_heads.
  const bool derived = c.arch == HfArch::kLlama || c.arch == HfArch::kQwen2 ||
                       c.arch == HfArch::kPhi3 || c.arch == HfArch::kOlmo2 ||
                       c.arch == HfArch::kSmolLM3 || c.arch == HfArch::kGranite;
  if (derived && c.head_dim * c.num_attention_heads != c.hidden_size) {
    return unimplemented(name, ": head_dim ", c.head_dim, " × num_attention_heads ",
                         c.num_attention_heads, " != hidden_size ", c.hidden_size, " (",
                         hf_arch_name(c.arch), " GGUF has no head size of its own)");
  }
  return ok_status();
}

Result<HfConfig> parse_hf_config_impl(std::string_view json_text, const std::string& name) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(name, ": not a JSON object");
  HfConfig c;
  ARBOR_RETURN_IF_ERROR(read_arch(j, &c, name));
  // Multimodal configs keep the language model's keys in text_config (llama.cpp merges it over
  // the root the same way).
  if (j.contains("text_config") && j["text_config"].is_object()) {
    for (const auto& [k, v] : j["text_config"].items()) j[k] = v;
  }
  if (j.contains("model_type") && j["model_type"].is_string())
    c.model_type = j["model_type"].get<std::string>();
  const ArchDefaults d = defaults_of(c.arch, c.model_type);
  ARBOR_RETURN_IF_ERROR(read_shape(j, d, &c, name));
  ARBOR_RETURN_IF_ERROR(check_activation(j, d, name));
  c.rope_theta = d.rope_theta;
  ARBOR_RETURN_IF_ERROR(read_float(j, "rope_theta", false, &c.rope_theta, name));
  c.rope_dim = c.head_dim;
  ARBOR_RETURN_IF_ERROR(read_rope(j, d.rope_types, &c, name));
  ARBOR_RETURN_IF_ERROR(read_layout(j, &c, name));
  c.bos_token_id = read_token_id(j, "bos_token_id");
  c.eos_token_id = read_token_id(j, "eos_token_id");
  ARBOR_RETURN_IF_ERROR(validate_config(c, name));
  return c;
}

}  // namespace

Result<HfConfig> parse_hf_config(std::string_view json_text, const std::string& name) {
  // nlohmann::json throws on type mismatches the parser does not check; never let it escape.
  try {
    return parse_hf_config_impl(json_text, name);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(name, ": ", e.what());
  }
}

}  // namespace arbor::convert
