// Re-encoding tensors and whole models to another ggml type: the library half of
// `arbor quantize` and `arbor convert --type`.
//
// Which tensors change (llama.cpp's basic rule, without its per-tensor "mixture" tweaks):
//   * tensors with 2 or more dims whose name ends in "weight" (except MoE routers,
//     "*ffn_gate_inp.weight", which llama.cpp keeps exact) get the target type;
//   * everything else (norms, biases, 1-D tensors) keeps its type;
//   * a matrix whose row length is not a multiple of the target's block size falls back as
//     llama.cpp does (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, q2_K/q3_K -> q4_0 where llama.cpp
//     would use iq4_nl), and to f16 if that does not fit either.
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
// q3_K, q4_K, q5_K, q6_K.
bool is_quantize_target(GgmlType type);
// Like parse_ggml_type, restricted to the targets above; the error lists them.
Result<GgmlType> parse_quantize_target(std::string_view name);

// llama.cpp's LLAMA_FTYPE value for a model whose weight matrices are `type`
// (f32 0, f16 1, q4_0 2, q4_1 3, q8_0 7, q5_0 8, q5_1 9, q2_K 10, q3_K 11 (Q3_K_S),
// q4_K 14 (Q4_K_S), q5_K 16 (Q5_K_S), q6_K 18, bf16 32). CHECKs is_quantize_target(type).
uint32_t llama_file_type(GgmlType type);

// The type `t` gets when the model's target is `target` (rules above).
GgmlType choose_tensor_type(std::string_view name, const std::vector<int64_t>& dims,
                            GgmlType source_type, GgmlType target);

// Re-encodes one tensor's data. src: ggml_nbytes(src_type, dims) bytes (CHECKed);
// returns ggml_nbytes(dst_type, dims) bytes. kUnimplemented when a type has no codec,
// kInvalidArgument when dims[0] is not a multiple of dst_type's block size.
Result<std::vector<uint8_t>> convert_tensor_data(GgmlType src_type, std::span<const uint8_t> src,
                                                 const std::vector<int64_t>& dims,
                                                 GgmlType dst_type);

struct QuantizeOptions {
  GgmlType target = GgmlType::kQ8_0;  // must satisfy is_quantize_target
  bool show_progress = false;         // a progress bar (tensors done) on stderr
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
// order. Unchanged tensors reference `in`'s mapping, so `in` must outlive the writer.
// `report` may be null. Errors name the tensor.
Result<GgufWriter> quantize_model(const GgufFile& in, const QuantizeOptions& options,
                                  QuantizeReport* report);

}  // namespace arbor::gguf
