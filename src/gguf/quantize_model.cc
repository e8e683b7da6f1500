#include "gguf/quantize_model.h"

#include <charconv>
#include <optional>
#include <thread>

#include "gguf/quants.h"

namespace arbor::gguf {

namespace {

struct TargetInfo {
  GgmlType type;
  uint32_t file_type;  // LLAMA_FTYPE_*
};

constexpr TargetInfo kTargets[] = {
    {GgmlType::kF32, 0},   {GgmlType::kF16, 1},   {GgmlType::kQ4_0, 2},  {GgmlType::kQ4_1, 3},
    {GgmlType::kQ8_0, 7},  {GgmlType::kQ5_0, 8},  {GgmlType::kQ5_1, 9},  {GgmlType::kQ2_K, 10},
    {GgmlType::kQ3_K, 11}, {GgmlType::kQ4_K, 14}, {GgmlType::kQ5_K, 16}, {GgmlType::kQ6_K, 18},
    {GgmlType::kBF16, 32},  {GgmlType::kIQ4_NL, 25}, {GgmlType::kIQ4_XS, 30},
    {GgmlType::kMXFP4, 38},
};

std::optional<TargetInfo> find_target(GgmlType type) {
  for (const TargetInfo& t : kTargets) {
    if (t.type == type) return t;
  }
  return std::nullopt;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool fits(GgmlType type, int64_t row_length) {
  return row_length % ggml_traits(type).block_size == 0;
}

// llama.cpp's fallback when the row length is not a multiple of the target's block size.
GgmlType fallback_type(GgmlType target) {
  switch (target) {
    case GgmlType::kQ4_K: return GgmlType::kQ5_0;
    case GgmlType::kQ5_K: return GgmlType::kQ5_1;
    case GgmlType::kQ6_K: return GgmlType::kQ8_0;
    case GgmlType::kQ2_K: case GgmlType::kQ3_K: return GgmlType::kQ4_0;
    case GgmlType::kIQ4_XS: return GgmlType::kIQ4_NL;
    default: return GgmlType::kF16;
  }
}

bool is_quantized(GgmlType type) {
  return type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16;
}

}  // namespace

bool is_quantize_target(GgmlType type) { return find_target(type).has_value(); }

Result<GgmlType> parse_quantize_target(std::string_view name) {
  auto parsed = parse_ggml_type(name);
  if (parsed.ok() && is_quantize_target(*parsed)) return *parsed;
  std::string accepted;
  for (const TargetInfo& t : kTargets) {
    if (!accepted.empty()) accepted += ", ";
    accepted += ggml_type_name(t.type);
  }
  return invalid_argument("unknown or unsupported quantisation type '", name,
                          "'; accepted: ", accepted);
}

uint32_t llama_file_type(GgmlType type) {
  const auto t = find_target(type);
  ARBOR_CHECK(t.has_value()) << ggml_type_name(type) << " is not a quantisation target";
  return t->file_type;
}

namespace {

struct MixInfo {
  QuantMix mix;
  std::string_view name;
  GgmlType base;
  uint32_t file_type;
};

constexpr MixInfo kMixes[] = {
    {QuantMix::kQ3_K_S, "q3_K_S", GgmlType::kQ3_K, 11},
    {QuantMix::kQ3_K_M, "q3_K_M", GgmlType::kQ3_K, 12},
    {QuantMix::kQ3_K_L, "q3_K_L", GgmlType::kQ3_K, 13},
    {QuantMix::kQ4_K_S, "q4_K_S", GgmlType::kQ4_K, 14},
    {QuantMix::kQ4_K_M, "q4_K_M", GgmlType::kQ4_K, 15},
    {QuantMix::kQ5_K_S, "q5_K_S", GgmlType::kQ5_K, 16},
    {QuantMix::kQ5_K_M, "q5_K_M", GgmlType::kQ5_K, 17},
    {QuantMix::kMxfp4Moe, "mxfp4_moe", GgmlType::kMXFP4, 38},
};

const MixInfo* find_mix(QuantMix mix) {
  for (const MixInfo& m : kMixes) {
    if (m.mix == mix) return &m;
  }
  return nullptr;
}

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// The N of "blk.N." in a tensor name, or -1.
int layer_index(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  int i = -1;
  const auto r = std::from_chars(name.data() + 4, name.data() + name.size(), i);
  return r.ec == std::errc() ? i : -1;
}

// llama.cpp's use_more_bits(i_layer, n_layers).
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The mixture's type for a weight matrix (before fallbacks); see quantize_model.h.
GgmlType mix_type(std::string_view name, GgmlType base, QuantMix mix, int layers, bool tied) {
  if (mix == QuantMix::kPure) return base;
  if (name == "output.weight" || (tied && name == "token_embd.weight")) return GgmlType::kQ6_K;
  const int i = layer_index(name), n = layers;
  const bool m_mix = mix == QuantMix::kQ4_K_M || mix == QuantMix::kQ5_K_M;
  if (contains(name, "attn_v.weight")) {
    if (mix == QuantMix::kQ3_K_M) return i < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
    if (mix == QuantMix::kQ3_K_L) return GgmlType::kQ5_K;
    if (m_mix && use_more_bits(i, n)) return GgmlType::kQ6_K;
    if (mix == QuantMix::kQ4_K_S && i < 4) return GgmlType::kQ5_K;
    return base;
  }
  if (contains(name, "ffn_down")) {
    if (mix == QuantMix::kQ3_K_M) return i < n / 16 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
    if (mix == QuantMix::kQ3_K_L) return GgmlType::kQ5_K;
    if (m_mix && use_more_bits(i, n)) return GgmlType::kQ6_K;
    if (mix == QuantMix::kQ4_K_S && i < n / 8) return GgmlType::kQ5_K;
    return base;
  }
  if (contains(name, "attn_output.weight")) {
    if (mix == QuantMix::kQ3_K_M) return GgmlType::kQ4_K;
    if (mix == QuantMix::kQ3_K_L) return GgmlType::kQ5_K;
  }
  if (contains(name, "attn_qkv.weight")) {
    if (mix == QuantMix::kQ3_K_M || mix == QuantMix::kQ3_K_L) return GgmlType::kQ4_K;
    if (mix == QuantMix::kQ4_K_M) return GgmlType::kQ5_K;
    if (mix == QuantMix::kQ5_K_M) return GgmlType::kQ6_K;
  }
  return base;
}

// The type before fallbacks: the mixture's rule, or llama.cpp's MXFP4_MOE (expert tensors, 3-D
// with several experts, MXFP4; every other matrix, the classifier included, Q8_0).
GgmlType intended_type(std::string_view name, const std::vector<int64_t>& dims, GgmlType base,
                       QuantMix mix, int layers, bool tied) {
  if (mix == QuantMix::kMxfp4Moe) {
    return dims.size() >= 3 && dims[2] > 1 ? GgmlType::kMXFP4 : GgmlType::kQ8_0;
  }
  return mix_type(name, base, mix, layers, tied);
}

}  // namespace

Result<QuantRecipe> parse_quantize_recipe(std::string_view name) {
  for (const MixInfo& m : kMixes) {
    if (equal_ignore_case(m.name, name)) return QuantRecipe{m.base, m.mix};
  }
  auto type = parse_quantize_target(name);
  if (type.ok()) return QuantRecipe{*type, QuantMix::kPure};
  std::string accepted;
  const auto add = [&accepted](std::string_view n) {
    accepted += str_cat(accepted.empty() ? "" : ", ", n);
  };
  for (const TargetInfo& t : kTargets) add(ggml_type_name(t.type));
  for (const MixInfo& m : kMixes) add(m.name);
  return invalid_argument("unknown or unsupported quantisation type '", name,
                          "'; accepted: ", accepted);
}

std::string recipe_name(const QuantRecipe& recipe) {
  const MixInfo* m = find_mix(recipe.mix);
  return std::string(m != nullptr ? m->name : ggml_type_name(recipe.type));
}

uint32_t llama_file_type(const QuantRecipe& recipe) {
  const MixInfo* m = find_mix(recipe.mix);
  return m != nullptr ? m->file_type : llama_file_type(recipe.type);
}

GgmlType choose_tensor_type(std::string_view name, const std::vector<int64_t>& dims,
                            GgmlType source_type, GgmlType target, QuantMix mix, int layers,
                            bool tied_embeddings) {
  // As llama-quantize: vectors, routers and the Gated DeltaNet's conv taps ([K, C], K ~ 4) stay.
  if (dims.size() < 2 || !ends_with(name, "weight") || ends_with(name, "ffn_gate_inp.weight") ||
      ends_with(name, "ssm_conv1d.weight")) {
    return source_type;
  }
  target = intended_type(name, dims, target, mix, layers, tied_embeddings);
  if (fits(target, dims[0])) return target;
  const GgmlType fallback = fallback_type(target);
  return fits(fallback, dims[0]) ? fallback : GgmlType::kF16;
}

namespace {

// Whether a tensor of `dims` converts from src_type to dst_type (the checks convert_tensor_data
// makes before it reads anything).
Status check_convertible(GgmlType src_type, const std::vector<int64_t>& dims, GgmlType dst_type) {
  if (src_type == dst_type) return ok_status();
  if (!can_dequantize(src_type)) {
    return unimplemented("cannot decode ", ggml_type_name(src_type), " tensors");
  }
  if (!can_quantize(dst_type)) {
    return unimplemented("cannot encode ", ggml_type_name(dst_type), " tensors");
  }
  if (!ggml_nbytes(dst_type, dims)) {
    return invalid_argument("row length ", dims[0], " is not a multiple of the ",
                            ggml_type_name(dst_type), " block size ",
                            ggml_traits(dst_type).block_size);
  }
  return ok_status();
}

}  // namespace

Result<std::vector<uint8_t>> convert_tensor_data(GgmlType src_type, std::span<const uint8_t> src,
                                                 const std::vector<int64_t>& dims,
                                                 GgmlType dst_type, int threads) {
  const auto src_bytes = ggml_nbytes(src_type, dims);
  ARBOR_CHECK(src_bytes.has_value() && *src_bytes == src.size())
      << "tensor data of " << src.size() << " bytes does not match its dims";
  if (src_type == dst_type) return std::vector<uint8_t>(src.begin(), src.end());
  ARBOR_RETURN_IF_ERROR(check_convertible(src_type, dims, dst_type));
  const auto dst_bytes = ggml_nbytes(dst_type, dims);
  const int64_t row = dims[0];
  const int64_t rows = static_cast<int64_t>(*src_bytes / ggml_row_size(src_type, row));
  const uint64_t src_row_bytes = ggml_row_size(src_type, row);
  const uint64_t dst_row_bytes = ggml_row_size(dst_type, row);
  std::vector<uint8_t> out(*dst_bytes);
  // Rows are independent: each thread converts a contiguous range of them.
  auto convert = [&](int64_t begin, int64_t end) -> Status {
    std::vector<float> buf(static_cast<size_t>(row));
    for (int64_t r = begin; r < end; ++r) {
      ARBOR_RETURN_IF_ERROR(
          dequantize_row(src_type, src.data() + r * src_row_bytes, buf.data(), row));
      ARBOR_RETURN_IF_ERROR(quantize_row(dst_type, buf.data(), out.data() + r * dst_row_bytes, row));
    }
    return ok_status();
  };
  const int64_t n = std::clamp<int64_t>(threads, 1, std::max<int64_t>(rows, 1));
  if (n == 1) {
    ARBOR_RETURN_IF_ERROR(convert(0, rows));
    return out;
  }
  std::vector<Status> status(static_cast<size_t>(n));
  std::vector<std::thread> workers;
  for (int64_t i = 0; i < n; ++i) {
    workers.emplace_back([&, i] { status[i] = convert(rows * i / n, rows * (i + 1) / n); });
  }
  for (std::thread& w : workers) w.join();
  for (const Status& st : status) ARBOR_RETURN_IF_ERROR(st);
  return out;
}

Result<GgufWriter> quantize_model(const GgufFile& in, const QuantizeOptions& options,
                                  QuantizeReport* report) {
  if (!is_quantize_target(options.target)) {
    return invalid_argument(ggml_type_name(options.target), " is not a quantisation target");
  }
  QuantizeReport local;
  QuantizeReport& rep = report != nullptr ? *report : local;
  rep = QuantizeReport{};
  GgufWriter w;
  w.set_version(in.version());
  w.set_alignment(in.alignment());
  for (const KeyValue& kv : in.metadata()) w.set(kv.key, kv.value);
  if (options.mix != QuantMix::kPure) {
    const MixInfo* m = find_mix(options.mix);
    if (m == nullptr || m->base != options.target) {
      return invalid_argument("a K-quant mixture needs its own base type, not ",
                              ggml_type_name(options.target));
    }
  }
  w.set("general.file_type", Value::u32(llama_file_type({options.target, options.mix})));
  if (is_quantized(options.target)) w.set("general.quantization_version", Value::u32(2));
  // n of the mixtures' rules: the model's attn_v (or fused attn_qkv) tensors, as llama.cpp's
  // n_attention_wv; and whether the classifier is the embedding (no output.weight).
  int layers = 0;
  bool tied = true;
  for (const TensorInfo& t : in.tensors()) {
    layers += contains(t.name, "attn_v.weight") || contains(t.name, "attn_qkv.weight") ? 1 : 0;
    tied = tied && t.name != "output.weight";
  }

  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  for (const TensorInfo& t : in.tensors()) {
    const GgmlType type =
        choose_tensor_type(t.name, t.dims, t.type, options.target, options.mix, layers, tied);
    rep.bytes_in += t.size_bytes;
    if (type == t.type) {
      w.add_tensor_ref(t.name, t.type, t.dims, t.bytes());
      rep.bytes_out += t.size_bytes;
      ++rep.num_kept;
      continue;
    }
    if (Status s = check_convertible(t.type, t.dims, type); !s.ok()) {
      return s.with_context(str_cat("tensor '", t.name, "'"));
    }
    // Converted when the writer writes it: one tensor in memory at a time.
    const TensorInfo* src = &t;
    w.add_tensor_generated(t.name, type, t.dims, [src, type, threads] {
      return convert_tensor_data(src->type, src->bytes(), src->dims, type, threads);
    });
    rep.bytes_out += *ggml_nbytes(type, t.dims);
    ++rep.num_converted;
    if (type != intended_type(t.name, t.dims, options.target, options.mix, layers, tied)) {
      ++rep.num_fallback;
    }
  }
  return w;
}

}  // namespace arbor::gguf
