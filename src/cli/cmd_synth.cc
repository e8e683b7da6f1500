// arbor synth: writes a deterministic random-weight model of a real shape with a real tokenizer,
// for benchmarks and tests that need the cost of a large model without its weights.
//
// Shapes, tensors and weights come from model/synth_model.h: a real shape for every architecture
// of the table (`--arch gemma3` writes Gemma-3-1B's shape), llama.cpp's tensor names and keys,
// fan-in uniform weights whose bytes depend only on the options, not on the thread count.
// Matrices take --type; norms, biases and MoE routers stay F32 (as llama.cpp writes them).
// Tensors are generated and quantised one at a time, rows in parallel, as the file is written:
// at most one tensor is in memory.
//
// --inflate SMALL.gguf instead writes a trained model's exact next-token function at the cost of
// a larger shape (convert/inflate.h, docs/inflate.md); this file only parses its flags.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "cli/command.h"
#include "convert/inflate.h"
#include "gguf/gguf.h"
#include "gguf/quants.h"
#include "kernels/thread_pool.h"
#include "model/arch.h"
#include "model/synth_model.h"
#include "tokenizer/tokenizer.h"

namespace arbor::cli {
namespace cmd_synth {  // named, not anonymous: the commands share unity sources

using gguf::GgmlType;
using gguf::Value;

struct Options {
  std::string shape = "stories15m";
  std::string type = "q4_0";
  std::string vocab_path;
  std::string out;
  uint64_t seed = 0;
  int64_t dim = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, vocab_size = 0, context = 0;
  int64_t head_dim = 0, window = 0;
  int64_t experts = 0, experts_used = 0, expert_ffn = 0;
  std::string arch;
  bool qkv_bias = false;
  bool tied = false;
  bool untied = false;
  int64_t nextn = -1;         // --nextn (-1: the shape's)
  float residual_damp = 1.0f;  // --residual-damp
  bool mtp_echo = false;       // --mtp-echo
  std::string pooling_type;  // --pooling-type: none, mean, cls, last, rank ("" = not written)
  int64_t rank_classes = 0;  // --rank-classes
  int threads = 0;
  std::string inflate;   // --inflate: the source model
  int64_t kv_ratio = 0;  // --kv-ratio (inflate only)
  bool shape_given = false;
};

// The --shape preset (or, with --arch alone, the architecture's real shape) with the command
// line's overrides, checked against the architecture table.
Result<model::SynthShape> resolve_shape(const Options& o, GgmlType type) {
  const bool by_arch = !o.shape_given && !o.arch.empty();
  const model::SynthShape* p =
      by_arch ? model::default_preset_for_arch(o.arch) : model::find_synth_preset(o.shape);
  if (p == nullptr) {
    if (by_arch) {
      return invalid_argument("--arch is ", o.arch, ", must be one of ",
                              model::supported_arch_names());
    }
    return invalid_argument("unknown --shape ", o.shape);
  }
  model::SynthShape s = o.arch.empty() ? *p : model::with_arch(*p, o.arch);
  const std::pair<int64_t, int64_t*> overrides[] = {
      {o.dim, &s.dim}, {o.ffn, &s.ffn}, {o.layers, &s.layers}, {o.heads, &s.heads},
      {o.kv_heads, &s.kv_heads}, {o.context, &s.context}, {o.vocab_size, &s.vocab},
      {o.head_dim, &s.head_dim}, {o.window, &s.window}, {o.experts, &s.experts},
      {o.experts_used, &s.experts_used}, {o.expert_ffn, &s.expert_ffn}};
  for (const auto& [flag, field] : overrides) {
    if (flag > 0) *field = flag;
  }
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  s.tied = (s.tied || o.tied) && !o.untied;
  if (o.nextn >= 0) s.nextn = o.nextn;
  s.residual_damp = o.residual_damp;
  s.mtp_echo = o.mtp_echo;
  s.qkv_bias = s.qkv_bias || o.qkv_bias || s.arch == "qwen2";
  if (!o.pooling_type.empty()) {
    const std::vector<std::string> names = {"none", "mean", "cls", "last", "rank"};
    s.pooling_type = std::find(names.begin(), names.end(), o.pooling_type) - names.begin();
  }
  s.rank_classes = o.rank_classes;
  ARBOR_RETURN_IF_ERROR(model::validate_synth_shape(s, type));
  return s;
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
      type != GgmlType::kQ8_0 && type != GgmlType::kMXFP4 && type != GgmlType::kIQ4_NL &&
      type != GgmlType::kIQ4_XS) {
    return invalid_argument("--type ", name,
                            " is not supported; use q4_0, q8_0, mxfp4, iq4_nl, iq4_xs, f16 or f32");
  }
  return type;
}

// --inflate's target shape: the --shape preset when one was given (its GQA ratio as the
// --kv-ratio; a mixture's experts, experts used and expert FFN length), with --dim/--ffn/
// --layers/--kv-ratio/--experts/--experts-used overriding it.
Result<convert::InflateOptions> inflate_options(const Options& o) {
  convert::InflateOptions io;
  if (o.shape_given) {
    const model::SynthShape* p = model::find_synth_preset(o.shape);
    if (p != nullptr && p->dim > 0) {
      io.dim = p->dim;
      io.ffn = p->ffn;
      io.layers = p->layers;
      io.kv_ratio = p->heads / p->kv_heads;
      if (p->experts > 0) {  // a mixture: each expert as long as the preset's
        io.experts = p->experts;
        io.experts_used = p->experts_used;
        io.ffn = p->expert_ffn > 0 ? p->expert_ffn : p->ffn;
      }
    }
  }
  const std::pair<int64_t, int64_t*> overrides[] = {
      {o.dim, &io.dim},           {o.ffn, &io.ffn},
      {o.layers, &io.layers},     {o.kv_ratio, &io.kv_ratio},
      {o.experts, &io.experts},   {o.experts_used, &io.experts_used}};
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
  ARBOR_ASSIGN_OR_RETURN(model::SynthShape shape, resolve_shape(o, type));
  ARBOR_ASSIGN_OR_RETURN(SynthVocab vocab, load_synth_vocab(o.vocab_path));
  const int64_t vocab_size = shape.vocab > 0 ? shape.vocab : vocab.size;
  if (vocab_size < vocab.size) {
    return invalid_argument("vocabulary size ", vocab_size, " is smaller than the tokenizer's ",
                            vocab.size, " tokens in ", o.vocab_path);
  }
  gguf::GgufWriter writer;
  model::set_synth_metadata(writer, shape, type, o.seed, vocab_size);
  for (gguf::KeyValue& kv : pad_vocab(std::move(vocab), vocab_size)) {
    writer.set(kv.key, std::move(kv.value));
  }
  const std::vector<model::SynthTensor> tensors = model::plan_synth_tensors(shape, type, vocab_size);
  uint64_t total = 0;
  for (const model::SynthTensor& t : tensors) total += *gguf::ggml_nbytes(t.type, t.dims);
  ARBOR_LOG(kInfo) << "synth " << shape.name << " (" << shape.arch << "): dim " << shape.dim
                   << ", ffn " << shape.ffn << ", " << shape.layers << " layers, " << shape.heads
                   << " heads (" << shape.kv_heads << " kv), vocab " << vocab_size << ", "
                   << gguf::ggml_type_name(type) << ", " << tensors.size() << " tensors, "
                   << total / 1000000 << " MB, seed " << o.seed;
  kernels::ThreadPool pool(o.threads);
  // Generated while the file is written, one tensor at a time: a model larger than memory
  // (Qwen3-30B-A3B's shape) never is in memory whole.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const model::SynthTensor& t = tensors[i];
    writer.add_tensor_generated(t.name, t.type, t.dims, [&t, &o, &pool, i] {
      return model::make_synth_tensor(t, o.seed, i, pool);
    });
  }
  ARBOR_RETURN_IF_ERROR(writer.write(o.out));
  ARBOR_LOG(kInfo) << "wrote " << o.out;
  return ok_status();
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const model::SynthShape& s : model::synth_presets()) names.push_back(s.name);
  return names;
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
          ->check(CLI::IsMember(preset_names()))
          ->capture_default_str();
  sub->add_option("--type", o->type, "Matrix type: q4_0, q8_0, mxfp4, iq4_nl, iq4_xs, f16, f32 (norms stay f32)")
      ->capture_default_str();
  CLI::Option* vocab = sub->add_option(
      "--vocab", o->vocab_path, "Tokenizer: a GGUF with tokenizer.* metadata or a tokenizer.json");
  sub->add_option("-o,--output", o->out, "Output GGUF path")->required();
  sub->add_option("--seed", o->seed, "Weight seed (same seed, same bytes)")->capture_default_str();
  sub->add_option("--dim", o->dim, "Override: embedding length");
  sub->add_option("--ffn", o->ffn, "Override: feed-forward length");
  sub->add_option("--layers", o->layers, "Override: number of layers");
  sub->add_option("--experts", o->experts,
                  "Override: experts per layer (qwen3moe; llama and --inflate: a Mixtral-style "
                  "mixture)");
  sub->add_option("--experts-used", o->experts_used, "Override: experts routed per token");
  const std::vector<CLI::Option*> synth_only = {
      vocab,
      sub->add_option("--heads", o->heads, "Override: attention heads"),
      sub->add_option("--kv-heads", o->kv_heads, "Override: key/value heads (default: --heads)"),
      sub->add_option("--vocab-size", o->vocab_size,
                      "Override: embedding rows, >= the tokenizer's size (padded with [PADn])"),
      sub->add_option("--context", o->context, "Override: context length"),
      sub->add_option("--arch", o->arch,
                      "Architecture (" + model::supported_arch_names() +
                          "): alone, its real shape (qwen3: qwen3-0.6b, gemma3: gemma3-1b, ...); "
                          "with --shape, that shape's dims with this architecture's variants"),
      sub->add_option("--head-dim", o->head_dim, "Override: head size (default dim / heads)"),
      sub->add_option("--window", o->window, "Override: sliding window of the sliding layers"),
      sub->add_option("--expert-ffn", o->expert_ffn,
                      "Override: each expert's feed-forward length (qwen3moe; llama: --ffn)"),
      sub->add_flag("--qkv-bias", o->qkv_bias, "Add q/k/v biases (always on for qwen2)"),
      sub->add_flag("--tied", o->tied, "No output.weight: the classifier is token_embd"),
      sub->add_flag("--untied", o->untied, "Write output.weight even where the shape ties it"),
      sub->add_option("--nextn", o->nextn,
                      "Multi-token-prediction blocks after the trunk (qwen35 / qwen35moe; "
                      "default: the shape's, 1 for the Qwen3.5 shapes)")
          ->check(CLI::Range(0, 1))
          ->default_str("the shape's"),
      sub->add_option("--residual-damp", o->residual_damp,
                      "Scale the stddev of every matrix writing into the trunk's residual "
                      "stream (a constructed file whose next token depends mostly on the "
                      "current one; for speculation runs)")
          ->check(CLI::Range(1e-6, 1.0))
          ->capture_default_str(),
      sub->add_flag("--mtp-echo", o->mtp_echo,
                    "Make the MTP block compute the damped trunk's function of the current "
                    "token (eh_proj = [I | 0], its outputs zero): MTP drafts that agree with the "
                    "target; needs --untied (docs/qwen35.md)"),
      sub->add_option("--pooling-type", o->pooling_type,
                      "Write <arch>.pooling_type (an embedding or rerank file, as llama.cpp's "
                      "converter writes Qwen3-Embedding: last, Qwen3-Reranker: rank)")
          ->check(CLI::IsMember({"none", "mean", "cls", "last", "rank"})),
      sub->add_option("--rank-classes", o->rank_classes,
                      "Add a rank head cls.output.weight of this many classes with "
                      "classifier.output_labels (2: \"yes\", \"no\", a Qwen3-Reranker's; qwen3 only)")
          ->check(CLI::Range(0, 64))};
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
