// Tensor parallelism on the CPU: what one rank of a TP group holds and runs
// (docs/tensor_parallel.md has the diagram).
//
// Megatron's layout over `size` ranks: rank r holds
//   q, k, v     rows of its heads (num_heads / size query heads, num_kv_heads / size kv heads,
//               whole GQA groups), their biases; its KV cache holds only those kv heads;
//   attn_output columns of its heads (row-parallel), as canonical K segments;
//   gate, up    rows [r * ffn / size, (r + 1) * ffn / size) and their biases;
//   ffn_down    the same columns (row-parallel), as canonical K segments;
//   output      rows [r * V', min(V, (r + 1) * V')), V' = ceil(V / size) (vocabulary-parallel);
//   everything else whole: token_embd (read one row per token), the norms, the biases of the
//   row-parallel matrices (added after the all-reduce), the rope factors.
// Per layer the ranks meet twice (an all-reduce after attn_output and after ffn_down), and once
// per step to gather the logits on rank 0 (greedy-only steps send each row's (max, argmax)).
//
// Identical output at any degree: a row-parallel matmul is computed as `num_segments` canonical
// K segments (the same column slices at every degree, TP = 1 included), each an f32 matmul of its
// own, combined in a fixed binary tree (collective::tree_sum): a rank sums its segments in the
// tree's lower levels, the all-reduce sums the ranks in its upper levels, so logits at TP = 1, 2
// and 4 are the same bits.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "collective/collective.h"
#include "model/model_config.h"

namespace arbor::model {

struct LlamaWeights;

// What a ModelRunner (and so a LocalExecutor) is built with to run one rank of a TP group.
// size 1 (the default): the whole model, no collective.
struct TpContext {
  int rank = 0;  // in [0, size)
  int size = 1;  // 1, 2 or 4, and at most the model's canonical segment count
  // The group's collectives (rank() == rank, size() == size); required when size > 1.
  std::shared_ptr<collective::Collective> collective;
};

// The most canonical K segments a row-parallel matrix is cut into (so TP degrees 1, 2 and 4).
inline constexpr int kMaxSegments = 4;

// The canonical segment count of a model: the largest of 4, 2, 1 that cuts q_dim and ffn_dim
// into slices that are whole kv-head groups and whole blocks of every layer's attn_output and
// ffn_down type. 1 for mixture-of-experts models (their FFN is not split). A property of the
// file, never of the TP degree. `w`: the whole (unsharded) weights.
int canonical_segments(const ModelConfig& c, const LlamaWeights& w);

// Rank `rank`'s share of a model cut `size` ways.
struct TpShape {
  int num_heads = 0;     // local query heads
  int num_kv_heads = 0;  // local kv heads
  int ffn_dim = 0;       // local feed-forward rows
  int64_t vocab_begin = 0;  // first output row of this rank
  int64_t vocab_rows = 0;   // output rows of this rank
  int64_t vocab_pad = 0;    // ceil(vocab / size): the rows every rank sends per logits row
};
TpShape tp_shape(const ModelConfig& c, int rank, int size);

// Whether the model can run at TP degree `size`: kUnimplemented naming what prevents it
// (experts, whole-projection QK-norm, a degree above the segment count or not in {1, 2, 4}).
Status check_tp(const ModelConfig& c, int num_segments, int size);
// check_tp's refusals that the config alone decides (before any weight is read): for a launcher
// that would otherwise start `size` processes that each refuse the model.
Status check_tp_config(const ModelConfig& c, int size);

}  // namespace arbor::model
