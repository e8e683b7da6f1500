// Tiny Qwen3-Embedding / Qwen3-Reranker-style files for the pooling tests: the qwen3 row with
// <arch>.pooling_type and a two-class rank head (cls.output.weight, labels "yes", "no"), random
// weights, stories260K's 512-token vocabulary; and an engine over the real CPU executor.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine_test_util.h"
#include "executor/local_executor.h"
#include "kernels/thread_pool.h"
#include "model/synth_model.h"

namespace arbor::engine::testing {

inline constexpr int32_t kPoolingVocab = 512;

// Writes the file to `path`: pooling_type `pooling` (-1: not written), a rank head of
// `rank_classes` classes (0: none), weights of `type`.
inline void write_pooling_model(const std::string& path, int64_t pooling, int64_t rank_classes,
                                gguf::GgmlType type = gguf::GgmlType::kF32) {
  model::SynthShape s{.name = "qwen3-embed-tiny", .arch = "qwen3", .dim = 128, .ffn = 256,
                      .layers = 3, .heads = 4, .kv_heads = 2, .context = 4096, .head_dim = 64,
                      .tied = true, .rope_theta = 1e6f, .rms_eps = 1e-6f};
  s.pooling_type = pooling;
  s.rank_classes = rank_classes;
  kernels::ThreadPool pool(2);
  auto w = model::synth_model(s, type, 11, kPoolingVocab, stories260k_tokenizer_keys(), pool);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_TRUE(w->write(path).ok());
}

struct PoolingEngineOptions {
  int32_t budget = 2048;     // max_num_batched_tokens
  int64_t num_kv_blocks = 128;
  int32_t block_size = 16;
  bool prefix_caching = true;
};

// An engine over `path` on the CPU (F32 KV, two threads); *exec_out (optional) sees the executor;
// `setup` (optional) runs on it before the engine starts.
inline std::unique_ptr<EngineCore> make_pooling_engine(
    const std::string& path, const PoolingEngineOptions& o,
    executor::LocalExecutor** exec_out = nullptr,
    const std::function<void(executor::LocalExecutor&)>& setup = nullptr) {
  executor::ExecutorOptions eo;
  eo.block_size = o.block_size;
  eo.num_kv_blocks = o.num_kv_blocks;
  eo.kv_dtype = kernels::KvDtype::kF32;
  eo.num_threads = 2;
  eo.reserve_tokens = o.budget;
  auto exec = executor::LocalExecutor::load(path, eo);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return nullptr;
  if (exec_out != nullptr) *exec_out = exec->get();
  if (setup) setup(**exec);
  EngineCoreConfig cfg;
  cfg.options.max_num_batched_tokens = o.budget;
  cfg.options.enable_prefix_caching = o.prefix_caching;
  cfg.eos_token_ids = std::vector<int32_t>{};
  return std::make_unique<EngineCore>(std::move(exec).value(), cfg);
}

inline std::shared_ptr<RequestStream> submit_pooling(EngineCore& engine,
                                                     const std::vector<int32_t>& prompt,
                                                     step::PoolingType type) {
  GenerateRequest g;
  g.prompt_token_ids = prompt;
  g.pooling = type;
  auto stream = engine.submit(std::move(g));
  EXPECT_TRUE(stream.ok()) << stream.status().to_string();
  return stream.ok() ? *stream : nullptr;
}

// The pooled vector of a pooling request's stream (one sample event, then the final one).
inline std::vector<float> drain_pooled(RequestStream& stream, StreamEvent* final_event = nullptr) {
  std::vector<float> v;
  int events = 0;
  while (std::optional<StreamEvent> e = stream.next()) {
    if (e->final) {
      EXPECT_TRUE(e->error.ok()) << e->error.to_string();
      if (final_event != nullptr) *final_event = *e;
      break;
    }
    ++events;
    EXPECT_TRUE(e->token_ids.empty());
    EXPECT_TRUE(e->stop_reason.has_value());
    v = e->pooled;
  }
  EXPECT_EQ(events, 1);
  return v;
}

}  // namespace arbor::engine::testing
