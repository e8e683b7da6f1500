#include "model/forward_batch.h"

#include <algorithm>
#include <string>
#include <vector>

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

Status check_sequence(const ForwardBatch& bt, const BatchLimits& lim, int g, int b) {
  const KvGroupArrays kv = bt.kv_group(g);
  const int32_t q0 = bt.qo_indptr[b], n = bt.qo_indptr[b + 1] - q0;
  const int32_t kv_len = bt.kv_len[b];
  const int64_t num_pages = kv.kv_indptr[b + 1] - kv.kv_indptr[b];
  const std::string seq = g == 0 ? str_cat("sequence ", b) : str_cat("group ", g, " sequence ", b);
  if (kv_len < n) {
    return invalid_argument(seq, ": kv_len ", kv_len, " < ", n, " new tokens");
  }
  if (num_pages * lim.block_size < kv_len) {
    return invalid_argument(seq, ": ", num_pages, " blocks of ", lim.block_size,
                            " tokens cannot hold kv_len ", kv_len);
  }
  const int32_t* table = kv.kv_page_indices.data() + kv.kv_indptr[b];
  for (int64_t i = 0; i < num_pages; ++i) {
    if (table[i] < 0 || table[i] >= lim.num_blocks) {
      return invalid_argument(seq, ": block table entry ", i, " = ", table[i],
                              ", the cache has ", lim.num_blocks, " blocks");
    }
  }
  const int32_t committed = kv_len - n;
  if (!lim.group_windows.empty()) {
    // Block 0 is the null block: what the first new token reads, and every new token's slot,
    // must be elsewhere.
    const int32_t w = lim.group_windows[(size_t)g];
    const int64_t first = w == 0 ? 0 : std::max<int64_t>(0, (int64_t)committed - w + 1);
    for (int64_t i = first / lim.block_size; i * lim.block_size < kv_len; ++i) {
      if (table[i] == 0) {
        return invalid_argument(seq, ": block table entry ", i, " is the null block (0) but ",
                                "positions ", first, " .. ", kv_len - 1, " are read or written");
      }
    }
  }
  for (int32_t i = 0; i < n; ++i) {
    const int32_t k = committed + i;
    const int64_t want = (int64_t)table[k / lim.block_size] * lim.block_size + k % lim.block_size;
    if (kv.slot_mapping[q0 + i] != want) {
      return invalid_argument(g == 0 ? std::string("slot_mapping[") : str_cat("group ", g, " slot_mapping["),
                              q0 + i, "] = ", kv.slot_mapping[q0 + i], ", but ", seq,
                              "'s block table puts logical index ", k, " at slot ", want);
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
  for (int g = 1; g < bt.num_kv_groups(); ++g) {
    if (bt.kv_group(g).slot_mapping.size() != t) {
      return invalid_argument("batch has ", t, " tokens but group ", g, " has ",
                              bt.kv_group(g).slot_mapping.size(), " slot_mapping entries");
    }
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
  for (size_t i = 0; i < bt.hidden_indices.size(); ++i) {
    if (bt.hidden_indices[i] < 0 || (size_t)bt.hidden_indices[i] >= t) {
      return invalid_argument("hidden_indices[", i, "] = ", bt.hidden_indices[i], ", batch has ",
                              t, " tokens");
    }
  }
  return ok_status();
}

Status check_state_slots(const ForwardBatch& bt, const BatchLimits& lim) {
  const size_t nb = bt.qo_indptr.size() - 1;
  if (lim.num_state_slots == 0) {
    if (!bt.state_slots.empty()) {
      return invalid_argument("batch has ", bt.state_slots.size(),
                              " state slots, the model has no recurrent layers");
    }
    return ok_status();
  }
  if (bt.state_slots.size() != nb) {
    return invalid_argument("state_slots has ", bt.state_slots.size(), " entries, expected ", nb,
                            " (the model has recurrent layers)");
  }
  std::vector<bool> seen(static_cast<size_t>(lim.num_state_slots));
  for (size_t b = 0; b < nb; ++b) {
    const int32_t s = bt.state_slots[b];
    if (s < 0 || s >= lim.num_state_slots) {
      return invalid_argument("state_slots[", b, "] = ", s, ", the model has ",
                              lim.num_state_slots, " state slots");
    }
    if (seen[static_cast<size_t>(s)]) {
      return invalid_argument("state_slots[", b, "] = ", s, " is shared with another sequence");
    }
    seen[static_cast<size_t>(s)] = true;
  }
  if (bt.state_src.size() != bt.state_dst.size() ||
      (!bt.state_src.empty() && bt.state_src.size() != bt.tokens.size())) {
    return invalid_argument("state_src has ", bt.state_src.size(), " entries and state_dst ",
                            bt.state_dst.size(), ", expected none or one per token (",
                            bt.tokens.size(), ")");
  }
  for (size_t i = 0; i < bt.replay_rows.size(); ++i) {
    const int32_t r = bt.replay_rows[i];
    if (bt.state_src.empty() || r < 0 || static_cast<size_t>(r) >= bt.tokens.size() ||
        (i > 0 && r <= bt.replay_rows[i - 1])) {
      return invalid_argument("replay_rows[", i, "] = ", r, ": rows must increase, stay below ",
                              bt.tokens.size(), " and come with state_src");
    }
  }
  std::vector<int32_t> writer(static_cast<size_t>(lim.num_state_slots), -1);
  for (size_t b = 0; b < nb && !bt.state_dst.empty(); ++b) {
    for (int32_t t = bt.qo_indptr[b]; t < bt.qo_indptr[b + 1]; ++t) {
      const int32_t src = bt.state_src[t], dst = bt.state_dst[t];
      if (src < -1 || src >= lim.num_state_slots || dst < 0 || dst >= lim.num_state_slots) {
        return invalid_argument("token ", t, ": state_src ", src, ", state_dst ", dst,
                                ", the model has ", lim.num_state_slots, " state slots");
      }
      int32_t& w = writer[static_cast<size_t>(dst)];
      if (w >= 0 && w != static_cast<int32_t>(b)) {
        return invalid_argument("state slot ", dst, " is written by sequences ", w, " and ", b);
      }
      w = static_cast<int32_t>(b);
    }
  }
  for (size_t b = 0; !bt.mask_indptr.empty() && bt.state_src.empty() && b < nb; ++b) {
    if (bt.mask_indptr[b + 1] != bt.mask_indptr[b]) {
      return unimplemented("sequence ", b, " has a custom mask (a token tree) but no per-token "
                           "state routing (state_src / state_dst): its recurrent state would "
                           "not branch with the tree");
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
  const int num_groups = bt.num_kv_groups();
  if (!lim.group_windows.empty() && (size_t)num_groups != lim.group_windows.size()) {
    return invalid_argument("batch has ", num_groups, " KV cache groups, the cache ",
                            lim.group_windows.size());
  }
  if (lim.group_windows.empty() && num_groups != 1) {
    return invalid_argument("batch has ", num_groups, " KV cache groups, the cache one");
  }
  for (int g = 0; g < num_groups; ++g) {
    const KvGroupArrays kv = bt.kv_group(g);
    ARBOR_RETURN_IF_ERROR(check_indptr(kv.kv_indptr, nb + 1, (int64_t)kv.kv_page_indices.size(),
                                       g == 0 ? "kv_indptr" : "a group's kv_indptr"));
  }
  if (bt.kv_len.size() != nb) {
    return invalid_argument("kv_len has ", bt.kv_len.size(), " entries, expected ", nb);
  }
  for (int g = 0; g < num_groups; ++g) {
    for (size_t b = 0; b < nb; ++b) ARBOR_RETURN_IF_ERROR(check_sequence(bt, lim, g, (int)b));
  }
  if (!bt.mask_indptr.empty()) {
    ARBOR_RETURN_IF_ERROR(check_indptr(bt.mask_indptr, nb + 1, -1, "mask_indptr"));
  }
  ARBOR_RETURN_IF_ERROR(check_state_slots(bt, lim));
  const size_t t = bt.tokens.size();
  const size_t hidden = t * static_cast<size_t>(lim.input_hidden_dim);
  if (bt.input_hidden.size() != hidden) {
    return invalid_argument("input_hidden has ", bt.input_hidden.size(), " floats, expected ",
                            hidden, lim.input_hidden_dim > 0
                                        ? str_cat(" (", t, " tokens x ", lim.input_hidden_dim, ")")
                                        : std::string(" (the model reads no hidden rows)"));
  }
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
