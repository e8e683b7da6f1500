// RoPE scaling and attention layout of a Hugging Face config: what llama.cpp's GGUF can carry
// for each architecture, and refusals (naming the field) for what it cannot.
#include <cmath>
#include <string>

#include "convert/hf_internal.h"

namespace arbor::convert::hf_internal {

namespace {

bool close(double a, double b) { return std::fabs(a - b) <= 1e-6 * std::max(1.0, std::fabs(b)); }

Result<RopeScalingType> parse_type(const Json& rope, const std::string& field,
                                   const std::string& name) {
  const Json* t = rope.contains("rope_type") ? &rope["rope_type"]
                  : rope.contains("type")    ? &rope["type"]
                                             : nullptr;
  if (t == nullptr || t->is_null()) return RopeScalingType::kNone;
  if (!t->is_string()) {
    return invalid_argument(name, ": ", field, ".rope_type = ", t->dump(), " is not a string");
  }
  const std::string s = t->get<std::string>();
  if (s == "default") return RopeScalingType::kNone;
  if (s == "linear") return RopeScalingType::kLinear;
  if (s == "yarn") return RopeScalingType::kYarn;
  if (s == "longrope" || s == "su") return RopeScalingType::kLongRope;
  if (s == "llama3") return RopeScalingType::kLlama3;
  return unimplemented(name, ": ", field, " type '", s, "' is not supported");
}

Status read_factors(const Json& rope, const char* key, size_t want, std::vector<float>* out,
                    const std::string& field, const std::string& name) {
  const auto it = rope.find(key);
  if (it == rope.end() || !it->is_array()) {
    return not_found(name, ": ", field, ".", key, " is missing (a list of ", want, " numbers)");
  }
  for (const auto& v : *it) {
    if (!v.is_number() || !(v.get<double>() > 0.0)) {
      return invalid_argument(name, ": ", field, ".", key, " has ", v.dump(),
                              ", not a positive number");
    }
    out->push_back(static_cast<float>(v.get<double>()));
  }
  if (out->size() != want) {
    return invalid_argument(name, ": ", field, ".", key, " has ", out->size(),
                            " entries, the rotary dimension ", want * 2, " needs ", want);
  }
  return ok_status();
}

Status read_llama3(const Json& rope, RopeScaling* s, const std::string& field,
                   const std::string& name) {
  s->factor = 8.0f;
  s->original_max_position_embeddings = 8192;
  ARBOR_RETURN_IF_ERROR(read_float(rope, "factor", false, &s->factor, name));
  ARBOR_RETURN_IF_ERROR(read_float(rope, "low_freq_factor", false, &s->low_freq_factor, name));
  ARBOR_RETURN_IF_ERROR(read_float(rope, "high_freq_factor", false, &s->high_freq_factor, name));
  ARBOR_RETURN_IF_ERROR(read_u32(rope, "original_max_position_embeddings", false,
                                 &s->original_max_position_embeddings, name));
  if (s->high_freq_factor <= s->low_freq_factor) {
    return invalid_argument(name, ": ", field, " high_freq_factor ", s->high_freq_factor,
                            " must exceed low_freq_factor ", s->low_freq_factor);
  }
  return ok_status();
}

// YaRN as llama.cpp evaluates it: factor, original context, betas; the attention factor is
// always recomputed from the factor (and, for Ministral 3, mscale_all_dim).
Status read_yarn(const Json& rope, HfConfig* c, const std::string& field,
                 const std::string& name) {
  RopeScaling& s = c->rope;
  ARBOR_RETURN_IF_ERROR(read_float(rope, "factor", true, &s.factor, name));
  ARBOR_RETURN_IF_ERROR(read_u32(rope, "original_max_position_embeddings", true,
                                 &s.original_max_position_embeddings, name));
  // transformers derives the interpolation factor from the two context lengths.
  const double implied =
      static_cast<double>(c->max_position_embeddings) / s.original_max_position_embeddings;
  if (!close(s.factor, implied)) {
    return unimplemented(name, ": ", field, ".factor ", s.factor,
                         " != max_position_embeddings / original_max_position_embeddings = ",
                         implied, " (transformers uses the ratio, the GGUF the factor)");
  }
  for (const char* key : {"attention_factor", "attn_factor"}) {
    if (rope.contains(key) && !rope[key].is_null()) {
      return unimplemented(name, ": ", field, ".", key,
                           " is not supported (llama.cpp derives the YaRN attention factor)");
    }
  }
  if (rope.contains("truncate") && rope["truncate"] == false) {
    return unimplemented(name, ": ", field, ".truncate = false is not supported");
  }
  ARBOR_RETURN_IF_ERROR(read_opt_float(rope, "beta_fast", &s.beta_fast, name));
  ARBOR_RETURN_IF_ERROR(read_opt_float(rope, "beta_slow", &s.beta_slow, name));
  ARBOR_RETURN_IF_ERROR(read_opt_float(rope, "extrapolation_factor", &s.extrapolation_factor, name));
  ARBOR_RETURN_IF_ERROR(read_opt_float(rope, "mscale_all_dim", &s.mscale_all_dim, name));
  ARBOR_RETURN_IF_ERROR(read_opt_float(rope, "llama_4_scaling_beta", &s.llama_4_scaling_beta, name));
  std::optional<float> mscale;
  ARBOR_RETURN_IF_ERROR(read_opt_float(rope, "mscale", &mscale, name));
  const bool ministral3 = c->arch == HfArch::kMistral3 && c->model_type == "ministral3";
  if (ministral3 && (!s.mscale_all_dim || !s.llama_4_scaling_beta)) {
    return not_found(name, ": ministral3 ", field, " needs mscale_all_dim and llama_4_scaling_beta");
  }
  if (!ministral3 && (s.mscale_all_dim || s.llama_4_scaling_beta)) {
    return unimplemented(name, ": ", field, ".", s.mscale_all_dim ? "mscale_all_dim" : "llama_4_scaling_beta",
                         " is only supported for ministral3");
  }
  if (s.mscale_all_dim && mscale && *mscale != 1.0f) {
    return unimplemented(name, ": ", field, ".mscale = ", *mscale,
                         " is not supported (llama.cpp assumes 1 with mscale_all_dim)");
  }
  return ok_status();
}

Status read_longrope(const Json& rope, HfConfig* c, const std::string& field,
                     const std::string& name) {
  RopeScaling& s = c->rope;
  if (rope.contains("attention_factor") && !rope["attention_factor"].is_null()) {
    return unimplemented(name, ": ", field,
                         ".attention_factor is not supported (llama.cpp derives it from "
                         "max_position_embeddings / original_max_position_embeddings)");
  }
  ARBOR_RETURN_IF_ERROR(read_factors(rope, "long_factor", c->rope_dim / 2, &s.long_factor, field, name));
  return read_factors(rope, "short_factor", c->rope_dim / 2, &s.short_factor, field, name);
}

std::string allowed_list(const std::vector<RopeScalingType>& allowed) {
  std::string out;
  for (auto t : allowed) out += (out.empty() ? "" : ", ") + std::string(rope_scaling_name(t));
  return out.empty() ? "none" : out;
}

// Partial rotary embedding: only Phi-3's GGUF carries a rope dimension count.
Status read_rope_dim(const Json& j, const Json& rope, HfConfig* c, const std::string& name) {
  double factor = 1.0;
  for (const Json* src : {&rope, &j}) {
    if (src->contains("partial_rotary_factor") && (*src)["partial_rotary_factor"].is_number()) {
      factor = (*src)["partial_rotary_factor"].get<double>();
      break;
    }
  }
  if (!(factor > 0.0 && factor <= 1.0)) {
    return invalid_argument(name, ": partial_rotary_factor ", factor, " is not in (0, 1]");
  }
  if (c->arch == HfArch::kPhi3) {
    c->rope_dim = static_cast<uint32_t>(factor * c->hidden_size) / c->num_attention_heads;
  } else if (factor != 1.0) {
    return unimplemented(name, ": partial_rotary_factor ", factor, " is not supported for ",
                         hf_arch_name(c->arch));
  }
  if (c->rope_dim == 0 || c->rope_dim % 2 != 0) {
    return invalid_argument(name, ": the rotary dimension ", c->rope_dim, " is not even");
  }
  return ok_status();
}

}  // namespace

Status read_rope(const Json& j, const std::vector<RopeScalingType>& allowed, HfConfig* c,
                 const std::string& name) {
  std::string field = j.contains("rope_parameters") && !j["rope_parameters"].is_null()
                          ? "rope_parameters"
                          : "rope_scaling";
  const Json none = Json::object();
  const Json& rp = j.contains(field) && !j[field].is_null() ? j[field] : none;
  if (!rp.is_object()) return invalid_argument(name, ": \"", field, "\" is not an object");
  const Json* full = &rp;
  if (rp.contains("full_attention") || rp.contains("sliding_attention")) {
    const Json& swa = rp.contains("sliding_attention") ? rp["sliding_attention"] : none;
    ARBOR_ASSIGN_OR_RETURN(auto swa_type, parse_type(swa, field + ".sliding_attention", name));
    if (swa_type != RopeScalingType::kNone) {
      return unimplemented(name, ": ", field, ".sliding_attention type '",
                           rope_scaling_name(swa_type), "' is not supported (sliding layers "
                           "are never scaled in GGUF)");
    }
    ARBOR_RETURN_IF_ERROR(read_opt_float(swa, "rope_theta", &c->rope_theta_swa, name));
    full = rp.contains("full_attention") ? &rp["full_attention"] : &none;
    field += ".full_attention";
  }
  ARBOR_RETURN_IF_ERROR(read_float(*full, "rope_theta", false, &c->rope_theta, name));
  if (!c->rope_theta_swa) {
    ARBOR_RETURN_IF_ERROR(read_opt_float(j, "rope_local_base_freq", &c->rope_theta_swa, name));
  }
  if (c->arch == HfArch::kGemma3 && !c->rope_theta_swa) c->rope_theta_swa = 10000.0f;
  ARBOR_RETURN_IF_ERROR(read_rope_dim(j, *full, c, name));
  c->rope.original_max_position_embeddings = 4096;  // Phi3Config's default
  ARBOR_RETURN_IF_ERROR(read_u32(j, "original_max_position_embeddings", false,
                                 &c->rope.original_max_position_embeddings, name));
  ARBOR_ASSIGN_OR_RETURN(c->rope.type, parse_type(*full, field, name));
  if (c->rope.type == RopeScalingType::kNone) return ok_status();
  bool ok = false;
  for (auto t : allowed) ok = ok || t == c->rope.type;
  if (!ok) {
    return unimplemented(name, ": ", field, " type '", rope_scaling_name(c->rope.type),
                         "' is not supported for ", hf_arch_name(c->arch), " (",
                         allowed_list(allowed), ")");
  }
  switch (c->rope.type) {
    case RopeScalingType::kNone:
      return ok_status();
    case RopeScalingType::kLinear:
      return read_float(*full, "factor", true, &c->rope.factor, name);
    case RopeScalingType::kLlama3:
      return read_llama3(*full, &c->rope, field, name);
    case RopeScalingType::kYarn:
      return read_yarn(*full, c, field, name);
    case RopeScalingType::kLongRope:
      ARBOR_RETURN_IF_ERROR(read_u32(*full, "original_max_position_embeddings", false,
                                     &c->rope.original_max_position_embeddings, name));
      return read_longrope(*full, c, field, name);
  }
  return ok_status();
}

namespace {

// layer_types (transformers >= 4.53), when present, must be the fixed pattern llama.cpp uses:
// layer il slides iff il % period < period - 1 (Gemma 2: period 2, Gemma 3: period 6).
Status check_layer_types(const Json& j, const HfConfig& c, uint32_t period,
                         const std::string& name) {
  const auto it = j.find("layer_types");
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_array() || it->size() != c.num_hidden_layers) {
    return invalid_argument(name, ": layer_types is not a list of ", c.num_hidden_layers,
                            " strings");
  }
  for (uint32_t il = 0; il < c.num_hidden_layers; ++il) {
    const bool swa = il % period < period - 1;
    const char* want = swa ? "sliding_attention" : "full_attention";
    if ((*it)[il] != want) {
      return unimplemented(name, ": layer_types[", il, "] = ", (*it)[il].dump(), "; ",
                           hf_arch_name(c.arch), " GGUF fixes every ", period,
                           "th layer to full attention and the others to sliding (", want, ")");
    }
  }
  return ok_status();
}

// Gemma's attention scale is not stored in GGUF: llama.cpp uses 1/sqrt(head_dim), or
// 1/sqrt(hidden_size / num_attention_heads) for the 27B models (by layer count).
Status check_gemma_scale(const Json& j, HfConfig* c, uint32_t layers_27b,
                         const std::string& name) {
  c->query_pre_attn_scalar = 256.0f;
  ARBOR_RETURN_IF_ERROR(read_float(j, "query_pre_attn_scalar", false, &c->query_pre_attn_scalar, name));
  const float want = c->num_hidden_layers == layers_27b
                         ? static_cast<float>(c->hidden_size / c->num_attention_heads)
                         : static_cast<float>(c->head_dim);
  if (c->query_pre_attn_scalar != want) {
    return unimplemented(name, ": query_pre_attn_scalar ", c->query_pre_attn_scalar,
                         " is not supported: a ", hf_arch_name(c->arch), " GGUF with ",
                         c->num_hidden_layers, " layers scales attention by 1/sqrt(", want, ")");
  }
  return ok_status();
}

Status read_gemma(const Json& j, HfConfig* c, const std::string& name) {
  const bool g2 = c->arch == HfArch::kGemma2;
  c->sliding_window = 4096;
  ARBOR_RETURN_IF_ERROR(read_u32(j, "sliding_window", false, &c->sliding_window, name));
  c->write_sliding_window = true;
  ARBOR_RETURN_IF_ERROR(check_gemma_scale(j, c, g2 ? 46 : 62, name));
  ARBOR_RETURN_IF_ERROR(read_opt_float(j, "attn_logit_softcapping", &c->attn_logit_softcapping, name));
  ARBOR_RETURN_IF_ERROR(read_opt_float(j, "final_logit_softcapping", &c->final_logit_softcapping, name));
  if (g2) {
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
      if (j.contains(key) && j[key].is_null()) {
        return unimplemented(name, ": ", key, " = null is not supported (gemma2 GGUF always "
                             "soft-caps)");
      }
    }
    if (!c->attn_logit_softcapping) c->attn_logit_softcapping = 50.0f;
    if (!c->final_logit_softcapping) c->final_logit_softcapping = 30.0f;
    return check_layer_types(j, *c, 2, name);
  }
  if (c->attn_logit_softcapping) {
    return unimplemented(name, ": attn_logit_softcapping is not supported for gemma3");
  }
  if (j.contains("sliding_window_pattern") && j["sliding_window_pattern"] == 1) {
    c->write_sliding_window = false;  // every layer global; llama.cpp then writes no window
    return ok_status();
  }
  if (j.contains("sliding_window_pattern") && j["sliding_window_pattern"] != 6) {
    return unimplemented(name, ": sliding_window_pattern ", j["sliding_window_pattern"].dump(),
                         " is not supported (gemma3 GGUF: 6)");
  }
  return check_layer_types(j, *c, 6, name);
}

// SmolLM3 skips RoPE in every 4th layer; llama.cpp hard-codes that step.
Status check_no_rope(const Json& j, const HfConfig& c, const std::string& name) {
  if (j.contains("no_rope_layer_interval") && j["no_rope_layer_interval"] != 4) {
    return unimplemented(name, ": no_rope_layer_interval ", j["no_rope_layer_interval"].dump(),
                         " is not supported (smollm3 GGUF: 4)");
  }
  const auto it = j.find("no_rope_layers");
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_array() || it->size() != c.num_hidden_layers) {
    return invalid_argument(name, ": no_rope_layers is not a list of ", c.num_hidden_layers,
                            " flags");
  }
  for (uint32_t il = 0; il < c.num_hidden_layers; ++il) {
    const int want = (il + 1) % 4 != 0 ? 1 : 0;
    if (!(*it)[il].is_number_integer() || (*it)[il].get<int>() != want) {
      return unimplemented(name, ": no_rope_layers[", il, "] = ", (*it)[il].dump(),
                           "; smollm3 GGUF uses RoPE in layer il iff (il + 1) % 4 != 0 (", want,
                           ")");
    }
  }
  return ok_status();
}

Status refuse_if_set(const Json& j, const char* key, const HfConfig& c, const std::string& name) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null() || *it == false) return ok_status();
  return unimplemented(name, ": \"", key, "\" = ", it->dump(), " is not supported for ",
                       hf_arch_name(c.arch), " (its GGUF has no sliding-window attention)");
}

}  // namespace

Status read_layout(const Json& j, HfConfig* c, const std::string& name) {
  switch (c->arch) {
    case HfArch::kLlama:
    case HfArch::kQwen2:
      return ok_status();
    case HfArch::kGemma2:
    case HfArch::kGemma3:
      return read_gemma(j, c, name);
    case HfArch::kQwen3:
      return refuse_if_set(j, "use_sliding_window", *c, name);
    case HfArch::kSmolLM3:
      ARBOR_RETURN_IF_ERROR(refuse_if_set(j, "use_sliding_window", *c, name));
      return check_no_rope(j, *c, name);
    case HfArch::kMistral3:
    case HfArch::kOlmo2:
      return refuse_if_set(j, "sliding_window", *c, name);
    case HfArch::kPhi3:
      // llama.cpp writes the window (0 when absent) but disables Phi-3 SWA when it evaluates.
      c->write_sliding_window = true;
      return read_u32(j, "sliding_window", false, &c->sliding_window, name);
    case HfArch::kGranite:
      ARBOR_RETURN_IF_ERROR(read_opt_float(j, "embedding_multiplier", &c->embedding_multiplier, name));
      ARBOR_RETURN_IF_ERROR(read_opt_float(j, "residual_multiplier", &c->residual_multiplier, name));
      ARBOR_RETURN_IF_ERROR(read_opt_float(j, "attention_multiplier", &c->attention_multiplier, name));
      if (!j.contains("logits_scaling")) c->logits_scaling = 1.0f;  // GraniteConfig's default
      return read_opt_float(j, "logits_scaling", &c->logits_scaling, name);
  }
  return ok_status();
}

}  // namespace arbor::convert::hf_internal
