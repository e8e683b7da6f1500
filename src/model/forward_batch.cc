#include "model/forward_batch.h"
#include "base/status.h"

#include "kernels/attention.h"

namespace arbor::model {
namespace {

Status check_indptr(std::span<const int32_t> indptr, size_t expected_size, int64_t end,
                    const char* name) {
  if (indptr.size() != expected_size) {
    return invalid_argument(name, " has ", indptr.size(), " entries, expected ", expected_size);
  }
  if (indptr.empty()) return ok_status();
  if (indptr.front() != 0) return invalid_argument(name, "[0] = ", indptr.front(), ", expected 0");
  for (size_t i = 1; i < indptr.size(); ++i) {
    if (indptr[i] < indptr[i - 1]) {
      return invalid_argument(name, " decreases at ", i, ": ", indptr[i - 1], " then ", indptr[i]);
    }
  }
  if (end >= 0 && indptr.back() != end) {
    return invalid_argument(name, "[", indptr.size() - 1, "] = ", indptr.back(), ", expected ",
                            end);
  }
  return ok_status();
}

Status check_sequence(const ForwardBatch& bt, const BatchLimits& lim, int b) {
  const int32_t q0 = bt.qo_indptr[b], n = bt.qo_indptr[b + 1] - q0;
  const int32_t kv_len = bt.kv_len[b];
  const int64_t num_pages = bt.kv_indptr[b + 1] - bt.kv_indptr[b];
  if (kv_len < n) {
    return invalid_argument("sequence ", b, ": kv_len ", kv_len, " < ", n, " new tokens");
  }
  if (num_pages * lim.block_size < kv_len) {
    return invalid_argument("sequence ", b, ": ", num_pages, " blocks of ", lim.block_size,
                            " tokens cannot hold kv_len ", kv_len);
  }
  const int32_t* table = bt.kv_page_indices.data() + bt.kv_indptr[b];
  for (int64_t i = 0; i < num_pages; ++i) {
    if (table[i] < 0 || table[i] >= lim.num_blocks) {
      return invalid_argument("sequence ", b, ": block table entry ", i, " = ", table[i],
                              ", the cache has ", lim.num_blocks, " blocks");
    }
  }
  const int32_t committed = kv_len - n;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t k = committed + i;
    const int64_t want = (int64_t)table[k / lim.block_size] * lim.block_size + k % lim.block_size;
    if (bt.slot_mapping[q0 + i] != want) {
      return invalid_argument("slot_mapping[", q0 + i, "] = ", bt.slot_mapping[q0 + i],
                              ", but sequence ", b, "'s block table puts logical index ", k,
                              " at slot ", want);
    }
  }
  return ok_status();
}

Status check_mask(const ForwardBatch& bt, int b) {
  const int32_t n = bt.qo_indptr[b + 1] - bt.qo_indptr[b];
  const int64_t bits = bt.mask_indptr[b + 1] - bt.mask_indptr[b];
  if (bits == 0) return ok_status();
  if (bits != (int64_t)n * n) {
    return invalid_argument("sequence ", b, ": mask has ", bits, " bits, expected ", n, " x ", n);
  }
  for (int32_t i = 0; i < n; ++i) {
    if (!kernels::mask_bit(bt.mask_bits.data(), bt.mask_indptr[b], n, i, i)) {
      return invalid_argument("sequence ", b, ": mask bit (", i, ", ", i,
                              ") is clear; a token must see itself");
    }
  }
  return ok_status();
}

Status check_tokens(const ForwardBatch& bt, const BatchLimits& lim) {
  const size_t t = bt.tokens.size();
  if (bt.positions.size() != t || bt.slot_mapping.size() != t) {
    return invalid_argument("batch has ", t, " tokens but ", bt.positions.size(),
                            " positions and ", bt.slot_mapping.size(), " slot_mapping entries");
  }
  for (size_t i = 0; i < t; ++i) {
    if (bt.tokens[i] < 0 || bt.tokens[i] >= lim.vocab_size) {
      return invalid_argument("tokens[", i, "] = ", bt.tokens[i], ", vocab size is ",
                              lim.vocab_size);
    }
    if (bt.positions[i] < 0) return invalid_argument("positions[", i, "] = ", bt.positions[i]);
  }
  for (size_t i = 0; i < bt.logits_indices.size(); ++i) {
    if (bt.logits_indices[i] < 0 || (size_t)bt.logits_indices[i] >= t) {
      return invalid_argument("logits_indices[", i, "] = ", bt.logits_indices[i], ", batch has ",
                              t, " tokens");
    }
  }
  return ok_status();
}

}  // namespace

Status validate_batch(const ForwardBatch& bt, const BatchLimits& lim) {
  if (bt.qo_indptr.empty()) return invalid_argument("qo_indptr is empty (needs B + 1 entries)");
  const size_t nb = bt.qo_indptr.size() - 1;
  ARBOR_RETURN_IF_ERROR(check_tokens(bt, lim));
  ARBOR_RETURN_IF_ERROR(check_indptr(bt.qo_indptr, nb + 1, (int64_t)bt.tokens.size(), "qo_indptr"));
  ARBOR_RETURN_IF_ERROR(
      check_indptr(bt.kv_indptr, nb + 1, (int64_t)bt.kv_page_indices.size(), "kv_indptr"));
  if (bt.kv_len.size() != nb) {
    return invalid_argument("kv_len has ", bt.kv_len.size(), " entries, expected ", nb);
  }
  for (size_t b = 0; b < nb; ++b) ARBOR_RETURN_IF_ERROR(check_sequence(bt, lim, (int)b));
  if (bt.mask_indptr.empty()) return ok_status();
  ARBOR_RETURN_IF_ERROR(check_indptr(bt.mask_indptr, nb + 1, -1, "mask_indptr"));
  if (((int64_t)bt.mask_indptr.back() + 7) / 8 > (int64_t)bt.mask_bits.size()) {
    return invalid_argument("mask_indptr ends at bit ", bt.mask_indptr.back(),
                            " but mask_bits has ", bt.mask_bits.size(), " bytes");
  }
  for (size_t b = 0; b < nb; ++b) ARBOR_RETURN_IF_ERROR(check_mask(bt, (int)b));
  return ok_status();
}

}  // namespace arbor::model
