// Hugging Face checkpoints (safetensors F32/F16/BF16) -> ModelPlan, writing what llama.cpp's
// convert_hf_to_gguf.py writes for the same checkpoint (keys, tensor names, shapes, q/k row
// order, Gemma's +1 on norm weights). See docs/convert.md for the per-architecture tables.
//
//   config.json            shape hyper-parameters (HfConfig); a multimodal config's text_config
//                          is merged over the root, as llama.cpp does
//   model.safetensors      or model.safetensors.index.json + shards
//   tokenizer.json         vocabulary (hf_tokenizer.h), with tokenizer_config.json if present
//
// Architectures (config.json "architectures"[0] -> GGUF general.architecture):
//   LlamaForCausalLM -> llama            Qwen2ForCausalLM -> qwen2
//   Qwen3ForCausalLM -> qwen3            Gemma2ForCausalLM -> gemma2
//   Gemma3ForCausalLM, Gemma3ForConditionalGeneration (text part) -> gemma3
//   Ministral3ForCausalLM, Mistral3ForConditionalGeneration (text part) -> mistral3
//   Phi3ForCausalLM -> phi3              SmolLM3ForCausalLM -> smollm3
//   Olmo2ForCausalLM -> olmo2            GraniteForCausalLM -> granite
//
// A configuration GGUF cannot express for the architecture (a RoPE scaling its llama.cpp graph
// ignores, a sliding-window or NoPE layout other than the fixed one llama.cpp assumes, an
// attention scale llama.cpp derives differently) is refused with a message naming the field.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "convert/model_plan.h"
#include "convert/safetensors.h"

namespace arbor::convert {

enum class HfArch { kLlama, kQwen2, kQwen3, kGemma2, kGemma3, kMistral3, kPhi3, kSmolLM3, kOlmo2,
                    kGranite };
// The GGUF architecture name ("llama", "gemma3", ...).
std::string_view hf_arch_name(HfArch arch);

enum class RopeScalingType { kNone, kLinear, kYarn, kLongRope, kLlama3 };
std::string_view rope_scaling_name(RopeScalingType type);  // "none", "linear", "yarn", ...

// config.json rope_scaling (or transformers v5 rope_parameters; for Gemma 3 its
// "full_attention" entry), resolved.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;  // linear, yarn, llama3
  // llama3: rope_freqs.weight from these (llama3_rope_factors)
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  // llama3, yarn, longrope: the pre-training context (yarn/longrope: from rope_scaling, else the
  // config's top-level original_max_position_embeddings)
  uint32_t original_max_position_embeddings = 8192;
  // yarn: written only when the config has them
  std::optional<float> beta_fast, beta_slow, extrapolation_factor;
  std::optional<float> mscale_all_dim;        // ministral3: yarn_log_multiplier
  std::optional<float> llama_4_scaling_beta;  // ministral3: attention.temperature_scale
  // longrope (Phi-3): per-frequency divisors, [rope_dim / 2] each
  std::vector<float> long_factor, short_factor;
};

struct HfConfig {
  HfArch arch = HfArch::kLlama;
  std::string hf_class;      // "architectures"[0]
  std::string model_type;    // the (text) config's model_type, "" if absent
  uint32_t hidden_size = 0;
  uint32_t intermediate_size = 0;
  uint32_t num_hidden_layers = 0;
  uint32_t num_attention_heads = 0;
  uint32_t num_key_value_heads = 0;  // defaults to num_attention_heads
  uint32_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  bool head_dim_in_config = false;   // llama.cpp writes key/value_length only then
  uint32_t rope_dim = 0;             // rotated dimensions per head (Phi-3: partial_rotary_factor)
  uint32_t max_position_embeddings = 2048;
  uint32_t vocab_size = 0;  // 0 = take it from the embedding tensor
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  bool tie_word_embeddings = false;
  RopeScaling rope;
  std::optional<float> rope_theta_swa;  // Gemma 3 local layers (rope_local_base_freq)
  // Sliding-window attention: window size (0 = none) and which layers use it.
  uint32_t sliding_window = 0;
  bool write_sliding_window = false;  // the key is written (Phi-3 writes 0 when absent)
  // Gemma 2/3
  std::optional<float> attn_logit_softcapping, final_logit_softcapping;
  float query_pre_attn_scalar = 0.0f;
  // Granite multipliers (written when present and non-zero)
  std::optional<float> embedding_multiplier, residual_multiplier, attention_multiplier,
      logits_scaling;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;
};

// Parses config.json text. Required: architectures (one of the classes above), hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads, and rms_norm_eps where the
// architecture's config class has no default. Errors name `name`, the key and the value.
Result<HfConfig> parse_hf_config(std::string_view json_text, const std::string& name);

// Builds the plan from an opened checkpoint. `tokenizer_metadata` is left empty (load_hf fills
// it). `n_vocab_tokens` > 0 truncates Gemma 3's embedding to that many rows, as llama.cpp does
// (its tokenizer.json count); 0 keeps every row.
Result<ModelPlan> plan_hf(const HfConfig& config, const SafetensorsModel& weights,
                          std::string model_name, uint32_t n_vocab_tokens = 0);

// The llama3 rope factors llama.cpp stores as rope_freqs.weight. // [head_dim / 2]
std::vector<float> llama3_rope_factors(const HfConfig& config);

// The `<arch>.*` keys llama.cpp's converter writes for `config` (general.architecture, name and
// file type excluded), in its order.
std::vector<gguf::KeyValue> hf_arch_metadata(const HfConfig& config, uint32_t vocab_size);

// A whole converted directory. Owns the safetensors mappings the plan points into.
struct HfModel {
  HfConfig config;
  SafetensorsModel weights;
  ModelPlan plan;
};

// Reads config.json, the safetensors and tokenizer.json (+ tokenizer_config.json) in `dir`.
Result<HfModel> load_hf(const std::string& dir);

}  // namespace arbor::convert
