// The engine thread's own cost of a request (everything but the executor: admission, sample
// setup, detokenisation, stop strings, bookkeeping), on a FakeExecutor with stories260K's real
// tokenizer, for prompts of 64 and 32,000 tokens and best_of 1 and 8.
//
//   engine_bench [--benchmark_repetitions=5]
// Reports the engine-thread seconds of one request (manual time). A sample's setup primes its
// detokenizer with the prompt's last few tokens only (engine/sample_text.h; the `decode_prompt`
// row is what priming with the whole prompt would add per sample). What a sample still costs in
// proportion to its prompt is copies of its token ids: the fork's, the executor's new-request
// message, and the first append's reallocation (each fresh allocation page-faults in).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "base/clock.h"
#include "engine/engine_core.h"
#include "executor/fake_executor.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace arbor;

const tokenizer::Tokenizer* stories260k() {
  static std::unique_ptr<tokenizer::Tokenizer> tok = [] {
    const std::string path = std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
    auto t = tokenizer::Tokenizer::from_file(path);
    if (!t.ok()) {
      std::fprintf(stderr, "engine_bench: %s\n", t.status().to_string().c_str());
      return std::unique_ptr<tokenizer::Tokenizer>();
    }
    return std::move(t).value();
  }();
  return tok.get();
}

int32_t prompt_token(int32_t i) { return 3 + (i * 7) % 400; }

// args: prompt length, best_of.
void BM_EngineThreadPerRequest(benchmark::State& state) {
  const tokenizer::Tokenizer* tok = stories260k();
  if (tok == nullptr) {
    state.SkipWithError("stories260K tokenizer missing (ARBOR_SHARED_DIR)");
    return;
  }
  const auto prompt_len = static_cast<int32_t>(state.range(0));
  const auto best_of = static_cast<int32_t>(state.range(1));
  for (auto _ : state) {
    engine::EngineCoreConfig cfg;
    cfg.tokenizer = tok;
    executor::FakeExecutorOptions f;
    f.vocab_size = tok->vocab_size();
    f.num_kv_blocks = 8192;
    engine::EngineCore engine(std::make_unique<executor::FakeExecutor>(f), cfg);
    engine::GenerateRequest r;
    for (int32_t i = 0; i < prompt_len; ++i) r.prompt_token_ids.push_back(prompt_token(i));
    r.sampling.temperature = 1.0f;
    r.n = 1;
    r.best_of = best_of;
    r.max_tokens = 4;
    r.stop = {"never appears in this text, but is checked"};
    auto s = engine.submit(std::move(r));
    if (!s.ok()) {
      state.SkipWithError(s.status().to_string().c_str());
      return;
    }
    while (std::optional<engine::StreamEvent> e = (*s)->next()) {
      if (e->final) break;
    }
    engine.wait_idle();
    const engine::EngineMetricsSnapshot m = engine.metrics();
    state.SetIterationTime(m.engine_busy_s - m.executor_s);
  }
}
BENCHMARK(BM_EngineThreadPerRequest)
    ->ArgNames({"prompt", "best_of"})
    ->Args({64, 1})
    ->Args({64, 8})
    ->Args({32000, 1})
    ->Args({32000, 8})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Detokenising a 32,000-token prompt once: what each sample would add if its setup primed the
// detokenizer with the whole prompt.
void BM_DecodePromptOnce(benchmark::State& state) {
  const tokenizer::Tokenizer* tok = stories260k();
  if (tok == nullptr) {
    state.SkipWithError("stories260K tokenizer missing (ARBOR_SHARED_DIR)");
    return;
  }
  for (auto _ : state) {
    tokenizer::IncrementalDetokenizer d(*tok);
    size_t bytes = 0;
    for (int32_t i = 0; i < 32000; ++i) bytes += d.add(prompt_token(i)).size();
    benchmark::DoNotOptimize(bytes);
  }
}
BENCHMARK(BM_DecodePromptOnce)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
