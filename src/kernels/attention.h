// Paged attention over a ragged batch (see docs/batch_layout.md for the arrays and a diagram).
//
// One operator for decode (one query per sequence) and multi-query steps (prefill chunks,
// draft tokens, token trees with a custom mask), over a paged KV cache with layout
//   k_cache, v_cache: [num_blocks][num_kv_heads][block_size][head_dim], F32 or F16.
//
// For sequence b with n_b = qo_indptr[b+1] - qo_indptr[b] new tokens and kv_len[b] tokens in all,
// committed = kv_len[b] - n_b. New token i (query row qo_indptr[b] + i) sees every committed
// token, and new token j when mask(i, j) (custom mask) or j <= i (causal). New tokens' K/V must
// already be in the cache at logical indices committed .. kv_len[b]-1 of the block table.
//
// GQA: query head h reads kv head h / (num_q_heads / num_kv_heads); one work item serves all
// query heads of its kv head, so each K/V block is read (and widened from F16) once per item.
// Scores are scaled by `scale` (then soft-capped when `softcap` is set), softmax is online (per
// block) with f32 accumulation; a sliding `window` hides keys too far behind each query. Work is
// split over (sequence, kv head, tile of 16 query tokens) and, when that leaves threads idle on
// long contexts, over fixed 512-key chunks merged afterwards (flash-decoding).
//
// Batch invariance: a query row's output depends, bit for bit, only on its q, the keys it sees,
// block_size and active_isa(): not on the other rows or sequences of the call, on how many rows
// its sequence has in it, or on the thread count. Keys are cut into chunks at fixed absolute
// positions, each with its own online softmax, folded in key order (docs/kernels.md).
// Decode (n_b = 1) and every block a tile sees in full skip the per-key visibility test; only
// blocks holding new tokens test causal order or the mask bits key by key.
//
// Never includes engine or model headers: raw pointers plus this parameter struct.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/thread_pool.h"

namespace arbor::kernels {

enum class KvDtype : uint8_t { kF32 = 0, kF16 = 1 };

inline int kv_dtype_size(KvDtype dtype) { return dtype == KvDtype::kF32 ? 4 : 2; }

struct PagedAttentionParams {
  int num_seqs = 0;       // B
  int num_q_heads = 0;    // multiple of num_kv_heads
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;     // tokens per KV block
  float scale = 0.0f;     // usually 1 / sqrt(head_dim)
  // Sliding window (llama.cpp's n_swa): 0 = none; W > 0: the query at logical index p (the index
  // of its own key) sees only keys with index > p - W. For a token tree's row, p is the row's
  // index on its own path (committed + depth). Items start at the first block any of their rows
  // can see, so a long context costs only the window.
  int32_t window = 0;
  // Soft-capping: > 0: every score becomes softcap * tanh(score / softcap) (kernels::softcap,
  // after `scale`) before the softmax (Gemma 2).
  float softcap = 0.0f;
  // Attention sinks (gpt-oss): null, or [num_q_heads] logits, one per query head, that join the
  // softmax's denominator as one more key with no value (not scaled or soft-capped):
  // out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink[h] - m)), m = max(max_j s_j,
  // sink[h]), as llama.cpp's soft_max with sinks. Not part of the plan (a layout's layers may
  // differ in sinks). A row that sees no key still outputs zeros.
  const float* sinks = nullptr;

  const float* q = nullptr;  // [num_tokens, num_q_heads, head_dim]
  float* out = nullptr;      // [num_tokens, num_q_heads, head_dim]
  KvDtype kv_dtype = KvDtype::kF16;
  const void* k_cache = nullptr;  // [num_blocks, num_kv_heads, block_size, head_dim]
  const void* v_cache = nullptr;  // [num_blocks, num_kv_heads, block_size, head_dim]

  const int32_t* qo_indptr = nullptr;        // [B+1]
  const int32_t* kv_indptr = nullptr;        // [B+1] into kv_page_indices
  const int32_t* kv_page_indices = nullptr;  // [kv_indptr[B]] block ids, per sequence in order
  const int32_t* kv_len = nullptr;           // [B] committed + new tokens

  // Optional custom mask among new tokens; null = causal for every sequence. mask_indptr[b] is
  // a bit offset into mask_bits; an empty segment means causal for that sequence, otherwise it
  // has n_b * n_b bits, row-major (query i, key j), little-endian bit order within each byte.
  const int32_t* mask_indptr = nullptr;  // [B+1]
  const uint8_t* mask_bits = nullptr;    // [ceil(mask_indptr[B] / 8)]
};

// Validates the geometry (CHECK): head counts, indptr monotone, kv_len >= n_b, block tables
// long enough for kv_len, mask segment sizes. O(B).
void check_paged_attention_params(const PagedAttentionParams& p);

// The work decomposition of paged_attention for one batch layout: work items over (sequence,
// kv head or all kv heads, tile of query rows, key range), the tiles split over key chunks and
// the partial results they need. It depends only on the layout — num_seqs, num_kv_heads,
// block_size, window, the contents of qo_indptr, kv_len and mask_indptr — and the thread count:
// not on q, out, the K/V pools, the block tables, head_dim, num_q_heads or the mask bits. So one
// plan serves every layer whose attention has that layout (all layers with the same window, of
// any KV cache group), and a call with it computes exactly what planning inside the call would
// (the plan is the same; batch invariance is unaffected).
struct PagedAttentionPlan {
  // Query rows [i0, i1) of sequence b against kv heads [g0, g1), keys [k0, k1). partial < 0:
  // the item covers every key its rows see and writes out directly; otherwise it covers one
  // key chunk and writes its partial result `partial`, folded by its split group.
  struct Item {
    int32_t b, g0, g1, i0, i1, k0, k1;
    int32_t partial;
  };
  // A query tile split over key chunks: items [first_item, first_item + num_splits).
  struct SplitGroup {
    int32_t first_item, num_splits;
  };
  std::vector<Item> items;
  std::vector<SplitGroup> groups;
  int32_t num_partials = 0;
  // What it was made for; paged_attention CHECKs a call against these (O(1)).
  int num_threads = 0;
  int num_seqs = -1;
  int num_kv_heads = 0;
  int block_size = 0;
  int32_t window = 0;
  const int32_t* qo_indptr = nullptr;
  const int32_t* kv_len = nullptr;
  const int32_t* mask_indptr = nullptr;
};

// Fills `plan` for p's layout and `num_threads` threads. Reusing a plan allocates only when a
// layout needs more items than any before it. Debug builds validate the geometry here
// (check_paged_attention_params), once per plan rather than once per layer. O(B + items).
void plan_paged_attention(const PagedAttentionParams& p, int num_threads,
                          PagedAttentionPlan& plan);

// Computes p.out with `plan`, made for p's layout with pool.num_threads() threads (CHECKed:
// the scalars above and the addresses of qo_indptr, kv_len and mask_indptr, which must be the
// arrays the plan was made from, unchanged since). Thread-safe for distinct outputs; uses
// `pool` for parallelism. Allocates only when a call needs more scratch than any earlier call
// on this thread.
void paged_attention(const PagedAttentionParams& p, const PagedAttentionPlan& plan,
                     ThreadPool& pool);

// Plans (into a plan of the calling thread) and runs: for one-off callers and tests.
void paged_attention(const PagedAttentionParams& p, ThreadPool& pool);

// Naive reference for one sequence with contiguous K/V and an explicit mask. Two-pass softmax in
// double precision; for tests.
struct RefAttentionParams {
  int num_q = 0;   // query tokens
  int num_kv = 0;  // key tokens
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.0f;
  float softcap = 0.0f;            // > 0: score = softcap * tanh(score / softcap)
  const float* sinks = nullptr;    // [num_q_heads] or null (PagedAttentionParams::sinks)
  const float* q = nullptr;        // [num_q, num_q_heads, head_dim]
  const float* k = nullptr;        // [num_kv, num_kv_heads, head_dim]
  const float* v = nullptr;        // [num_kv, num_kv_heads, head_dim]
  const uint8_t* visible = nullptr;  // [num_q, num_kv], nonzero = query i sees key j
  float* out = nullptr;            // [num_q, num_q_heads, head_dim]; zeros for a row seeing nothing
};
void attention_ref(const RefAttentionParams& p);

// Reads bit (i, j) of an n x n mask segment starting at bit `offset`.
inline bool mask_bit(const uint8_t* bits, int64_t offset, int n, int i, int j) {
  const int64_t bit = offset + (int64_t)i * n + j;
  return (bits[bit >> 3] >> (bit & 7)) & 1;
}

}  // namespace arbor::kernels
