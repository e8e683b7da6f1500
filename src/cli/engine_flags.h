// Engine flags shared by every command that runs the engine (`arbor serve`, `arbor generate`,
// `arbor bench throughput`), so they have one spelling and one set of defaults:
//
//   --max-num-seqs N                  running sequences per step (default 64)
//   --max-num-batched-tokens N        token budget per step (default 2048)
//   --long-prefill-token-threshold N  per-request chunk cap per step; 0 = the budget (default 0)
//   --max-waiting-requests N          admission control: queue bound (default 1024)
//   --max-model-len N                 longest sequence, prompt + generated tokens (default 0 =
//                                     the model's context length, capped by the KV pool; more
//                                     than that is a startup error)
//   --device auto|cpu|cuda            where the model runs (default auto: a CUDA GPU when one is
//                                     present and the GPU path runs the model, else the CPU;
//                                     executor/device.h, docs/cuda.md)
//   --cuda-device N                   which GPU (default 0)
//   --block-size N                    tokens per KV block (default 16)
//   --kv-cache-gib X                  KV memory budget in GiB (default 1.0)
//   --num-kv-blocks N                 exact KV pool size in blocks, overrides --kv-cache-gib
//                                     (default 0 = use the budget; tests use it to force
//                                     preemption)
//   --kv-dtype f16|f32                KV element type (default f16)
//   --scheduling-policy fcfs|priority (default fcfs)
//   --no-prefix-caching               disable automatic prefix caching
//   --spec off|ngram|suffix|draft     speculative decoding proposer (default off)
//   --spec-k N                        drafts verified per request per step, at most (default 4;
//                                     the policy chooses 0..N each step)
//   --draft-model PATH                the draft GGUF for --spec draft (same vocabulary)
//   --spec-ngram-min N / --spec-ngram-max N   n-gram sizes the ngram proposer matches (2 / 4)
//   --spec-tree-budget N              token trees of at most N nodes per request, up to --spec-k
//                                     levels (default 0 = chains)
//   --spec-tree-width W               children per tree node, at most (default 4)
//   --spec-tree-sampling topk|specinfer|sequoia   how a draft model's trees are built for
//                                     unseeded sampling requests (default topk)
//   --spec-tree-shape W1,W2,...       static draft-model trees: W_d children per node at depth
//                                     d (default: dynamic trees)
//
// Header-only: only cmd_*.cc files are compiled into the executable, and this needs CLI11,
// which the engine library does not link.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>

#include "engine/engine_options.h"
#include "executor/executor_options.h"

namespace arbor::cli {

// What the flags below fill: the engine's scheduling knobs and the executor's (device, KV pool,
// threads, speculation).
struct ServingOptions {
  ServingOptions() { executor.device = executor::Device::kAuto; }
  engine::EngineOptions engine;
  executor::ExecutorOptions executor;
  int32_t spec_k = 4;  // --spec-k; the engine's max_spec_tokens when --spec is not off
};

// --device and --cuda-device (also used by `arbor bench`).
inline void add_device_flags(CLI::App& app, executor::Device* device, int* cuda_device) {
  static const std::map<std::string, executor::Device> kDevices{
      {"auto", executor::Device::kAuto},
      {"cpu", executor::Device::kCpu},
      {"cuda", executor::Device::kCuda}};
  app.add_option("--device", *device,
                 "Where the model runs: cpu; cuda (an error without a GPU, or for a model the "
                 "GPU path does not run); auto (a CUDA GPU when one is present and the GPU path "
                 "runs the model, else the CPU; the startup log says which and why; "
                 "docs/cuda.md, \"Device choice\")")
      ->transform(CLI::CheckedTransformer(kDevices, CLI::ignore_case).description(""))
      ->type_name("auto|cpu|cuda")
      ->default_str(std::string(executor::device_name(*device)));
  app.add_option("--cuda-device", *cuda_device, "Which CUDA GPU, when the model runs on one")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

// Adds the flags to `app`; parsing writes into *serving, which must outlive the parse. The
// defaults shown in --help are the values *serving holds when this is called.
inline void add_engine_flags(CLI::App& app, ServingOptions* serving) {
  engine::EngineOptions* options = &serving->engine;
  executor::ExecutorOptions* exec = &serving->executor;
  app.add_option("--max-num-seqs", options->max_num_seqs, "Running sequences per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-num-batched-tokens", options->max_num_batched_tokens,
                 "Token budget per step (prompt chunks + decode tokens)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--long-prefill-token-threshold", options->long_prefill_token_threshold,
                 "Per-request chunk cap per step; 0 = the token budget")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-waiting-requests", options->max_waiting_requests,
                 "Waiting requests beyond this are rejected")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-model-len", options->max_model_len,
                 "Longest sequence (prompt + generated tokens); 0 = the model's context length "
                 "(capped by the KV pool)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  add_device_flags(app, &exec->device, &exec->cuda_device);
  app.add_option("--block-size", exec->block_size, "Tokens per KV block")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--kv-cache-gib", exec->kv_cache_gib, "KV cache memory budget (GiB)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--num-kv-blocks", exec->num_kv_blocks,
                 "KV pool size in blocks (incl. the null block); overrides --kv-cache-gib")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  static const std::map<std::string, kernels::KvDtype> kDtypes{{"f16", kernels::KvDtype::kF16},
                                                               {"f32", kernels::KvDtype::kF32}};
  app.add_option("--kv-dtype", exec->kv_dtype, "KV element type: f16 or f32")
      ->transform(CLI::CheckedTransformer(kDtypes, CLI::ignore_case).description(""))
      ->type_name("f16|f32")
      ->default_str("f16");
  app.add_option("--state-checkpoints", exec->state_checkpoints,
                 "Models with recurrent layers (Qwen3.5): recurrent states kept at prompts' "
                 "block boundaries for prefix-cache hits, each one sequence's state (the load "
                 "logs its size); 0 turns prefix caching off for such models")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  app.add_flag("!--no-kv-reclaim", exec->kv_reclaim,
               "Keep every KV block of sliding-window layers (default: blocks that left every "
               "query's window are released; docs/kv_layout.md)");
  static const std::map<std::string, sched::SchedulingPolicy> kPolicies{
      {"fcfs", sched::SchedulingPolicy::kFcfs}, {"priority", sched::SchedulingPolicy::kPriority}};
  app.add_option("--scheduling-policy", options->policy, "fcfs or priority")
      ->transform(CLI::CheckedTransformer(kPolicies, CLI::ignore_case).description(""))
      ->type_name("fcfs|priority")
      ->default_str("fcfs");
  app.add_flag("!--no-prefix-caching", options->enable_prefix_caching,
               "Disable automatic prefix caching");
  app.add_option("-t,--threads", exec->num_threads, "Forward threads; 0 = all cores")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  static const std::map<std::string, executor::SpecProposer> kProposers{
      {"off", executor::SpecProposer::kNone},
      {"ngram", executor::SpecProposer::kNgram},
      {"suffix", executor::SpecProposer::kSuffix},
      {"draft", executor::SpecProposer::kDraft},
      {"mtp", executor::SpecProposer::kMtp}};
  app.add_option("--spec", exec->proposer,
                 "Speculative decoding proposer: off, ngram (prompt lookup), suffix (suffix "
                 "trees over this and recent requests), draft (--draft-model), mtp (the "
                 "model's own multi-token-prediction head: Qwen3.5 files with nextn layers)")
      ->transform(CLI::CheckedTransformer(kProposers, CLI::ignore_case).description(""))
      ->type_name("off|ngram|suffix|draft|mtp")
      ->default_str("off");
  app.add_option("--spec-k", serving->spec_k,
                 "Drafts verified per request per step, at most (the policy chooses 0..k)")
      ->check(CLI::Range(1, sched::kMaxSpecTokens))
      ->capture_default_str();
  app.add_option("--draft-model", exec->draft_model,
                 "Draft model GGUF for --spec draft (must share the target's vocabulary)");
  app.add_option("--spec-ngram-min", exec->ngram_min, "Smallest n-gram the ngram proposer matches")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--spec-ngram-max", exec->ngram_max, "Largest n-gram the ngram proposer matches")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--spec-tree-budget", exec->tree_budget,
                 "Token-tree speculation: at most N draft nodes per request and step, up to "
                 "--spec-k levels deep (0 = chains)")
      ->check(CLI::Range(0, executor::kMaxTreeBudget))
      ->capture_default_str();
  app.add_option("--spec-tree-width", exec->tree_width,
                 "Token-tree speculation: children per node, at most")
      ->check(CLI::Range(1, executor::kMaxTreeWidth))
      ->capture_default_str();
  static const std::map<std::string, executor::TreeSampling> kTreeSampling{
      {"topk", executor::TreeSampling::kTopK},
      {"specinfer", executor::TreeSampling::kSpecInfer},
      {"sequoia", executor::TreeSampling::kSequoia}};
  app.add_option("--spec-tree-sampling", exec->tree_sampling,
                 "Draft-model and MTP trees for unseeded sampling requests: topk (most probable "
                 "children), specinfer (drawn with replacement), sequoia (drawn without "
                 "replacement); greedy and seeded requests always use topk")
      ->transform(CLI::CheckedTransformer(kTreeSampling, CLI::ignore_case).description(""))
      ->type_name("topk|specinfer|sequoia")
      ->default_str("topk");
  app.add_option("--spec-tree-shape", exec->tree_static_widths,
                 "Static draft-model or MTP trees: children per node at each depth, e.g. 4,2,2,1 "
                 "(default: dynamic trees, the most probable branches within the budget)")
      ->delimiter(',')
      ->check(CLI::Range(1, executor::kMaxTreeWidth))
      ->type_name("W1,W2,...")
      ->default_str("dynamic");
}

// The engine's options: --spec-k applies when a proposer is chosen.
inline engine::EngineOptions engine_options(const ServingOptions& s) {
  engine::EngineOptions e = s.engine;
  e.max_spec_tokens = s.executor.proposer == executor::SpecProposer::kNone ? 0 : s.spec_k;
  return e;
}

// The executor's activation scratch follows the engine's token budget.
inline executor::ExecutorOptions executor_options(const ServingOptions& s) {
  executor::ExecutorOptions e = s.executor;
  e.reserve_tokens = s.engine.max_num_batched_tokens;
  e.max_num_seqs = s.engine.max_num_seqs;
  return e;
}

}  // namespace arbor::cli
