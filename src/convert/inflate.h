// Inflating a small Llama model: the same next-token function at the compute cost of a large one
// (`arbor synth --inflate`, docs/inflate.md). Speculative decoding needs a target that is both
// expensive and a real trained model; this gives stories260K TinyLlama-1.1B's matmul shapes while
// its greedy tokens stay those of stories260K.
//
// The construction, for a source with embedding length d, n_heads q heads and n_kv kv heads of
// head_dim hd = d / n_heads (GQA ratio r = n_heads / n_kv), ffn f and L layers, inflated to
// embedding length D, ffn F, L' layers and GQA ratio R (it is the one in
// shared/tools/inflate_gguf.py; only the random numbers differ):
//   * head_dim stays hd; the result has H = D / hd q heads and H / R kv heads.
//   * Original q head h becomes head (h / r) * R + h % r, so that it still reads kv head h / r;
//     original kv heads keep their index.
//   * The residual stream is the original one followed by D - d zeros: token_embd and output are
//     zero in the new columns; every matrix that writes into the stream (attn_output, ffn_down)
//     is zero outside the original block, so the new dims stay zero in every layer.
//   * Work nobody reads is real: q rows of new heads, k/v rows of new kv heads and gate/up rows of
//     new FFN units are random (uniform, std `random_std`, deterministic in (seed, tensor, row));
//     the attn_output columns of new heads and the ffn_down columns of new units are zero. New q
//     heads read only the live columns (the others are zero anyway). Layers l >= L are all new:
//     random q/k/v/gate/up, zero attn_output/ffn_down, so they add exactly 0 to the stream.
//   * RMSNorm sees a sum of squares over the same live values divided by D instead of d, so the
//     eps is scaled by d / D and every norm weight by sqrt(d / D) (the new dims of a norm weight
//     are sqrt(d / D) too, as the reference writes them; they multiply zeros). With D / d a power
//     of two every scaling is exact in float; when D / d is also a power of four, sqrt(d / D) is
//     exact as well and the logits are bit-identical on kernels whose reductions do not depend on
//     the row length (docs/inflate.md has the numbers).
//   * Metadata: the source's keys in order (tokenizer included) with embedding_length,
//     feed_forward_length, block_count, head_count, head_count_kv, layer_norm_rms_epsilon,
//     rope.dimension_count (= hd) and general.name ("inflated-<name>-<D>x<L'>") replaced, plus
//     general.file_type (and general.quantization_version for quantised types).
//   * Tensors are written in the reference's order: token_embd, per layer attn_norm, attn_q,
//     attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_down, ffn_up, then output_norm and
//     output (absent when the source ties it to token_embd).
//   * A mixture of experts (experts > 0; Mixtral's layout on `llama`: expert_count,
//     expert_used_count, each expert feed_forward_length = F long): every expert is the source
//     FFN grown as above (ffn_{gate,up}_exps [D, F, E], ffn_down_exps [F, D, E]; the dead units'
//     random rows differ per expert), and the router ffn_gate_inp [D, E] is random over the live
//     columns. The routed weights are a softmax over the chosen experts, so they sum to 1 and the
//     layer adds the source FFN's output (to float rounding: the sum of K equal terms), while the
//     experts each token touches follow its hidden state as in a trained mixture. Tensor order:
//     ffn_gate_inp, ffn_gate_exps, ffn_down_exps, ffn_up_exps in place of the three ffn tensors.
//
// Thread-safety: pure functions; the source GgufFile is immutable. `parallel_for` is called from
// the calling thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/status.h"
#include "gguf/ggml_type.h"
#include "gguf/gguf.h"

namespace arbor::convert {

// Runs fn(begin, end) over disjoint ranges covering [0, n), possibly on several threads, and
// returns when all are done (a thread pool's parallel_for). Empty: everything inline.
using ParallelFor =
    std::function<void(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn)>;

struct InflateOptions {
  int64_t dim = 0;       // D: d times a power of two (1, 2, 4, ...)
  int64_t ffn = 0;       // F >= the source's feed_forward_length
  int64_t layers = 0;    // L' >= the source's block_count
  int64_t kv_ratio = 0;  // R: a multiple of the source's r; H / R >= n_kv
  int64_t experts = 0;       // E: 0 = dense; else a mixture of E experts of `ffn` each
  int64_t experts_used = 0;  // K: experts routed per token, 1 <= K <= E (with experts > 0)
  gguf::GgmlType type = gguf::GgmlType::kF32;  // matrices: f32, f16, q8_0 or q4_0; norms stay F32
  uint64_t seed = 0;          // the random rows; same options, same bytes (any thread count)
  float random_std = 0.02f;   // standard deviation of the random rows
  ParallelFor parallel_for;    // rows of one tensor in parallel; empty: one thread
};

// The source's shape and the inflated one, validated.
struct InflateGeometry {
  int64_t dim = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0;  // the source's
  int64_t head_dim = 0, vocab = 0;
  bool tied = false;  // the source has no output.weight
  float rms_eps = 0.0f;
  int64_t new_dim = 0, new_ffn = 0, new_layers = 0, new_heads = 0, new_kv_heads = 0;
  int64_t new_experts = 0, new_experts_used = 0;  // 0: dense

  int64_t kv_ratio() const { return heads / kv_heads; }              // r
  int64_t new_kv_ratio() const { return new_heads / new_kv_heads; }  // R
  // The inflated head of source q head h: (h / r) * R + h % r.
  int64_t new_q_head(int64_t h) const {
    return (h / kv_ratio()) * new_kv_ratio() + h % kv_ratio();
  }
};

// Reads the source's shape and checks it (general.architecture llama, every tensor F32 with the
// shape its metadata implies, no other tensors) and the options against it. Errors are
// kInvalidArgument naming the flag, the value and the limit ("--kv-ratio 16 leaves 2 kv heads,
// fewer than the model's 4; at most 8").
Result<InflateGeometry> plan_inflation(const gguf::GgufFile& src, const InflateOptions& options);

// A writer for the inflated model. Its tensors are generated when it writes (one at a time, so a
// model larger than memory can be made; GgufWriter::write shows the progress): `src` must outlive
// the writer, and options.parallel_for must stay callable until it has written. Errors as
// plan_inflation.
Result<gguf::GgufWriter> inflate_model(const gguf::GgufFile& src, const InflateOptions& options);

}  // namespace arbor::convert
