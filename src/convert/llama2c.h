// llama2.c checkpoints and tokenizers -> ModelPlan.
//
// Checkpoint formats (all little-endian):
//   legacy   7 × i32 header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
//            seq_len; vocab_size < 0 means a separate classifier. Then fp32 weights:
//            token_embedding [vocab, dim], rms_att [L, dim], wq [L, dim, dim],
//            wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim],
//            w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim], rms_final [dim],
//            freq_cis_real [seq_len, head_dim/2], freq_cis_imag (same; ignored),
//            wcls [vocab, dim] (only with a separate classifier).
//   ak42 v1  u32 magic 0x616b3432 ("ak42"), i32 version 1, the 7 × i32 header (vocab > 0),
//            u8 shared_classifier, zero padding to 256 bytes. fp32 weights: rms_att [L, dim],
//            rms_ffn [L, dim], rms_final [dim], token_embedding, wq, wk, wv, wo, w1, w2, w3
//            (each [L, ...] as above), wcls if not shared.
//   ak42 v2  same header plus i32 group_size at byte 37; norms in fp32 as in v1, then for each
//            of token_embedding, wq, wk, wv, wo, w1, w2, w3 (per layer), wcls: int8 values
//            [numel] followed by fp32 scales [numel / group_size]. Dequantised to F32 here.
// Matrices are stored [out, in] row-major, which is ggml's [in, out] layout byte for byte; q/k
// are NOT permuted because llama2.c's interleaved RoPE is ggml's normal (non-NEOX) mode.
//
// Tokenizer (tokenizer.bin): i32 max_token_length, then per token: f32 score, i32 len, bytes.
// Written as SentencePiece ("llama") GGUF vocabulary exactly as llama.cpp's
// convert-llama2c-to-ggml does: ids 0/1/2 become "<unk>" (UNKNOWN), "<s>", "</s>" (CONTROL),
// "<0xXX>" pieces are BYTE, spaces are escaped to U+2581.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "convert/model_plan.h"
#include "gguf/gguf.h"

namespace arbor::convert {

struct Llama2cHeader {
  int version = 0;  // 0 = legacy, 1 = ak42 fp32, 2 = ak42 Q8_0
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;  // always positive here
  int32_t seq_len = 0;
  bool shared_classifier = true;
  int32_t group_size = 0;   // version 2 only
  size_t header_bytes = 0;  // 28 (legacy) or 256
};

// Parses and validates the header (sizes positive and bounded, heads dividing dim, kv heads
// dividing heads, even head_dim). `name` prefixes errors.
Result<Llama2cHeader> parse_llama2c_header(std::span<const uint8_t> bytes, const std::string& name);

// Parses tokenizer.bin into GGUF tokenizer metadata for `vocab_size` tokens.
Result<std::vector<gguf::KeyValue>> llama2c_tokenizer_metadata(std::span<const uint8_t> bytes,
                                                               int32_t vocab_size,
                                                               const std::string& name);

// A parsed checkpoint ready to write. Owns the mappings the plan's tensors point into.
struct Llama2cModel {
  Llama2cHeader header;
  MappedFile model_file;
  ModelPlan plan;
};

// Opens both files and builds the plan. Tensors are emitted in the reference order
// (token_embd, output_norm, output, then per layer attn_q, attn_k, attn_v, attn_output,
// attn_norm, ffn_gate, ffn_down, ffn_up, ffn_norm); a shared classifier is written as an
// explicit copy named output.weight, as llama.cpp's converter does.
Result<Llama2cModel> load_llama2c(const std::string& model_path, const std::string& tokenizer_path);

// Same from bytes the caller keeps alive (tests).
Result<ModelPlan> plan_llama2c(std::span<const uint8_t> model, std::span<const uint8_t> tokenizer,
                               const std::string& model_name, const std::string& tokenizer_name,
                               Llama2cHeader* header_out);

}  // namespace arbor::convert
