// ForwardBatch: the geometry of one ragged-batch forward step (see docs/batch_layout.md).
//
// Non-owning views; whoever builds the batch (the executor, BatchBuilder, SingleSequence) keeps
// the arrays alive for the forward call. B = qo_indptr.size() - 1 sequences, T = tokens.size()
// new tokens, L = logits_indices.size() output rows.
//
//   tokens          [T]      token ids of the new tokens, sequences back to back
//   positions       [T]      RoPE positions (token trees: siblings share a position)
//   qo_indptr       [B+1]    sequence b's new tokens are rows [qo_indptr[b], qo_indptr[b+1])
//   kv_indptr       [B+1]    sequence b's block table is
//                            kv_page_indices[kv_indptr[b] .. kv_indptr[b+1])
//   kv_page_indices [nnz]    block ids covering committed + new tokens, in order
//   kv_len          [B]      committed + new tokens of b after this step
//   slot_mapping    [T]      block_id * block_size + offset where each new token's K/V goes; for
//                            new token i of b it must be the slot of logical index
//                            kv_len[b] - n_b + i in b's block table
//   logits_indices  [L]      rows of `tokens` whose logits are wanted
//   hidden_indices  [H]      rows of `tokens` whose final hidden state (after the output norm,
//                            before the classifier) is wanted: embeddings (pooling)
//   mask_indptr     [B+1]    optional (empty = causal everywhere): bit offsets into mask_bits;
//                            an empty segment = causal for that sequence, else n_b * n_b bits
//   mask_bits       [bytes]  row-major bit (i, j) = new token i sees new token j, bit k of the
//                            batch in byte k / 8 at bit k % 8; diagonal bits must be set
//   more_kv_groups  [G-1]    KV cache groups 1 .. G-1 (sliding-window layers, docs/kv_layout.md):
//                            each its own kv_indptr [B+1], kv_page_indices and slot_mapping [T],
//                            with the meaning above; the fields above are group 0's. Empty: one
//                            group. A layer reads the arrays of its group (KvCacheShape::
//                            group_of); kv_len, qo_indptr and the mask are shared.
//   state_slots     [B]      models with recurrent layers only (else empty): the
//                            RecurrentStateCache slot holding sequence b's state after its
//                            kv_len[b] - n_b computed tokens (a sequence starting at 0 starts
//                            from zero), which the step leaves holding its state after its last
//                            new token; distinct. Custom mask segments (token trees) need
//                            state_src / state_dst: each node continues its parent's state.
//   state_src       [T]      optional, with state_slots (speculation): token t continues the
//   state_dst       [T]      state of slot state_src[t] (-1: zero) and leaves its own in slot
//                            state_dst[t], instead of updating state_slots[b] in place; a
//                            sequence's dst slots are its own (its state_slots[b] or a scratch
//                            slot no other sequence names). Empty: in place.
//   replay_rows     [R]      optional, increasing rows < T (with state_src): the rows of the
//                            sequences that verify drafts, whose recurrent-layer inputs the
//                            forward keeps for ModelRunner::commit_states (only these: a prompt
//                            chunk beside them is not copied).
//   input_hidden    [T, dim] an MTP head's batch only (LlamaModel::mtp_model(); else empty):
//                            row t = the target's final hidden state (after its output norm)
//                            at the position before token t's, zeros where there is none
//                            (position 0), which the head mixes with token t's embedding.
// Output of a forward: logits [L, vocab_size] f32 and hidden states [H, dim] f32.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"

namespace arbor::model {

// One KV cache group's block tables and write slots.
struct KvGroupArrays {
  std::span<const int32_t> kv_indptr;        // [B+1]
  std::span<const int32_t> kv_page_indices;  // [kv_indptr[B]]
  std::span<const int32_t> slot_mapping;     // [T]
};

struct ForwardBatch {
  std::span<const int32_t> tokens;
  std::span<const int32_t> positions;
  std::span<const int32_t> qo_indptr;
  std::span<const int32_t> kv_indptr;
  std::span<const int32_t> kv_page_indices;
  std::span<const int32_t> kv_len;
  std::span<const int32_t> slot_mapping;
  std::span<const int32_t> logits_indices;
  std::span<const int32_t> hidden_indices;
  std::span<const int32_t> mask_indptr;
  std::span<const uint8_t> mask_bits;
  std::span<const KvGroupArrays> more_kv_groups;
  std::span<const int32_t> state_slots;
  std::span<const int32_t> state_src;
  std::span<const int32_t> state_dst;
  std::span<const int32_t> replay_rows;
  std::span<const float> input_hidden;

  int32_t num_kv_groups() const { return 1 + (int32_t)more_kv_groups.size(); }
  // Group g's arrays: g == 0 the fields above, else more_kv_groups[g - 1].
  KvGroupArrays kv_group(int g) const {
    return g == 0 ? KvGroupArrays{kv_indptr, kv_page_indices, slot_mapping}
                  : more_kv_groups[(size_t)g - 1];
  }
  int32_t num_seqs() const { return qo_indptr.empty() ? 0 : (int32_t)qo_indptr.size() - 1; }
  int32_t num_tokens() const { return (int32_t)tokens.size(); }
  int32_t num_logits() const { return (int32_t)logits_indices.size(); }
  int32_t num_hidden() const { return (int32_t)hidden_indices.size(); }
};

// What validate_batch checks against.
struct BatchLimits {
  int32_t vocab_size = 0;
  int32_t block_size = 0;
  int64_t num_blocks = 0;
  // The cache's KV cache groups, by window ([num_groups]; KvCacheLayout::windows()). Empty: one
  // group, block 0 an ordinary block. Otherwise the batch must have this many groups, and block
  // 0 is the KV manager's null block (a sliding group's released entries): no new token may be
  // written to it, nor may the first new token's window (position kv_len - n - W + 1 on; every
  // position in a full-attention group) touch it.
  std::span<const int32_t> group_windows;
  // The model's recurrent state slots (RecurrentStateCache::num_slots); 0: the model has no
  // recurrent layers, and the batch must have no state_slots.
  int32_t num_state_slots = 0;
  // > 0: an MTP head's batch, which must carry input_hidden rows of this width; 0: none.
  int32_t input_hidden_dim = 0;
};

// Checks every array's size, monotone indptrs, token ids, block ids, that block tables cover
// kv_len, that slot_mapping matches the block tables (every group's), the null block rule
// above, logits rows, mask sizes and diagonals.
// O(T + nnz + B + mask bits); the error names the array, the index and the numbers.
Status validate_batch(const ForwardBatch& batch, const BatchLimits& limits);

}  // namespace arbor::model
