// Gated DeltaNet: the linear-attention mixer of Qwen3.5's recurrent layers (docs/qwen35.md §5),
// after the layer's input projections and before its output projection, over a ragged batch
// of sequences, each carrying its conv and recurrent state in a slot between calls.
//
// For every sequence b (new tokens rows [qo_indptr[b], qo_indptr[b+1]), its state in slot
// state_slots[b]) and every new token t of it, in order:
//   conv:  y[t, c] = silu(sum_{j<K} conv_w[c, j] * x[t - K + 1 + j, c]) for every channel c of
//          qkv ([T, C], C = 2 * Hk * dk + Hv * dv), rows before the first new token taken from
//          the slot's conv state (the last K-1 inputs, oldest first); the state then holds the
//          sequence's last K-1 inputs.
//   split: q = y[t, 0 : Hk*dk], k = y[t, Hk*dk : 2*Hk*dk] (Hk heads of dk), v = the rest (Hv
//          heads of dv); q and k L2-normalised per head (x / sqrt(sum x^2 + eps)), q times
//          1 / sqrt(dk).
//   gates: g = softplus(alpha[t, h] + dt_bias[h]) * a[h] (a = -exp(A_log), so g <= 0) and
//          beta = sigmoid(beta[t, h]), per value head h.
//   delta rule, per value head h with key head h % Hk (the GGUF files' tiled order):
//          S_h = S_h * exp(g);  d = (v_h - S_h^T k) * beta;  S_h += k d^T;  o_h = S_h^T q.
//   output: out[t, h*dv + j] = o_h[j] / sqrt(mean(o_h^2) + eps) * norm_w[j] * silu(z[t, h*dv + j]).
// A sequence whose new tokens start at position 0 (kv_len[b] == its token count) starts from a
// zero state, whatever its slot held.
//
// Per-token slots (state_src / state_dst, for speculation): token t continues the state of slot
// state_src[t] (-1: zero) and leaves its own in slot state_dst[t], instead of sequence b's
// tokens updating state_slots[b] in place; a sequence's tokens run in row order, so a token may
// read any slot an earlier row of its sequence wrote. A chain of drafts verified without
// touching the request's slot is src = slot, dst = scratch for its first token, then src = dst =
// scratch; a token tree gives each node its parent's slot as src and its own as dst (its
// parent's, in place, for the parent's last child). The accepted tokens are then replayed into
// the slot (out == null: states only).
//
// Numerics: every (sequence, head) is computed on its own in a fixed order, token by token, so a
// sequence's output and final state do not depend, bit for bit, on the other sequences of the
// call nor on how its tokens are split over calls (one call of n tokens equals n calls of one:
// the recurrent form everywhere, never a chunked form with a different summation order).
#pragma once

#include <cstdint>

#include "kernels/thread_pool.h"

namespace arbor::kernels {

struct GatedDeltaNetParams {
  int32_t num_seqs = 0;              // B
  const int32_t* qo_indptr = nullptr;  // [B+1]
  const int32_t* kv_len = nullptr;     // [B] tokens of b after the call (fresh: == its new tokens)
  const int32_t* state_slots = nullptr;  // [B] distinct slots in [0, num_slots); or null with
  const int32_t* state_src = nullptr;    // [T] (above): the slot token t continues, -1: zero
  const int32_t* state_dst = nullptr;    // [T] the slot token t's state goes to (a sequence's
                                         // rows write slots no other sequence reads or writes)
  int num_k_heads = 0;   // Hk
  int num_v_heads = 0;   // Hv, a multiple of Hk
  int head_k_dim = 0;    // dk
  int head_v_dim = 0;    // dv
  int conv_kernel = 0;   // K >= 1
  float eps = 0.0f;      // the L2 and RMS norms' epsilon
  const float* qkv = nullptr;    // [T, C] before the conv
  const float* z = nullptr;      // [T, Hv * dv] the output gate's input
  const float* alpha = nullptr;  // [T, Hv]
  const float* beta = nullptr;   // [T, Hv] logits
  const float* conv_w = nullptr;   // [C, K]
  const float* dt_bias = nullptr;  // [Hv]
  const float* a = nullptr;        // [Hv]
  const float* norm_w = nullptr;   // [dv]
  // The layer's states: conv [num_slots, C, K-1], recurrent [num_slots, Hv, dv, dk] (per head
  // the transpose of S[dk, dv]: value column j of S is the contiguous row j).
  float* conv_state = nullptr;
  float* ssm_state = nullptr;
  float* mixed = nullptr;  // [T, C] scratch: the conv's output
  float* out = nullptr;    // [T, Hv * dv]; null: only the states are computed (z unread)

  int64_t conv_dim() const {
    return 2 * int64_t{num_k_heads} * head_k_dim + int64_t{num_v_heads} * head_v_dim;
  }
};

// Runs the mixer on `pool`. Shapes as above (CHECKed: heads, dims, K, slots).
void gated_delta_net(const GatedDeltaNetParams& p, ThreadPool& pool);

}  // namespace arbor::kernels
