// Re-encoding tensors and whole models to another ggml type: the library half of
// `arbor quantize` and `arbor convert --type`.
//
// Which tensors change (llama.cpp's basic rule; the K-quant mixtures below add its tweaks):
//   * tensors with 2 or more dims whose name ends in "weight" (except MoE routers,
//     "*ffn_gate_inp.weight", which llama.cpp keeps exact) get the target type;
//   * everything else (norms, biases, 1-D tensors) keeps its type;
//   * a matrix whose row length is not a multiple of the target's block size falls back as
//     llama.cpp does (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, q2_K/q3_K -> q4_0, iq4_xs ->
//     iq4_nl), and to f16 if that does not fit either.
// Quantised sources are dequantised to f32 first (so requantising is lossy twice, as in
// llama.cpp with --allow-requantize).
//
// Thread-safety: pure functions; they read the GgufFile, which is immutable.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace arbor::gguf {

// Types accepted as a model-wide target: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K,
// q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, mxfp4 (the codebook types quantise as llama-quantize
// does without an importance matrix: gguf/quants.h).
bool is_quantize_target(GgmlType type);
// Like parse_ggml_type, restricted to the targets above; the error lists them.
Result<GgmlType> parse_quantize_target(std::string_view name);

// llama.cpp's LLAMA_FTYPE value for a model whose weight matrices are `type`
// (f32 0, f16 1, q4_0 2, q4_1 3, q8_0 7, q5_0 8, q5_1 9, q2_K 10, q3_K 11 (Q3_K_S),
// q4_K 14 (Q4_K_S), q5_K 16 (Q5_K_S), q6_K 18, bf16 32, iq4_nl 25, iq4_xs 30, mxfp4 38
// (MXFP4_MOE)). CHECKs is_quantize_target(type).
uint32_t llama_file_type(GgmlType type);

// llama-quantize's K-quant mixtures (llama_tensor_get_type for Llama-family models, without an
// importance matrix): the base type everywhere the rule above applies, except
//   output.weight                      q6_K in every mixture (token_embd.weight too when there is
//                                      no output.weight: the classifier is the embedding)
//   attn_v.weight / ffn_down.weight    Q4_K_M, Q5_K_M: q6_K on layers where use_more_bits(i, n)
//                                      (i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2)
//                                      Q4_K_S: q5_K on layers i < 4 (attn_v), i < n/8 (ffn_down)
//                                      Q3_K_M: attn_v q5_K for i < 2 else q4_K; ffn_down q5_K
//                                      for i < n/16 else q4_K. Q3_K_L: q5_K
//   attn_output.weight                 Q3_K_M: q4_K, Q3_K_L: q5_K
//   attn_qkv.weight (fused)            Q3_K_M / Q3_K_L: q4_K, Q4_K_M: q5_K, Q5_K_M: q6_K
// with n the number of attn_v (or attn_qkv) tensors in the model (its layers) and i the
// tensor's "blk.<i>." index. Rows that do not fit a K block fall back as above.
// MXFP4_MOE (llama.cpp's, what gpt-oss files use): expert tensors (3-D with more than one
// expert) mxfp4, every other matrix q8_0.
enum class QuantMix {
  kPure, kQ3_K_S, kQ3_K_M, kQ3_K_L, kQ4_K_S, kQ4_K_M, kQ5_K_S, kQ5_K_M, kMxfp4Moe
};

// A model-wide target: a type, and for the K-quants optionally a mixture (named like
// llama-quantize's: "q4_K_M", case-insensitive).
struct QuantRecipe {
  GgmlType type = GgmlType::kQ8_0;
  QuantMix mix = QuantMix::kPure;
};
// The targets above plus q3_K_S, q3_K_M, q3_K_L, q4_K_S, q4_K_M, q5_K_S, q5_K_M, mxfp4_moe; the
// error lists them.
Result<QuantRecipe> parse_quantize_recipe(std::string_view name);
std::string recipe_name(const QuantRecipe& recipe);
// LLAMA_FTYPE of a mixture (Q3_K_S 11, Q3_K_M 12, Q3_K_L 13, Q4_K_S 14, Q4_K_M 15, Q5_K_S 16,
// Q5_K_M 17, MXFP4_MOE 38), else llama_file_type(recipe.type).
uint32_t llama_file_type(const QuantRecipe& recipe);

// The type `t` gets when the model's target is `target` (rules above). For a mixture, `layers`
// is n above and tied_embeddings says the model has no output.weight.
GgmlType choose_tensor_type(std::string_view name, const std::vector<int64_t>& dims,
                            GgmlType source_type, GgmlType target,
                            QuantMix mix = QuantMix::kPure, int layers = 0,
                            bool tied_embeddings = false);

// Re-encodes one tensor's data. src: ggml_nbytes(src_type, dims) bytes (CHECKed);
// returns ggml_nbytes(dst_type, dims) bytes. kUnimplemented when a type has no codec,
// kInvalidArgument when dims[0] is not a multiple of dst_type's block size. Rows are split over
// `threads` threads (each row is encoded alone, so the bytes do not depend on the split).
Result<std::vector<uint8_t>> convert_tensor_data(GgmlType src_type, std::span<const uint8_t> src,
                                                 const std::vector<int64_t>& dims,
                                                 GgmlType dst_type, int threads = 1);

struct QuantizeOptions {
  GgmlType target = GgmlType::kQ8_0;  // must satisfy is_quantize_target
  QuantMix mix = QuantMix::kPure;     // a mixture's base type is `target`
  int threads = 0;                    // threads converting each tensor's rows; 0: every core
};

struct QuantizeReport {
  int64_t num_converted = 0;  // tensors whose type changed
  int64_t num_kept = 0;       // tensors copied unchanged
  int64_t num_fallback = 0;   // tensors that got a fallback type instead of the target
  uint64_t bytes_in = 0;      // tensor data bytes before
  uint64_t bytes_out = 0;     // tensor data bytes after
};

// A writer for `in` with its weights re-encoded: same version, alignment, metadata (plus
// general.file_type and, for quantised targets, general.quantization_version = 2) and tensor
// order. Unchanged tensors reference `in`'s mapping, so `in` must outlive the writer; changed
// ones are converted as the writer writes them (one tensor in memory at a time; the writer's
// progress bar shows it), and a conversion error ends write() naming the tensor. `report`
// (may be null) is complete on return: sizes come from the types. Errors the types decide
// (no codec, a row that fits no block) are returned here, naming the tensor.
Result<GgufWriter> quantize_model(const GgufFile& in, const QuantizeOptions& options,
                                  QuantizeReport* report);

}  // namespace arbor::gguf
