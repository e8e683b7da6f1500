#include "model/batch_builder.h"

#include <algorithm>

#include "base/check.h"

namespace arbor::model {

BatchBuilder::BatchBuilder(int32_t block_size, int32_t num_kv_groups)
    : block_size_(block_size), more_(static_cast<size_t>(std::max(num_kv_groups, 1) - 1)) {
  ARBOR_CHECK_GE(num_kv_groups, 1);
}

void BatchBuilder::clear() {
  for (GroupArrays& g : more_) {
    g.kv_indptr.assign(1, 0);
    g.kv_page_indices.clear();
    g.slot_mapping.clear();
  }
  any_mask_ = false;
  any_scratch_ = false;
  for (auto* v : {&tokens_, &positions_, &kv_page_indices_, &kv_len_, &slot_mapping_,
                  &logits_indices_, &hidden_indices_, &state_slots_, &state_src_,
                  &state_dst_, &replay_rows_}) {
    v->clear();
  }
  qo_indptr_.assign(1, 0);
  kv_indptr_.assign(1, 0);
  mask_indptr_.assign(1, 0);
  mask_bits_.clear();
  input_hidden_.clear();
}

// The segment goes at bit `start` of mask_bits_: a byte copy when start is byte-aligned, else
// each byte shifted across two. The padding bits of the input's last byte are cleared first,
// since the next segment's bits share that byte.
void BatchBuilder::append_mask(const SequenceInput& seq) {
  const int64_t n = (int64_t)seq.tokens.size();
  const int64_t start = mask_indptr_.back();
  const int64_t bits = seq.mask_bits.empty() ? 0 : n * n;
  if (bits > 0) {
    const int64_t bytes = (bits + 7) / 8;
    ARBOR_CHECK_EQ((int64_t)seq.mask_bits.size(), bytes)
        << "mask bytes for " << n << " new tokens (" << bits << " bits)";
    any_mask_ = true;
    mask_bits_.resize((start + bits + 7) / 8, 0);
    uint8_t* dst = mask_bits_.data() + (start >> 3);
    const int shift = (int)(start & 7);
    for (int64_t k = 0; k < bytes; ++k) {
      uint8_t v = seq.mask_bits[k];
      if (k == bytes - 1 && bits % 8 != 0) v &= (uint8_t)((1u << (bits % 8)) - 1u);
      dst[k] |= (uint8_t)(v << shift);
      if (shift != 0 && (v >> (8 - shift)) != 0) dst[k + 1] |= (uint8_t)(v >> (8 - shift));
    }
  }
  mask_indptr_.push_back((int32_t)(start + bits));
}

int32_t BatchBuilder::add(const SequenceInput& seq) {
  const int32_t n = (int32_t)seq.tokens.size();
  const int32_t kv_len = seq.num_committed + n;
  ARBOR_CHECK((int64_t)seq.block_table.size() * block_size_ >= kv_len)
      << seq.block_table.size() << " blocks of " << block_size_ << " for " << kv_len << " tokens";
  ARBOR_CHECK(seq.positions.empty() || (int32_t)seq.positions.size() == n);
  const int32_t row0 = (int32_t)tokens_.size();
  const int32_t first_logit = (int32_t)logits_indices_.size();
  ARBOR_CHECK(seq.logits != LogitsMode::kRange ||
              (0 <= seq.logits_begin && seq.logits_begin <= seq.logits_end && seq.logits_end <= n))
      << "logits rows [" << seq.logits_begin << ", " << seq.logits_end << ") of " << n;
  ARBOR_CHECK(0 <= seq.hidden_begin && seq.hidden_begin <= seq.hidden_end &&
              seq.hidden_end <= n)
      << "hidden rows [" << seq.hidden_begin << ", " << seq.hidden_end << ") of " << n;
  ARBOR_CHECK_EQ(seq.more_block_tables.size(), more_.size()) << "KV cache group tables";
  for (int32_t i = 0; i < n; ++i) {
    const int32_t k = seq.num_committed + i;
    tokens_.push_back(seq.tokens[i]);
    positions_.push_back(seq.positions.empty() ? k : seq.positions[i]);
    if (seq.logits == LogitsMode::kAll || (seq.logits == LogitsMode::kLast && i == n - 1) ||
        (seq.logits == LogitsMode::kRange && i >= seq.logits_begin && i < seq.logits_end)) {
      logits_indices_.push_back(row0 + i);
    }
    if (i >= seq.hidden_begin && i < seq.hidden_end) hidden_indices_.push_back(row0 + i);
  }
  qo_indptr_.push_back(row0 + n);
  append_table(seq.block_table, seq, block_size_, kv_indptr_, kv_page_indices_, slot_mapping_);
  for (size_t g = 0; g < more_.size(); ++g) {
    const std::vector<int32_t>& table = seq.more_block_tables[g];
    ARBOR_CHECK_EQ(table.size(), seq.block_table.size()) << "group " << g + 1 << "'s table";
    append_table(table, seq, block_size_, more_[g].kv_indptr, more_[g].kv_page_indices,
                 more_[g].slot_mapping);
  }
  kv_len_.push_back(kv_len);
  ARBOR_CHECK(seq.state_slot >= 0 ? state_slots_.size() + 1 == kv_len_.size()
                                   : state_slots_.empty())
      << "every sequence of a batch has a state slot, or none";
  if (seq.state_slot >= 0) {
    state_slots_.push_back(seq.state_slot);
    const bool routed = !seq.state_src.empty();
    ARBOR_CHECK(!routed || ((int32_t)seq.state_src.size() == n && (int32_t)seq.state_dst.size() == n))
        << "state routing for " << n << " tokens";
    const bool scratch = seq.state_scratch >= 0 || routed;
    any_scratch_ = any_scratch_ || scratch;
    if (seq.replayable || seq.state_scratch >= 0) {
      for (int32_t i = 0; i < n; ++i) replay_rows_.push_back(row0 + i);
    }
    for (int32_t i = 0; i < n && routed; ++i) {
      state_src_.push_back(seq.state_src[i]);
      state_dst_.push_back(seq.state_dst[i]);
    }
    for (int32_t i = 0; i < n && !routed; ++i) {
      const int32_t prev = i > 0 ? (scratch ? seq.state_scratch : seq.state_slot)
                                 : (seq.num_committed == 0 ? -1 : seq.state_slot);
      state_src_.push_back(prev);
      state_dst_.push_back(scratch ? seq.state_scratch : seq.state_slot);
    }
  }
  ARBOR_CHECK(n == 0 || seq.input_hidden.size() % static_cast<size_t>(n) == 0)
      << seq.input_hidden.size() << " input hidden floats for " << n << " tokens";
  ARBOR_CHECK((row0 == 0 || !input_hidden_.empty() == !seq.input_hidden.empty()) &&
              (input_hidden_.empty() || row0 == 0 ||
               input_hidden_.size() / static_cast<size_t>(row0) ==
                   seq.input_hidden.size() / static_cast<size_t>(std::max(n, 1))))
      << "every sequence of a batch gives input hidden rows of one width, or none does";
  input_hidden_.insert(input_hidden_.end(), seq.input_hidden.begin(), seq.input_hidden.end());
  append_mask(seq);
  return first_logit;
}

void BatchBuilder::append_table(std::span<const int32_t> table, const SequenceInput& seq,
                                int32_t block_size, std::vector<int32_t>& kv_indptr,
                                std::vector<int32_t>& kv_page_indices,
                                std::vector<int32_t>& slot_mapping) {
  const auto n = (int32_t)seq.tokens.size();
  for (int32_t i = 0; i < n; ++i) {
    const int32_t k = seq.num_committed + i;
    slot_mapping.push_back(table[k / block_size] * block_size + k % block_size);
  }
  // Only the blocks the sequence uses so far: a caller may pass a longer reservation.
  const size_t used = (size_t)(seq.num_committed + n + block_size - 1) / block_size;
  kv_page_indices.insert(kv_page_indices.end(), table.begin(), table.begin() + used);
  kv_indptr.push_back((int32_t)kv_page_indices.size());
}

ForwardBatch BatchBuilder::batch() const {
  ForwardBatch b;
  b.tokens = tokens_;
  b.positions = positions_;
  b.qo_indptr = qo_indptr_;
  b.kv_indptr = kv_indptr_;
  b.kv_page_indices = kv_page_indices_;
  b.kv_len = kv_len_;
  b.slot_mapping = slot_mapping_;
  b.logits_indices = logits_indices_;
  b.hidden_indices = hidden_indices_;
  if (any_mask_) {
    b.mask_indptr = mask_indptr_;
    b.mask_bits = mask_bits_;
  }
  more_views_.clear();
  for (const GroupArrays& g : more_) {
    more_views_.push_back(KvGroupArrays{g.kv_indptr, g.kv_page_indices, g.slot_mapping});
  }
  b.more_kv_groups = more_views_;
  b.state_slots = state_slots_;
  if (any_scratch_) {
    b.state_src = state_src_;
    b.state_dst = state_dst_;
    b.replay_rows = replay_rows_;
  }
  b.input_hidden = input_hidden_;
  return b;
}

}  // namespace arbor::model
