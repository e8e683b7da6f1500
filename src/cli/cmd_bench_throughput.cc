// arbor bench throughput: offline throughput of the engine (vLLM's benchmark_throughput).
//
// Submits --num-requests requests at once, each a prompt of --input-len random token ids
// (fixed seed, no prefix sharing) and exactly --output-len greedy tokens (EOS ignored), to an
// EngineCore over the CPU executor, and times submission -> last token. Reports requests/s,
// output tokens/s and total tokens/s, plus engine metrics (steps, mean batch, TTFT,
// preemptions). With --sweep-max-num-seqs 1,4,16,32 it runs once per value (a fresh engine
// each, the model loaded once per run); --reps runs per value, the table shows the median.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/log.h"
#include "cli/bench_command.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "executor/local_executor.h"
#include "engine/engine_core.h"
#include "kernels/cpu_features.h"

namespace arbor::cli {
namespace cmd_bench_throughput {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string model;
  ServingOptions serving;
  int32_t num_requests = 128;
  int32_t input_len = 128;
  int32_t distinct_prompts = 0;  // > 0: requests cycle through this many prompts
  int32_t output_len = 128;
  std::vector<int32_t> sweep;  // max_num_seqs values; empty = --max-num-seqs only
  int reps = 1;
  uint64_t seed = 0;
  bool json = false;
};

struct RunResult {
  int32_t max_num_seqs = 0;
  double seconds = 0;
  double requests_per_s = 0;
  double output_tokens_per_s = 0;
  double total_tokens_per_s = 0;
  engine::EngineMetricsSnapshot metrics;
};

std::vector<std::vector<int32_t>> make_prompts(const Options& o, int32_t vocab) {
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> tok(3, vocab - 1);
  std::vector<std::vector<int32_t>> prompts(o.num_requests);
  const int32_t distinct = o.distinct_prompts > 0 ? o.distinct_prompts : o.num_requests;
  for (int32_t i = 0; i < o.num_requests; ++i) {
    if (i >= distinct) {
      prompts[i] = prompts[i % distinct];  // a workload that repeats itself
      continue;
    }
    prompts[i].resize(o.input_len);
    for (int32_t& t : prompts[i]) t = tok(rng);
  }
  return prompts;
}

Result<RunResult> run_once(const Options& o, int32_t max_num_seqs) {
  engine::EngineOptions eo = engine_options(o.serving);
  eo.max_num_seqs = max_num_seqs;
  ARBOR_ASSIGN_OR_RETURN(auto exec, executor::LocalExecutor::load(o.model, executor_options(o.serving)));
  const int32_t vocab = exec->vocab_size();
  engine::EngineCoreConfig cfg;
  cfg.options = eo;
  cfg.eos_token_ids = std::vector<int32_t>{};
  ARBOR_RETURN_IF_ERROR(engine::EngineCore::validate_config(*exec, cfg));
  engine::EngineCore core(std::move(exec), cfg);
  const auto prompts = make_prompts(o, vocab);
  {
    // Warm-up: pages the weights in and sizes the scratch buffers.
    engine::GenerateRequest w;
    w.prompt_token_ids = prompts[0];
    w.sampling.temperature = 0.0f;
    w.max_tokens = 2;
    ARBOR_ASSIGN_OR_RETURN(auto s, core.submit(std::move(w)));
    while (s->next()) {
    }
  }
  const engine::EngineMetricsSnapshot before = core.metrics();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (const auto& p : prompts) {
    engine::GenerateRequest r;
    r.prompt_token_ids = p;
    r.sampling.temperature = 0.0f;
    r.max_tokens = o.output_len;
    r.ignore_eos = true;
    ARBOR_ASSIGN_OR_RETURN(auto s, core.submit(std::move(r)));
    streams.push_back(std::move(s));
  }
  int64_t out_tokens = 0;
  for (auto& s : streams) {
    while (std::optional<engine::StreamEvent> e = s->next()) {
      if (e->final && !e->error.ok()) return e->error;
      out_tokens += static_cast<int64_t>(e->token_ids.size());
    }
  }
  RunResult r;
  r.max_num_seqs = max_num_seqs;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  core.wait_idle();
  r.metrics = core.metrics();
  r.metrics.num_steps -= before.num_steps;
  r.requests_per_s = o.num_requests / r.seconds;
  r.output_tokens_per_s = static_cast<double>(out_tokens) / r.seconds;
  r.total_tokens_per_s =
      static_cast<double>(out_tokens + int64_t{o.num_requests} * o.input_len) / r.seconds;
  return r;
}

RunResult median_of(std::vector<RunResult> runs) {
  std::sort(runs.begin(), runs.end(), [](const RunResult& a, const RunResult& b) {
    return a.output_tokens_per_s < b.output_tokens_per_s;
  });
  return runs[runs.size() / 2];
}

void print_results(const Options& o, const std::vector<RunResult>& results) {
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const RunResult& r : results) {
      j.push_back({{"max_num_seqs", r.max_num_seqs}, {"seconds", r.seconds},
                   {"requests_per_s", r.requests_per_s},
                   {"output_tokens_per_s", r.output_tokens_per_s},
                   {"total_tokens_per_s", r.total_tokens_per_s},
                   {"steps", r.metrics.num_steps},
                   {"mean_batch", r.metrics.batch_size.mean()},
                   {"mean_ttft_s", r.metrics.ttft_s.mean()},
                   {"preemptions", r.metrics.num_preemptions},
                   {"draft_tokens", r.metrics.num_draft_tokens},
                   {"accepted_draft_tokens", r.metrics.num_accepted_draft_tokens},
                   {"verify_steps", r.metrics.num_verify_steps}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("| max_num_seqs | seconds | requests/s | output tok/s | total tok/s | steps | "
              "mean batch | mean TTFT s | preemptions | drafts accepted | mean accepted length |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const RunResult& r : results) {
    const engine::EngineMetricsSnapshot& m = r.metrics;
    const std::string accepted =
        m.num_draft_tokens == 0
            ? std::string("-")
            : str_cat(m.num_accepted_draft_tokens, "/", m.num_draft_tokens);
    const std::string length =
        m.num_verify_steps == 0
            ? std::string("-")
            : str_cat(1.0 + static_cast<double>(m.num_accepted_draft_tokens) / m.num_verify_steps);
    std::printf("| %d | %.2f | %.3f | %.1f | %.1f | %lld | %.1f | %.3f | %lld | %s | %s |\n",
                r.max_num_seqs, r.seconds, r.requests_per_s, r.output_tokens_per_s,
                r.total_tokens_per_s, static_cast<long long>(m.num_steps), m.batch_size.mean(),
                m.ttft_s.mean(), static_cast<long long>(m.num_preemptions), accepted.c_str(),
                length.c_str());
  }
  if (results.size() > 1) {
    std::printf("\noutput tok/s relative to max_num_seqs = %d:", results[0].max_num_seqs);
    for (const RunResult& r : results) {
      std::printf(" %d: %.2fx", r.max_num_seqs, r.output_tokens_per_s / results[0].output_tokens_per_s);
    }
    std::printf("\n");
  }
}

Status run(const Options& o) {
  if (o.num_requests < 1 || o.input_len < 1 || o.output_len < 1 || o.reps < 1) {
    return invalid_argument("--num-requests, --input-len, --output-len and --reps must be >= 1");
  }
  std::vector<int32_t> values = o.sweep.empty() ? std::vector<int32_t>{o.serving.engine.max_num_seqs}
                                                 : o.sweep;
  std::vector<RunResult> results;
  for (int32_t seqs : values) {
    if (seqs < 1) return invalid_argument("max_num_seqs ", seqs, " must be >= 1");
    std::vector<RunResult> runs;
    for (int rep = 0; rep < o.reps; ++rep) {
      ARBOR_ASSIGN_OR_RETURN(RunResult r, run_once(o, seqs));
      ARBOR_LOG(kInfo) << "max_num_seqs " << seqs << " run " << rep + 1 << ": "
                       << r.output_tokens_per_s << " output tok/s";
      runs.push_back(std::move(r));
    }
    results.push_back(median_of(std::move(runs)));
  }
  if (!o.json) {
    std::printf("model %s: %d requests, %d prompt + %d output tokens, budget %d tokens/step, "
                "cpu %s: %s, median of %d\n\n",
                o.model.c_str(), o.num_requests, o.input_len, o.output_len,
                o.serving.engine.max_num_batched_tokens, kernels::cpu_summary().c_str(),
                kernels::isa_summary().c_str(), o.reps);
  }
  print_results(o, results);
  return ok_status();
}

void setup(CLI::App& bench) {
  auto* sub = bench.add_subcommand(
      "throughput", "Offline engine throughput: N requests at once, fixed prompt/output lengths");
  auto o = std::make_shared<Options>();
  sub->add_option("-m,--model", o->model, "GGUF model")->required();
  add_engine_flags(*sub, &o->serving);
  sub->add_option("--num-requests", o->num_requests, "Requests")->capture_default_str();
  sub->add_option("--input-len", o->input_len, "Prompt tokens per request")->capture_default_str();
  sub->add_option("--distinct-prompts", o->distinct_prompts,
                  "Requests cycle through this many random prompts (a repetitive workload, e.g. "
                  "for --spec suffix); 0 = every prompt distinct")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--output-len", o->output_len, "Generated tokens per request")
      ->capture_default_str();
  sub->add_option("--sweep-max-num-seqs", o->sweep,
                  "Run once per max_num_seqs value (e.g. 1,4,16,32); overrides --max-num-seqs")
      ->delimiter(',');
  sub->add_option("-r,--reps", o->reps, "Runs per value; the median is reported")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed of the random prompts")->capture_default_str();
  sub->add_flag("--json", o->json, "Print JSON instead of the table");
  sub->callback([o] { exit_on_error(run(*o)); });
}
ARBOR_REGISTER_BENCH_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
