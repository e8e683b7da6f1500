// ModelConfig: the hyperparameters of a Llama-family model, read from GGUF metadata.
//
// Supported `general.architecture` values: "llama" (Llama 2/3, TinyStories, Mistral-style GQA;
// RoPE on adjacent pairs, as llama.cpp's converter leaves q/k) and "qwen2" (q/k/v biases, NeoX
// RoPE on the two halves of each head). Keys read, with <a> the architecture:
//   required: <a>.embedding_length, <a>.feed_forward_length, <a>.block_count,
//             <a>.attention.head_count, <a>.attention.layer_norm_rms_epsilon,
//             <a>.context_length, tensor token_embd.weight (vocab size = its dims[1])
//   optional: <a>.attention.head_count_kv (default head_count),
//             <a>.attention.key_length (head_dim; default embedding_length / head_count),
//             <a>.rope.dimension_count (default head_dim), <a>.rope.freq_base (default 10000),
//             <a>.rope.scaling.type ("none" | "llama3"), <a>.rope.scaling.factor,
//             <a>.rope.scaling.original_context_length, <a>.rope.scaling.low_freq_factor
//             (default 1), <a>.rope.scaling.high_freq_factor (default 4)
// A missing required key or an unsupported value is an error that names the key.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "gguf/gguf.h"

namespace arbor::model {

enum class Arch { kLlama, kQwen2 };

enum class RopeScaling { kNone, kLlama3 };

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_name;  // "llama" | "qwen2"
  int dim = 0;            // embedding_length
  int ffn_dim = 0;        // feed_forward_length
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int context_length = 0;
  float rms_eps = 1e-5f;

  float rope_theta = 10000.0f;
  int rope_dim = 0;         // leading dims of each head that RoPE rotates (<= head_dim)
  bool rope_neox = false;   // true: pairs (d, d + rope_dim/2); false: pairs (2i, 2i+1)
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_factor = 0.0f;  // kLlama3 only
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int rope_original_context = 0;

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }

  static Result<ModelConfig> from_gguf(const gguf::GgufFile& file);
  // "llama: dim 64, ffn 172, 5 layers, 8 heads (4 kv, head_dim 8), vocab 512, ..."
  std::string summary() const;
};

}  // namespace arbor::model
