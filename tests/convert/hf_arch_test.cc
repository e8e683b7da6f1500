// Per-architecture config handling of the Hugging Face converter: the `<arch>.*` keys written
// (compared with what llama.cpp's convert_hf_to_gguf.py writes for the same config, read off its
// TextModel / architecture classes), and the refusals that name the offending field. The
// configs are those of tests/reference/hf/make_checkpoint.py, whose converted files llama.cpp
// evaluates in the hf_parity_* tests.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "convert/hf.h"
#include "gguf/gguf.h"

namespace arbor::convert {
namespace {

using Json = nlohmann::json;

const std::map<std::string, std::string> kConfigs = {
    {"qwen3", R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 24, "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_scaling": null, "tie_word_embeddings": true, "attention_bias": false, "use_sliding_window": false})"},
    {"gemma2", R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 24, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "query_pre_attn_scalar": 24, "sliding_window": 16, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0, "tie_word_embeddings": true, "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]})"},
    {"gemma3", R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 24, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 24, "sliding_window": 16, "final_logit_softcapping": null, "attn_logit_softcapping": null, "tie_word_embeddings": true, "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]})"},
    {"mistral3", R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2, "architectures": ["Ministral3ForCausalLM"], "model_type": "ministral3", "head_dim": 24, "hidden_act": "silu", "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "sliding_window": null, "rope_parameters": {"rope_type": "yarn", "type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}})"},
    {"phi3", R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "partial_rotary_factor": 0.75, "original_max_position_embeddings": 32, "sliding_window": 128, "tie_word_embeddings": false, "rope_scaling": {"type": "longrope", "long_factor": [4.1255, 5.4861, 4.8784, 2.126, 2.5008, 5.3678], "short_factor": [1.0026, 1.4106, 1.3985, 1.234, 1.1515, 1.1392]}})"},
    {"smollm3", R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2, "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 5000000.0, "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0], "use_sliding_window": false, "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64}, "tie_word_embeddings": true})"},
    {"olmo2", R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2, "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 500000.0, "rope_scaling": null, "tie_word_embeddings": false, "attention_bias": false})"},
    {"granite", R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2, "architectures": ["GraniteForCausalLM"], "model_type": "granite", "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "embedding_multiplier": 12.0, "attention_multiplier": 0.015625, "residual_multiplier": 0.22, "logits_scaling": 8.0, "tie_word_embeddings": true})"},
};

// What llama.cpp writes for each config above, checked by hand against convert_hf_to_gguf.py
// (base TextModel keys in its order, then each class's additions; key_length only where the
// transformers config class has head_dim; Granite drops head_dim).
const std::map<std::string, std::string> kWantKeys = {
    {"gemma2",
         "gemma2.context_length=256\n"
         "gemma2.embedding_length=64\n"
         "gemma2.block_count=4\n"
         "gemma2.feed_forward_length=128\n"
         "gemma2.attention.head_count=4\n"
         "gemma2.attention.head_count_kv=2\n"
         "gemma2.attention.layer_norm_rms_epsilon=9.99999997e-07\n"
         "gemma2.attention.key_length=24\n"
         "gemma2.attention.value_length=24\n"
         "gemma2.attn_logit_softcapping=2\n"
         "gemma2.final_logit_softcapping=5\n"
         "gemma2.attention.sliding_window=16\n"},
    {"gemma3",
         "gemma3.block_count=7\n"
         "gemma3.context_length=256\n"
         "gemma3.embedding_length=64\n"
         "gemma3.feed_forward_length=128\n"
         "gemma3.attention.head_count=4\n"
         "gemma3.attention.head_count_kv=2\n"
         "gemma3.rope.scaling.type=\"linear\"\n"
         "gemma3.rope.scaling.factor=8\n"
         "gemma3.rope.freq_base=1000000\n"
         "gemma3.rope.freq_base_swa=10000\n"
         "gemma3.attention.layer_norm_rms_epsilon=9.99999997e-07\n"
         "gemma3.attention.key_length=24\n"
         "gemma3.attention.value_length=24\n"
         "gemma3.attention.sliding_window=16\n"},
    {"granite",
         "granite.block_count=4\n"
         "granite.context_length=256\n"
         "granite.embedding_length=64\n"
         "granite.feed_forward_length=128\n"
         "granite.attention.head_count=4\n"
         "granite.attention.head_count_kv=2\n"
         "granite.rope.freq_base=10000\n"
         "granite.attention.layer_norm_rms_epsilon=9.99999975e-06\n"
         "granite.vocab_size=2048\n"
         "granite.rope.dimension_count=16\n"
         "granite.attention.scale=0.015625\n"
         "granite.embedding_scale=12\n"
         "granite.residual_scale=0.219999999\n"
         "granite.logit_scale=8\n"},
    {"mistral3",
         "mistral3.block_count=4\n"
         "mistral3.context_length=128\n"
         "mistral3.embedding_length=64\n"
         "mistral3.feed_forward_length=128\n"
         "mistral3.attention.head_count=4\n"
         "mistral3.attention.head_count_kv=2\n"
         "mistral3.rope.scaling.type=\"yarn\"\n"
         "mistral3.rope.scaling.factor=4\n"
         "mistral3.rope.scaling.original_context_length=32\n"
         "mistral3.rope.scaling.yarn_beta_fast=32\n"
         "mistral3.rope.scaling.yarn_beta_slow=1\n"
         "mistral3.rope.freq_base=1000000\n"
         "mistral3.attention.layer_norm_rms_epsilon=9.99999975e-06\n"
         "mistral3.attention.key_length=24\n"
         "mistral3.attention.value_length=24\n"
         "mistral3.vocab_size=2048\n"
         "mistral3.rope.dimension_count=24\n"
         "mistral3.rope.scaling.yarn_log_multiplier=1\n"
         "mistral3.attention.temperature_scale=0.100000001\n"},
    {"olmo2",
         "olmo2.block_count=4\n"
         "olmo2.context_length=256\n"
         "olmo2.embedding_length=64\n"
         "olmo2.feed_forward_length=128\n"
         "olmo2.attention.head_count=4\n"
         "olmo2.attention.head_count_kv=2\n"
         "olmo2.rope.freq_base=500000\n"
         "olmo2.attention.layer_norm_rms_epsilon=9.99999997e-07\n"},
    {"phi3",
         "phi3.context_length=128\n"
         "phi3.rope.scaling.original_context_length=32\n"
         "phi3.embedding_length=64\n"
         "phi3.feed_forward_length=128\n"
         "phi3.block_count=4\n"
         "phi3.attention.head_count=4\n"
         "phi3.attention.head_count_kv=2\n"
         "phi3.attention.layer_norm_rms_epsilon=9.99999975e-06\n"
         "phi3.rope.dimension_count=12\n"
         "phi3.rope.freq_base=10000\n"
         "phi3.attention.sliding_window=128\n"
         "phi3.rope.scaling.attn_factor=1.18321598\n"},
    {"qwen3",
         "qwen3.block_count=4\n"
         "qwen3.context_length=256\n"
         "qwen3.embedding_length=64\n"
         "qwen3.feed_forward_length=128\n"
         "qwen3.attention.head_count=4\n"
         "qwen3.attention.head_count_kv=2\n"
         "qwen3.rope.freq_base=1000000\n"
         "qwen3.attention.layer_norm_rms_epsilon=9.99999997e-07\n"
         "qwen3.attention.key_length=24\n"
         "qwen3.attention.value_length=24\n"},
    {"smollm3",
         "smollm3.block_count=4\n"
         "smollm3.context_length=128\n"
         "smollm3.embedding_length=64\n"
         "smollm3.feed_forward_length=128\n"
         "smollm3.attention.head_count=4\n"
         "smollm3.attention.head_count_kv=2\n"
         "smollm3.rope.scaling.type=\"yarn\"\n"
         "smollm3.rope.scaling.factor=2\n"
         "smollm3.rope.scaling.original_context_length=64\n"
         "smollm3.rope.freq_base=5000000\n"
         "smollm3.attention.layer_norm_rms_epsilon=9.99999997e-07\n"
         "smollm3.vocab_size=2048\n"
         "smollm3.rope.dimension_count=16\n"},
};

Json config(const std::string& arch) { return Json::parse(kConfigs.at(arch)); }

// "key=value" lines of the arch keys for `j`, or the error message.
std::string keys_of(const Json& j) {
  auto c = parse_hf_config(j.dump(), "config.json");
  if (!c.ok()) return c.status().message();
  std::string out;
  for (const auto& kv : hf_arch_metadata(*c, 2048)) {
    out += kv.key + "=" + gguf::value_to_string(kv.value) + "\n";
  }
  return out;
}

TEST(HfArchTest, KeysAreLlamaCppsForEveryArchitecture) {
  for (const auto& [arch, want] : kWantKeys) EXPECT_EQ(keys_of(config(arch)), want) << arch;
}

TEST(HfArchTest, Gemma3WithoutSlidingLayersWritesNoWindow) {
  Json j = config("gemma3");
  j.erase("layer_types");
  j["sliding_window_pattern"] = 1;
  EXPECT_EQ(keys_of(j).find("sliding_window"), std::string::npos);
}

TEST(HfArchTest, MultimodalTextConfigIsMergedOverTheRoot) {
  Json text = config("gemma3");
  text.erase("architectures");
  const Json j = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"text_config", text},
                  {"vision_config", {{"hidden_size", 1152}}}};
  EXPECT_EQ(keys_of(j), kWantKeys.at("gemma3"));
}

TEST(HfArchTest, TransformersV5RopeParametersReadLikeRopeScaling) {
  Json j = config("gemma3");
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("rope_local_base_freq");
  j["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  EXPECT_EQ(keys_of(j), kWantKeys.at("gemma3"));
}

// Each edit makes a config llama.cpp's GGUF cannot represent (or that llama.cpp would evaluate
// differently from transformers); the error names the field.
TEST(HfArchTest, RefusalsNameTheField) {
  struct Case {
    const char* arch;
    const char* key;  // top-level key set to `value` ("rope_scaling.x": inside rope_scaling)
    Json value;
    const char* message;
  };
  const Case cases[] = {
      {"gemma2", "query_pre_attn_scalar", 64, "query_pre_attn_scalar 64 is not supported"},
      {"gemma2", "attn_logit_softcapping", nullptr, "attn_logit_softcapping = null"},
      {"gemma2", "layer_types", Json::array({"full_attention", "sliding_attention",
                                             "full_attention", "sliding_attention"}),
       "layer_types[0] = \"full_attention\""},
      {"gemma2", "rope_scaling", Json{{"rope_type", "linear"}, {"factor", 2.0}},
       "rope_scaling type 'linear' is not supported for gemma2 (none)"},
      {"gemma2", "hidden_activation", "gelu", "\"hidden_activation\" = \"gelu\""},
      {"gemma3", "attn_logit_softcapping", 50.0, "attn_logit_softcapping is not supported"},
      {"gemma3", "sliding_window_pattern", 4, "sliding_window_pattern 4 is not supported"},
      {"gemma3", "rope_scaling", Json{{"rope_type", "yarn"}, {"factor", 2.0}},
       "rope_scaling type 'yarn' is not supported for gemma3 (linear)"},
      {"qwen3", "use_sliding_window", true, "\"use_sliding_window\" = true is not supported"},
      {"qwen3", "rope_scaling", Json{{"rope_type", "yarn"}, {"factor", 4.0},
                                     {"original_max_position_embeddings", 32}},
       "rope_scaling.factor 4 != max_position_embeddings / original_max_position_embeddings = 8"},
      {"qwen3", "rope_scaling", Json{{"rope_type", "yarn"}, {"factor", 8.0},
                                     {"original_max_position_embeddings", 32},
                                     {"attention_factor", 1.5}},
       "rope_scaling.attention_factor is not supported"},
      {"qwen3", "partial_rotary_factor", 0.5, "partial_rotary_factor 0.5 is not supported"},
      {"smollm3", "no_rope_layers", Json::array({1, 1, 0, 1}),
       "no_rope_layers[2] = 0; smollm3 GGUF uses RoPE in layer il iff (il + 1) % 4 != 0"},
      {"smollm3", "no_rope_layer_interval", 3, "no_rope_layer_interval 3 is not supported"},
      {"smollm3", "rope_scaling", Json{{"rope_type", "llama3"}, {"factor", 8.0}},
       "rope_scaling type 'llama3' is not supported for smollm3 (linear, yarn)"},
      {"mistral3", "sliding_window", 4096, "\"sliding_window\" = 4096 is not supported"},
      {"mistral3", "rope_parameters.mscale", 0.5, "rope_parameters.mscale = 0.5 is not supported"},
      {"mistral3", "rope_parameters.llama_4_scaling_beta", nullptr,
       "ministral3 rope_parameters needs mscale_all_dim and llama_4_scaling_beta"},
      {"mistral3", "rope_parameters.truncate", false, "rope_parameters.truncate = false"},
      {"phi3", "rope_scaling.attention_factor", 1.2, "rope_scaling.attention_factor is not supported"},
      {"phi3", "rope_scaling.long_factor", Json::array({1.0, 2.0}),
       "rope_scaling.long_factor has 2 entries, the rotary dimension 12 needs 6"},
      {"olmo2", "sliding_window", 16, "\"sliding_window\" = 16 is not supported for olmo2"},
      {"olmo2", "head_dim", 24, "head_dim 24 × num_attention_heads 4 != hidden_size 64"},
      {"granite", "rope_scaling", Json{{"rope_type", "yarn"}, {"factor", 2.0}},
       "rope_scaling type 'yarn' is not supported for granite (llama3, linear)"},
      {"granite", "hidden_act", "gelu", "\"hidden_act\" = \"gelu\" is not supported (silu)"},
  };
  for (const auto& c : cases) {
    Json j = config(c.arch);
    const std::string key = c.key;
    if (const size_t dot = key.find('.'); dot != std::string::npos) {
      j[key.substr(0, dot)][key.substr(dot + 1)] = c.value;
    } else {
      j[key] = c.value;
    }
    const std::string got = keys_of(j);
    EXPECT_NE(got.find(c.message), std::string::npos) << c.arch << " " << c.key << ": " << got;
  }
}

TEST(HfArchTest, Gemma3DefaultsFromItsConfigClass) {
  // A multimodal Gemma 3 text_config leaves most keys to Gemma3TextConfig's defaults.
  const Json j = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                  {"text_config",
                   {{"hidden_size", 2560}, {"intermediate_size", 10240},
                    {"num_hidden_layers", 34}, {"model_type", "gemma3_text"},
                    {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}},
                    {"sliding_window", 1024}}}};
  const std::string k = keys_of(j);
  for (const char* want : {"gemma3.attention.head_count=8\n", "gemma3.attention.head_count_kv=4\n",
                           "gemma3.attention.key_length=256\n", "gemma3.rope.freq_base=1000000\n",
                           "gemma3.rope.freq_base_swa=10000\n", "gemma3.context_length=131072\n",
                           "gemma3.attention.sliding_window=1024\n"}) {
    EXPECT_NE(k.find(want), std::string::npos) << want << " in\n" << k;
  }
}

}  // namespace
}  // namespace arbor::convert
