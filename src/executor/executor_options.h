// ExecutorOptions: where the local executor runs its forwards and how it sizes its KV pool. cli/
// engine_flags.h maps them to command-line flags (`arbor serve`, `arbor bench throughput`).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/attention.h"
#include "model/tp.h"

namespace arbor::executor {

// kMtp: the target file's own multi-token-prediction head (nextn_predict_layers; Qwen3.5).
enum class SpecProposer : uint8_t { kNone, kNgram, kSuffix, kDraft, kMtp };
// "off", "ngram", "suffix", "draft", "mtp"
std::string_view spec_proposer_name(SpecProposer p);

// How a draft model builds token trees for unseeded sampling requests (greedy and seeded ones
// always get top-k trees verified by sample-and-compare, which keeps their tokens exactly):
//   kTopK       the most probable children (one-hot), verified by sample-and-compare;
//   kSpecInfer  children drawn from q with replacement, SpecInfer's multi-step verification;
//   kSequoia    children drawn without replacement, Sequoia's variant of it.
enum class TreeSampling : uint8_t { kTopK, kSpecInfer, kSequoia };

// --device: where the forward runs and the KV pool lives. kAuto: a CUDA GPU when this build has
// CUDA and one is present, else the CPU.
enum class Device : uint8_t { kAuto, kCpu, kCuda };
std::string_view device_name(Device d);  // "auto", "cpu", "cuda"

struct ExecutorOptions {
  Device device = Device::kCpu;           // --device (the flag's default is auto)
  int cuda_device = 0;                    // --cuda-device: which GPU (cudaSetDevice's ordinal)
  int32_t block_size = 16;                // --block-size: tokens per KV block
  double kv_cache_gib = 1.0;              // --kv-cache-gib: KV memory budget
  int64_t num_kv_blocks = 0;              // --num-kv-blocks: > 0 overrides kv_cache_gib
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF16;  // --kv-dtype
  // Release the KV of sliding-window layers that no query can read again (KV cache groups,
  // docs/kv_layout.md); false (--no-kv-reclaim): every layer keeps every block.
  bool kv_reclaim = true;
  // -t: forward threads (CPU; on a GPU the host's sampling and proposers); 0 = hardware
  // concurrency
  int num_threads = 0;
  // Activation scratch sized up front for this many tokens per step (the engine's
  // max_num_batched_tokens); grows on demand anyway.
  int32_t reserve_tokens = 2048;
  // The engine's --max-num-seqs: a model with recurrent layers (Qwen3.5) holds this many
  // requests' states (ModelExecutor::recurrent_state_slots).
  int32_t max_num_seqs = 64;
  // --state-checkpoints: a recurrent model's states kept at prompts' block boundaries for
  // prefix-cache hits (ModelExecutor::state_checkpoints); 0: none (no prefix caching).
  int32_t state_checkpoints = 8;
  // --spec: who proposes drafts (the engine's --spec-k > 0 turns speculation on).
  SpecProposer proposer = SpecProposer::kNone;
  std::string draft_model;                // --draft-model: a GGUF with the target's vocabulary
  int32_t ngram_min = 2;                  // --spec-ngram-min / --spec-ngram-max: n-gram sizes
  int32_t ngram_max = 4;                  //   matched by the n-gram proposer
  // --spec-tree-budget: > 0 proposes token trees of at most this many nodes per request (up to
  // --spec-k levels deep) instead of chains; 0 = chains. --spec-tree-width: children per node,
  // at most (the draft model's top candidates, the model-free proposers' branches).
  int32_t tree_budget = 0;
  int32_t tree_width = 4;
  TreeSampling tree_sampling = TreeSampling::kTopK;  // --spec-tree-sampling
  // --spec-tree-shape W1,W2,...: a draft model's trees are static (every node at depth d gets
  // W_d children, len levels) instead of dynamic; empty = dynamic (EAGLE-2).
  std::vector<int32_t> tree_static_widths;
  // Sampled top_k requests get only their candidates back (LocalExecutor::top_k_suffices) when
  // the forward runs on a GPU. On the CPU that costs ~35 us more per row at a 32k vocabulary than
  // sampling the whole row in place, so it is off there unless this is set (tests run the GPU's
  // path on the CPU with it).
  bool top_k_candidates_on_host = false;
  // Tensor parallelism: run rank tp.rank of a TP group (model/tp.h; docs/tensor_parallel.md).
  // The shard process that hosts a rank sets it; size 1 (the default) runs the whole model. CPU
  // only: a GPU device with tp.size > 1 is refused at load.
  model::TpContext tp;
};

inline constexpr int32_t kMaxTreeBudget = 64;  // --spec-tree-budget, at most
inline constexpr int32_t kMaxTreeWidth = 8;    // --spec-tree-width, at most

}  // namespace arbor::executor
