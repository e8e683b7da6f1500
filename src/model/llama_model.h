// LlamaModel: a Llama-family model's config and weights, viewed in place in the mmapped GGUF.
//
// Tensor names (llama.cpp's): token_embd, output_norm, output (absent = tied to token_embd),
// blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}
// (.weight), optionally blk.N.attn_{q,k,v}.bias (qwen2: required) and rope_freqs.weight
// (Llama 3.1 frequency divisors, as llama.cpp and `arbor convert` write them). Matrices may be
// any type kernels::matmul_supported() accepts; norms and biases must be F32. load() checks every
// tensor's dims against the config and names the tensor on mismatch.
//
// Q8_0, Q4_0, K-quant, Q4_1 and Q5_x matrices are repacked at load for the CPU's packed kernels
// when it has them (kernels::pack_weights; each view's `packed` points into this model) and their
// mmapped pages are released, so the resident copy is the packed one. Immutable after load; any thread may read it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "model/model_config.h"

namespace arbor::model {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  kernels::WeightView wq;            // [q_dim, dim]   (rows, cols)
  kernels::WeightView wk;            // [kv_dim, dim]
  kernels::WeightView wv;            // [kv_dim, dim]
  const float* bq = nullptr;         // [q_dim] or null
  const float* bk = nullptr;         // [kv_dim] or null
  const float* bv = nullptr;         // [kv_dim] or null
  kernels::WeightView wo;            // [dim, q_dim]
  const float* ffn_norm = nullptr;   // [dim]
  kernels::WeightView w_gate;        // [ffn_dim, dim]
  kernels::WeightView w_up;          // [ffn_dim, dim]
  kernels::WeightView w_down;        // [dim, ffn_dim]
};

struct LlamaWeights {
  kernels::WeightView token_embd;    // [vocab, dim]
  std::vector<LayerWeights> layers;  // [num_layers]
  const float* output_norm = nullptr;  // [dim]
  kernels::WeightView output;        // [vocab, dim]; equals token_embd when tied
  bool tied_output = false;
  // [rope_dim / 2] or null: llama.cpp's rope_freqs.weight; frequency i is divided by it.
  const float* rope_freqs = nullptr;
};

struct ModelLoadOptions {
  // Repack matrices for the CPU's packed kernels (see above). A model that runs on a GPU skips
  // it: the device reads the GGUF encoding from the mapping.
  bool pack_for_cpu = true;
};

class LlamaModel {
 public:
  // Opens and maps `path`, reads the config and binds every weight.
  static Result<std::unique_ptr<LlamaModel>> load(const std::string& path,
                                                  const ModelLoadOptions& options = {});
  // Same, from an already opened file (taken over).
  static Result<std::unique_ptr<LlamaModel>> from_file(gguf::GgufFile file,
                                                       const ModelLoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  const gguf::GgufFile& file() const { return file_; }

 private:
  LlamaModel(gguf::GgufFile file, ModelConfig config)
      : file_(std::move(file)), config_(std::move(config)) {}
  Status bind_weights();
  Status check_cheap_weights() const;
  Status bind_layer(int layer);
  // Packs every matrix matmul() reads that has a packed kernel on this CPU.
  void pack_matrices();

  std::vector<kernels::PackedWeights> packed_;
  gguf::GgufFile file_;
  ModelConfig config_;
  LlamaWeights weights_;
};

}  // namespace arbor::model
