#include "convert/hf.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "convert/hf_tokenizer.h"
#include "base/status.h"

namespace arbor::convert {

namespace {

using Json = nlohmann::json;

// Reads an unsigned integer key; kNotFound when absent and `required`.
Status read_u32(const Json& j, const char* key, bool required, uint32_t* out,
                const std::string& name) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return not_found(name, ": missing required key \"", key, "\"");
    return ok_status();
  }
  if (!it->is_number_integer() || it->get<int64_t>() <= 0 ||
      it->get<int64_t>() > (int64_t{1} << 30)) {
    return invalid_argument(name, ": \"", key, "\" = ", it->dump(),
                            " is not a positive integer below 2^30");
  }
  *out = static_cast<uint32_t>(it->get<int64_t>());
  return ok_status();
}

Status read_float(const Json& j, const char* key, bool required, float* out,
                  const std::string& name) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return not_found(name, ": missing required key \"", key, "\"");
    return ok_status();
  }
  if (!it->is_number() || !(it->get<double>() > 0.0) || !std::isfinite(it->get<double>())) {
    return invalid_argument(name, ": \"", key, "\" = ", it->dump(), " is not a positive number");
  }
  *out = static_cast<float>(it->get<double>());
  return ok_status();
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

Result<HfArch> read_arch(const Json& j, const std::string& name) {
  const auto it = j.find("architectures");
  if (it == j.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) {
    return not_found(name, ": missing required key \"architectures\" (a list of class names)");
  }
  const std::string arch = (*it)[0].get<std::string>();
  if (arch == "LlamaForCausalLM") return HfArch::kLlama;
  if (arch == "Qwen2ForCausalLM") return HfArch::kQwen2;
  return unimplemented(name, ": architecture '", arch,
                       "' is not supported (LlamaForCausalLM, Qwen2ForCausalLM)");
}

Status read_rope_scaling(const Json& j, HfConfig* c, const std::string& name) {
  const auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_object()) return invalid_argument(name, ": \"rope_scaling\" is not an object");
  const std::string type = it->value("rope_type", it->value("type", ""));
  if (type != "llama3") {
    return unimplemented(name, ": rope_scaling type '", type, "' is not supported (llama3)");
  }
  Llama3RopeScaling s;
  ARBOR_RETURN_IF_ERROR(read_float(*it, "factor", false, &s.factor, name));
  ARBOR_RETURN_IF_ERROR(read_float(*it, "low_freq_factor", false, &s.low_freq_factor, name));
  ARBOR_RETURN_IF_ERROR(read_float(*it, "high_freq_factor", false, &s.high_freq_factor, name));
  ARBOR_RETURN_IF_ERROR(read_u32(*it, "original_max_position_embeddings", false,
                                   &s.original_max_position_embeddings, name));
  if (s.high_freq_factor <= s.low_freq_factor) {
    return invalid_argument(name, ": rope_scaling high_freq_factor ", s.high_freq_factor,
                            " must exceed low_freq_factor ", s.low_freq_factor);
  }
  c->rope_scaling = s;
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
  if (c.head_dim * c.num_attention_heads != c.hidden_size || c.head_dim % 2 != 0) {
    return unimplemented(name, ": head_dim ", c.head_dim, " × num_attention_heads ",
                         c.num_attention_heads, " != hidden_size ", c.hidden_size,
                         " (or head_dim is odd)");
  }
  return ok_status();
}

}  // namespace

std::string_view hf_arch_name(HfArch arch) {
  switch (arch) {
    case HfArch::kLlama:
      return "llama";
    case HfArch::kQwen2:
      return "qwen2";
  }
  return "?";
}

namespace {

Result<HfConfig> parse_hf_config_impl(std::string_view json_text, const std::string& name) {
  const Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(name, ": not a JSON object");
  HfConfig c;
  ARBOR_ASSIGN_OR_RETURN(c.arch, read_arch(j, name));
  ARBOR_RETURN_IF_ERROR(read_u32(j, "hidden_size", true, &c.hidden_size, name));
  ARBOR_RETURN_IF_ERROR(read_u32(j, "intermediate_size", true, &c.intermediate_size, name));
  ARBOR_RETURN_IF_ERROR(read_u32(j, "num_hidden_layers", true, &c.num_hidden_layers, name));
  ARBOR_RETURN_IF_ERROR(read_u32(j, "num_attention_heads", true, &c.num_attention_heads, name));
  c.num_key_value_heads = c.num_attention_heads;
  ARBOR_RETURN_IF_ERROR(read_u32(j, "num_key_value_heads", false, &c.num_key_value_heads, name));
  c.head_dim = c.hidden_size / c.num_attention_heads;
  ARBOR_RETURN_IF_ERROR(read_u32(j, "head_dim", false, &c.head_dim, name));
  ARBOR_RETURN_IF_ERROR(
      read_u32(j, "max_position_embeddings", false, &c.max_position_embeddings, name));
  ARBOR_RETURN_IF_ERROR(read_u32(j, "vocab_size", false, &c.vocab_size, name));
  ARBOR_RETURN_IF_ERROR(read_float(j, "rms_norm_eps", true, &c.rms_norm_eps, name));
  ARBOR_RETURN_IF_ERROR(read_float(j, "rope_theta", false, &c.rope_theta, name));
  const auto tie = j.find("tie_word_embeddings");
  if (tie != j.end() && tie->is_boolean()) c.tie_word_embeddings = tie->get<bool>();
  ARBOR_RETURN_IF_ERROR(read_rope_scaling(j, &c, name));
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

std::vector<float> llama3_rope_factors(const HfConfig& c) {
  ARBOR_CHECK(c.rope_scaling.has_value());
  const auto& s = *c.rope_scaling;
  const double old_ctx = s.original_max_position_embeddings;
  const double low_wavelen = old_ctx / s.low_freq_factor;
  const double high_wavelen = old_ctx / s.high_freq_factor;
  std::vector<float> factors;
  for (uint32_t i = 0; i < c.head_dim; i += 2) {
    // Same float32 frequency as llama.cpp's torch computation.
    const float freq =
        1.0f / std::pow(c.rope_theta, static_cast<float>(i) / static_cast<float>(c.head_dim));
    const double wavelen = 2.0 * M_PI / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(s.factor);
    } else {
      const double smooth =
          (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / s.factor + smooth)));
    }
  }
  return factors;
}

namespace {

struct LayerTensor {
  std::string_view hf_suffix;
  std::string_view gguf_suffix;
};

// Per-layer names in the order they are written.
constexpr LayerTensor kLayerTensors[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

// Expected PyTorch shape of a per-layer tensor; empty for an unknown suffix.
std::vector<int64_t> expected_shape(const HfConfig& c, std::string_view suffix) {
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size;
  const int64_t q = int64_t{c.num_attention_heads} * c.head_dim;
  const int64_t kv = int64_t{c.num_key_value_heads} * c.head_dim;
  if (suffix == "input_layernorm.weight" || suffix == "post_attention_layernorm.weight")
    return {hidden};
  if (suffix == "self_attn.q_proj.weight") return {q, hidden};
  if (suffix == "self_attn.q_proj.bias") return {q};
  if (suffix == "self_attn.k_proj.weight" || suffix == "self_attn.v_proj.weight")
    return {kv, hidden};
  if (suffix == "self_attn.k_proj.bias" || suffix == "self_attn.v_proj.bias") return {kv};
  if (suffix == "self_attn.o_proj.weight") return {hidden, q};
  if (suffix == "mlp.gate_proj.weight" || suffix == "mlp.up_proj.weight") return {ffn, hidden};
  if (suffix == "mlp.down_proj.weight") return {hidden, ffn};
  return {};
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Wraps a safetensors tensor as a planned GGUF tensor (dims reversed to ggml order).
Result<PlannedTensor> plan_tensor(const StTensor& st, std::string gguf_name,
                                  const std::vector<int64_t>& want_shape) {
  if (st.shape != want_shape) {
    return data_loss(*st.file, ": tensor '", st.name, "' has shape ", shape_str(st.shape),
                     ", config.json implies ", shape_str(want_shape));
  }
  PlannedTensor t;
  switch (st.dtype) {
    case StDtype::kF32:
      t.src_type = SourceType::kF32;
      break;
    case StDtype::kF16:
      t.src_type = SourceType::kF16;
      break;
    case StDtype::kBF16:
      t.src_type = SourceType::kBF16;
      break;
    default:
      return unimplemented(*st.file, ": tensor '", st.name, "' has dtype ", st_dtype_name(st.dtype),
                           " (supported: F32, F16, BF16)");
  }
  t.name = std::move(gguf_name);
  t.dims.assign(st.shape.rbegin(), st.shape.rend());
  t.src = st.bytes;
  return t;
}

// Accepts only tensors the converter knows, so a checkpoint of another architecture fails
// loudly instead of losing weights.
Status check_known_names(const HfConfig& c, const SafetensorsModel& w) {
  for (const StTensor* t : w.tensors()) {
    const std::string& n = t->name;
    if (n == "model.embed_tokens.weight" || n == "lm_head.weight" || n == "model.norm.weight")
      continue;
    if (n.rfind("model.layers.", 0) == 0) {
      const size_t dot = n.find('.', 13);
      const std::string idx = n.substr(13, dot == std::string::npos ? 0 : dot - 13);
      const bool numeric = !idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos;
      if (numeric && idx.size() < 6 && std::stoul(idx) < c.num_hidden_layers) {
        const std::string_view suffix = std::string_view(n).substr(dot + 1);
        if (suffix == "self_attn.rotary_emb.inv_freq") continue;  // recomputed from rope_theta
        if (!expected_shape(c, suffix).empty()) continue;
      }
    }
    return unimplemented(*t->file, ": tensor '", n, "' has no GGUF mapping for ",
                         hf_arch_name(c.arch), " with ", c.num_hidden_layers, " layers");
  }
  return ok_status();
}

// token_embd.weight and, unless tied, output.weight. Either HF tensor may be the stored one.
Status plan_embeddings(const HfConfig& c, const SafetensorsModel& w, ModelPlan* plan, bool* tied) {
  const StTensor* embed = w.find("model.embed_tokens.weight");
  const StTensor* head = w.find("lm_head.weight");
  if (embed == nullptr && head == nullptr) {
    return not_found("neither model.embed_tokens.weight nor lm_head.weight is in the checkpoint");
  }
  const StTensor* tok = embed != nullptr ? embed : head;
  const int64_t vocab = c.vocab_size > 0 ? c.vocab_size : tok->shape.empty() ? 0 : tok->shape[0];
  const std::vector<int64_t> shape = {vocab, int64_t{c.hidden_size}};
  ARBOR_ASSIGN_OR_RETURN(PlannedTensor t, plan_tensor(*tok, "token_embd.weight", shape));
  plan->tensors.push_back(std::move(t));
  *tied = embed == nullptr || head == nullptr || c.tie_word_embeddings;
  if (head != nullptr && embed == nullptr && !c.tie_word_embeddings) {
    ARBOR_LOG(kWarn) << "only lm_head.weight is stored; tying it to the embedding";
  }
  plan->hparams.vocab_size = static_cast<uint32_t>(vocab);
  if (!*tied) {
    ARBOR_ASSIGN_OR_RETURN(PlannedTensor out, plan_tensor(*head, "output.weight", shape));
    plan->tensors.push_back(std::move(out));
  }
  return ok_status();
}

Status plan_layers(const HfConfig& c, const SafetensorsModel& w, ModelPlan* plan) {
  const bool permute = c.arch == HfArch::kLlama;  // Qwen2 uses NEOX rope: no permutation
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    for (const auto& lt : kLayerTensors) {
      const std::string hf_name = str_cat("model.layers.", l, ".", lt.hf_suffix);
      const StTensor* st = w.find(hf_name);
      const bool is_bias = lt.hf_suffix.ends_with(".bias");
      if (st == nullptr) {
        if (is_bias) continue;  // Llama has none; Qwen2 has q/k/v biases
        return not_found("tensor '", hf_name, "' is missing from the checkpoint");
      }
      ARBOR_ASSIGN_OR_RETURN(PlannedTensor t,
                             plan_tensor(*st, str_cat("blk.", l, ".", lt.gguf_suffix),
                                         expected_shape(c, lt.hf_suffix)));
      if (permute && lt.gguf_suffix.starts_with("attn_q.")) t.permute_heads = c.num_attention_heads;
      if (permute && lt.gguf_suffix.starts_with("attn_k.")) t.permute_heads = c.num_key_value_heads;
      plan->tensors.push_back(std::move(t));
    }
  }
  return ok_status();
}

LlamaHparams hparams_of(const HfConfig& c, std::string name) {
  LlamaHparams hp;
  hp.arch = std::string(hf_arch_name(c.arch));
  hp.name = std::move(name);
  hp.context_length = c.max_position_embeddings;
  hp.embedding_length = c.hidden_size;
  hp.feed_forward_length = c.intermediate_size;
  hp.block_count = c.num_hidden_layers;
  hp.head_count = c.num_attention_heads;
  hp.head_count_kv = c.num_key_value_heads;
  hp.rope_dimension_count = c.head_dim;
  hp.rms_norm_eps = c.rms_norm_eps;
  hp.rope_freq_base = c.rope_theta;
  hp.write_rope_freq_base = true;
  return hp;
}

}  // namespace

Result<ModelPlan> plan_hf(const HfConfig& c, const SafetensorsModel& w, std::string model_name) {
  ARBOR_RETURN_IF_ERROR(check_known_names(c, w));
  ModelPlan plan;
  plan.hparams = hparams_of(c, std::move(model_name));
  bool tied = false;
  ARBOR_RETURN_IF_ERROR(plan_embeddings(c, w, &plan, &tied));
  ARBOR_RETURN_IF_ERROR(plan_layers(c, w, &plan));
  const StTensor* norm = w.find("model.norm.weight");
  if (norm == nullptr)
    return not_found("tensor 'model.norm.weight' is missing from the checkpoint");
  ARBOR_ASSIGN_OR_RETURN(PlannedTensor t,
                         plan_tensor(*norm, "output_norm.weight", {int64_t{c.hidden_size}}));
  plan.tensors.push_back(std::move(t));
  if (c.rope_scaling) {
    const std::vector<float> factors = llama3_rope_factors(c);
    PlannedTensor r;
    r.name = "rope_freqs.weight";
    r.dims = {static_cast<int64_t>(factors.size())};
    r.owned.resize(factors.size() * 4);
    std::memcpy(r.owned.data(), factors.data(), r.owned.size());
    plan.tensors.push_back(std::move(r));
  }
  return plan;
}

Result<HfModel> load_hf(const std::string& dir) {
  namespace fs = std::filesystem;
  HfModel m;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  ARBOR_ASSIGN_OR_RETURN(std::string config_text, read_file(config_path));
  ARBOR_ASSIGN_OR_RETURN(m.config, parse_hf_config(config_text, config_path));
  ARBOR_ASSIGN_OR_RETURN(m.weights, SafetensorsModel::open_dir(dir));
  const std::string name = fs::path(dir).filename().empty()
                               ? fs::path(dir).parent_path().filename().string()
                               : fs::path(dir).filename().string();
  ARBOR_ASSIGN_OR_RETURN(m.plan, plan_hf(m.config, m.weights, name));
  HfTokenizerFiles tok;
  ARBOR_ASSIGN_OR_RETURN(tok.tokenizer_json,
                         read_file((fs::path(dir) / "tokenizer.json").string()));
  const fs::path tok_config = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(tok_config)) {
    ARBOR_ASSIGN_OR_RETURN(tok.tokenizer_config_json, read_file(tok_config.string()));
  }
  tok.config_bos_id = m.config.bos_token_id;
  tok.config_eos_id = m.config.eos_token_id;
  tok.model_vocab_size = m.plan.hparams.vocab_size;
  tok.pre_name = m.config.arch == HfArch::kQwen2 ? "qwen2" : "llama-bpe";
  auto kv = hf_tokenizer_metadata(tok);
  if (!kv.ok()) return kv.status().with_context(dir);
  m.plan.tokenizer_metadata = std::move(kv).value();
  return m;
}

}  // namespace arbor::convert
