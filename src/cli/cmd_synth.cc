// arbor synth: writes a deterministic random-weight model of a real shape with a real tokenizer,
// for benchmarks and tests that need the cost of a large model without its weights.
//
// Weights: every matrix row is drawn from its own generator seeded by (seed, tensor, row), uniform
// with standard deviation 1/sqrt(row length) (fan-in), so activations stay O(1) through the
// layers and the output logits have unit variance (softmax neither one-hot nor flat). Norm
// weights are 1, q/k/v biases (qwen2) have std 0.02. The bytes depend only on the options, not on
// the thread count. Matrices take --type; norms and biases stay F32 (as llama.cpp writes them).
// Tensors are generated and quantised one at a time, rows in parallel, into buffers the writer
// owns: the model is held once, in its final type.
//
// --inflate SMALL.gguf instead writes a trained model's exact next-token function at the cost of
// a larger shape (convert/inflate.h, docs/inflate.md); this file only parses its flags.
#include <CLI/CLI.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/progress.h"
#include "cli/command.h"
#include "convert/inflate.h"
#include "gguf/gguf.h"
#include "gguf/quants.h"
#include "tokenizer/tokenizer.h"
#include "kernels/thread_pool.h"
#include "sampling/rng.h"

namespace arbor::cli {
namespace {

using gguf::GgmlType;
using gguf::Value;

struct Shape {
  std::string name;
  std::string arch = "llama";
  int64_t dim = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, context = 0;
  int64_t vocab = 0;  // 0: the tokenizer's size; else padded up to this (Qwen's 151936)
  bool tied = false;
  bool qkv_bias = false;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
};

const std::vector<Shape>& presets() {
  static const std::vector<Shape> kShapes = {
      {"tinyllama-1.1b", "llama", 2048, 5632, 22, 32, 4, 2048, 0, false, false, 10000.0f, 1e-5f},
      {"stories110m", "llama", 768, 2048, 12, 12, 12, 1024, 0, false, false, 10000.0f, 1e-5f},
      {"stories15m", "llama", 288, 768, 6, 6, 6, 256, 0, false, false, 10000.0f, 1e-5f},
      {"qwen2.5-0.5b", "qwen2", 896, 4864, 24, 14, 2, 32768, 151936, true, true, 1e6f, 1e-6f},
      {"custom", "llama", 0, 0, 0, 0, 0, 2048, 0, false, false, 10000.0f, 1e-5f},
  };
  return kShapes;
}

struct Options {
  std::string shape = "stories15m";
  std::string type = "q4_0";
  std::string vocab_path;
  std::string out;
  uint64_t seed = 0;
  int64_t dim = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, vocab_size = 0, context = 0;
  std::string arch;
  bool qkv_bias = false;
  bool tied = false;
  int threads = 0;
  std::string inflate;   // --inflate: the source model
  int64_t kv_ratio = 0;  // --kv-ratio (inflate only)
  bool shape_given = false;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the row length
  GgmlType type;
  float stddev;  // 0: all ones (norm weights)
};

// The preset with the command line's overrides applied, checked for consistency.
Result<Shape> resolve_shape(const Options& o, GgmlType type) {
  Shape s;
  for (const Shape& p : presets()) {
    if (p.name == o.shape) s = p;
  }
  if (s.name.empty()) return invalid_argument("unknown --shape ", o.shape);
  const std::pair<int64_t, int64_t*> overrides[] = {
      {o.dim, &s.dim}, {o.ffn, &s.ffn}, {o.layers, &s.layers}, {o.heads, &s.heads},
      {o.kv_heads, &s.kv_heads}, {o.context, &s.context}, {o.vocab_size, &s.vocab}};
  for (const auto& [flag, field] : overrides) {
    if (flag > 0) *field = flag;
  }
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  if (!o.arch.empty()) s.arch = o.arch;
  s.tied = s.tied || o.tied;
  s.qkv_bias = s.qkv_bias || o.qkv_bias || s.arch == "qwen2";
  if (s.arch != "llama" && s.arch != "qwen2") {
    return invalid_argument("--arch is ", s.arch, ", must be llama or qwen2");
  }
  if (s.dim <= 0 || s.ffn <= 0 || s.layers <= 0 || s.heads <= 0 || s.context <= 0) {
    return invalid_argument("shape ", s.name, " needs --dim, --ffn, --layers and --heads > 0 (got ",
                            s.dim, ", ", s.ffn, ", ", s.layers, ", ", s.heads, ")");
  }
  if (s.dim % s.heads != 0 || (s.dim / s.heads) % 2 != 0) {
    return invalid_argument("--dim ", s.dim, " must be a multiple of 2 * --heads (", s.heads, ")");
  }
  if (s.heads % s.kv_heads != 0) {
    return invalid_argument("--heads ", s.heads, " must be a multiple of --kv-heads ", s.kv_heads);
  }
  const int64_t block = gguf::ggml_traits(type).block_size;
  if (s.dim % block != 0 || s.ffn % block != 0) {
    return invalid_argument("--dim ", s.dim, " and --ffn ", s.ffn, " must be multiples of ", block,
                            " for type ", gguf::ggml_type_name(type));
  }
  return s;
}

std::vector<TensorSpec> plan_tensors(const Shape& s, GgmlType type, int64_t vocab) {
  const int64_t head_dim = s.dim / s.heads;
  const int64_t q_dim = s.heads * head_dim, kv_dim = s.kv_heads * head_dim;
  auto fan_in = [](int64_t n) { return static_cast<float>(1.0 / std::sqrt(double(n))); };
  std::vector<TensorSpec> t;
  t.push_back({"token_embd.weight", {s.dim, vocab}, type, fan_in(s.dim)});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t.push_back({p + "attn_norm.weight", {s.dim}, GgmlType::kF32, 0.0f});
    t.push_back({p + "attn_q.weight", {s.dim, q_dim}, type, fan_in(s.dim)});
    t.push_back({p + "attn_k.weight", {s.dim, kv_dim}, type, fan_in(s.dim)});
    t.push_back({p + "attn_v.weight", {s.dim, kv_dim}, type, fan_in(s.dim)});
    if (s.qkv_bias) {
      t.push_back({p + "attn_q.bias", {q_dim}, GgmlType::kF32, 0.02f});
      t.push_back({p + "attn_k.bias", {kv_dim}, GgmlType::kF32, 0.02f});
      t.push_back({p + "attn_v.bias", {kv_dim}, GgmlType::kF32, 0.02f});
    }
    t.push_back({p + "attn_output.weight", {q_dim, s.dim}, type, fan_in(q_dim)});
    t.push_back({p + "ffn_norm.weight", {s.dim}, GgmlType::kF32, 0.0f});
    t.push_back({p + "ffn_gate.weight", {s.dim, s.ffn}, type, fan_in(s.dim)});
    t.push_back({p + "ffn_up.weight", {s.dim, s.ffn}, type, fan_in(s.dim)});
    t.push_back({p + "ffn_down.weight", {s.ffn, s.dim}, type, fan_in(s.ffn)});
  }
  t.push_back({"output_norm.weight", {s.dim}, GgmlType::kF32, 0.0f});
  if (!s.tied) t.push_back({"output.weight", {s.dim, vocab}, type, fan_in(s.dim)});
  return t;
}

uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// One row of a tensor: uniform in [-a, a] with a = stddev * sqrt(3), or ones.
void fill_row(float* row, int64_t n, float stddev, uint64_t seed, size_t tensor, int64_t r) {
  if (stddev == 0.0f) {
    std::fill(row, row + n, 1.0f);
    return;
  }
  sampling::Rng rng(mix64(mix64(seed) ^ (uint64_t(tensor) << 40)) ^ uint64_t(r));
  const float scale = stddev * std::sqrt(3.0f) * 0x1.0p-23f;  // 24-bit ints in [-2^23, 2^23)
  for (int64_t i = 0; i < n; i += 2) {
    const uint64_t bits = rng.next_u64();
    row[i] = (static_cast<float>(bits >> 40) - 0x1.0p23f) * scale;
    if (i + 1 < n) row[i + 1] = (static_cast<float>((bits >> 8) & 0xffffff) - 0x1.0p23f) * scale;
  }
}

std::vector<uint8_t> make_tensor(const TensorSpec& t, uint64_t seed, size_t index,
                                 kernels::ThreadPool& pool) {
  const int64_t n = t.dims[0];
  int64_t rows = 1;
  for (size_t d = 1; d < t.dims.size(); ++d) rows *= t.dims[d];
  const uint64_t row_bytes = gguf::ggml_row_size(t.type, n);
  std::vector<uint8_t> data(row_bytes * rows);
  pool.parallel_for(
      rows,
      [&](int64_t begin, int64_t end, int) {
        std::vector<float> row(n);
        for (int64_t r = begin; r < end; ++r) {
          fill_row(row.data(), n, t.stddev, seed, index, r);
          // Type and row length were validated in resolve_shape, so this cannot fail.
          const Status s = gguf::quantize_row(t.type, row.data(), data.data() + r * row_bytes, n);
          ARBOR_CHECK(s.ok()) << s.to_string();
        }
      });
  return data;
}

uint32_t file_type_of(GgmlType type) {  // llama.cpp's llama_ftype
  switch (type) {
    case GgmlType::kF32: return 0;
    case GgmlType::kF16: return 1;
    case GgmlType::kQ4_0: return 2;
    default: return 7;  // Q8_0
  }
}

void set_model_metadata(gguf::GgufWriter& w, const Shape& s, GgmlType type, const Options& o,
                        int64_t vocab) {
  const std::string a = s.arch;
  w.set("general.architecture", Value::str(a));
  w.set("general.name", Value::str("arbor-synth " + s.name + " seed " + std::to_string(o.seed)));
  w.set("general.file_type", Value::u32(file_type_of(type)));
  if (type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0) {
    w.set("general.quantization_version", Value::u32(2));
  }
  w.set(a + ".context_length", Value::u32(uint32_t(s.context)));
  w.set(a + ".embedding_length", Value::u32(uint32_t(s.dim)));
  w.set(a + ".block_count", Value::u32(uint32_t(s.layers)));
  w.set(a + ".feed_forward_length", Value::u32(uint32_t(s.ffn)));
  w.set(a + ".rope.dimension_count", Value::u32(uint32_t(s.dim / s.heads)));
  w.set(a + ".rope.freq_base", Value::f32(s.rope_theta));
  w.set(a + ".attention.head_count", Value::u32(uint32_t(s.heads)));
  w.set(a + ".attention.head_count_kv", Value::u32(uint32_t(s.kv_heads)));
  w.set(a + ".attention.layer_norm_rms_epsilon", Value::f32(s.rms_eps));
  w.set(a + ".vocab_size", Value::u32(uint32_t(vocab)));
}

// The tokenizer's GGUF metadata (every tokenizer.* key) and its number of tokens.
struct SynthVocab {
  int64_t size = 0;
  std::vector<gguf::KeyValue> keys;
};

Result<SynthVocab> load_synth_vocab(const std::string& path) {
  SynthVocab v;
  auto file = gguf::GgufFile::open(path);
  if (file.ok()) {  // a GGUF: its tokenizer keys verbatim
    for (const gguf::KeyValue& kv : file->metadata()) {
      if (kv.key.starts_with("tokenizer.")) v.keys.push_back(kv);
    }
  } else {  // a tokenizer.json (or a directory holding one), exported as llama.cpp lays it out
    ARBOR_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::from_file(path));
    v.keys = tok->to_gguf_metadata();
  }
  for (const gguf::KeyValue& kv : v.keys) {
    if (kv.key == "tokenizer.ggml.tokens" && kv.value.type == gguf::ValueType::kArray) {
      v.size = static_cast<int64_t>(std::get<gguf::Array>(kv.value.data).items.size());
    }
  }
  if (v.size == 0) return invalid_argument(path, " has no tokenizer.ggml.tokens array");
  return v;
}

// Pads the per-token arrays to `vocab_size` entries with unused "[PADn]" tokens, as llama.cpp's
// converter does for Qwen's 151936-row embedding.
std::vector<gguf::KeyValue> pad_vocab(SynthVocab vocab, int64_t vocab_size) {
  for (gguf::KeyValue& kv : vocab.keys) {
    if (kv.value.type != gguf::ValueType::kArray) continue;
    auto& arr = std::get<gguf::Array>(kv.value.data);
    if (static_cast<int64_t>(arr.items.size()) != vocab.size) continue;
    for (int64_t id = vocab.size; id < vocab_size; ++id) {
      if (kv.key == "tokenizer.ggml.tokens") {
        arr.items.push_back(Value::str("[PAD" + std::to_string(id) + "]"));
      } else if (kv.key == "tokenizer.ggml.scores") {
        arr.items.push_back(Value::f32(0.0f));
      } else if (kv.key == "tokenizer.ggml.token_type") {
        arr.items.push_back(Value::i32(5));  // llama_token_type UNUSED
      }
    }
  }
  return std::move(vocab.keys);
}

Result<GgmlType> parse_type(const std::string& name) {
  ARBOR_ASSIGN_OR_RETURN(GgmlType type, gguf::parse_ggml_type(name));
  if (type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kQ4_0 &&
      type != GgmlType::kQ8_0) {
    return invalid_argument("--type ", name, " is not supported; use q4_0, q8_0, f16 or f32");
  }
  return type;
}

// --inflate's target shape: the --shape preset when one was given (its GQA ratio as the
// --kv-ratio), with --dim/--ffn/--layers/--kv-ratio overriding it.
Result<convert::InflateOptions> inflate_options(const Options& o) {
  convert::InflateOptions io;
  if (o.shape_given) {
    for (const Shape& p : presets()) {
      if (p.name != o.shape || p.dim == 0) continue;
      io.dim = p.dim;
      io.ffn = p.ffn;
      io.layers = p.layers;
      io.kv_ratio = p.heads / p.kv_heads;
    }
  }
  const std::pair<int64_t, int64_t*> overrides[] = {
      {o.dim, &io.dim}, {o.ffn, &io.ffn}, {o.layers, &io.layers}, {o.kv_ratio, &io.kv_ratio}};
  for (const auto& [flag, field] : overrides) {
    if (flag > 0) *field = flag;
  }
  if (io.dim <= 0 || io.ffn <= 0 || io.layers <= 0 || io.kv_ratio <= 0) {
    return invalid_argument("--inflate needs --dim, --ffn, --layers and --kv-ratio > 0, or a "
                            "--shape such as tinyllama-1.1b (got ", io.dim, ", ", io.ffn, ", ",
                            io.layers, ", ", io.kv_ratio, ")");
  }
  ARBOR_ASSIGN_OR_RETURN(io.type, parse_type(o.type));
  io.seed = o.seed;
  io.show_progress = true;
  return io;
}

Status run_inflate(const Options& o) {
  ARBOR_ASSIGN_OR_RETURN(convert::InflateOptions io, inflate_options(o));
  kernels::ThreadPool pool(o.threads);
  io.parallel_for = [&pool](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    pool.parallel_for(n, [&fn](int64_t begin, int64_t end, int) { fn(begin, end); });
  };
  ARBOR_ASSIGN_OR_RETURN(gguf::GgufFile src, gguf::GgufFile::open(o.inflate));
  ARBOR_ASSIGN_OR_RETURN(gguf::GgufWriter writer, convert::inflate_model(src, io));
  ARBOR_RETURN_IF_ERROR(writer.write(o.out));
  ARBOR_LOG(kInfo) << "wrote " << o.out;
  return ok_status();
}

Status run(const Options& o) {
  if (!o.inflate.empty()) return run_inflate(o);
  if (o.vocab_path.empty()) {
    return invalid_argument("synth needs --vocab (or --inflate SMALL.gguf)");
  }
  ARBOR_ASSIGN_OR_RETURN(GgmlType type, parse_type(o.type));
  ARBOR_ASSIGN_OR_RETURN(Shape shape, resolve_shape(o, type));
  ARBOR_ASSIGN_OR_RETURN(SynthVocab vocab, load_synth_vocab(o.vocab_path));
  const int64_t vocab_size = shape.vocab > 0 ? shape.vocab : vocab.size;
  if (vocab_size < vocab.size) {
    return invalid_argument("vocabulary size ", vocab_size, " is smaller than the tokenizer's ",
                            vocab.size, " tokens in ", o.vocab_path);
  }
  gguf::GgufWriter writer;
  set_model_metadata(writer, shape, type, o, vocab_size);
  for (gguf::KeyValue& kv : pad_vocab(std::move(vocab), vocab_size)) writer.set(kv.key, std::move(kv.value));
  const std::vector<TensorSpec> tensors = plan_tensors(shape, type, vocab_size);
  uint64_t total = 0;
  for (const TensorSpec& t : tensors) total += *gguf::ggml_nbytes(t.type, t.dims);
  ARBOR_LOG(kInfo) << "synth " << shape.name << " (" << shape.arch << "): dim " << shape.dim
                   << ", ffn " << shape.ffn << ", " << shape.layers << " layers, " << shape.heads
                   << " heads (" << shape.kv_heads << " kv), vocab " << vocab_size << ", "
                   << gguf::ggml_type_name(type) << ", " << tensors.size() << " tensors, "
                   << total / 1000000 << " MB, seed " << o.seed;
  kernels::ThreadPool pool(o.threads);
  ProgressBar bar("generating", total / 1000000, "MB");
  uint64_t done = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    writer.add_tensor_owned(t.name, t.type, t.dims, make_tensor(t, o.seed, i, pool));
    done += *gguf::ggml_nbytes(t.type, t.dims);
    bar.set(done / 1000000);
  }
  bar.finish();
  ARBOR_RETURN_IF_ERROR(writer.write(o.out));
  ARBOR_LOG(kInfo) << "wrote " << o.out;
  return ok_status();
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("synth", "Write a deterministic random-weight model of a real "
                                          "shape with a real tokenizer, or (--inflate) a small "
                                          "trained model padded to a large shape");
  auto o = std::make_shared<Options>();
  CLI::Option* shape =
      sub->add_option("--shape", o->shape,
                      "Model shape (custom: give --dim --ffn --layers --heads; with --inflate: "
                      "its dim, ffn, layers and heads / kv heads as --kv-ratio)")
          ->check(CLI::IsMember({"tinyllama-1.1b", "stories110m", "stories15m", "qwen2.5-0.5b",
                                 "custom"}))
          ->capture_default_str();
  sub->add_option("--type", o->type, "Matrix type: q4_0, q8_0, f16, f32 (norms stay f32)")
      ->capture_default_str();
  CLI::Option* vocab = sub->add_option(
      "--vocab", o->vocab_path, "Tokenizer: a GGUF with tokenizer.* metadata or a tokenizer.json");
  sub->add_option("-o,--output", o->out, "Output GGUF path")->required();
  sub->add_option("--seed", o->seed, "Weight seed (same seed, same bytes)")->capture_default_str();
  sub->add_option("--dim", o->dim, "Override: embedding length");
  sub->add_option("--ffn", o->ffn, "Override: feed-forward length");
  sub->add_option("--layers", o->layers, "Override: number of layers");
  const std::vector<CLI::Option*> synth_only = {
      vocab,
      sub->add_option("--heads", o->heads, "Override: attention heads"),
      sub->add_option("--kv-heads", o->kv_heads, "Override: key/value heads (default: --heads)"),
      sub->add_option("--vocab-size", o->vocab_size,
                      "Override: embedding rows, >= the tokenizer's size (padded with [PADn])"),
      sub->add_option("--context", o->context, "Override: context length"),
      sub->add_option("--arch", o->arch, "Override: llama or qwen2 (q/k/v biases, NeoX RoPE)"),
      sub->add_flag("--qkv-bias", o->qkv_bias, "Add q/k/v biases (always on for qwen2)"),
      sub->add_flag("--tied", o->tied, "No output.weight: the classifier is token_embd")};
  sub->add_option("--threads", o->threads, "Generator threads (0: all cores)")
      ->capture_default_str();
  CLI::Option* inflate = sub->add_option(
      "--inflate", o->inflate,
      "Inflate this F32 llama GGUF to --dim/--ffn/--layers/--kv-ratio (or --shape) with the "
      "same logits (docs/inflate.md)");
  for (CLI::Option* opt : synth_only) inflate->excludes(opt);
  sub->add_option("--kv-ratio", o->kv_ratio,
                  "Inflate: query heads per kv head in the result (a multiple of the model's)")
      ->needs(inflate);
  sub->callback([o, shape] {
    o->shape_given = shape->count() > 0;
    exit_on_error(run(*o));
  });
}
ARBOR_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
