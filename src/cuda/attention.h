// Paged attention on the GPU: kernels::paged_attention's contract (kernels/attention.h), every
// pointer a device pointer. Usable from code not compiled by nvcc.
//
// Work: one thread block (4 warps) per (query token t, kv head g) — and per key chunk when the
// call is split — serving the r = num_q_heads / num_kv_heads query heads of g, so each K/V row is
// read from the cache once per block (widened to f32 into shared memory, 32 keys at a time).
//
// Key order. Row (t, h) of sequence b, new token i, sees a *logical* key range [0, end):
//   causal:  end = committed + i + 1, logical key k = cache position k;
//   masked:  end = committed + (set bits of mask row i); logical keys below `committed` are the
//            committed tokens, then come the new tokens row i sees, in index order.
// So a token tree's row runs over exactly the keys, in the same order, that a decode of that
// token after its path would (what lossless greedy tree speculation needs), and no per-key
// visibility test is left. Keys are cut into chunks at fixed logical positions
// [0, C), [C, 2C), ... with C = max(1, 512 / block_size) * block_size (as the CPU does); within a
// chunk, tiles of 32 keys at fixed offsets each do one online-softmax step (f32, explicit
// round-to-nearest arithmetic); chunks fold in key order (the CPU's fold_partial), either in the
// block that ran them or, when the call is split over chunks (few blocks, long contexts), in a
// merge kernel with the same arithmetic. A row's output therefore depends, bit for bit, only on
// its q, its keys and block_size: not on the other rows or sequences, nor on the split decision.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/matmul.h"
#include "kernels/attention.h"

namespace arbor::cuda {

// What the host must know about the call beyond PagedAttentionParams (its arrays live on the
// device): the number of query rows qo_indptr[B] and the longest kv_len[b].
struct AttentionGeometry {
  int32_t num_tokens = 0;
  int32_t max_kv_len = 0;
};

struct AttentionPlan {
  bool split = false;          // one block per (token, kv head, key chunk), then a merge kernel
  int32_t max_chunks = 0;      // key chunks of the longest sequence
  size_t workspace_bytes = 0;  // device scratch the launch needs (0 unless split)
  size_t shared_bytes = 0;     // dynamic shared memory per block
};

// Splits over key chunks when the unsplit grid (num_tokens * num_kv_heads blocks) would leave
// SMs idle (< 2 blocks per SM) and the longest sequence has several chunks. CHECKs that the
// shared memory fits (head_dim 256 with 16 query heads per kv head does).
AttentionPlan plan_paged_attention(const kernels::PagedAttentionParams& p,
                                   const AttentionGeometry& g, int num_sms);

// Computes p.out on `stream`. workspace: plan.workspace_bytes of device memory, untouched until
// the call has run.
void launch_paged_attention(const kernels::PagedAttentionParams& p, const AttentionGeometry& g,
                            const AttentionPlan& plan, void* workspace, cudaStream_t stream);

}  // namespace arbor::cuda
