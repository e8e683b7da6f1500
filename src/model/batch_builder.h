// BatchBuilder: assembles the flat arrays of a ForwardBatch from per-sequence descriptions.
//
// For tests, benchmarks and simple callers (SingleSequence, `arbor generate`); the engine's
// executor builds the same arrays from the scheduler's output. The builder owns the arrays and
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
  std::span<const int32_t> block_table;
  int32_t num_committed = 0;         // tokens already in the cache (always visible)
  std::span<const int32_t> tokens;   // [n] new tokens
  // [n] RoPE positions; empty = num_committed + i (a plain chain).
  std::span<const int32_t> positions;
  // [n * n] row-major, nonzero = new token i sees new token j; empty = causal.
  std::span<const uint8_t> mask;
  LogitsMode logits = LogitsMode::kLast;  // which of this sequence's rows get logits
  int32_t logits_begin = 0;  // kRange: 0 <= logits_begin <= logits_end <= n (CHECKed)
  int32_t logits_end = 0;
};

class BatchBuilder {
 public:
  explicit BatchBuilder(int32_t block_size) : block_size_(block_size) {}

  void clear();
  // Appends one sequence. CHECKs that block_table covers the tokens and that a non-empty mask
  // (or positions) has the right size. Returns the sequence's first logits row (its row index
  // in the forward's logits output).
  int32_t add(const SequenceInput& seq);

  // Views into this builder: valid until the next add() or clear().
  ForwardBatch batch() const;
  int32_t num_logits() const { return (int32_t)logits_indices_.size(); }
  int32_t block_size() const { return block_size_; }

 private:
  void append_mask(const SequenceInput& seq);

  int32_t block_size_;
  bool any_mask_ = false;
  std::vector<int32_t> tokens_, positions_, qo_indptr_{0}, kv_indptr_{0}, kv_page_indices_;
  std::vector<int32_t> kv_len_, slot_mapping_, logits_indices_, mask_indptr_{0};
  std::vector<uint8_t> mask_bits_;
};

}  // namespace arbor::model
