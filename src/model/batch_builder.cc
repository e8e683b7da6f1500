#include "model/batch_builder.h"

#include "base/check.h"

namespace arbor::model {

void BatchBuilder::clear() {
  any_mask_ = false;
  for (auto* v : {&tokens_, &positions_, &kv_page_indices_, &kv_len_, &slot_mapping_,
                  &logits_indices_}) {
    v->clear();
  }
  qo_indptr_.assign(1, 0);
  kv_indptr_.assign(1, 0);
  mask_indptr_.assign(1, 0);
  mask_bits_.clear();
}

void BatchBuilder::append_mask(const SequenceInput& seq) {
  const int64_t n = (int64_t)seq.tokens.size();
  const int64_t start = mask_indptr_.back();
  if (!seq.mask.empty()) {
    ARBOR_CHECK_EQ((int64_t)seq.mask.size(), n * n);
    any_mask_ = true;
    mask_bits_.resize((start + n * n + 7) / 8, 0);
    for (int64_t k = 0; k < n * n; ++k) {
      if (seq.mask[k]) mask_bits_[(start + k) >> 3] |= (uint8_t)(1u << ((start + k) & 7));
    }
  }
  mask_indptr_.push_back((int32_t)(start + (int64_t)seq.mask.size()));
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
  for (int32_t i = 0; i < n; ++i) {
    const int32_t k = seq.num_committed + i;
    tokens_.push_back(seq.tokens[i]);
    positions_.push_back(seq.positions.empty() ? k : seq.positions[i]);
    slot_mapping_.push_back(seq.block_table[k / block_size_] * block_size_ + k % block_size_);
    if (seq.logits == LogitsMode::kAll || (seq.logits == LogitsMode::kLast && i == n - 1) ||
        (seq.logits == LogitsMode::kRange && i >= seq.logits_begin && i < seq.logits_end)) {
      logits_indices_.push_back(row0 + i);
    }
  }
  qo_indptr_.push_back(row0 + n);
  // Only the blocks the sequence uses so far: a caller may pass a longer reservation.
  const size_t used = (size_t)(kv_len + block_size_ - 1) / block_size_;
  kv_page_indices_.insert(kv_page_indices_.end(), seq.block_table.begin(),
                          seq.block_table.begin() + used);
  kv_indptr_.push_back((int32_t)kv_page_indices_.size());
  kv_len_.push_back(kv_len);
  append_mask(seq);
  return first_logit;
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
  if (any_mask_) {
    b.mask_indptr = mask_indptr_;
    b.mask_bits = mask_bits_;
  }
  return b;
}

}  // namespace arbor::model
