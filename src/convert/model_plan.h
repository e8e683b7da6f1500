// The format-independent half of a conversion: a ModelPlan (GGUF metadata plus the tensors to
// write, each with its source bytes and the transform that puts it in GGUF layout), and the
// writer that encodes every tensor to the requested output type and writes the GGUF file.
//
// The readers (llama2c.h, hf.h) build a plan; write_plan() turns it into a file. Source bytes are
// referenced, not copied, where the readers can (mmapped checkpoints), so a plan is cheap until
// it is written.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/ggml_type.h"
#include "gguf/gguf.h"

namespace arbor::convert {

// Element type of a tensor's source bytes.
enum class SourceType : uint8_t { kF32, kF16, kBF16 };
std::string_view source_type_name(SourceType type);
size_t source_type_size(SourceType type);

struct PlannedTensor {
  std::string name;           // GGUF name ("blk.0.attn_q.weight")
  std::vector<int64_t> dims;  // ggml order: dims[0] is the row length (fastest-varying)
  SourceType src_type = SourceType::kF32;
  // Row-major source data, num_elements() × source_type_size(src_type) bytes. Either points into
  // memory the plan's creator keeps alive (a mapping) or, when `owned` is non-empty, is ignored
  // in favour of `owned`.
  std::span<const uint8_t> src;
  std::vector<uint8_t> owned;
  // > 0: the rows (dims[1]) are permuted from Hugging Face's rotate-half layout to GGUF's
  // interleaved layout with this many heads (llama.cpp's LlamaModel.permute).
  uint32_t permute_heads = 0;

  std::span<const uint8_t> bytes() const {
    return owned.empty() ? src : std::span<const uint8_t>(owned);
  }
  int64_t num_elements() const;
};

// Shape hyper-parameters written as `<arch>.*` metadata.
struct LlamaHparams {
  std::string arch = "llama";  // GGUF architecture and key prefix: "llama" or "qwen2"
  std::string name;            // general.name
  uint32_t context_length = 0;
  uint32_t embedding_length = 0;
  uint32_t feed_forward_length = 0;
  uint32_t block_count = 0;
  uint32_t head_count = 0;
  uint32_t head_count_kv = 0;
  uint32_t rope_dimension_count = 0;  // head_dim
  uint32_t vocab_size = 0;
  float rms_norm_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  bool write_rope_freq_base = false;  // llama2.c checkpoints leave it implicit (10000)
};

struct ModelPlan {
  LlamaHparams hparams;  // describe_plan(); the `<arch>.*` keys unless arch_metadata is set
  // When non-empty: the `<arch>.*` keys to write instead of those derived from `hparams`
  // (Hugging Face architectures other than llama/qwen2 write exactly llama.cpp's key set).
  std::vector<gguf::KeyValue> arch_metadata;
  std::vector<gguf::KeyValue> tokenizer_metadata;  // tokenizer.ggml.* keys, in write order
  std::vector<PlannedTensor> tensors;              // in write order
};

// What --type asks for. kSource keeps F16/BF16 sources as they are (F32 stays F32).
struct OutputType {
  bool keep_source = false;
  gguf::GgmlType type = gguf::GgmlType::kF32;
};
// Accepts "source" and every type gguf::parse_quantize_target() accepts (f32, f16, bf16, q4_0,
// q4_1, q5_0, q5_1, q8_0, q2_K ... q6_K).
Result<OutputType> parse_output_type(std::string_view name);
std::string output_type_name(const OutputType& type);

// The GGUF type a tensor gets: 1-D tensors (norms, biases, rope factors) are F32; 2-D weights
// keep their source type with "source", else follow gguf::choose_tensor_type (the requested
// type, or llama.cpp's fallback when the row length is not a multiple of its block size).
gguf::GgmlType choose_tensor_type(const PlannedTensor& tensor, const OutputType& type);

// Row permutation from Hugging Face to GGUF q/k layout, on elements of `elem_size` bytes.
// `rows` = dims[1] of the tensor (1 for a bias), `row_len` = dims[0]. Row r' = h*hd + 2*i + j of
// the output is row h*hd + j*hd/2 + i of the input (hd = rows / n_heads). CHECKs that rows is a
// multiple of 2 * n_heads.
void permute_rows(std::span<const uint8_t> in, std::span<uint8_t> out, int64_t rows,
                  int64_t row_len, size_t elem_size, uint32_t n_heads);

// All metadata for the GGUF file: general.*, <arch>.*, tokenizer.*, general.file_type.
std::vector<gguf::KeyValue> plan_metadata(const ModelPlan& plan, const OutputType& type);

// One line describing the resolved configuration (shape, tensor count, types) for the log.
std::string describe_plan(const ModelPlan& plan, const OutputType& type);

// Encodes every tensor (progress bar on stderr) and writes the GGUF file to `path`.
Status write_plan(const ModelPlan& plan, const OutputType& type, const std::string& path);

}  // namespace arbor::convert
