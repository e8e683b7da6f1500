// The architecture table: one row per GGUF `general.architecture` that arbor runs.
//
// A row names the block variant flags of that architecture, as llama.cpp (de3ff81) builds its
// graph: which norms exist and where, QK-norm, the feed-forward activation, fused tensors, the
// optional biases the reference reads, sliding-window defaults, soft-capping, the attention
// scale rule, NoPE layers and the per-architecture GGUF keys. ModelConfig::from_gguf reads the
// keys a row asks for, LlamaModel binds the tensors it names, and LlamaForward runs one forward
// over every row (docs/architectures.md lists the rows, keys and tensors). A new architecture is
// a row here plus, at most, a new op — never a copy of the forward.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace arbor::model {

enum class Arch : uint8_t {
  kLlama, kQwen2, kQwen3, kQwen3Moe, kGemma2, kGemma3, kMistral3, kPhi3, kSmolLM3, kOlmo2,
  kGranite, kGptOss, kQwen2Moe, kQwen35, kQwen35Moe,
};

// Per-head or whole-projection RMS norm of q and k before RoPE.
enum class QkNorm : uint8_t {
  kNone,
  kPerHead,  // attn_q_norm / attn_k_norm: [head_dim], applied to every head (Qwen3, Gemma 3)
  kWhole,    // attn_q_norm: [q_dim], attn_k_norm: [kv_dim], over the whole projection (OLMo 2)
};

// The gated feed-forward's activation: down(act(gate(x)) * up(x)).
enum class Activation : uint8_t {
  kSilu,      // x / (1 + exp(-x))
  kGeluTanh,  // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))  (Gemma's gelu_pytorch_tanh)
  // gpt-oss's clamped SwiGLU (llama.cpp's ggml_swiglu_oai, alpha 1.702, limit 7):
  // g = min(gate, 7), u = clamp(up, -7, 7), out = g * sigmoid(1.702 g) * (u + 1).
  kSwigluOai,
};

// Whether output.weight may be present.
enum class OutputTensor : uint8_t {
  kOptional,  // absent: the classifier is token_embd (tied)
  kRequired,  // OLMo 2
  kTied,      // always token_embd; an output.weight in the file is refused (Gemma 2)
};

// How the attention score scale is chosen (before any soft-cap).
enum class AttnScale : uint8_t {
  kHeadDim,  // 1 / sqrt(head_dim)
  kGemma,    // 1 / sqrt(head_dim), but 1 / sqrt(dim / heads) for the 27B shape (its layer count:
             // ArchSpec::gemma_large_layers), as gemma_pytorch's query_pre_attn_scalar
  kKey,      // <arch>.attention.scale when present, else 1 / sqrt(head_dim) (Granite)
};

// Whether the feed-forward blocks are mixtures of experts (ModelConfig::num_experts): a router
// ffn_gate_inp [num_experts, dim] and the experts' 3-D ffn_{gate,up,down}_exps tensors instead
// of ffn_gate / ffn_up / ffn_down.
enum class Experts : uint8_t {
  kNone,      // dense only; <a>.expert_count > 0 is refused
  kOptional,  // experts when <a>.expert_count > 0, of feed_forward_length each (Mixtral on llama)
  kRequired,  // always experts, of <a>.expert_feed_forward_length each (Qwen3-MoE)
};

struct ArchSpec {
  std::string_view name;  // general.architecture
  Arch arch = Arch::kLlama;
  // RoPE rotates pairs (i, i + rope_dim / 2) (NeoX) instead of (2i, 2i + 1).
  bool rope_neox = false;
  // Block structure. pre_norms: attn_norm before attention and ffn_norm before the FFN (absent
  // in OLMo 2). post_norms: post_attention_norm on the attention output and post_ffw_norm on the
  // FFN output, before each residual add (Gemma 2/3, OLMo 2).
  bool pre_norms = true;
  bool post_norms = false;
  QkNorm qk_norm = QkNorm::kNone;
  Activation activation = Activation::kSilu;
  // ffn_up holds [gate; up] ([2 * ffn, dim]) and there is no ffn_gate (Phi-3).
  bool fused_gate_up = false;
  // Optional biases the reference reads: attn_output.bias; ffn_gate/up/down.bias.
  bool attn_out_bias = false;
  bool ffn_bias = false;
  // The per-tensor `.scale` of ffn_gate/up/down is applied (q/k/v/qkv, attn_output and output
  // scales are applied by every row).
  bool ffn_scales = false;
  // attn_q/k/v.bias (or attn_qkv.bias) must be present (Qwen2).
  bool qkv_bias_required = false;
  // rope_freqs.weight (Llama 3.1 divisors) and, with rope.scaling.type longrope,
  // rope_factors_long/short.weight may be present.
  bool rope_freqs = false;
  OutputTensor output = OutputTensor::kOptional;
  // Embeddings times sqrt(dim) (Gemma).
  bool embed_scale_sqrt_dim = false;
  // Granite's multipliers: embedding_scale, residual_scale, logit_scale (required) and
  // attention.scale; rope.scaling.finetuned = false turns RoPE off.
  bool granite_scales = false;
  // Sliding window: layer l is a sliding layer when l % pattern < pattern - 1 (or per the
  // attention.sliding_window_pattern array). swa_pattern 0: no sliding layers. swa_needs_key:
  // only when attention.sliding_window is present and > 0 (else the default window applies).
  int swa_pattern = 0;
  int swa_default_window = 0;
  bool swa_needs_key = true;
  // Sliding layers' RoPE base: rope.freq_base_swa when present, else 10000 (Gemma 3) or the
  // global base (swa_base_is_global: Gemma 2, OLMo 2); no scaling on sliding layers.
  bool swa_base_is_global = false;
  // Layer l has no RoPE when (l + 1) % nope_every == 0 (SmolLM3: 4); 0: every layer rotates.
  int nope_every = 0;
  // Soft-caps (score = cap * tanh(score / cap)); attention's on the scaled scores, the final
  // one on the logits. The key overrides the default when the row reads it.
  bool attn_softcap_key = false;
  float attn_softcap_default = 0.0f;
  bool final_softcap_key = false;
  float final_softcap_default = 0.0f;
  AttnScale attn_scale = AttnScale::kHeadDim;
  int gemma_large_layers = 0;
  // Mistral 3: attention.temperature_scale (Llama 4 scaling of q by position) and the YaRN
  // beta_fast / beta_slow / yarn_log_multiplier keys.
  bool mistral_keys = false;
  // RoPE must rotate whole heads (rope.dimension_count == head_dim).
  bool rope_whole_head = false;
  // cls.output.weight ([classes, dim]) may be present: the rank head of llama.cpp's rank pooling
  // (Qwen3-Reranker files: the "yes" and "no" rows of the LM head), applied to the last token's
  // normed hidden state and softmaxed (executor/pooler.h).
  bool rank_head = false;
  Experts experts = Experts::kNone;
  // gpt-oss: blk.N.attn_sinks.weight [num_heads] (required): a learned logit per query head that
  // joins every softmax's denominator and adds no value (kernels::PagedAttentionParams::sinks).
  bool attn_sinks = false;
  // The FFN's pre-norm tensor (gpt-oss names it post_attention_norm: the norm after the
  // attention's residual add, i.e. before the FFN).
  std::string_view ffn_norm_name = "ffn_norm";
  // gpt-oss: the router's bias ffn_gate_inp.bias [experts] and per-expert biases
  // ffn_{gate,up}_exps.bias [expert_ffn, experts], ffn_down_exps.bias [dim, experts] (required).
  bool expert_biases = false;
  // Sliding layers use the full-attention layers' RoPE (scaling included), with their own base
  // only when rope.freq_base_swa is present (gpt-oss); else they run unscaled RoPE (Gemma, OLMo).
  bool swa_rope_is_global = false;
  // attention.sliding_window is required (gpt-oss: llama.cpp refuses a file without it).
  bool swa_key_required = false;
  // The routed experts' weights are their probabilities renormalised over the chosen (qwen3moe,
  // Mixtral, gpt-oss's softmax over the chosen) or, false, the probabilities of the softmax over
  // all experts (Qwen2-MoE; llama.cpp's norm_w).
  bool expert_weights_norm = true;
  // Qwen2-MoE's shared expert (required): blk.N.ffn_{gate,up,down}_shexp.weight, an FFN of
  // <a>.expert_shared_feed_forward_length (default feed_forward_length) every token runs, added
  // to the routed experts' sum times sigmoid(x . ffn_gate_inp_shexp.weight [dim]).
  bool shared_expert = false;
  // Qwen3.5's hybrid stack (docs/qwen35.md): Gated DeltaNet layers (ModelConfig::ssm, the
  // <a>.ssm.* keys; layer l is recurrent per <a>.attention.recurrent_layers, else when
  // (l + 1) % <a>.full_attention_interval != 0) between full-attention layers, and trailing
  // multi-token-prediction blocks (<a>.nextn_predict_layers) that the trunk does not run.
  bool gated_delta_net = false;
  // attn_q holds, per head, [q (head_dim); gate (head_dim)] rows: the attention's output is
  // multiplied by sigmoid(gate) before attn_output (Qwen3.5's gated attention).
  bool attn_output_gate = false;
  // <a>.feed_forward_length may be absent (Qwen3.5-MoE: the experts' and the shared expert's
  // widths have their own keys).
  bool ffn_length_optional = false;
};

// The row for `name`, or null.
const ArchSpec* find_arch(std::string_view name);
// "llama, qwen2, qwen3, ..." for error messages.
std::string supported_arch_names();

}  // namespace arbor::model
