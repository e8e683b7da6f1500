#include "model/arch.h"

#include <array>

namespace arbor::model {
namespace {

// Each row as llama.cpp de3ff81 builds the architecture (src/models/<name>.cpp there).
constexpr std::array kArchs = {
    ArchSpec{.name = "llama", .arch = Arch::kLlama, .attn_out_bias = true, .ffn_bias = true,
             .ffn_scales = true, .rope_freqs = true, .rope_whole_head = true,
             .experts = Experts::kOptional},
    ArchSpec{.name = "qwen2", .arch = Arch::kQwen2, .rope_neox = true, .qkv_bias_required = true},
    ArchSpec{.name = "qwen3", .arch = Arch::kQwen3, .rope_neox = true,
             .qk_norm = QkNorm::kPerHead, .ffn_scales = true, .rank_head = true},
    ArchSpec{.name = "qwen3moe", .arch = Arch::kQwen3Moe, .rope_neox = true,
             .qk_norm = QkNorm::kPerHead, .experts = Experts::kRequired},
    ArchSpec{.name = "gemma2", .arch = Arch::kGemma2, .rope_neox = true, .post_norms = true,
             .activation = Activation::kGeluTanh, .output = OutputTensor::kTied,
             .embed_scale_sqrt_dim = true, .swa_pattern = 2, .swa_default_window = 4096,
             .swa_needs_key = false, .swa_base_is_global = true, .attn_softcap_key = true,
             .attn_softcap_default = 50.0f, .final_softcap_key = true,
             .final_softcap_default = 30.0f, .attn_scale = AttnScale::kGemma,
             .gemma_large_layers = 46},
    ArchSpec{.name = "gemma3", .arch = Arch::kGemma3, .rope_neox = true, .post_norms = true,
             .qk_norm = QkNorm::kPerHead, .activation = Activation::kGeluTanh,
             .embed_scale_sqrt_dim = true, .swa_pattern = 6, .final_softcap_key = true,
             .attn_scale = AttnScale::kGemma, .gemma_large_layers = 62},
    ArchSpec{.name = "mistral3", .arch = Arch::kMistral3, .attn_out_bias = true,
             .ffn_bias = true, .ffn_scales = true, .rope_freqs = true, .mistral_keys = true},
    ArchSpec{.name = "phi3", .arch = Arch::kPhi3, .rope_neox = true, .fused_gate_up = true,
             .rope_freqs = true},
    ArchSpec{.name = "smollm3", .arch = Arch::kSmolLM3, .nope_every = 4},
    ArchSpec{.name = "olmo2", .arch = Arch::kOlmo2, .rope_neox = true, .pre_norms = false,
             .post_norms = true, .qk_norm = QkNorm::kWhole, .output = OutputTensor::kRequired,
             .swa_pattern = 4, .swa_base_is_global = true},
    ArchSpec{.name = "granite", .arch = Arch::kGranite, .attn_out_bias = true, .ffn_bias = true,
             .rope_freqs = true, .granite_scales = true, .attn_scale = AttnScale::kKey},
    // gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE, src/models/openai-moe.cpp): q/k/v and output
    // biases, sinks, even layers sliding, top-k then softmax routing with biases everywhere.
    ArchSpec{.name = "gpt-oss", .arch = Arch::kGptOss, .rope_neox = true,
             .activation = Activation::kSwigluOai, .attn_out_bias = true,
             .output = OutputTensor::kRequired, .swa_pattern = 2,
             .experts = Experts::kRequired, .attn_sinks = true,
             .ffn_norm_name = "post_attention_norm", .expert_biases = true,
             .swa_rope_is_global = true, .swa_key_required = true},
    // Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention, experts weighted by their full-softmax
    // probabilities, and a gated shared expert.
    ArchSpec{.name = "qwen2moe", .arch = Arch::kQwen2Moe, .rope_neox = true,
             .qkv_bias_required = true, .output = OutputTensor::kRequired,
             .experts = Experts::kRequired, .expert_weights_norm = false,
             .shared_expert = true},
    // Qwen3.5 / 3.6 (llama.cpp's src/models/qwen35.cpp, qwen35moe.cpp): Gated DeltaNet layers
    // and gated full attention with per-head QK-norm and partial NeoX RoPE (IMRoPE with text
    // positions), the FFN's pre-norm named post_attention_norm; the MoE adds a gated shared
    // expert to softmax-top-k-renormalised experts.
    ArchSpec{.name = "qwen35", .arch = Arch::kQwen35, .rope_neox = true,
             .qk_norm = QkNorm::kPerHead, .ffn_norm_name = "post_attention_norm",
             .gated_delta_net = true, .attn_output_gate = true},
    ArchSpec{.name = "qwen35moe", .arch = Arch::kQwen35Moe, .rope_neox = true,
             .qk_norm = QkNorm::kPerHead, .experts = Experts::kRequired,
             .ffn_norm_name = "post_attention_norm", .shared_expert = true,
             .gated_delta_net = true, .attn_output_gate = true, .ffn_length_optional = true},
};

}  // namespace

const ArchSpec* find_arch(std::string_view name) {
  for (const ArchSpec& a : kArchs) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::string supported_arch_names() {
  std::string s;
  for (const ArchSpec& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += a.name;
  }
  return s;
}

}  // namespace arbor::model
