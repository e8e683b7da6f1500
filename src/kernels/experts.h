// Mixture-of-experts kernels: the router's choice per token, the (token, slot) pairs sorted by
// expert, and the grouped matmuls that run every pair of a step through its expert's matrix,
// each expert's weights streamed once for all the pairs routed to it (docs/kernels.md,
// "Mixture-of-experts FFN").
//
//   y[p, r] = sum_c E[e(p)][r, c] * x[src(p), c]      for every pair p < num_pairs
//
// The pairs come sorted by expert (model::ForwardOps::route_experts makes them):
//   expert_indptr: [num_experts + 1], nondecreasing from 0; pairs [expert_indptr[e],
//                  expert_indptr[e + 1]) go through expert e; num_pairs = expert_indptr[E]
//   src_rows:      [num_pairs] the x row each pair reads, or null: pair p reads x[p]
//   x:             [*, cols] f32 row-major;  y: [num_pairs, rows] f32 row-major
// Each matrix set is one 3-D GGUF tensor seen as num_experts 2-D WeightViews (same type, rows and
// cols), packed per expert like any matrix (pack_weights; each view's `packed`).
//
// Work split: the activations of each pair are quantised into per-expert, block-major records
// (up to 128 pairs by every thread into its own records, for the experts it runs; above, once
// per call, shared); one parallel_for runs units of (matrix, expert, run of 16-row
// groups), the packed kernels' tile, cut so that every unit costs about the same — a unit of an
// expert with n pairs covers fewer groups the larger n is (cost ~ groups x (n + a weight-read
// term)) — so a step's threads share the work whether it routes one token to 8 experts (decode)
// or 512 tokens to 128 (prefill). Weights without a packed kernel (F32, F16, BF16, the generic
// types, the affine reference path) run one matmul() per expert on the gathered rows instead.
//
// Batch invariance: y[p] depends, bit for bit, only on x[src(p)], the expert's matrix and the
// active ISA — exactly matmul(E[e(p)], x[src(p)], 1 token) — not on the other pairs, how many
// share its expert, the thread count or the split (the kernels' own guarantee, docs/kernels.md).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/matmul.h"
#include "kernels/thread_pool.h"

namespace arbor::kernels {

// The softmax router of one token, as llama.cpp's build_moe_ffn runs it for qwen3moe and
// Mixtral (softmax over the experts, the top k, their probabilities renormalised to sum 1),
// computed as the equal softmax over the chosen: the k largest logits (ties to the lower expert
// id; a NaN is never chosen over a number), e_j = exp(l_j - max over all logits) in f32,
// weight_j = e_j / (e_0 + ... + e_{k-1}) (summed in choice order). The weights depend only on
// the chosen logits and the maximum, not on the order of the experts; one expert with k = 1
// gets weight 1 exactly.
// renormalize false (Qwen2-MoE: llama.cpp's norm_w off): the chosen experts' probabilities of
// the softmax over all experts, weight_j = e_j / (e_0 + ... + e_{E-1}) with the sum over every
// expert in id order (the weights then depend on that order in their last bits).
// logits: [num_experts]; ids, weights: [k], in choice order (largest p first). 1 <= k <= E.
void route_softmax_top_k(const float* logits, int num_experts, int k, int32_t* ids,
                         float* weights, bool renormalize = true);

// Sorts the (token, slot) pairs of a step by expert (a counting sort: within an expert, by token,
// then slot). ids: [num_tokens, k], each in [0, num_experts) (CHECKed) ->
//   expert_indptr: [num_experts + 1]  pairs [indptr[e], indptr[e + 1]) are expert e's
//   pair_token:    [num_tokens * k]   the token of each pair
//   slot_pair:     [num_tokens, k]    where token t's j-th choice sits among the pairs
// O(num_tokens * k + num_experts).
void sort_pairs_by_expert(const int32_t* ids, int32_t num_tokens, int k, int num_experts,
                          int32_t* expert_indptr, int32_t* pair_token, int32_t* slot_pair);

struct ExpertRows {
  int32_t num_experts = 0;
  const int32_t* expert_indptr = nullptr;  // [num_experts + 1]
  const int32_t* src_rows = nullptr;       // [num_pairs] or null
  int32_t num_pairs() const { return expert_indptr[num_experts]; }
};

// One matrix set: experts[e] is expert e's [rows, cols] matrix.
struct ExpertMatmul {
  std::span<const WeightView> experts;  // [num_experts], one type, rows and cols
  float* y = nullptr;                   // [num_pairs, rows]
};

// y[p] += bias[e(p)] for every pair p (y: [num_pairs, cols], bias: [num_experts, cols]): the
// per-expert biases of gpt-oss's gate, up and down projections. Pair p's bits depend only on
// y[p] and its expert's bias row.
void add_expert_bias(float* y, const ExpertRows& rows, const float* bias, int cols,
                     ThreadPool& pool);

// Every set of `mats` (at most 4, sharing x and cols: a layer's gate and up projections) over the
// pairs of `rows`, as above. Called from the pool's caller thread; uses the pool's workspace
// (slot 0) and all its threads. y must not alias x.
void matmul_experts(std::span<const ExpertMatmul> mats, const float* x, const ExpertRows& rows,
                    ThreadPool& pool);

}  // namespace arbor::kernels
