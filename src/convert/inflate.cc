#include "convert/inflate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "base/bits.h"
#include "base/log.h"
#include "gguf/quantize_model.h"
#include "gguf/quants.h"

namespace arbor::convert {

using gguf::GgmlType;
using gguf::GgufFile;
using gguf::Value;

namespace {

constexpr const char* kLayerTensors[] = {"attn_norm", "attn_q",   "attn_k",    "attn_v",
                                         "attn_output", "ffn_norm", "ffn_gate", "ffn_down",
                                         "ffn_up"};

std::string layer_name(int64_t l, const char* tensor) {
  return str_cat("blk.", l, ".", tensor, ".weight");
}

// The source tensor an inflated one grows from: an expert tensor's is the dense FFN's.
std::string source_name(const std::string& name) {
  for (const char* t : {"ffn_gate", "ffn_down", "ffn_up"}) {
    const std::string exps = str_cat(".", t, "_exps.");
    if (const size_t at = name.find(exps); at != std::string::npos) {
      return name.substr(0, at) + "." + t + "." + name.substr(at + exps.size());
    }
  }
  return name;
}

bool is_power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += str_cat(i ? ", " : "", dims[i]);
  return s + "]";
}

Result<InflateGeometry> read_source_shape(const GgufFile& src) {
  ARBOR_ASSIGN_OR_RETURN(std::string arch, src.get_string("general.architecture"));
  if (arch != "llama") {
    return invalid_argument(src.name(), " is a ", arch, " model; --inflate handles llama");
  }
  InflateGeometry g;
  ARBOR_ASSIGN_OR_RETURN(g.dim, src.get_i64("llama.embedding_length"));
  ARBOR_ASSIGN_OR_RETURN(g.ffn, src.get_i64("llama.feed_forward_length"));
  ARBOR_ASSIGN_OR_RETURN(g.layers, src.get_i64("llama.block_count"));
  ARBOR_ASSIGN_OR_RETURN(g.heads, src.get_i64("llama.attention.head_count"));
  g.kv_heads = g.heads;
  if (src.find("llama.attention.head_count_kv") != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(g.kv_heads, src.get_i64("llama.attention.head_count_kv"));
  }
  ARBOR_ASSIGN_OR_RETURN(g.rms_eps, src.get_f32("llama.attention.layer_norm_rms_epsilon"));
  if (g.dim <= 0 || g.heads <= 0 || g.kv_heads <= 0 || g.dim % g.heads != 0 ||
      g.heads % g.kv_heads != 0) {
    return invalid_argument(src.name(), ": embedding length ", g.dim, ", ", g.heads, " heads and ",
                            g.kv_heads, " kv heads do not divide evenly");
  }
  g.head_dim = g.dim / g.heads;
  const gguf::TensorInfo* embd = src.find_tensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2) {
    return invalid_argument(src.name(), " has no 2-D token_embd.weight");
  }
  g.vocab = embd->dims[1];
  g.tied = src.find_tensor("output.weight") == nullptr;
  return g;
}

Status check_options(const InflateGeometry& g, const InflateOptions& o) {
  if (o.dim <= 0 || o.ffn <= 0 || o.layers <= 0 || o.kv_ratio <= 0) {
    return invalid_argument("--dim, --ffn, --layers and --kv-ratio must be > 0 (got ", o.dim, ", ",
                            o.ffn, ", ", o.layers, ", ", o.kv_ratio, ")");
  }
  if (o.dim % g.dim != 0 || !is_power_of_two(o.dim / g.dim)) {
    return invalid_argument("--dim ", o.dim, " must be the model's embedding length ", g.dim,
                            " times a power of two (", g.dim, ", ", 2 * g.dim, ", ", 4 * g.dim,
                            ", ...)");
  }
  if (o.ffn < g.ffn) {
    return invalid_argument("--ffn ", o.ffn, " is less than the model's feed_forward_length ",
                            g.ffn);
  }
  if (o.layers < g.layers) {
    return invalid_argument("--layers ", o.layers, " is fewer than the model's ", g.layers,
                            " layers");
  }
  const int64_t heads = o.dim / g.head_dim;
  if (o.kv_ratio % g.kv_ratio() != 0) {
    return invalid_argument("--kv-ratio ", o.kv_ratio, " must be a multiple of the model's ",
                            g.kv_ratio(), " query heads per kv head");
  }
  if (heads % o.kv_ratio != 0 || heads / o.kv_ratio < g.kv_heads) {
    return invalid_argument("--kv-ratio ", o.kv_ratio, " must divide the inflated model's ", heads,
                            " heads (--dim ", o.dim, " / head_dim ", g.head_dim,
                            ") and leave at least the model's ", g.kv_heads,
                            " kv heads; at most ", heads / g.kv_heads);
  }
  if (o.experts < 0 || (o.experts == 0 && o.experts_used != 0) ||
      (o.experts > 0 && (o.experts_used < 1 || o.experts_used > o.experts))) {
    return invalid_argument("--experts ", o.experts, " and --experts-used ", o.experts_used,
                            ": a mixture needs 1 <= experts used <= experts (0 and 0: dense)");
  }
  if (o.type != GgmlType::kF32 && o.type != GgmlType::kF16 && o.type != GgmlType::kQ8_0 &&
      o.type != GgmlType::kQ4_0) {
    return invalid_argument("--type ", gguf::ggml_type_name(o.type),
                            " is not supported; use f32, f16, q8_0 or q4_0");
  }
  const int64_t block = gguf::ggml_traits(o.type).block_size;
  if (o.dim % block != 0 || o.ffn % block != 0) {
    return invalid_argument("--dim ", o.dim, " and --ffn ", o.ffn, " must be multiples of ", block,
                            " for type ", gguf::ggml_type_name(o.type));
  }
  return ok_status();
}

// Every source tensor: F32, the shape the metadata implies, nothing else.
Status check_source_tensors(const GgufFile& src, const InflateGeometry& g) {
  const int64_t q_dim = g.heads * g.head_dim, kv_dim = g.kv_heads * g.head_dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"token_embd.weight", {g.dim, g.vocab}}, {"output_norm.weight", {g.dim}}};
  if (!g.tied) want.push_back({"output.weight", {g.dim, g.vocab}});
  for (int64_t l = 0; l < g.layers; ++l) {
    const std::vector<int64_t> shapes[] = {{g.dim},        {g.dim, q_dim}, {g.dim, kv_dim},
                                           {g.dim, kv_dim}, {q_dim, g.dim}, {g.dim},
                                           {g.dim, g.ffn}, {g.ffn, g.dim}, {g.dim, g.ffn}};
    for (size_t i = 0; i < std::size(kLayerTensors); ++i) {
      want.push_back({layer_name(l, kLayerTensors[i]), shapes[i]});
    }
  }
  std::set<std::string> known;
  for (const auto& [name, dims] : want) {
    const gguf::TensorInfo* t = src.find_tensor(name);
    if (t == nullptr) return invalid_argument(src.name(), " has no tensor ", name);
    if (t->type != GgmlType::kF32) {
      return invalid_argument(src.name(), ": ", name, " is ", gguf::ggml_type_name(t->type),
                              "; --inflate needs an all-F32 model");
    }
    if (t->dims != dims) {
      return invalid_argument(src.name(), ": ", name, " has shape ", dims_string(t->dims),
                              ", expected ", dims_string(dims));
    }
    known.insert(name);
  }
  for (const gguf::TensorInfo& t : src.tensors()) {
    if (!known.contains(t.name)) {
      return invalid_argument(src.name(), ": tensor ", t.name,
                              " is not part of a plain llama model; --inflate cannot place it");
    }
  }
  return ok_status();
}

// ---- rows ------------------------------------------------------------------------------------

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// out[0, live): uniform in [-a, a] with a = stddev * sqrt(3), from a splitmix64 stream keyed by
// (seed, tensor, row); out[live, n): 0.
void random_row(float* out, int64_t n, int64_t live, float stddev, uint64_t key) {
  const float scale = stddev * std::sqrt(3.0f) * 0x1.0p-23f;  // 24-bit ints in [-2^23, 2^23)
  uint64_t state = key;
  for (int64_t i = 0; i < live; i += 2) {
    state += 0x9e3779b97f4a7c15ULL;
    const uint64_t bits = mix64(state);
    out[i] = (static_cast<float>(bits >> 40) - 0x1.0p23f) * scale;
    if (i + 1 < live) out[i + 1] = (static_cast<float>((bits >> 8) & 0xffffff) - 0x1.0p23f) * scale;
  }
  std::fill(out + live, out + n, 0.0f);
}

// out[0, m) = src[0, m); out[m, n) = 0.
void padded_row(float* out, int64_t n, const float* src, int64_t m) {
  std::memcpy(out, src, static_cast<size_t>(m) * sizeof(float));
  std::fill(out + m, out + n, 0.0f);
}

// One output tensor: fill(r, out) writes row r (of dims[1] x dims[2] ... rows), out: [dims[0]]
// floats.
struct TensorJob {
  std::string name;
  std::vector<int64_t> dims;  // ggml order
  GgmlType type;
  std::function<void(int64_t row, float* out)> fill;
};

const float* f32_data(const GgufFile& src, const std::string& name) {
  return reinterpret_cast<const float*>(src.find_tensor(name)->data);
}

// What one layer's jobs read: its source tensors (real layers only) and the shared geometry.
struct LayerContext {
  const GgufFile& src;
  const InflateGeometry& g;
  const InflateOptions& o;
  std::vector<int64_t> source_head;  // [new_heads]: the source q head at each new head, or -1
  float norm_scale;                  // sqrt(d / D)
};

TensorJob norm_job(const LayerContext& c, std::string name, bool real) {
  const float* w = real ? f32_data(c.src, name) : nullptr;
  const int64_t d = c.g.dim;
  const float sc = c.norm_scale;
  auto fill = [w, d, sc, n = c.g.new_dim](int64_t, float* out) {
    std::fill(out, out + n, sc);
    for (int64_t i = 0; w != nullptr && i < d; ++i) out[i] = w[i] * sc;
  };
  return {std::move(name), {c.g.new_dim}, GgmlType::kF32, fill};
}

// Rows [0, live_rows) copy the source's rows (padded with zeros); the others are random over
// `random_cols` columns (the rest zero). live_rows = 0: every row random. experts > 0: a 3-D
// tensor of that many such matrices (every expert the same source rows, its own random rows).
TensorJob grow_rows_job(const LayerContext& c, std::string name, int64_t rows, int64_t live_rows,
                        int64_t random_cols, int64_t experts = 0) {
  const float* w = live_rows > 0 ? f32_data(c.src, source_name(name)) : nullptr;
  const uint64_t key = mix64(c.o.seed) ^ fnv1a(name);
  auto fill = [=, d = c.g.dim, n = c.g.new_dim, stddev = c.o.random_std](int64_t r, float* out) {
    if (r % rows < live_rows) return padded_row(out, n, w + (r % rows) * d, d);
    random_row(out, n, random_cols, stddev, mix64(key + static_cast<uint64_t>(r)));
  };
  std::vector<int64_t> dims = {c.g.new_dim, rows};
  if (experts > 0) dims.push_back(experts);
  return {std::move(name), std::move(dims), c.o.type, fill};
}

// attn_q: the source head h's rows at new head new_q_head(h); new heads random over the live
// columns.
TensorJob q_job(const LayerContext& c, std::string name, bool real) {
  const float* w = real ? f32_data(c.src, name) : nullptr;
  const uint64_t key = mix64(c.o.seed) ^ fnv1a(name);
  const InflateGeometry& g = c.g;
  auto fill = [=, &g, heads = &c.source_head, stddev = c.o.random_std](int64_t r, float* out) {
    const int64_t h = real ? (*heads)[r / g.head_dim] : -1;
    if (h >= 0) return padded_row(out, g.new_dim, w + (h * g.head_dim + r % g.head_dim) * g.dim,
                                  g.dim);
    random_row(out, g.new_dim, g.dim, stddev, mix64(key + static_cast<uint64_t>(r)));
  };
  return {std::move(name), {g.new_dim, g.new_heads * g.head_dim}, c.o.type, fill};
}

// attn_output: rows [0, d) hold the source head h's columns at new head new_q_head(h); all else 0.
TensorJob o_job(const LayerContext& c, std::string name, bool real) {
  const float* w = real ? f32_data(c.src, name) : nullptr;
  const InflateGeometry& g = c.g;
  auto fill = [=, &g, heads = &c.source_head](int64_t r, float* out) {
    const int64_t n = g.new_heads * g.head_dim;
    std::fill(out, out + n, 0.0f);
    if (!real || r >= g.dim) return;
    for (int64_t nh = 0; nh < g.new_heads; ++nh) {
      const int64_t h = (*heads)[nh];
      if (h < 0) continue;
      std::memcpy(out + nh * g.head_dim, w + r * g.dim + h * g.head_dim,
                  static_cast<size_t>(g.head_dim) * sizeof(float));
    }
  };
  return {std::move(name), {g.new_heads * g.head_dim, g.new_dim}, c.o.type, fill};
}

// ffn_down: rows [0, d) hold the source's rows padded with zeros; all else 0. experts > 0: a
// 3-D tensor of that many copies.
TensorJob down_job(const LayerContext& c, std::string name, bool real, int64_t experts = 0) {
  const float* w = real ? f32_data(c.src, source_name(name)) : nullptr;
  auto fill = [=, f = c.g.ffn, d = c.g.dim, D = c.g.new_dim, n = c.g.new_ffn](int64_t r,
                                                                                float* out) {
    if (real && r % D < d) return padded_row(out, n, w + (r % D) * f, f);
    std::fill(out, out + n, 0.0f);
  };
  std::vector<int64_t> dims = {c.g.new_ffn, c.g.new_dim};
  if (experts > 0) dims.push_back(experts);
  return {std::move(name), std::move(dims), c.o.type, fill};
}

void add_layer_jobs(const LayerContext& c, int64_t l, std::vector<TensorJob>* jobs) {
  const InflateGeometry& g = c.g;
  const bool real = l < g.layers;
  const int64_t kv_rows = g.new_kv_heads * g.head_dim;
  const int64_t live_kv = real ? g.kv_heads * g.head_dim : 0, live_ffn = real ? g.ffn : 0;
  jobs->push_back(norm_job(c, layer_name(l, "attn_norm"), real));
  jobs->push_back(q_job(c, layer_name(l, "attn_q"), real));
  jobs->push_back(grow_rows_job(c, layer_name(l, "attn_k"), kv_rows, live_kv, g.new_dim));
  jobs->push_back(grow_rows_job(c, layer_name(l, "attn_v"), kv_rows, live_kv, g.new_dim));
  jobs->push_back(o_job(c, layer_name(l, "attn_output"), real));
  jobs->push_back(norm_job(c, layer_name(l, "ffn_norm"), real));
  const int64_t e = g.new_experts;
  if (e > 0) {  // the router reads the live columns only (the others are zero)
    jobs->push_back(grow_rows_job(c, layer_name(l, "ffn_gate_inp"), e, 0, g.dim));
  }
  const char* gate = e > 0 ? "ffn_gate_exps" : "ffn_gate";
  const char* down = e > 0 ? "ffn_down_exps" : "ffn_down";
  const char* up = e > 0 ? "ffn_up_exps" : "ffn_up";
  jobs->push_back(grow_rows_job(c, layer_name(l, gate), g.new_ffn, live_ffn, g.new_dim, e));
  jobs->push_back(down_job(c, layer_name(l, down), real, e));
  jobs->push_back(grow_rows_job(c, layer_name(l, up), g.new_ffn, live_ffn, g.new_dim, e));
}

std::vector<TensorJob> plan_jobs(const LayerContext& c) {
  const InflateGeometry& g = c.g;
  std::vector<TensorJob> jobs;
  // The embedding and the classifier: every row is a source row padded with zeros.
  jobs.push_back(grow_rows_job(c, "token_embd.weight", g.vocab, g.vocab, 0));
  for (int64_t l = 0; l < g.new_layers; ++l) add_layer_jobs(c, l, &jobs);
  jobs.push_back(norm_job(c, "output_norm.weight", true));
  if (!g.tied) jobs.push_back(grow_rows_job(c, "output.weight", g.vocab, g.vocab, 0));
  return jobs;
}

std::vector<uint8_t> make_tensor(const TensorJob& job, const ParallelFor& parallel_for) {
  const int64_t n = job.dims[0];
  int64_t rows = 1;
  for (size_t i = 1; i < job.dims.size(); ++i) rows *= job.dims[i];
  const uint64_t row_bytes = gguf::ggml_row_size(job.type, n);
  std::vector<uint8_t> data(row_bytes * static_cast<uint64_t>(rows));
  auto body = [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t r = begin; r < end; ++r) {
      job.fill(r, row.data());
      // Row lengths were checked against the type's block size in check_options.
      const Status s = gguf::quantize_row(job.type, row.data(), data.data() + r * row_bytes, n);
      ARBOR_CHECK(s.ok()) << job.name << ": " << s.to_string();
    }
  };
  if (parallel_for) {
    parallel_for(rows, body);
  } else {
    body(0, rows);
  }
  return data;
}

void set_metadata(const GgufFile& src, const InflateGeometry& g, GgmlType type,
                  gguf::GgufWriter* w) {
  for (const gguf::KeyValue& kv : src.metadata()) w->set(kv.key, kv.value);
  auto name = src.get_string("general.name");
  w->set("general.name", Value::str(str_cat("inflated-", name.ok() ? *name : "model", "-",
                                            g.new_dim, "x", g.new_layers)));
  w->set("llama.embedding_length", Value::u32(static_cast<uint32_t>(g.new_dim)));
  w->set("llama.feed_forward_length", Value::u32(static_cast<uint32_t>(g.new_ffn)));
  w->set("llama.block_count", Value::u32(static_cast<uint32_t>(g.new_layers)));
  w->set("llama.attention.head_count", Value::u32(static_cast<uint32_t>(g.new_heads)));
  w->set("llama.attention.head_count_kv", Value::u32(static_cast<uint32_t>(g.new_kv_heads)));
  // d / D is a power of two, so the product is exact.
  const float eps = g.rms_eps * (static_cast<float>(g.dim) / static_cast<float>(g.new_dim));
  w->set("llama.attention.layer_norm_rms_epsilon", Value::f32(eps));
  w->set("llama.rope.dimension_count", Value::u32(static_cast<uint32_t>(g.head_dim)));
  if (g.new_experts > 0) {
    w->set("llama.expert_count", Value::u32(static_cast<uint32_t>(g.new_experts)));
    w->set("llama.expert_used_count", Value::u32(static_cast<uint32_t>(g.new_experts_used)));
  }
  w->set("general.file_type", Value::u32(gguf::llama_file_type(type)));
  if (gguf::ggml_traits(type).block_size > 1) {
    w->set("general.quantization_version", Value::u32(2));
  }
}

}  // namespace

Result<InflateGeometry> plan_inflation(const GgufFile& src, const InflateOptions& options) {
  ARBOR_ASSIGN_OR_RETURN(InflateGeometry g, read_source_shape(src));
  ARBOR_RETURN_IF_ERROR(check_options(g, options));
  ARBOR_RETURN_IF_ERROR(check_source_tensors(src, g));
  g.new_dim = options.dim;
  g.new_ffn = options.ffn;
  g.new_layers = options.layers;
  g.new_heads = options.dim / g.head_dim;
  g.new_kv_heads = g.new_heads / options.kv_ratio;
  g.new_experts = options.experts;
  g.new_experts_used = options.experts_used;
  return g;
}

namespace {

// What the writer's generators share: the plan and the jobs (LayerContext points into it).
struct InflateState {
  InflateState(const GgufFile& src, InflateGeometry geometry, InflateOptions options)
      : g(std::move(geometry)),
        o(std::move(options)),
        c{src, g, o, std::vector<int64_t>(g.new_heads, -1),
          static_cast<float>(std::sqrt(static_cast<double>(g.dim) / g.new_dim))} {
    for (int64_t h = 0; h < g.heads; ++h) c.source_head[g.new_q_head(h)] = h;
    jobs = plan_jobs(c);
  }
  InflateGeometry g;
  InflateOptions o;
  LayerContext c;
  std::vector<TensorJob> jobs;
  uint64_t total = 0;  // bytes
};

}  // namespace

Result<gguf::GgufWriter> inflate_model(const GgufFile& src, const InflateOptions& options) {
  ARBOR_ASSIGN_OR_RETURN(InflateGeometry g, plan_inflation(src, options));
  auto state = std::make_shared<InflateState>(src, std::move(g), options);
  for (const TensorJob& j : state->jobs) state->total += *gguf::ggml_nbytes(j.type, j.dims);
  const InflateGeometry& ng = state->g;
  ARBOR_LOG(kInfo) << "inflate " << src.name() << ": dim " << ng.dim << " -> " << ng.new_dim
                   << ", ffn " << ng.ffn << " -> " << ng.new_ffn << ", layers " << ng.layers
                   << " -> " << ng.new_layers << ", heads " << ng.heads << " -> " << ng.new_heads
                   << " (kv " << ng.kv_heads << " -> " << ng.new_kv_heads << "), head_dim "
                   << ng.head_dim
                   << (ng.new_experts > 0 ? str_cat(", ", ng.new_experts, " experts (",
                                                    ng.new_experts_used, " used)")
                                          : std::string())
                   << ", " << gguf::ggml_type_name(options.type) << ", " << state->jobs.size()
                   << " tensors, " << state->total / 1000000 << " MB, seed " << options.seed;
  gguf::GgufWriter writer;
  set_metadata(src, ng, options.type, &writer);
  for (size_t i = 0; i < state->jobs.size(); ++i) {
    const TensorJob& j = state->jobs[i];
    writer.add_tensor_generated(j.name, j.type, j.dims,
                                [state, i]() -> Result<std::vector<uint8_t>> {
      const InflateState& s = *state;
      return make_tensor(s.jobs[i], s.o.parallel_for);
    });
  }
  return writer;
}

}  // namespace arbor::convert
