// Hugging Face checkpoints (LlamaForCausalLM, Qwen2ForCausalLM; safetensors F32/F16/BF16) ->
// ModelPlan. See docs/convert.md for the tensor name mapping and the permutation and tie rules.
//
//   config.json            shape hyper-parameters (HfConfig)
//   model.safetensors      or model.safetensors.index.json + shards
//   tokenizer.json         vocabulary (hf_tokenizer.h), with tokenizer_config.json if present
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "convert/model_plan.h"
#include "convert/safetensors.h"

namespace arbor::convert {

enum class HfArch { kLlama, kQwen2 };
std::string_view hf_arch_name(HfArch arch);

struct Llama3RopeScaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  uint32_t original_max_position_embeddings = 8192;
};

struct HfConfig {
  HfArch arch = HfArch::kLlama;
  uint32_t hidden_size = 0;
  uint32_t intermediate_size = 0;
  uint32_t num_hidden_layers = 0;
  uint32_t num_attention_heads = 0;
  uint32_t num_key_value_heads = 0;  // defaults to num_attention_heads
  uint32_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  uint32_t max_position_embeddings = 2048;
  uint32_t vocab_size = 0;  // 0 = take it from the embedding tensor
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  bool tie_word_embeddings = false;
  std::optional<Llama3RopeScaling> rope_scaling;  // only rope_type "llama3" is supported
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;
};

// Parses config.json text. Required: architectures (LlamaForCausalLM or Qwen2ForCausalLM),
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, rms_norm_eps.
// Errors name `name`, the key and the value.
Result<HfConfig> parse_hf_config(std::string_view json_text, const std::string& name);

// Builds the plan from an opened checkpoint. `tokenizer_metadata` is used as is.
Result<ModelPlan> plan_hf(const HfConfig& config, const SafetensorsModel& weights,
                          std::string model_name);

// The llama3 rope factors llama.cpp stores as rope_freqs.weight. // [head_dim / 2]
std::vector<float> llama3_rope_factors(const HfConfig& config);

// A whole converted directory. Owns the safetensors mappings the plan points into.
struct HfModel {
  HfConfig config;
  SafetensorsModel weights;
  ModelPlan plan;
};

// Reads config.json, the safetensors and tokenizer.json (+ tokenizer_config.json) in `dir`.
Result<HfModel> load_hf(const std::string& dir);

}  // namespace arbor::convert
