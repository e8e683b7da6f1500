#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <variant>

#include "base/log.h"
#include "base/status.h"

namespace arbor::model {
namespace {

// Reads an integer key into a positive int, naming the key on error.
Result<int> get_positive_int(const gguf::GgufFile& f, const std::string& key) {
  ARBOR_ASSIGN_OR_RETURN(const int64_t v, f.get_i64(key));
  if (v < 1 || v > std::numeric_limits<int32_t>::max()) {
    return invalid_argument(f.name(), ": ", key, " = ", v, " (must be in [1, 2^31))");
  }
  return (int)v;
}

// A per-layer key that may be an array (llama.cpp's get_key_or_arr): arbor runs one value for
// every layer, so an array must hold one value.
Result<int> get_uniform_int(const gguf::GgufFile& f, const std::string& key, int layers) {
  const gguf::Value* v = f.find(key);
  if (v == nullptr || v->type != gguf::ValueType::kArray) return get_positive_int(f, key);
  ARBOR_ASSIGN_OR_RETURN(const std::vector<int32_t> items, f.get_i32_array(key));
  if ((int)items.size() != layers) {
    return invalid_argument(f.name(), ": ", key, " has ", items.size(), " entries for ", layers,
                            " layers");
  }
  for (int32_t x : items) {
    if (x != items[0]) {
      return unimplemented(f.name(), ": ", key, " differs between layers (", items[0], " and ", x,
                           "); arbor runs one value for every layer");
    }
  }
  if (items[0] < 1) return invalid_argument(f.name(), ": ", key, " = ", items[0], " (must be >= 1)");
  return items[0];
}

Result<int> get_int_or(const gguf::GgufFile& f, const std::string& key, int fallback) {
  if (f.find(key) == nullptr) return fallback;
  return get_positive_int(f, key);
}

Result<float> get_float_or(const gguf::GgufFile& f, const std::string& key, float fallback) {
  if (f.find(key) == nullptr) return fallback;
  return f.get_f32(key);
}

Status check_finite_positive(const gguf::GgufFile& f, const std::string& key, float v) {
  if (!(v > 0.0f) || !std::isfinite(v)) {
    return invalid_argument(f.name(), ": ", key, " = ", v, " (must be a positive finite number)");
  }
  return ok_status();
}

// Keys llama.cpp reads for architectures arbor does not run in this form: present, they would
// change the function, so they are refused by name.
Status refuse_unsupported_keys(const gguf::GgufFile& f, const std::string& a, int head_dim,
                               int rope_dim) {
  for (const char* k : {".attention.key_length_mla", ".attention.q_lora_rank",
                        ".attention.kv_lora_rank", ".attention.clamp_kqv",
                        ".attention.max_alibi_bias", ".expert_group_count",
                        ".expert_group_used_count"}) {
    const gguf::Value* v = f.find(a + k);
    if (v == nullptr) continue;
    auto zero = f.get_i64(a + k);
    if (zero.ok() && *zero == 0) continue;
    const bool groups = std::string_view(k).starts_with(".expert_group");
    if (groups && zero.ok() && *zero == 1) continue;  // one group: no group selection
    return unimplemented(f.name(), ": ", a, k, " is set; arbor does not run ",
                         groups ? "grouped expert selection" : "this attention variant");
  }
  const std::pair<const char*, int> same[] = {{".attention.key_length_swa", head_dim},
                                              {".attention.value_length_swa", head_dim},
                                              {".rope.dimension_count_swa", rope_dim}};
  for (const auto& [k, want] : same) {
    if (f.find(a + k) == nullptr) continue;
    ARBOR_ASSIGN_OR_RETURN(const int v, get_positive_int(f, a + k));
    if (v != want) {
      return unimplemented(f.name(), ": ", a, k, " = ", v, " differs from the full-attention "
                           "layers' ", want, "; arbor runs one head size for every layer");
    }
  }
  return ok_status();
}

Status read_shape(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  ARBOR_ASSIGN_OR_RETURN(c.dim, get_positive_int(f, a + ".embedding_length"));
  ARBOR_ASSIGN_OR_RETURN(c.num_layers, get_positive_int(f, a + ".block_count"));
  if (!c.spec->ffn_length_optional || f.find(a + ".feed_forward_length") != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(c.ffn_dim,
                           get_uniform_int(f, a + ".feed_forward_length", c.num_layers));
  }
  ARBOR_ASSIGN_OR_RETURN(c.num_heads,
                         get_uniform_int(f, a + ".attention.head_count", c.num_layers));
  c.num_kv_heads = c.num_heads;
  if (f.find(a + ".attention.head_count_kv") != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(c.num_kv_heads,
                           get_uniform_int(f, a + ".attention.head_count_kv", c.num_layers));
  }
  ARBOR_ASSIGN_OR_RETURN(c.context_length, get_positive_int(f, a + ".context_length"));
  ARBOR_ASSIGN_OR_RETURN(c.rms_eps, f.get_f32(a + ".attention.layer_norm_rms_epsilon"));
  if (c.num_heads % c.num_kv_heads != 0) {
    return invalid_argument(f.name(), ": ", a, ".attention.head_count = ", c.num_heads,
                            " is not a multiple of ", a, ".attention.head_count_kv = ",
                            c.num_kv_heads);
  }
  const bool explicit_head = f.find(a + ".attention.key_length") != nullptr;
  ARBOR_ASSIGN_OR_RETURN(c.head_dim,
                         get_int_or(f, a + ".attention.key_length", c.dim / c.num_heads));
  if (!explicit_head && c.head_dim * c.num_heads != c.dim) {
    return invalid_argument(f.name(), ": ", a, ".embedding_length = ", c.dim,
                            " is not a multiple of ", a, ".attention.head_count = ", c.num_heads);
  }
  ARBOR_ASSIGN_OR_RETURN(const int v_dim, get_int_or(f, a + ".attention.value_length", c.head_dim));
  if (v_dim != c.head_dim) {
    return unimplemented(f.name(), ": ", a, ".attention.value_length = ", v_dim, " differs from ",
                         a, ".attention.key_length = ", c.head_dim, " (not supported)");
  }
  if (c.head_dim % 2 != 0) {
    return invalid_argument(f.name(), ": head_dim ", c.head_dim, " is odd");
  }
  return check_finite_positive(f, a + ".attention.layer_norm_rms_epsilon", c.rms_eps);
}

// The full-attention layers' RoPE (ropes[0]) from the generic keys, as llama.cpp reads them.
Status read_rope(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  RopeVariant r;
  ARBOR_ASSIGN_OR_RETURN(r.theta, get_float_or(f, a + ".rope.freq_base", 10000.0f));
  ARBOR_RETURN_IF_ERROR(check_finite_positive(f, a + ".rope.freq_base", r.theta));
  ARBOR_ASSIGN_OR_RETURN(c.rope_dim, get_int_or(f, a + ".rope.dimension_count", c.head_dim));
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return invalid_argument(f.name(), ": ", a, ".rope.dimension_count = ", c.rope_dim,
                            " (must be even and <= head_dim ", c.head_dim, ")");
  }
  if (c.spec->rope_whole_head && c.rope_dim != c.head_dim) {
    return invalid_argument(f.name(), ": ", a, ".rope.dimension_count = ", c.rope_dim,
                            " must equal head_dim ", c.head_dim, " for ", a);
  }
  c.rope_neox = c.spec->rope_neox;
  const std::string type_key = a + ".rope.scaling.type";
  std::string type = "linear";  // llama.cpp's default: linear with factor 0, i.e. none
  if (f.find(type_key) != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(type, f.get_string(type_key));
  }
  float factor = 0.0f;
  if (f.find(a + ".rope.scaling.factor") != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(factor, f.get_f32(a + ".rope.scaling.factor"));
  } else {
    ARBOR_ASSIGN_OR_RETURN(factor, get_float_or(f, a + ".rope.scale_linear", 0.0f));
  }
  if (factor < 0.0f || !std::isfinite(factor)) {
    return invalid_argument(f.name(), ": ", a, ".rope.scaling.factor = ", factor,
                            " (must be >= 0)");
  }
  ARBOR_ASSIGN_OR_RETURN(r.original_context,
                         get_int_or(f, a + ".rope.scaling.original_context_length",
                                    c.context_length));
  ARBOR_ASSIGN_OR_RETURN(const float attn_factor,
                         get_float_or(f, a + ".rope.scaling.attn_factor", 1.0f));
  ARBOR_RETURN_IF_ERROR(check_finite_positive(f, a + ".rope.scaling.attn_factor", attn_factor));
  r.freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
  if (type == "none") {
    r.freq_scale = 1.0f;
  } else if (type == "linear") {
    r.scaling = r.freq_scale == 1.0f ? RopeScaling::kNone : RopeScaling::kLinear;
  } else if (type == "yarn") {
    r.scaling = RopeScaling::kYarn;
  } else if (type == "longrope") {
    r.scaling = RopeScaling::kLongRope;
  } else if (type == "llama3") {
    r.scaling = RopeScaling::kLlama3;
    r.freq_scale = 1.0f;
    r.llama3_factor = factor;
    ARBOR_ASSIGN_OR_RETURN(r.llama3_low_freq_factor,
                           get_float_or(f, a + ".rope.scaling.low_freq_factor", 1.0f));
    ARBOR_ASSIGN_OR_RETURN(r.llama3_high_freq_factor,
                           get_float_or(f, a + ".rope.scaling.high_freq_factor", 4.0f));
    if (!(factor > 0.0f)) {
      return invalid_argument(f.name(), ": ", a, ".rope.scaling.factor = ", factor,
                              " (must be > 0 for llama3 scaling)");
    }
  } else {
    return unimplemented(f.name(), ": ", type_key, " = \"", type,
                         "\" (supported: none, linear, yarn, longrope, llama3)");
  }
  r.mscale = attn_factor;
  if (c.spec->mistral_keys) {
    ARBOR_ASSIGN_OR_RETURN(r.yarn_beta_fast,
                           get_float_or(f, a + ".rope.scaling.yarn_beta_fast", 32.0f));
    ARBOR_ASSIGN_OR_RETURN(r.yarn_beta_slow,
                           get_float_or(f, a + ".rope.scaling.yarn_beta_slow", 1.0f));
  }
  if (r.scaling == RopeScaling::kYarn && r.freq_scale < 1.0f) {
    // llama.cpp's yarn_attn_factor: get_mscale(factor) (over get_mscale(factor, log_mul) when
    // the file gives yarn_log_multiplier), times attn_factor.
    const float f_factor = 1.0f / r.freq_scale;
    auto get_mscale = [](float s, float m) { return s <= 1.0f ? 1.0f : 0.1f * m * std::log(s) + 1.0f; };
    float log_mul = 0.0f;
    if (c.spec->mistral_keys) {
      ARBOR_ASSIGN_OR_RETURN(log_mul,
                             get_float_or(f, a + ".rope.scaling.yarn_log_multiplier", 0.0f));
    }
    r.mscale *= log_mul != 0.0f ? get_mscale(f_factor, 1.0f) / get_mscale(f_factor, log_mul)
                                : get_mscale(f_factor, 1.0f);
  }
  r.use_freq_factors = c.spec->rope_freqs;  // the model binds a table only where allowed
  c.longrope_original_context = r.original_context;
  c.ropes = {r};
  return ok_status();
}

// gpt-oss's sliding layers: the full-attention layers' RoPE, scaling included (llama.cpp sets
// rope_freq_scale_train_swa to the global scale), on rope.freq_base_swa when the file gives a
// different base (then ropes[1]: ropes[0] with that base).
Status use_global_rope_on_sliding(const gguf::GgufFile& f, const std::string& a, int window,
                                  const std::vector<bool>& sliding, ModelConfig& c) {
  RopeVariant swa = c.ropes[0];
  ARBOR_ASSIGN_OR_RETURN(swa.theta, get_float_or(f, a + ".rope.freq_base_swa", swa.theta));
  ARBOR_RETURN_IF_ERROR(check_finite_positive(f, a + ".rope.freq_base_swa", swa.theta));
  const bool own_base = swa.theta != c.ropes[0].theta;
  if (own_base) c.ropes.push_back(swa);
  for (int l = 0; l < c.num_layers; ++l) {
    if (!sliding[l]) continue;
    c.layers[l].window = window;
    c.layers[l].rope = own_base ? 1 : 0;
  }
  return ok_status();
}

// The sliding layers (ArchSpec::swa_*): their windows and, when their RoPE differs, ropes[1].
Status read_sliding(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  c.layers.assign(c.num_layers, LayerSpec{});
  const ArchSpec& s = *c.spec;
  const std::string wkey = a + ".attention.sliding_window";
  int window = s.swa_default_window;
  if (f.find(wkey) != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(const int64_t w, f.get_i64(wkey));
    if (w < 0 || w > std::numeric_limits<int32_t>::max()) {
      return invalid_argument(f.name(), ": ", wkey, " = ", w);
    }
    window = static_cast<int>(w);
  } else if (s.swa_key_required) {
    return not_found(f.name(), ": ", wkey, " is missing (", a, " has sliding-window layers)");
  } else if (s.swa_needs_key) {
    window = 0;
  }
  if (s.swa_pattern == 0) {
    if (window > 0) {  // llama.cpp does not read it for this architecture (Phi-3: disabled)
      ARBOR_LOG(kWarn) << f.name() << ": " << wkey << " = " << window << " is not used: " << a
                       << " runs full attention on every layer, as llama.cpp does";
    }
    return ok_status();
  }
  if (window == 0) return ok_status();
  const std::string pkey = a + ".attention.sliding_window_pattern";
  std::vector<bool> sliding(c.num_layers);
  const gguf::Value* pv = f.find(pkey);
  if (pv != nullptr && pv->type == gguf::ValueType::kArray) {
    const auto& items = std::get<gguf::Array>(pv->data).items;
    if ((int)items.size() != c.num_layers) {
      return invalid_argument(f.name(), ": ", pkey, " has ", items.size(), " entries for ",
                              c.num_layers, " layers");
    }
    for (int l = 0; l < c.num_layers; ++l) {
      if (items[l].type != gguf::ValueType::kBool) {
        return invalid_argument(f.name(), ": ", pkey, " must be an array of bools");
      }
      sliding[l] = std::get<bool>(items[l].data);
    }
  } else {
    int pattern = s.swa_pattern;
    if (pv != nullptr) {
      ARBOR_ASSIGN_OR_RETURN(const int64_t p, f.get_i64(pkey));
      if (p < 0 || p > std::numeric_limits<int32_t>::max()) {
        return invalid_argument(f.name(), ": ", pkey, " = ", p);
      }
      pattern = static_cast<int>(p);
    }
    for (int l = 0; l < c.num_layers; ++l) {
      sliding[l] = pattern == 0 || l % pattern < pattern - 1;
    }
  }
  if (s.swa_rope_is_global) return use_global_rope_on_sliding(f, a, window, sliding, c);
  RopeVariant swa = c.ropes[0];
  swa.scaling = RopeScaling::kNone;
  swa.freq_scale = 1.0f;
  swa.use_freq_factors = false;
  if (!s.swa_base_is_global) swa.theta = 10000.0f;
  ARBOR_ASSIGN_OR_RETURN(swa.theta, get_float_or(f, a + ".rope.freq_base_swa", swa.theta));
  ARBOR_RETURN_IF_ERROR(check_finite_positive(f, a + ".rope.freq_base_swa", swa.theta));
  if (s.arch == Arch::kOlmo2) swa.mscale = 1.0f;  // OLMo 3's sliding layers: plain RoPE
  c.ropes.push_back(swa);
  for (int l = 0; l < c.num_layers; ++l) {
    if (!sliding[l]) continue;
    c.layers[l].window = window;
    c.layers[l].rope = 1;
  }
  return ok_status();
}

// The expert keys (ArchSpec::experts), as llama.cpp reads them for qwen3moe and llama.
Status read_experts(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  const Experts kind = c.spec->experts;
  const std::string count_key = a + ".expert_count", used_key = a + ".expert_used_count";
  int64_t count = 0;
  if (f.find(count_key) != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(count, f.get_i64(count_key));
  }
  if (count < 0 || count > 512) {
    return invalid_argument(f.name(), ": ", count_key, " = ", count, " (must be in [0, 512])");
  }
  if (count == 0) {
    if (kind == Experts::kRequired) {
      return invalid_argument(f.name(), ": ", count_key, " is ", f.find(count_key) ? "0" : "missing",
                              "; ", a, " is a mixture of experts");
    }
    return ok_status();
  }
  if (kind == Experts::kNone) {
    return unimplemented(f.name(), ": ", count_key, " = ", count, "; arbor runs mixtures of "
                         "experts on the qwen2moe, qwen3moe, gpt-oss and llama rows, not on ", a);
  }
  c.num_experts = static_cast<int>(count);
  if (f.find(used_key) == nullptr) {
    return not_found(f.name(), ": ", used_key, " is missing (", count_key, " = ", count, ")");
  }
  ARBOR_ASSIGN_OR_RETURN(c.num_experts_used, get_uniform_int(f, used_key, c.num_layers));
  if (c.num_experts_used > c.num_experts) {
    return invalid_argument(f.name(), ": ", used_key, " = ", c.num_experts_used, " exceeds ",
                            count_key, " = ", c.num_experts);
  }
  c.expert_ffn_dim = c.ffn_dim;
  const std::string ffn_key = a + ".expert_feed_forward_length";
  if (kind == Experts::kRequired && f.find(ffn_key) != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(c.expert_ffn_dim, get_uniform_int(f, ffn_key, c.num_layers));
  } else if (kind == Experts::kRequired) {
    c.expert_ffn_dim = c.ffn_dim / c.num_experts_used;  // llama.cpp's fallback
  }
  if (c.expert_ffn_dim < 1 && c.ffn_dim == 0) {
    return not_found(f.name(), ": ", ffn_key, " is missing (and so is ", a,
                     ".feed_forward_length)");
  }
  if (c.expert_ffn_dim < 1) return invalid_argument(f.name(), ": the expert FFN length is 0");
  if (c.spec->shared_expert) {
    c.shared_expert_ffn_dim = c.ffn_dim;  // llama.cpp's fallback
    const std::string shared_key = a + ".expert_shared_feed_forward_length";
    if (f.find(shared_key) != nullptr) {
      ARBOR_ASSIGN_OR_RETURN(c.shared_expert_ffn_dim, get_uniform_int(f, shared_key, c.num_layers));
    }
    if (c.shared_expert_ffn_dim < 1) {
      return invalid_argument(f.name(), ": the shared expert's FFN length is 0 (",
                              shared_key, " and ", a, ".feed_forward_length are missing)");
    }
  }
  return ok_status();
}

// Soft-caps, scales and the other per-architecture keys of the row.
Status read_arch_keys(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  const ArchSpec& s = *c.spec;
  c.attn_softcap = s.attn_softcap_default;
  if (s.attn_softcap_key) {
    ARBOR_ASSIGN_OR_RETURN(c.attn_softcap,
                           get_float_or(f, a + ".attn_logit_softcapping", c.attn_softcap));
  }
  c.final_softcap = s.final_softcap_default;
  if (s.final_softcap_key) {
    ARBOR_ASSIGN_OR_RETURN(c.final_softcap,
                           get_float_or(f, a + ".final_logit_softcapping", c.final_softcap));
  }
  if (c.attn_softcap < 0.0f || c.final_softcap < 0.0f) {
    return invalid_argument(f.name(), ": a soft-cap is negative");
  }
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (s.attn_scale == AttnScale::kGemma && c.num_layers == s.gemma_large_layers) {
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.dim / c.num_heads));
  }
  if (s.embed_scale_sqrt_dim) c.embed_scale = std::sqrt(static_cast<float>(c.dim));
  if (s.granite_scales) {
    ARBOR_ASSIGN_OR_RETURN(const float logit_scale, f.get_f32(a + ".logit_scale"));
    ARBOR_RETURN_IF_ERROR(check_finite_positive(f, a + ".logit_scale", logit_scale));
    c.logit_scale = 1.0f / logit_scale;
    ARBOR_ASSIGN_OR_RETURN(const float res, get_float_or(f, a + ".residual_scale", 0.0f));
    ARBOR_ASSIGN_OR_RETURN(const float emb, get_float_or(f, a + ".embedding_scale", 0.0f));
    ARBOR_ASSIGN_OR_RETURN(const float att, get_float_or(f, a + ".attention.scale", 0.0f));
    if (res != 0.0f) c.residual_scale = res;
    if (emb != 0.0f) c.embed_scale = emb;
    if (att != 0.0f) c.attn_scale = att;
    bool finetuned = true;  // Granite uses rope.scaling.finetuned as RoPE's switch
    if (f.find(a + ".rope.scaling.finetuned") != nullptr) {
      ARBOR_ASSIGN_OR_RETURN(finetuned, f.get_bool(a + ".rope.scaling.finetuned"));
    }
    if (!finetuned) {
      for (LayerSpec& l : c.layers) l.rope = -1;
    }
  }
  if (s.mistral_keys) {
    ARBOR_ASSIGN_OR_RETURN(c.attn_temp_scale,
                           get_float_or(f, a + ".attention.temperature_scale", 0.0f));
    if (c.attn_temp_scale != 0.0f) c.attn_temp_floor = c.ropes[0].original_context;
  }
  if (s.nope_every > 0) {
    for (int l = 0; l < c.num_layers; ++l) {
      if ((l + 1) % s.nope_every == 0) c.layers[l].rope = -1;
    }
  }
  return ok_status();
}

// <a>.pooling_type (llama.cpp reads it for every architecture) and the rank head's labels.
Status read_pooling(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  if (f.find(a + ".pooling_type") != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(const int64_t v, f.get_i64(a + ".pooling_type"));
    if (v < -1 || v > 4) {
      return invalid_argument(f.name(), ": ", a, ".pooling_type = ", v,
                              " (llama.cpp's values: -1 unspecified, 0 none, 1 mean, 2 cls, "
                              "3 last, 4 rank)");
    }
    c.pooling_type = static_cast<int>(v);
  }
  if (f.find(a + ".classifier.output_labels") != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(c.classifier_labels,
                           f.get_string_array(a + ".classifier.output_labels"));
  }
  return ok_status();
}

// Qwen3.5's hybrid stack (ArchSpec::gated_delta_net; docs/qwen35.md §1-2): the trunk's layer
// count without the MTP blocks, which layers are recurrent, the ssm shape and the IMRoPE
// sections (text positions only: IMRoPE is then NeoX RoPE over rope.dimension_count dims).
Status read_gated_delta_net(const gguf::GgufFile& f, const std::string& a, int block_count,
                            ModelConfig& c) {
  ARBOR_ASSIGN_OR_RETURN(const int nextn, get_int_or(f, a + ".nextn_predict_layers", 0));
  if (f.find(a + ".nextn_predict_layers") != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(const int64_t v, f.get_i64(a + ".nextn_predict_layers"));
    if (v < 0 || v >= block_count) {
      return invalid_argument(f.name(), ": ", a, ".nextn_predict_layers = ", v, " of ",
                              block_count, " blocks");
    }
  }
  c.num_nextn_layers = nextn;
  c.num_layers = block_count - nextn;
  SsmConfig& s = c.ssm;
  ARBOR_ASSIGN_OR_RETURN(s.conv_kernel, get_positive_int(f, a + ".ssm.conv_kernel"));
  ARBOR_ASSIGN_OR_RETURN(s.state_size, get_positive_int(f, a + ".ssm.state_size"));
  ARBOR_ASSIGN_OR_RETURN(s.num_k_heads, get_positive_int(f, a + ".ssm.group_count"));
  ARBOR_ASSIGN_OR_RETURN(s.num_v_heads, get_positive_int(f, a + ".ssm.time_step_rank"));
  ARBOR_ASSIGN_OR_RETURN(const int inner, get_positive_int(f, a + ".ssm.inner_size"));
  if (s.state_size % 8 != 0 || s.state_size > 1024 || s.conv_kernel > 64) {
    return unimplemented(f.name(), ": ", a, ".ssm.state_size = ", s.state_size, ", conv_kernel ",
                         s.conv_kernel, " (arbor runs state sizes that are multiples of 8 up to "
                         "1024 and kernels up to 64)");
  }
  if (inner != s.value_dim() || s.num_v_heads % s.num_k_heads != 0) {
    return invalid_argument(f.name(), ": ", a, ".ssm.inner_size = ", inner, " must be ",
                            a, ".ssm.time_step_rank x .state_size = ", s.value_dim(),
                            ", and time_step_rank (", s.num_v_heads,
                            ") a multiple of group_count (", s.num_k_heads, ")");
  }
  const std::string sections = a + ".rope.dimension_sections";
  if (f.find(sections) == nullptr) {
    return not_found(f.name(), ": ", sections, " is missing (", a, " runs IMRoPE)");
  }
  ARBOR_ASSIGN_OR_RETURN(const std::vector<int32_t> sec, f.get_i32_array(sections));
  int64_t pairs = 0;
  for (int32_t x : sec) pairs += x;
  if (sec.empty() || pairs > c.rope_dim / 2 || *std::min_element(sec.begin(), sec.end()) < 0) {
    return invalid_argument(f.name(), ": ", sections, " must be non-negative and sum to at most "
                            "rope.dimension_count / 2 = ", c.rope_dim / 2);
  }
  c.layers.assign(c.num_layers, LayerSpec{});
  const std::string pattern = a + ".attention.recurrent_layers";
  if (const gguf::Value* pv = f.find(pattern); pv != nullptr) {
    if (pv->type != gguf::ValueType::kArray) {
      return invalid_argument(f.name(), ": ", pattern, " must be an array of bools");
    }
    const auto& items = std::get<gguf::Array>(pv->data).items;
    if ((int)items.size() < c.num_layers) {
      return invalid_argument(f.name(), ": ", pattern, " has ", items.size(), " entries for ",
                              c.num_layers, " layers");
    }
    for (int l = 0; l < c.num_layers; ++l) {
      if (items[l].type != gguf::ValueType::kBool) {
        return invalid_argument(f.name(), ": ", pattern, " must be an array of bools");
      }
      c.layers[l].recurrent = std::get<bool>(items[l].data);
    }
  } else {
    ARBOR_ASSIGN_OR_RETURN(const int interval, get_int_or(f, a + ".full_attention_interval", 4));
    for (int l = 0; l < c.num_layers; ++l) c.layers[l].recurrent = (l + 1) % interval != 0;
  }
  c.attn_output_gate = c.spec->attn_output_gate;
  return ok_status();
}

}  // namespace

int ModelConfig::num_recurrent_layers() const {
  int n = 0;
  for (const LayerSpec& l : layers) n += l.recurrent;
  return n;
}

bool ModelConfig::has_sliding_layers() const {
  for (const LayerSpec& l : layers) {
    if (l.window > 0) return true;
  }
  return false;
}

Result<ModelConfig> ModelConfig::from_gguf(const gguf::GgufFile& f) {
  ModelConfig c;
  ARBOR_ASSIGN_OR_RETURN(c.arch_name, f.get_string("general.architecture"));
  c.spec = find_arch(c.arch_name);
  if (c.spec == nullptr) {
    return unimplemented(f.name(), ": general.architecture = \"", c.arch_name,
                         "\" (supported: ", supported_arch_names(), ")");
  }
  c.arch = c.spec->arch;
  const std::string& a = c.arch_name;
  ARBOR_RETURN_IF_ERROR(read_shape(f, a, c));
  ARBOR_RETURN_IF_ERROR(read_rope(f, a, c));
  ARBOR_RETURN_IF_ERROR(refuse_unsupported_keys(f, a, c.head_dim, c.rope_dim));
  ARBOR_RETURN_IF_ERROR(read_sliding(f, a, c));
  ARBOR_RETURN_IF_ERROR(read_arch_keys(f, a, c));
  ARBOR_RETURN_IF_ERROR(read_pooling(f, a, c));
  ARBOR_RETURN_IF_ERROR(read_experts(f, a, c));
  if (c.spec->gated_delta_net) {
    ARBOR_RETURN_IF_ERROR(read_gated_delta_net(f, a, c.num_layers, c));
  }
  const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr) return not_found(f.name(), ": tensor token_embd.weight is missing");
  if (embd->dims.size() != 2 || embd->dims[1] < 1 || embd->dims[1] > (1 << 30)) {
    return invalid_argument(f.name(), ": token_embd.weight must be 2-D [embedding_length, vocab]");
  }
  c.vocab_size = (int)embd->dims[1];
  return c;
}

std::string ModelConfig::summary() const {
  std::string s = str_cat(arch_name, ": dim ", dim, ", ffn ", ffn_dim, ", ", num_layers,
                          " layers, ", num_heads, " heads (", num_kv_heads, " kv, head_dim ",
                          head_dim, "), vocab ", vocab_size, ", context ", context_length,
                          ", rope theta ", ropes.empty() ? 0.0f : ropes[0].theta, " dim ",
                          rope_dim, rope_neox ? " neox" : "", ", rms_eps ", rms_eps);
  int sliding = 0, nope = 0;
  for (const LayerSpec& l : layers) {
    sliding += l.window > 0;
    nope += l.rope < 0;
  }
  if (sliding > 0) {
    for (const LayerSpec& l : layers) {
      if (l.window > 0) {
        s += str_cat(", ", sliding, " sliding layers (window ", l.window, ")");
        break;
      }
    }
  }
  if (nope > 0) s += str_cat(", ", nope, " NoPE layers");
  if (has_recurrent_layers()) {
    s += str_cat(", ", num_recurrent_layers(), " Gated DeltaNet layers (", ssm.num_k_heads, "/",
                 ssm.num_v_heads, " heads of ", ssm.state_size, ", conv ", ssm.conv_kernel, ")");
  }
  if (num_nextn_layers > 0) s += str_cat(", ", num_nextn_layers, " MTP block(s) (--spec mtp)");
  if (is_moe()) {
    s += str_cat(", ", num_experts, " experts (", num_experts_used, " per token, ffn ",
                 expert_ffn_dim, ")");
  }
  if (attn_softcap > 0.0f) s += str_cat(", attention soft-cap ", attn_softcap);
  if (final_softcap > 0.0f) s += str_cat(", final soft-cap ", final_softcap);
  return s;
}

}  // namespace arbor::model
