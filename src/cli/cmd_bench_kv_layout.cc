// arbor bench kv-layout: the KV bytes one long request holds with KV cache groups (sliding-window
// layers release the blocks that left every query's window) against a full-attention layout,
// measured by running the request through the engine's own bookkeeping: model::
// plan_kv_cache_layout groups the layers, kv::KvCacheManager allocates the request's prompt in
// prefill chunks and releases as the scheduler would, and the blocks it holds are counted.
//
//   arbor bench kv-layout                      Gemma 3 1B and 4B shapes at 32k context
//   arbor bench kv-layout --shape gemma3-1b --context 8192 --block-size 1 --json
//   arbor bench kv-layout -m model.gguf       the file's own layers and windows
//
// Per shape: the groups and pools, the blocks the request holds once its `context` tokens are
// computed and the peak during its prefill, KV bytes and bytes per token, and the ratio to the
// bytes a layout that keeps every layer's every block would hold (layers x 2 x kv heads x
// head_dim x dtype bytes per token, rounded up to whole blocks).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_command.h"
#include "cli/command.h"
#include "gguf/gguf.h"
#include "kv/kv_cache_manager.h"
#include "model/kv_cache.h"
#include "model/model_config.h"

namespace arbor::cli {
namespace cmd_bench_kv_layout {  // named, not anonymous: the commands share unity sources

// A model's attention shape: `layers` layers of which every `pattern`-th (layer % pattern ==
// pattern - 1) is full attention and the others slide over `window` tokens (Gemma 3's rule,
// llama.cpp's n_swa_pattern); pattern 1: every layer full.
struct Shape {
  std::string name;
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int32_t window = 0;
  int pattern = 1;
  std::vector<int32_t> layer_windows{};  // a file's own windows; empty: from window and pattern
};

const std::map<std::string, Shape>& shapes() {
  static const std::map<std::string, Shape> kShapes{
      {"gemma3-1b", {"gemma3-1b", 26, 1, 256, 512, 6}},
      {"gemma3-4b", {"gemma3-4b", 34, 4, 256, 1024, 6}},
      {"gemma3-12b", {"gemma3-12b", 48, 8, 256, 1024, 6}},
      {"gemma3-27b", {"gemma3-27b", 62, 16, 128, 1024, 6}},
  };
  return kShapes;
}

struct Options {
  std::string model;  // a GGUF instead of the shapes
  std::vector<std::string> shapes = {"gemma3-1b", "gemma3-4b"};
  int64_t context = 32768;
  int32_t block_size = 16;
  int64_t chunk = 2048;
  std::string kv_dtype = "f16";
  bool json = false;
};

struct Measured {
  Shape shape;
  model::KvCacheLayout layout;
  std::vector<int32_t> group_blocks;  // [groups] held once the context is computed
  int64_t blocks = 0;                 // their sum
  int64_t peak_blocks = 0;            // most held right after a step's allocation
  int64_t bytes_per_block = 0;        // every pool, K and V
  int64_t bytes = 0;                  // blocks * bytes_per_block
  int64_t full_bytes = 0;             // the same context with every layer keeping every block
};

std::vector<int32_t> layer_windows(const Shape& s) {
  if (!s.layer_windows.empty()) return s.layer_windows;
  std::vector<int32_t> w(static_cast<size_t>(s.layers));
  for (int l = 0; l < s.layers; ++l) w[static_cast<size_t>(l)] = l % s.pattern == s.pattern - 1 ? 0 : s.window;
  return w;
}

Result<Measured> measure(const Shape& shape, const Options& o) {
  Measured m{.shape = shape};
  ARBOR_ASSIGN_OR_RETURN(m.layout, model::plan_kv_cache_layout(layer_windows(shape), true));
  model::KvCacheShape ks{.num_layers = shape.layers,
                         .num_kv_heads = shape.kv_heads,
                         .head_dim = shape.head_dim,
                         .block_size = o.block_size,
                         .dtype = o.kv_dtype == "f32" ? kernels::KvDtype::kF32 : kernels::KvDtype::kF16};
  const model::KvCacheShape full = ks;
  model::apply_kv_cache_layout(m.layout, ks);
  m.bytes_per_block = static_cast<int64_t>(model::PagedKvCache::bytes_per_block(ks));
  const int64_t context_blocks = (o.context + o.block_size - 1) / o.block_size;
  m.full_bytes = context_blocks * static_cast<int64_t>(model::PagedKvCache::bytes_per_block(full));
  // A pool that never runs short: every group could hold the whole context.
  const int64_t pool = context_blocks * m.layout.num_groups() + 2;
  if (pool > INT32_MAX) return invalid_argument("--context ", o.context, " needs too many blocks");
  kv::KvCacheManager kv(kv::KvCacheManagerOptions{.num_blocks = static_cast<int32_t>(pool),
                                                  .block_size = o.block_size,
                                                  .enable_prefix_caching = false,
                                                  .group_windows = m.layout.windows()});
  std::vector<int32_t> tokens(static_cast<size_t>(o.context));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 1000);
  int64_t computed = 0;
  while (computed < o.context) {
    const int64_t n = std::min(o.chunk, o.context - computed);
    const kv::KvRequest view{1, tokens, computed, "", 0};
    if (!kv.allocate_slots(view, n)) return internal_error("the measuring pool ran short");
    m.peak_blocks = std::max<int64_t>(m.peak_blocks, kv.block_pool().num_used_blocks());
    computed += n;  // the step ran: the scheduler then caches and releases
    kv.cache_full_blocks(kv::KvRequest{1, tokens, computed, "", 0});
  }
  m.group_blocks = kv.stats().group_used_blocks;
  for (int32_t b : m.group_blocks) m.blocks += b;
  m.bytes = m.blocks * m.bytes_per_block;
  kv.check_invariants();
  return m;
}

std::string windows_text(const model::KvCacheLayout& layout) {
  std::map<int32_t, size_t> layers;
  for (const model::KvCacheGroup& g : layout.groups) layers[g.window] += g.layers.size();
  std::string s;
  for (const auto& [w, n] : layers) {
    s += str_cat(s.empty() ? "" : " + ", n, w == 0 ? std::string(" full") : str_cat(" x ", w));
  }
  return s;
}

void print(const Options& o, const std::vector<Measured>& ms) {
  if (o.json) {
    nlohmann::json j = {{"context", o.context}, {"block_size", o.block_size},
                        {"chunk", o.chunk},     {"kv_dtype", o.kv_dtype},
                        {"shapes", nlohmann::json::array()}};
    for (const Measured& m : ms) {
      j["shapes"].push_back({{"name", m.shape.name},
                             {"layers", m.shape.layers},
                             {"kv_heads", m.shape.kv_heads},
                             {"head_dim", m.shape.head_dim},
                             {"window", m.shape.window},
                             {"groups", m.layout.num_groups()},
                             {"pools", m.layout.num_pools},
                             {"group_blocks", m.group_blocks},
                             {"blocks", m.blocks},
                             {"peak_blocks", m.peak_blocks},
                             {"bytes_per_block", m.bytes_per_block},
                             {"kv_bytes", m.bytes},
                             {"kv_bytes_per_token", static_cast<double>(m.bytes) / o.context},
                             {"peak_kv_bytes", m.peak_blocks * m.bytes_per_block},
                             {"full_attention_bytes", m.full_bytes},
                             {"full_attention_bytes_per_token",
                              static_cast<double>(m.full_bytes) / o.context},
                             {"ratio", static_cast<double>(m.bytes) / m.full_bytes}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("KV held by one request of %lld tokens (blocks of %d, %s, prefill chunks of %lld)\n\n",
              static_cast<long long>(o.context), o.block_size, o.kv_dtype.c_str(),
              static_cast<long long>(o.chunk));
  std::printf("%-11s %-22s %6s %5s %7s %10s %13s %10s %13s %10s %6s\n", "shape", "layers",
              "groups", "pools", "blocks", "peak", "KV MiB", "B/token", "full MiB", "B/token",
              "ratio");
  for (const Measured& m : ms) {
    std::printf("%-11s %-22s %6d %5d %7lld %10lld %13.1f %10.0f %13.1f %10.0f %6.3f\n",
                m.shape.name.c_str(), windows_text(m.layout).c_str(), m.layout.num_groups(),
                m.layout.num_pools, static_cast<long long>(m.blocks),
                static_cast<long long>(m.peak_blocks), m.bytes / 1048576.0,
                static_cast<double>(m.bytes) / o.context, m.full_bytes / 1048576.0,
                static_cast<double>(m.full_bytes) / o.context,
                static_cast<double>(m.bytes) / m.full_bytes);
  }
}

Status run(const Options& o) {
  if (o.context < 1 || o.chunk < 1) {
    return invalid_argument("--context is ", o.context, " and --chunk ", o.chunk,
                            "; both must be >= 1");
  }
  if (o.kv_dtype != "f16" && o.kv_dtype != "f32") {
    return invalid_argument("--kv-dtype is '", o.kv_dtype, "', not f16 or f32");
  }
  std::vector<Measured> ms;
  if (!o.model.empty()) {
    ARBOR_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::open(o.model));
    ARBOR_ASSIGN_OR_RETURN(model::ModelConfig c, model::ModelConfig::from_gguf(file));
    Shape s{.name = c.arch_name, .layers = c.num_layers, .kv_heads = c.num_kv_heads,
            .head_dim = c.head_dim};
    for (int l = 0; l < c.num_layers; ++l) {
      s.layer_windows.push_back(c.layer_window(l));
      s.window = std::max<int32_t>(s.window, c.layer_window(l));
    }
    ARBOR_ASSIGN_OR_RETURN(Measured m, measure(s, o));
    ms.push_back(std::move(m));
    print(o, ms);
    return ok_status();
  }
  for (const std::string& name : o.shapes) {
    auto it = shapes().find(name);
    if (it == shapes().end()) {
      std::string known;
      for (const auto& [n, s] : shapes()) known += str_cat(known.empty() ? "" : ", ", n);
      return invalid_argument("unknown shape '", name, "' (known: ", known, ")");
    }
    ARBOR_ASSIGN_OR_RETURN(Measured m, measure(it->second, o));
    ms.push_back(std::move(m));
  }
  print(o, ms);
  return ok_status();
}

void setup(CLI::App& bench) {
  auto* sub = bench.add_subcommand(
      "kv-layout",
      "KV bytes one long request holds with sliding-window blocks released, against keeping "
      "every block (KV cache groups, docs/kv_layout.md)");
  auto o = std::make_shared<Options>();
  sub->add_option("-m,--model", o->model, "A GGUF: measure its own layers and windows");
  sub->add_option("--shape", o->shapes,
                  "Model shapes: gemma3-1b (26 layers, 1 KV head, head_dim 256, window 512, "
                  "every 6th layer full), gemma3-4b (34, 4, 256, 1024, 6), gemma3-12b, gemma3-27b")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--context", o->context, "Tokens the request holds")->capture_default_str();
  sub->add_option("--block-size", o->block_size, "Tokens per KV block")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--chunk", o->chunk, "Prefill chunk (tokens per step)")->capture_default_str();
  sub->add_option("--kv-dtype", o->kv_dtype, "f16 or f32")->capture_default_str();
  sub->add_flag("--json", o->json, "Print JSON instead of the table");
  sub->callback([o] { exit_on_error(run(*o)); });
}
ARBOR_REGISTER_BENCH_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
