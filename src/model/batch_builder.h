// BatchBuilder: assembles the flat arrays of a ForwardBatch from per-sequence descriptions.
//
// The engine's executor, the draft model, SingleSequence, benchmarks and tests all build their
// batches with it. The builder owns the arrays and
// keeps their capacity across clear(), so a steady-state step does not allocate.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/forward_batch.h"

namespace arbor::model {

// Which of a sequence's rows get logits: none, the last, all, or rows [logits_begin, logits_end)
// (kRange: prompt logprobs score a run of prompt rows, possibly followed by the sampling row).
enum class LogitsMode { kNone, kLast, kAll, kRange };

struct SequenceInput {
  // Block ids of the sequence, covering num_committed + tokens.size() tokens. [num_blocks]
  // With KV cache groups: group 0's table.
  std::span<const int32_t> block_table;
  int32_t num_committed = 0;         // tokens already in the cache (always visible)
  std::span<const int32_t> tokens;   // [n] new tokens
  // [n] RoPE positions; empty = num_committed + i (a plain chain).
  std::span<const int32_t> positions;
  // The sequence's custom mask segment, packed as in the batch (docs/batch_layout.md): n * n
  // bits from bit 0, row-major, bit (i, j) = new token i sees new token j, bit k in byte k / 8
  // at bit k % 8 — sampling::TokenTree::packed_mask()'s format. [ceil(n * n / 8)] bytes; the
  // padding bits of the last byte are ignored. Empty = causal.
  std::span<const uint8_t> mask_bits;
  LogitsMode logits = LogitsMode::kLast;  // which of this sequence's rows get logits
  int32_t logits_begin = 0;  // kRange: 0 <= logits_begin <= logits_end <= n (CHECKed)
  int32_t logits_end = 0;
  // Rows [hidden_begin, hidden_end) of this sequence's new tokens return their final hidden
  // state (ForwardBatch::hidden_indices: pooling); 0 <= begin <= end <= n (CHECKed).
  int32_t hidden_begin = 0;
  int32_t hidden_end = 0;
  // [num_groups - 1] the tables of KV cache groups 1 .. G-1 (as long as block_table each);
  // empty with one group. The builder's group count must match.
  std::span<const std::vector<int32_t>> more_block_tables;
  // The sequence's recurrent state slot (ForwardBatch::state_slots), or -1 for a model without
  // recurrent layers. Every sequence of a batch gives one, or none does (CHECKed).
  int32_t state_slot = -1;
  // >= 0: verify this sequence's tokens without touching state_slot (speculation): its first
  // token reads state_slot (zero when num_committed is 0) and writes this scratch slot, the
  // others continue in it (ForwardBatch::state_src / state_dst; ModelRunner::commit_states
  // replays the accepted ones into state_slot afterwards).
  int32_t state_scratch = -1;
  // Or explicit per-token routing ([n] each; ForwardBatch::state_src / state_dst): a token tree's
  // nodes each continue their parent's slot. Empty: state_scratch's chain, or in place.
  std::span<const int32_t> state_src;
  std::span<const int32_t> state_dst;
  // The sequence's rows may be replayed into its state after verification (drafts:
  // ForwardBatch::replay_rows); implied by state_scratch.
  bool replayable = false;
  // An MTP head's batch (ForwardBatch::input_hidden): [n, dim] the target's hidden row before
  // each new token. Every sequence of a batch gives them, or none does (CHECKed).
  std::span<const float> input_hidden;
};

class BatchBuilder {
 public:
  // num_kv_groups: the KV cache groups every sequence brings a table for (>= 1).
  explicit BatchBuilder(int32_t block_size, int32_t num_kv_groups = 1);

  void clear();
  // Appends one sequence, copying its mask bits into the batch's bit array once. CHECKs only
  // what its own reads need (block tables long enough, positions and mask of the right size, the
  // logits range); the batch as a whole is validated once, where it enters the model
  // (ModelRunner::forward: validate_batch). Returns the sequence's first logits row (its row
  // index in the forward's logits output).
  int32_t add(const SequenceInput& seq);

  // Views into this builder: valid until the next add() or clear().
  ForwardBatch batch() const;
  int32_t num_logits() const { return (int32_t)logits_indices_.size(); }
  // Token rows so far: the next sequence's first row.
  int32_t num_tokens() const { return (int32_t)tokens_.size(); }
  // Hidden-state rows so far: the next sequence's first hidden row.
  int32_t num_hidden() const { return (int32_t)hidden_indices_.size(); }
  int32_t block_size() const { return block_size_; }
  int32_t num_kv_groups() const { return 1 + (int32_t)more_.size(); }

 private:
  struct GroupArrays {
    std::vector<int32_t> kv_indptr{0}, kv_page_indices, slot_mapping;
  };
  void append_mask(const SequenceInput& seq);
  static void append_table(std::span<const int32_t> table, const SequenceInput& seq,
                           int32_t block_size, std::vector<int32_t>& kv_indptr,
                           std::vector<int32_t>& kv_page_indices,
                           std::vector<int32_t>& slot_mapping);

  int32_t block_size_;
  std::vector<GroupArrays> more_;       // groups 1 .. G-1
  mutable std::vector<KvGroupArrays> more_views_;  // batch()'s views of more_
  bool any_mask_ = false;
  std::vector<int32_t> tokens_, positions_, qo_indptr_{0}, kv_indptr_{0}, kv_page_indices_;
  std::vector<int32_t> kv_len_, slot_mapping_, logits_indices_, hidden_indices_, mask_indptr_{0};
  std::vector<int32_t> state_slots_;
  bool any_scratch_ = false;
  std::vector<int32_t> state_src_, state_dst_;  // [T] when any sequence has a scratch slot
  std::vector<int32_t> replay_rows_;            // [R] rows of replayable sequences
  std::vector<float> input_hidden_;             // [T, dim] when the sequences give them
  std::vector<uint8_t> mask_bits_;
};

}  // namespace arbor::model
