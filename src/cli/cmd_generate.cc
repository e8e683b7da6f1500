// arbor generate: one prompt, one sequence, text streamed to stdout as it is generated.
//
// It runs the same engine as `arbor serve` and `arbor bench throughput` (an EngineCore over the
// CPU executor, built from the shared engine flags of engine_flags.h) with a single
// GenerateRequest, and prints the text of each StreamEvent as it arrives. The model's own
// tokenizer (GGUF metadata) encodes the prompt, which is echoed first. Generation ends after -n
// tokens or at the engine's stop ids (engine/stop_rules.h: end-of-generation tokens and BOS,
// since llama2.c-trained models (stories*) separate stories with BOS and never emit their
// vocabulary's EOS) unless --ignore-eos. The stop token is not part of the output. Timings go to
// stderr; --json prints one object with the ids, the generated text and the timings instead of
// streaming.
//
// Unless --num-kv-blocks or --kv-cache-gib is given, the KV pool is sized for this one sequence
// (prompt + -n tokens, capped at the model's context length), not the serving default.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/log.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "engine/engine_core.h"
#include "executor/local_executor.h"
#include "gguf/gguf.h"
#include "kernels/cpu_features.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace arbor::cli {
namespace cmd_generate {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string model;
  std::string prompt;
  int32_t n = 128;
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int64_t seed = -1;
  ServingOptions serving;
  bool pool_size_given = false;  // --num-kv-blocks or --kv-cache-gib on the command line
  bool no_bos = false;
  bool ignore_eos = false;
  bool json = false;
};

struct Generation {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> ids;  // generated only, without the stop token
  std::string text;          // generated only
  std::string stop_reason = "length";
  // Measured by the engine (its TTFT and inter-token histograms hold this one request).
  double prompt_seconds = 0.0;  // arrival to the first token: prefill and its sampling
  double decode_seconds = 0.0;  // first token to the last
  int32_t decode_forwards = 0;  // forwards after the prefill
  // Memory: the process's peak resident set, against the model file and the KV cache.
  uint64_t peak_rss_bytes = 0;
  uint64_t file_bytes = 0;
  uint64_t kv_bytes = 0;
};

uint64_t peak_rss_bytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

sampling::SamplingParams sampling_params(const Options& o) {
  sampling::SamplingParams p;
  p.temperature = o.temperature;
  p.top_k = o.top_k;
  p.top_p = o.top_p;
  p.min_p = o.min_p;
  p.repetition_penalty = o.repeat_penalty;
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  if (o.seed >= 0) p.seed = static_cast<uint64_t>(o.seed);
  return p;
}

void log_configuration(executor::LocalExecutor& exec, const Options& o, int64_t num_tokens) {
  model::ModelRunner& runner = exec.runner();
  const model::LlamaModel& m = runner.model();
  const auto& w = m.weights();
  ARBOR_LOG(kInfo) << "model " << o.model << ": " << runner.config().summary();
  const model::LayerWeights& l0 = w.layers[0];
  const bool moe = !l0.down_exps.empty();
  ARBOR_LOG(kInfo) << "weights: token_embd " << gguf::ggml_type_name(w.token_embd.type)
                   << ", attn_q " << gguf::ggml_type_name(l0.q.w.type)
                   << (moe ? ", ffn_down_exps " : ", ffn_down ")
                   << gguf::ggml_type_name(moe ? l0.down_exps[0].type : l0.down.w.type)
                   << ", output "
                   << gguf::ggml_type_name(w.output.w.type) << (w.tied_output ? " (tied)" : "");
  const model::PagedKvCache& cache = runner.kv_cache();
  ARBOR_LOG(kInfo) << "threads " << runner.pool().num_threads()
                   << ", cpu " << kernels::cpu_summary() << ": " << kernels::isa_summary();
  ARBOR_LOG(kInfo) << "kv cache: " << cache.num_blocks() << " blocks x " << cache.block_size()
                   << " tokens (" << num_tokens << " needed), "
                   << (o.serving.executor.kv_dtype == kernels::KvDtype::kF16 ? "f16" : "f32") << ", "
                   << cache.total_bytes() / 1024 << " KiB";
}

// The executor's options for one sequence of `num_tokens` (prompt + -n): unless the command
// line sized the pool, the blocks it needs (as many as the context can use) in each of the
// model's `num_kv_groups` KV cache groups (a sliding group may need them all while the prompt
// runs in one step) plus the null block; scratch for the prompt's prefill.
executor::ExecutorOptions sequence_executor_options(const Options& o, int64_t num_tokens,
                                                    int64_t context_length,
                                                    int64_t num_prompt_tokens, int num_kv_groups) {
  executor::ExecutorOptions e = executor_options(o.serving);
  if (!o.pool_size_given) {
    const int64_t tokens = std::min(num_tokens, context_length);
    e.num_kv_blocks = (tokens + e.block_size - 1) / e.block_size * num_kv_groups + 1;
  }
  e.reserve_tokens = static_cast<int32_t>(std::min<int64_t>(e.reserve_tokens, num_prompt_tokens));
  return e;
}

void emit(const Options& o, const std::string& text) {
  if (o.json || text.empty()) return;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// Reads the stream to its final event, printing text as it comes; fills ids, text, the stop
// reason and decode_forwards.
Status consume(const Options& o, const tokenizer::Tokenizer& tok, engine::RequestStream& stream,
               Generation& g) {
  int32_t num_sampled = 0;  // the stop token included
  std::optional<sched::StopReason> stop;
  while (std::optional<engine::StreamEvent> ev = stream.next()) {
    if (ev->final) {
      if (!ev->error.ok()) return ev->error;
      break;
    }
    num_sampled += static_cast<int32_t>(ev->token_ids.size());
    g.ids.insert(g.ids.end(), ev->token_ids.begin(), ev->token_ids.end());
    g.text += ev->text;
    emit(o, ev->text);
    if (ev->stop_reason) stop = ev->stop_reason;
  }
  if (stop && (stop->kind == sched::StopKind::kEos || stop->kind == sched::StopKind::kStopToken) &&
      !g.ids.empty()) {
    // The stop decision names its token: BOS (a llama2.c model starting the next story) or EOS.
    g.stop_reason = stop->token_id == tok.bos_id() ? "bos" : "eos";
    g.ids.pop_back();
  } else if (stop && stop->kind == sched::StopKind::kAbort) {
    g.stop_reason = "abort";
  }
  g.decode_forwards = std::max(num_sampled - 1, 0);
  return ok_status();
}

void report(const Options& o, const Generation& g) {
  const double pp = g.prompt_ids.size() / std::max(g.prompt_seconds, 1e-9);
  const double tg = g.decode_forwards / std::max(g.decode_seconds, 1e-9);
  if (o.json) {
    nlohmann::json j;
    j["prompt_ids"] = g.prompt_ids;
    j["ids"] = g.ids;
    j["text"] = g.text;
    j["stop_reason"] = g.stop_reason;
    j["timings"] = {{"prompt_tokens", g.prompt_ids.size()},
                    {"prompt_seconds", g.prompt_seconds},
                    {"prompt_tokens_per_second", pp},
                    {"generated_tokens", g.ids.size()},
                    {"decode_forwards", g.decode_forwards},
                    {"decode_seconds", g.decode_seconds},
                    {"generation_tokens_per_second", tg}};
    j["memory"] = {{"peak_rss_bytes", g.peak_rss_bytes},
                   {"model_file_bytes", g.file_bytes},
                   {"kv_cache_bytes", g.kv_bytes}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "prompt:     %zu tokens in %.3f s (%.2f tok/s)\n", g.prompt_ids.size(),
               g.prompt_seconds, pp);
  std::fprintf(stderr, "generation: %zu tokens, %d forwards in %.3f s (%.2f tok/s), stop: %s\n",
               g.ids.size(), g.decode_forwards, g.decode_seconds, tg, g.stop_reason.c_str());
  const double mib = 1024.0 * 1024.0;
  std::fprintf(stderr,
               "memory:     peak RSS %.1f MiB = model file %.1f MiB + KV cache %.1f MiB + %.1f MiB\n",
               g.peak_rss_bytes / mib, g.file_bytes / mib, g.kv_bytes / mib,
               (static_cast<double>(g.peak_rss_bytes) - g.file_bytes - g.kv_bytes) / mib);
}

Status run(const Options& o) {
  if (o.n < 1) return invalid_argument("-n is ", o.n, ", must be >= 1");
  Generation g;
  int64_t context_length = 0;
  int num_kv_groups = 1;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  {
    ARBOR_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::open(o.model));
    ARBOR_ASSIGN_OR_RETURN(tok, tokenizer::Tokenizer::from_gguf(file));
    ARBOR_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::ModelConfig::from_gguf(file));
    context_length = cfg.context_length;
    std::vector<int32_t> windows;
    for (int l = 0; l < cfg.num_layers; ++l) windows.push_back(cfg.layer_window(l));
    ARBOR_ASSIGN_OR_RETURN(model::KvCacheLayout layout,
                           model::plan_kv_cache_layout(windows, o.serving.executor.kv_reclaim));
    num_kv_groups = layout.num_groups();
    ARBOR_RETURN_IF_ERROR(sampling_params(o).validate(cfg.vocab_size));
  }
  tokenizer::EncodeOptions enc;
  if (o.no_bos) enc.add_bos = false;
  g.prompt_ids = tok->encode(o.prompt, enc);
  if (g.prompt_ids.empty()) return invalid_argument("the prompt is empty (and --no-bos is set)");
  const auto num_prompt = static_cast<int64_t>(g.prompt_ids.size());
  const int64_t total = num_prompt + o.n;
  ARBOR_ASSIGN_OR_RETURN(
      auto exec, executor::LocalExecutor::load(o.model, sequence_executor_options(
                                                            o, total, context_length, num_prompt,
                                                            num_kv_groups)));
  executor::LocalExecutor& exec_ref = *exec;
  log_configuration(exec_ref, o, total);
  engine::EngineCoreConfig cfg;
  cfg.options = engine_options(o.serving);
  cfg.tokenizer = tok.get();
  ARBOR_RETURN_IF_ERROR(engine::EngineCore::validate_config(*exec, cfg));
  engine::EngineCore core(std::move(exec), cfg);
  // -n is a promise of exactly that many tokens (unless a stop id comes first), so a request the
  // engine would cut short at max_model_len is an error here, not a shorter output.
  if (total > core.max_model_len()) {
    return out_of_range("prompt has ", num_prompt, " tokens and -n asks for ", o.n,
                        " more; max_model_len is ", core.max_model_len());
  }
  emit(o, tok->decode(g.prompt_ids));
  engine::GenerateRequest request;
  request.prompt_token_ids = g.prompt_ids;
  request.sampling = sampling_params(o);
  request.max_tokens = o.n;
  request.ignore_eos = o.ignore_eos;
  ARBOR_ASSIGN_OR_RETURN(std::shared_ptr<engine::RequestStream> stream,
                         core.submit(std::move(request)));
  ARBOR_RETURN_IF_ERROR(consume(o, *tok, *stream, g));
  core.wait_idle();  // the metrics of the finished request are published
  const engine::EngineMetricsSnapshot metrics = core.metrics();
  g.prompt_seconds = metrics.ttft_s.sum();
  g.decode_seconds = metrics.inter_token_s.sum();
  g.peak_rss_bytes = peak_rss_bytes();
  std::error_code size_error;
  g.file_bytes = std::filesystem::file_size(o.model, size_error);
  g.kv_bytes = exec_ref.runner().kv_cache().total_bytes();
  report(o, g);
  return ok_status();
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Generate text from a prompt with one sequence");
  auto o = std::make_shared<Options>();
  sub->add_option("-m,--model", o->model, "GGUF model")->required();
  sub->add_option("-p,--prompt", o->prompt, "Prompt text")->required();
  sub->add_option("-n,--n-predict", o->n, "Tokens to generate")->capture_default_str();
  sub->add_option("--temp", o->temperature, "Temperature; 0 = greedy (default as llama.cpp)")
      ->capture_default_str();
  sub->add_option("--top-k", o->top_k, "Top-k; 0 = off")->capture_default_str();
  sub->add_option("--top-p", o->top_p, "Top-p; 1 = off")->capture_default_str();
  sub->add_option("--min-p", o->min_p, "Min-p; 0 = off")->capture_default_str();
  sub->add_option("--repeat-penalty", o->repeat_penalty,
                  "Repetition penalty over prompt + output; 1 = off")->capture_default_str();
  sub->add_option("--presence-penalty", o->presence_penalty, "Presence penalty (OpenAI)")
      ->capture_default_str();
  sub->add_option("--frequency-penalty", o->frequency_penalty, "Frequency penalty (OpenAI)")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Sampling seed; -1 = random")->capture_default_str();
  sub->add_flag("--no-bos", o->no_bos, "Do not prepend BOS to the prompt");
  sub->add_flag("--ignore-eos", o->ignore_eos,
                "Keep generating after end-of-generation tokens and BOS");
  sub->add_flag("--json", o->json,
                "Print one JSON object (prompt_ids, ids, text, timings) instead of streaming");
  add_engine_flags(*sub, &o->serving);
  sub->callback([o, sub] {
    o->pool_size_given = sub->count("--num-kv-blocks") > 0 || sub->count("--kv-cache-gib") > 0;
    exit_on_error(run(*o));
  });
}
ARBOR_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
