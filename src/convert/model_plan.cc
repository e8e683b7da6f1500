#include "convert/model_plan.h"

#include <cstring>
#include <sstream>

#include "base/log.h"
#include "base/progress.h"
#include "gguf/quantize_model.h"

namespace arbor::convert {

using gguf::GgmlType;
using gguf::KeyValue;
using gguf::Value;

std::string_view source_type_name(SourceType type) {
  switch (type) {
    case SourceType::kF32:
      return "F32";
    case SourceType::kF16:
      return "F16";
    case SourceType::kBF16:
      return "BF16";
  }
  return "?";
}

size_t source_type_size(SourceType type) {
  switch (type) {
    case SourceType::kF32:
      return 4;
    case SourceType::kF16:
      return 2;
    case SourceType::kBF16:
      return 2;
  }
  return 0;
}

int64_t PlannedTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

Result<OutputType> parse_output_type(std::string_view name) {
  if (name == "source") return OutputType{.keep_source = true, .type = GgmlType::kF32};
  auto type = gguf::parse_quantize_target(name);
  if (!type.ok())
    return invalid_argument("--type '", name, "': ", type.status().message(), " (or 'source')");
  return OutputType{.keep_source = false, .type = *type};
}

std::string output_type_name(const OutputType& type) {
  return type.keep_source ? "source" : std::string(gguf::ggml_type_name(type.type));
}

namespace {

GgmlType ggml_of(SourceType type) {
  switch (type) {
    case SourceType::kF32:
      return GgmlType::kF32;
    case SourceType::kF16:
      return GgmlType::kF16;
    case SourceType::kBF16:
      return GgmlType::kBF16;
  }
  return GgmlType::kF32;
}

// The tensor's bytes in GGUF row order (permuted if asked), still in the source type.
std::vector<uint8_t> gguf_ordered_bytes(const PlannedTensor& t) {
  const auto in = t.bytes();
  std::vector<uint8_t> out(in.size());
  const bool is_vector = t.dims.size() == 1;
  const int64_t rows = is_vector ? t.dims[0] : t.dims[1];
  const int64_t row_len = is_vector ? 1 : t.dims[0];
  permute_rows(in, out, rows, row_len, source_type_size(t.src_type), t.permute_heads);
  return out;
}

}  // namespace

void permute_rows(std::span<const uint8_t> in, std::span<uint8_t> out, int64_t rows,
                  int64_t row_len, size_t elem_size, uint32_t n_heads) {
  const size_t row_bytes = static_cast<size_t>(row_len) * elem_size;
  ARBOR_CHECK_EQ(in.size(), static_cast<size_t>(rows) * row_bytes);
  ARBOR_CHECK_EQ(out.size(), in.size());
  ARBOR_CHECK(n_heads > 0 && rows % (2 * static_cast<int64_t>(n_heads)) == 0)
      << rows << " rows cannot be split into " << n_heads << " heads of even size";
  const int64_t head_dim = rows / n_heads;
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < static_cast<int64_t>(n_heads); ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t dst = h * head_dim + 2 * i + j;
        const int64_t src = h * head_dim + j * half + i;
        std::memcpy(out.data() + dst * row_bytes, in.data() + src * row_bytes, row_bytes);
      }
    }
  }
}

GgmlType choose_tensor_type(const PlannedTensor& tensor, const OutputType& type) {
  if (tensor.dims.size() < 2) return GgmlType::kF32;
  const GgmlType source = ggml_of(tensor.src_type);
  if (type.keep_source) return source;
  return gguf::choose_tensor_type(tensor.name, tensor.dims, source, type.type);
}

namespace {

void add_hparams(const LlamaHparams& hp, std::vector<KeyValue>* kv) {
  const std::string& a = hp.arch;
  kv->push_back({"general.architecture", Value::str(a)});
  kv->push_back({"general.name", Value::str(hp.name)});
  kv->push_back({a + ".context_length", Value::u32(hp.context_length)});
  kv->push_back({a + ".embedding_length", Value::u32(hp.embedding_length)});
  kv->push_back({a + ".feed_forward_length", Value::u32(hp.feed_forward_length)});
  kv->push_back({a + ".block_count", Value::u32(hp.block_count)});
  kv->push_back({a + ".attention.head_count", Value::u32(hp.head_count)});
  kv->push_back({a + ".attention.head_count_kv", Value::u32(hp.head_count_kv)});
  kv->push_back({a + ".rope.dimension_count", Value::u32(hp.rope_dimension_count)});
  if (hp.write_rope_freq_base)
    kv->push_back({a + ".rope.freq_base", Value::f32(hp.rope_freq_base)});
  kv->push_back({a + ".attention.layer_norm_rms_epsilon", Value::f32(hp.rms_norm_eps)});
  kv->push_back({a + ".vocab_size", Value::u32(hp.vocab_size)});
}

}  // namespace

std::vector<KeyValue> plan_metadata(const ModelPlan& plan, const OutputType& type) {
  std::vector<KeyValue> kv;
  if (plan.arch_metadata.empty()) {
    add_hparams(plan.hparams, &kv);
  } else {
    kv.push_back({"general.architecture", Value::str(plan.hparams.arch)});
    kv.push_back({"general.name", Value::str(plan.hparams.name)});
    kv.insert(kv.end(), plan.arch_metadata.begin(), plan.arch_metadata.end());
  }
  if (!type.keep_source)
    kv.push_back({"general.file_type", Value::u32(gguf::llama_file_type(type.type))});
  if (!type.keep_source && gguf::ggml_traits(type.type).block_size > 1) {
    kv.push_back({"general.quantization_version", Value::u32(2)});
  }
  kv.insert(kv.end(), plan.tokenizer_metadata.begin(), plan.tokenizer_metadata.end());
  return kv;
}

std::string describe_plan(const ModelPlan& plan, const OutputType& type) {
  const auto& hp = plan.hparams;
  std::ostringstream os;
  os << "arch " << hp.arch << ", dim " << hp.embedding_length << ", ffn " << hp.feed_forward_length
     << ", " << hp.block_count << " layers, " << hp.head_count << " heads, " << hp.head_count_kv
     << " kv heads, head_dim " << hp.rope_dimension_count << ", vocab " << hp.vocab_size
     << ", context " << hp.context_length << ", rms_eps " << hp.rms_norm_eps << ", rope_theta "
     << hp.rope_freq_base << "; " << plan.tensors.size() << " tensors";
  if (!plan.tensors.empty()) {
    os << " (source " << source_type_name(plan.tensors.front().src_type) << ")";
  }
  os << " -> --type " << output_type_name(type);
  return os.str();
}

namespace {

// The GGUF bytes of one tensor in `type`: permuted in the source type, then re-encoded.
Result<std::vector<uint8_t>> encode_tensor(const PlannedTensor& t, GgmlType type) {
  std::vector<uint8_t> permuted;
  auto bytes = t.bytes();
  if (t.permute_heads > 0) {
    permuted = gguf_ordered_bytes(t);
    if (type == ggml_of(t.src_type)) return permuted;
    bytes = permuted;
  }
  return gguf::convert_tensor_data(ggml_of(t.src_type), bytes, t.dims, type);
}

}  // namespace

Status write_plan(const ModelPlan& plan, const OutputType& type, const std::string& path) {
  gguf::GgufWriter writer;
  for (auto& kv : plan_metadata(plan, type)) writer.set(std::move(kv.key), std::move(kv.value));
  ProgressBar progress("convert", plan.tensors.size(), "tensors");
  for (const auto& t : plan.tensors) {
    const GgmlType out_type = choose_tensor_type(t, type);
    const auto src = t.bytes();
    const size_t want = static_cast<size_t>(t.num_elements()) * source_type_size(t.src_type);
    ARBOR_CHECK_EQ(src.size(), want) << t.name;
    if (out_type == ggml_of(t.src_type) && t.permute_heads == 0) {
      writer.add_tensor_ref(t.name, out_type, t.dims, src);  // zero-copy: bytes stay in the mapping
    } else {
      auto encoded = encode_tensor(t, out_type);
      if (!encoded.ok()) return encoded.status().with_context(t.name);
      writer.add_tensor_owned(t.name, out_type, t.dims, std::move(*encoded));
    }
    ARBOR_LOG(kDebug) << t.name << " " << source_type_name(t.src_type) << " -> "
                      << gguf::ggml_type_name(out_type);
    progress.add(1);
  }
  progress.finish();
  return writer.write(path);
}

}  // namespace arbor::convert
