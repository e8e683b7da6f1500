// Kernel benchmarks at TinyLlama-1.1B shapes (hidden 2048, FFN 5632, vocab 32000).
//
//   GEMV (1 token, decode): GB/s of weight bytes read — compare with BM_ReadBandwidth.
//   GEMM (64 tokens, prefill): GFLOP/s (2 * rows * cols * tokens per call).
// Threads: ARBOR_BENCH_THREADS (default 2). ISA: ARBOR_ISA=scalar|avx2 (default: best).
//   kernels_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "kernels/attention.h"
#include "kernels/bandwidth.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"

namespace arbor::kernels {
namespace {

using gguf::GgmlType;

ThreadPool& bench_pool() {
  static ThreadPool pool([] {
    const char* env = std::getenv("ARBOR_BENCH_THREADS");
    return env != nullptr ? std::atoi(env) : 2;
  }());
  return pool;
}

// Random weights in `type` with sane scales (fp16 scales ~1e-2, f16/bf16 values in [-1, 1]);
// generated as bytes rather than by quantising, so setup stays fast for 32000 x 2048.
std::vector<uint8_t> random_weights(GgmlType type, int64_t rows, int64_t cols) {
  const size_t row_bytes = weight_row_bytes(type, cols);
  std::vector<uint8_t> data(row_bytes * static_cast<size_t>(rows));
  std::mt19937_64 rng(7);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  const size_t block = weight_block_bytes(type);
  for (size_t off = 0; off + block <= data.size(); off += block) {
    uint16_t h = 0;
    if (type == GgmlType::kF16) h = fp32_to_fp16(static_cast<float>(rng() % 2001) / 1000 - 1);
    if (type == GgmlType::kBF16) h = fp32_to_bf16(static_cast<float>(rng() % 2001) / 1000 - 1);
    if (type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0) h = fp32_to_fp16(0.01f);
    if (type != GgmlType::kF32) std::memcpy(&data[off], &h, 2);
  }
  if (type == GgmlType::kF32) {
    for (size_t i = 0; i + 4 <= data.size(); i += 4) {
      const float f = static_cast<float>(rng() % 2001) / 1000 - 1;
      std::memcpy(&data[i], &f, 4);
    }
  }
  return data;
}

void run_matmul(benchmark::State& state, GgmlType type, int64_t num_tokens, bool packed = false) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const std::vector<uint8_t> data = random_weights(type, rows, cols);
  WeightView w = make_weight_view(type, data.data(), rows, cols);
  PackedWeights pk;
  if (packed) {
    if (!packing_available(type)) {
      state.SkipWithError("no packed kernel on this CPU");
      return;
    }
    pk = pack_weights(w);
    w.packed = pk.data();
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(num_tokens * cols)),
      y(static_cast<size_t>(num_tokens * rows));
  for (float& v : x) v = dist(rng);
  ThreadPool& pool = bench_pool();
  matmul(w, x.data(), y.data(), num_tokens, pool);  // warm the workspace and caches
  for (auto _ : state) {
    matmul(w, x.data(), y.data(), num_tokens, pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double bytes = static_cast<double>(data.size());
  state.counters["GB/s"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * num_tokens / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(ggml_type_name(type)) + (packed ? " packed " : " ") +
                 std::string(isa_name(active_isa())) +
                 " threads=" + std::to_string(pool.num_threads()));
}

void BM_GemvQ4_0(benchmark::State& s) { run_matmul(s, GgmlType::kQ4_0, 1); }
void BM_GemvQ8_0(benchmark::State& s) { run_matmul(s, GgmlType::kQ8_0, 1); }
void BM_GemvF16(benchmark::State& s) { run_matmul(s, GgmlType::kF16, 1); }
void BM_GemmQ4_0(benchmark::State& s) { run_matmul(s, GgmlType::kQ4_0, 64); }
void BM_GemmQ8_0(benchmark::State& s) { run_matmul(s, GgmlType::kQ8_0, 64); }
void BM_GemmF16(benchmark::State& s) { run_matmul(s, GgmlType::kF16, 64); }
void BM_GemvQ4_0Packed(benchmark::State& s) { run_matmul(s, GgmlType::kQ4_0, 1, true); }
void BM_GemvQ8_0Packed(benchmark::State& s) { run_matmul(s, GgmlType::kQ8_0, 1, true); }
void BM_GemmQ4_0Packed(benchmark::State& s) { run_matmul(s, GgmlType::kQ4_0, s.range(2), true); }
void BM_GemmQ8_0Packed(benchmark::State& s) { run_matmul(s, GgmlType::kQ8_0, s.range(2), true); }
void BM_GemmQ4_0Tokens(benchmark::State& s) { run_matmul(s, GgmlType::kQ4_0, s.range(2)); }

// Every packed type (Q4_0, Q8_0 and the affine types) on the FFN's 5632 x 2048 shape, at one
// token (decode), 9 (a verification of 8 drafts), 16 and 64 (prefill).
void BM_MatmulPacked(benchmark::State& s) {
  run_matmul(s, static_cast<GgmlType>(s.range(2)), s.range(3), true);
}
BENCHMARK(BM_MatmulPacked)
    ->ArgsProduct({{5632},
                   {2048},
                   {int64_t(GgmlType::kQ4_0), int64_t(GgmlType::kQ8_0), int64_t(GgmlType::kQ4_1),
                    int64_t(GgmlType::kQ5_0), int64_t(GgmlType::kQ5_1), int64_t(GgmlType::kQ2_K),
                    int64_t(GgmlType::kQ3_K), int64_t(GgmlType::kQ4_K), int64_t(GgmlType::kQ5_K),
                    int64_t(GgmlType::kQ6_K)},
                   {1, 9, 16, 64}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The verification-step token counts (1 = decode, 5 = four drafts, 9 = eight) for the types of
// the Q8_0 and Q4_K_M files (a Q4_K_M file mixes Q4_K and Q6_K), same shape.
BENCHMARK(BM_MatmulPacked)
    ->Name("BM_VerifyPacked")
    ->ArgsProduct({{5632},
                   {2048},
                   {int64_t(GgmlType::kQ8_0), int64_t(GgmlType::kQ4_K), int64_t(GgmlType::kQ6_K)},
                   {1, 2, 5, 9}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The same from L2 (256 x 2048: 0.3-0.5 MB), where the kernels are bound by their arithmetic:
// run with ARBOR_BENCH_THREADS=1 and read the CPU time on a loaded machine.
BENCHMARK(BM_MatmulPacked)
    ->Name("BM_VerifyPackedL2")
    ->ArgsProduct({{256},
                   {2048},
                   {int64_t(GgmlType::kQ8_0), int64_t(GgmlType::kQ4_K), int64_t(GgmlType::kQ6_K)},
                   {1, 2, 5, 9}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void tinyllama_shapes(benchmark::internal::Benchmark* b) {
  b->Args({2048, 2048})->Args({5632, 2048})->Args({2048, 5632})->Args({32000, 2048});
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_GemvQ4_0)->Apply(tinyllama_shapes);
BENCHMARK(BM_GemvQ8_0)->Apply(tinyllama_shapes);
BENCHMARK(BM_GemvF16)->Apply(tinyllama_shapes);
BENCHMARK(BM_GemmQ4_0)
    ->Args({2048, 2048})
    ->Args({5632, 2048})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemvQ4_0Packed)->Apply(tinyllama_shapes);
BENCHMARK(BM_GemvQ8_0Packed)->Apply(tinyllama_shapes);
// Token counts of batched decode (4, 16) and prefill (64), packed and plain.
void token_shapes(benchmark::internal::Benchmark* b) {
  for (int64_t t : {4, 16, 64}) b->Args({2048, 2048, t});
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_GemmQ4_0Tokens)->Apply(token_shapes);
BENCHMARK(BM_GemmQ4_0Packed)->Apply(token_shapes);
BENCHMARK(BM_GemmQ8_0Packed)->Apply(token_shapes);
void BM_GemmF16Tokens(benchmark::State& s) { run_matmul(s, GgmlType::kF16, s.range(2)); }
BENCHMARK(BM_GemmF16Tokens)->Args({1024, 1024, 1})->Args({1024, 1024, 8})->Args({1024, 1024, 16})->Args({1024, 1024, 17})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GemmQ8_0)->Args({2048, 2048})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmF16)->Args({2048, 2048})->UseRealTime()->Unit(benchmark::kMillisecond);

// Small-T steps over DRAM-resident weights: the seven matrices of a TinyLlama-1.1B layer (q, k,
// v, o, gate, up, down) for 8 layers (~375 MB in Q8_0, ~10x the L3), T tokens through each, as
// a verification step sees them. Compare the time per call across T (r(T) = t(T) / t(1)).
struct LayerStack {
  std::vector<std::vector<uint8_t>> data;
  std::vector<PackedWeights> packed;
  std::vector<WeightView> views;
};

const LayerStack& layer_stack(GgmlType type) {
  static std::map<GgmlType, LayerStack> stacks;
  LayerStack& s = stacks[type];
  if (!s.views.empty()) return s;
  const int64_t shapes[7][2] = {{2048, 2048}, {256, 2048},  {256, 2048}, {2048, 2048},
                                {5632, 2048}, {5632, 2048}, {2048, 5632}};
  for (int layer = 0; layer < 8; ++layer) {
    for (const auto& sh : shapes) {
      s.data.push_back(random_weights(type, sh[0], sh[1]));
      WeightView w = make_weight_view(type, s.data.back().data(), sh[0], sh[1]);
      if (packing_available(type)) {
        s.packed.push_back(pack_weights(w));
        w.packed = s.packed.back().data();
        std::vector<uint8_t>().swap(s.data.back());  // the kernels read the packed copy only
      }
      s.views.push_back(w);
    }
  }
  return s;
}

void run_layer_stack(benchmark::State& state, GgmlType type) {
  const int64_t num_tokens = state.range(0);
  const LayerStack& s = layer_stack(type);
  std::vector<float> x(static_cast<size_t>(num_tokens * 5632), 0.5f), y(x.size());
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  ThreadPool& pool = bench_pool();
  double bytes = 0;
  for (const WeightView& w : s.views) {
    bytes += static_cast<double>(w.rows) * static_cast<double>(weight_row_bytes(w.type, w.cols));
  }
  for (auto _ : state) {
    for (const WeightView& w : s.views) matmul(w, x.data(), y.data(), num_tokens, pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(ggml_type_name(type)) + " " + std::string(isa_name(active_isa())));
}
void BM_StepQ8_0(benchmark::State& s) { run_layer_stack(s, GgmlType::kQ8_0); }
void BM_StepQ4_0(benchmark::State& s) { run_layer_stack(s, GgmlType::kQ4_0); }
void BM_StepF16(benchmark::State& s) { run_layer_stack(s, GgmlType::kF16); }
void BM_StepQ4_K(benchmark::State& s) { run_layer_stack(s, GgmlType::kQ4_K); }
void BM_StepQ6_K(benchmark::State& s) { run_layer_stack(s, GgmlType::kQ6_K); }
void step_tokens(benchmark::internal::Benchmark* b) {
  for (int64_t t : {1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17}) b->Arg(t);
  b->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.3);
}
BENCHMARK(BM_StepQ8_0)->Apply(step_tokens);
BENCHMARK(BM_StepQ4_0)->Apply(step_tokens);
BENCHMARK(BM_StepF16)->Apply(step_tokens);
BENCHMARK(BM_StepQ4_K)->Apply(step_tokens);
BENCHMARK(BM_StepQ6_K)->Apply(step_tokens);

// Paged attention of one sequence at the Qwen3-0.6B shape (16 query heads, 8 kv heads, head dim
// 128, F16 cache in blocks of 16) over 256 cached keys (ARBOR_BENCH_ATTN_CONTEXT), T new tokens
// (1: decode, 5: four drafts), through 28 layers' caches in turn (29 MB at 256 keys, about the
// L3: past it from ~512 keys, as a step streams them between the layers' weights). Time per
// layer call; GB/s: the K and V it reads.
void BM_AttentionVerify(benchmark::State& state) {
  const int num_tokens = static_cast<int>(state.range(0));
  constexpr int kHeads = 16, kKvHeads = 8, kHd = 128, kBs = 16;
  // ARBOR_BENCH_ATTN_LAYERS=1: one layer's cache (1.1 MB), which stays in L2 / L3: the kernels'
  // arithmetic without the DRAM stream. ARBOR_BENCH_ATTN_CONTEXT: cached keys (256).
  const char* layers_env = std::getenv("ARBOR_BENCH_ATTN_LAYERS");
  const int kLayers = layers_env != nullptr ? std::max(1, std::atoi(layers_env)) : 28;
  const char* context_env = std::getenv("ARBOR_BENCH_ATTN_CONTEXT");
  const int kContext = context_env != nullptr ? std::max(1, std::atoi(context_env)) : 256;
  const int kv_len = kContext + num_tokens, blocks = (kv_len + kBs - 1) / kBs;
  const size_t layer_elems = static_cast<size_t>(blocks) * kKvHeads * kBs * kHd;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> bits(0x3000, 0x3bff);  // f16 in [0.125, 1)
  std::vector<uint16_t> k(layer_elems * kLayers), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint16_t>(bits(rng));
    v[i] = static_cast<uint16_t>(bits(rng));
  }
  std::vector<float> q(static_cast<size_t>(num_tokens) * kHeads * kHd, 0.01f), out(q.size());
  std::vector<int32_t> pages(blocks);
  for (int b = 0; b < blocks; ++b) pages[b] = b;
  const int32_t qo[2] = {0, num_tokens}, kvp[2] = {0, blocks}, lens[1] = {kv_len};
  PagedAttentionParams p;
  p.num_seqs = 1;
  p.num_q_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHd;
  p.block_size = kBs;
  p.scale = 0.0884f;
  p.q = q.data();
  p.out = out.data();
  p.kv_dtype = KvDtype::kF16;
  p.qo_indptr = qo;
  p.kv_indptr = kvp;
  p.kv_page_indices = pages.data();
  p.kv_len = lens;
  ThreadPool& pool = bench_pool();
  int layer = 0;
  for (auto _ : state) {
    p.k_cache = k.data() + layer_elems * layer;
    p.v_cache = v.data() + layer_elems * layer;
    paged_attention(p, pool);
    layer = (layer + 1) % kLayers;
    benchmark::DoNotOptimize(out.data());
  }
  // K and V of every cached key (what a call must read).
  const double kv_bytes = 2.0 * kv_len * kKvHeads * kHd * sizeof(uint16_t);
  state.counters["GB/s"] = benchmark::Counter(kv_bytes * static_cast<double>(state.iterations()) /
                                              1e9, benchmark::Counter::kIsRate);
  state.SetLabel("context=" + std::to_string(kContext) + " layers=" + std::to_string(kLayers) +
                 " threads=" + std::to_string(pool.num_threads()));
}
BENCHMARK(BM_AttentionVerify)->Arg(1)->Arg(2)->Arg(5)->Arg(9)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_ReadBandwidth(benchmark::State& state) {
  ThreadPool& pool = bench_pool();
  double gbs = 0.0;
  for (auto _ : state) gbs = measure_read_bandwidth_gbs(pool, size_t{256} << 20, 3);
  state.counters["GB/s"] = gbs;
  state.SetLabel(std::string(isa_name(active_isa())) +
                 " threads=" + std::to_string(pool.num_threads()));
}
BENCHMARK(BM_ReadBandwidth)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace arbor::kernels

BENCHMARK_MAIN();
