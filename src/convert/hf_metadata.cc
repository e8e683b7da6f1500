// The `<arch>.*` GGUF keys of a Hugging Face conversion, in the order and with the types
// llama.cpp's convert_hf_to_gguf.py writes them (TextModel.set_gguf_parameters and the
// architecture classes that extend or replace it).
#include <cmath>

#include "convert/hf_internal.h"

namespace arbor::convert {

namespace {

using gguf::KeyValue;
using gguf::Value;

// Key-value list with Python-dict semantics: setting an existing key overwrites it in place.
class Keys {
 public:
  explicit Keys(std::string_view arch) : arch_(arch) {}
  void set(const std::string& suffix, Value v) {
    const std::string key = arch_ + "." + suffix;
    for (auto& kv : kv_) {
      if (kv.key == key) {
        kv.value = std::move(v);
        return;
      }
    }
    kv_.push_back({key, std::move(v)});
  }
  void u32(const std::string& s, uint32_t v) { set(s, Value::u32(v)); }
  void f32(const std::string& s, float v) { set(s, Value::f32(v)); }
  std::vector<KeyValue> take() { return std::move(kv_); }

 private:
  std::string arch_;
  std::vector<KeyValue> kv_;
};

void add_rope_scaling(const HfConfig& c, Keys* k) {
  const RopeScaling& r = c.rope;
  switch (r.type) {
    case RopeScalingType::kNone:
    case RopeScalingType::kLlama3:  // rope_freqs.weight instead
      return;
    case RopeScalingType::kLinear:
      k->set("rope.scaling.type", Value::str("linear"));
      k->f32("rope.scaling.factor", r.factor);
      return;
    case RopeScalingType::kYarn:
      k->set("rope.scaling.type", Value::str("yarn"));
      k->f32("rope.scaling.factor", r.factor);
      k->u32("rope.scaling.original_context_length", r.original_max_position_embeddings);
      if (r.extrapolation_factor) k->f32("rope.scaling.yarn_ext_factor", *r.extrapolation_factor);
      if (r.beta_fast) k->f32("rope.scaling.yarn_beta_fast", *r.beta_fast);
      if (r.beta_slow) k->f32("rope.scaling.yarn_beta_slow", *r.beta_slow);
      return;
    case RopeScalingType::kLongRope:
      k->set("rope.scaling.type", Value::str("longrope"));
      return;
  }
}

// TextModel.set_gguf_parameters.
void add_base(const HfConfig& c, Keys* k) {
  k->u32("block_count", c.num_hidden_layers);
  k->u32("context_length", c.max_position_embeddings);
  k->u32("embedding_length", c.hidden_size);
  k->u32("feed_forward_length", c.intermediate_size);
  k->u32("attention.head_count", c.num_attention_heads);
  k->u32("attention.head_count_kv", c.num_key_value_heads);
  add_rope_scaling(c, k);
  k->f32("rope.freq_base", c.rope_theta);
  if (c.rope_theta_swa) k->f32("rope.freq_base_swa", *c.rope_theta_swa);
  k->f32("attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  if (c.head_dim_in_config && c.arch != HfArch::kGranite) {  // Granite drops head_dim
    k->u32("attention.key_length", c.head_dim);
    k->u32("attention.value_length", c.head_dim);
  }
}

// LlamaModel.set_gguf_parameters (mistral3, smollm3, granite).
void add_llama(const HfConfig& c, uint32_t vocab_size, Keys* k) {
  add_base(c, k);
  k->u32("vocab_size", vocab_size);
  k->u32("rope.dimension_count", c.arch == HfArch::kGranite
                                     ? c.hidden_size / c.num_attention_heads
                                     : c.head_dim);
}

void add_gemma2(const HfConfig& c, Keys* k) {
  k->u32("context_length", c.max_position_embeddings);
  k->u32("embedding_length", c.hidden_size);
  k->u32("block_count", c.num_hidden_layers);
  k->u32("feed_forward_length", c.intermediate_size);
  k->u32("attention.head_count", c.num_attention_heads);
  k->u32("attention.head_count_kv", c.num_key_value_heads);
  k->f32("attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  k->u32("attention.key_length", c.head_dim);
  k->u32("attention.value_length", c.head_dim);
  k->f32("attn_logit_softcapping", *c.attn_logit_softcapping);
  k->f32("final_logit_softcapping", *c.final_logit_softcapping);
  k->u32("attention.sliding_window", c.sliding_window);
  // llama.cpp's Gemma2 converter drops rope_theta (its loader defaults to 10000); arbor keeps a
  // non-default one rather than lose it.
  if (c.rope_theta != 10000.0f) k->f32("rope.freq_base", c.rope_theta);
}

void add_gemma3(const HfConfig& c, Keys* k) {
  add_base(c, k);
  k->u32("attention.key_length", c.head_dim);
  k->u32("attention.value_length", c.head_dim);
  if (c.final_logit_softcapping) k->f32("final_logit_softcapping", *c.final_logit_softcapping);
  if (c.write_sliding_window) k->u32("attention.sliding_window", c.sliding_window);
}

void add_phi3(const HfConfig& c, Keys* k) {
  k->u32("context_length", c.max_position_embeddings);
  k->u32("rope.scaling.original_context_length", c.rope.original_max_position_embeddings);
  k->u32("embedding_length", c.hidden_size);
  k->u32("feed_forward_length", c.intermediate_size);
  k->u32("block_count", c.num_hidden_layers);
  k->u32("attention.head_count", c.num_attention_heads);
  k->u32("attention.head_count_kv", c.num_key_value_heads);
  k->f32("attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  k->u32("rope.dimension_count", c.rope_dim);
  k->f32("rope.freq_base", c.rope_theta);
  k->u32("attention.sliding_window", c.sliding_window);
  if (c.rope.type == RopeScalingType::kLongRope) {
    const double orig = c.rope.original_max_position_embeddings;
    const double scale = c.max_position_embeddings / orig;
    const double attn = scale > 1.0 ? std::sqrt(1.0 + std::log(scale) / std::log(orig)) : 1.0;
    k->f32("rope.scaling.attn_factor", static_cast<float>(attn));
  }
}

}  // namespace

std::vector<KeyValue> hf_arch_metadata(const HfConfig& c, uint32_t vocab_size) {
  Keys k(hf_arch_name(c.arch));
  switch (c.arch) {
    case HfArch::kLlama:
    case HfArch::kQwen2:
      return {};  // the LlamaHparams keys (model_plan.cc)
    case HfArch::kQwen3:
    case HfArch::kOlmo2:
      add_base(c, &k);
      break;
    case HfArch::kGemma2:
      add_gemma2(c, &k);
      break;
    case HfArch::kGemma3:
      add_gemma3(c, &k);
      break;
    case HfArch::kPhi3:
      add_phi3(c, &k);
      break;
    case HfArch::kSmolLM3:
      add_llama(c, vocab_size, &k);
      break;
    case HfArch::kMistral3:
      add_llama(c, vocab_size, &k);
      if (c.rope.mscale_all_dim) k.f32("rope.scaling.yarn_log_multiplier", *c.rope.mscale_all_dim);
      if (c.rope.llama_4_scaling_beta)
        k.f32("attention.temperature_scale", *c.rope.llama_4_scaling_beta);
      break;
    case HfArch::kGranite:
      add_llama(c, vocab_size, &k);
      // Python truthiness: a zero multiplier is not written.
      if (c.attention_multiplier.value_or(0) != 0) k.f32("attention.scale", *c.attention_multiplier);
      if (c.embedding_multiplier.value_or(0) != 0) k.f32("embedding_scale", *c.embedding_multiplier);
      if (c.residual_multiplier.value_or(0) != 0) k.f32("residual_scale", *c.residual_multiplier);
      if (c.logits_scaling.value_or(0) != 0) k.f32("logit_scale", *c.logits_scaling);
      break;
  }
  return k.take();
}

}  // namespace arbor::convert
