#include "model/tp.h"

#include <algorithm>

#include "kernels/matmul.h"
#include "model/llama_model.h"

namespace arbor::model {

int canonical_segments(const ModelConfig& c, const LlamaWeights& w) {
  if (c.is_moe() || c.has_recurrent_layers()) return 1;
  const auto fits = [&](int s) {
    if (c.num_kv_heads % s != 0 || c.ffn_dim % s != 0) return false;
    for (const LayerWeights& l : w.layers) {
      if ((c.q_dim() / s) % kernels::weight_block_size(l.o.w.type) != 0) return false;
      if ((c.ffn_dim / s) % kernels::weight_block_size(l.down.w.type) != 0) return false;
    }
    return true;
  };
  for (int s = kMaxSegments; s > 1; s /= 2) {
    if (fits(s)) return s;
  }
  return 1;
}

TpShape tp_shape(const ModelConfig& c, int rank, int size) {
  TpShape s;
  s.num_heads = c.num_heads / size;
  s.num_kv_heads = c.num_kv_heads / size;
  s.ffn_dim = c.ffn_dim / size;
  s.vocab_pad = (c.vocab_size + size - 1) / size;
  s.vocab_begin = std::min<int64_t>(c.vocab_size, rank * s.vocab_pad);
  s.vocab_rows = std::min<int64_t>(c.vocab_size, s.vocab_begin + s.vocab_pad) - s.vocab_begin;
  return s;
}

Status check_tp(const ModelConfig& c, int num_segments, int size) {
  if (size == 1) return ok_status();
  ARBOR_RETURN_IF_ERROR(check_tp_config(c, size));
  if (num_segments % size != 0) {
    return unimplemented(
        "tensor-parallel degree ", size, ": the model's row-parallel matrices have ",
        num_segments, " canonical K segment(s) (", c.num_kv_heads, " kv heads, q_dim ",
        c.q_dim(), ", ffn ", c.ffn_dim,
        " against the weight types' block sizes), so the degree can be at most ", num_segments);
  }
  return ok_status();
}

Status check_tp_config(const ModelConfig& c, int size) {
  if (size == 1) return ok_status();
  if (size != 2 && size != 4) {
    return invalid_argument("tensor-parallel degree ", size, ": arbor runs 1, 2 or 4");
  }
  if (c.is_moe()) {
    return unimplemented(c.arch_name, " with ", c.num_experts,
                         " experts: tensor parallelism does not split mixture-of-experts layers");
  }
  if (c.has_recurrent_layers()) {
    return unimplemented(c.arch_name, " has Gated DeltaNet layers: tensor parallelism does not "
                         "split their heads and states yet");
  }
  if (c.spec != nullptr && c.spec->qk_norm == QkNorm::kWhole) {
    return unimplemented(c.arch_name, " normalises the whole q/k projection (QK-norm over all "
                         "heads): tensor parallelism splits heads across ranks and cannot");
  }
  return ok_status();
}

}  // namespace arbor::model
