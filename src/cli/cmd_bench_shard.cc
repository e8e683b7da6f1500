// arbor bench shard: the control plane's cost per step over the shard protocol (docs/shards.md).
//
//   arbor bench shard -m MODEL [--requests 64] [--steps 128] [--shard-uri URI] [engine flags]
//
// Launches one `arbor shard` on a Unix socket (or connects to --shard-uri), submits --requests
// greedy requests of 16 prompt tokens and --steps output tokens each (EOS ignored) to an engine
// over the RemoteExecutor, and reports, over the steps that ran every request (pure decode), the
// median step wall time as the engine saw it, the shard's execute time, and their difference:
// encoding the deltas, the gRPC round trip, decoding and validating on both sides. The same
// workload then runs in process for the step time without a shard.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/log.h"
#include "cli/bench_command.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/shard_flags.h"
#include "engine/engine_core.h"
#include "executor/local_executor.h"
#include "shard/wire.h"

namespace arbor::cli {
namespace cmd_bench_shard {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string model;
  ServingOptions serving;
  ShardFlags shards;
  int32_t num_requests = 64;
  int32_t steps = 128;
  int32_t protocol_steps = 0;  // --protocol-only
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Runs the workload on `exec` through an engine; `done` runs once every request finished, while
// the engine (and the executor it owns) still exists. Returns the engine's metrics.
Result<engine::EngineMetricsSnapshot> drive(const Options& o,
                                            std::unique_ptr<step::ModelExecutor> exec,
                                            const std::function<void()>& done) {
  engine::EngineCoreConfig cfg;
  cfg.options = engine_options(o.serving);
  cfg.options.max_num_seqs = std::max(cfg.options.max_num_seqs, o.num_requests);
  cfg.eos_token_ids = std::vector<int32_t>{};
  ARBOR_RETURN_IF_ERROR(engine::EngineCore::validate_config(*exec, cfg));
  const int32_t vocab = exec->vocab_size();
  engine::EngineCore core(std::move(exec), cfg);
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int32_t> tok(3, vocab - 1);
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (int32_t i = 0; i < o.num_requests; ++i) {
    engine::GenerateRequest r;
    r.prompt_token_ids.resize(16);
    for (int32_t& t : r.prompt_token_ids) t = tok(rng);
    r.sampling.temperature = 0;
    r.max_tokens = o.steps;
    r.ignore_eos = true;
    ARBOR_ASSIGN_OR_RETURN(auto s, core.submit(std::move(r)));
    streams.push_back(std::move(s));
  }
  for (auto& s : streams) {
    while (std::optional<engine::StreamEvent> e = s->next()) {
      if (!e->error.ok()) return e->error;
      if (e->final) break;
    }
  }
  core.wait_idle();
  done();
  return core.metrics();
}

// The protocol's CPU cost per step without the transport: the engine's encoding and the shard's
// parsing and validation of a decode step of n requests, and the same for its result (both ends'
// protobuf serialisation included). Microseconds per step, the median over `steps`.
Result<std::vector<double>> protocol_cpu_us(int32_t n, int32_t steps) {
  constexpr int32_t kBlocks = 80, kPrompt = 16, kVocab = 512;
  shard::StepEncoder enc;
  shard::StepDecoder dec({.vocab_size = kVocab, .num_kv_blocks = n * kBlocks + 1,
                          .block_size = 16, .num_kv_groups = 1});
  dec.reset(1);
  step::SchedulerOutput o;
  step::StepResult res;
  for (int32_t i = 0; i < n; ++i) {
    const step::RequestId id = static_cast<step::RequestId>(i + 1);
    step::NewRequestData d;
    d.request_id = id;
    d.token_ids.assign(kPrompt, 5);
    d.num_prompt_tokens = kPrompt;
    d.sampling.temperature = 0;
    o.new_requests.push_back(std::move(d));
    step::ScheduledRequest s;
    s.request_id = id;
    s.num_scheduled_tokens = kPrompt;
    s.sample = true;
    s.block_tables.resize(1);
    for (int32_t b = 0; b < kBlocks; ++b) s.block_tables[0].push_back(i * kBlocks + b + 1);
    o.requests.push_back(std::move(s));
    step::RequestResult r;
    r.request_id = id;
    r.tokens = {step::SampledToken{.token_id = 7, .logprob = 0, .top_logprobs = {}}};
    res.requests.push_back(std::move(r));
  }
  o.total_num_scheduled_tokens = n * kPrompt;
  shard::wire::Step m, m_back;
  shard::wire::StepReply r, r_back;
  std::string bytes;
  step::SchedulerOutput got;
  std::vector<double> us;
  for (int32_t k = 0; k < steps; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    enc.encode(o, 1, &m);
    m.SerializeToString(&bytes);
    m_back.ParseFromString(bytes);
    if (auto e = dec.decode(m_back, &got)) return e->status;
    r.Clear();
    shard::encode_result(res, &r);
    r.SerializeToString(&bytes);
    r_back.ParseFromString(bytes);
    ARBOR_ASSIGN_OR_RETURN(const step::StepResult back, shard::decode_result(r_back));
    ARBOR_RETURN_IF_ERROR(step::validate_step_result(o, back, kVocab));
    us.push_back(1e6 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    o.new_requests.clear();  // the next step: every request decodes one token
    o.total_num_scheduled_tokens = n;
    for (step::ScheduledRequest& s : o.requests) {
      s.num_computed_tokens += s.num_scheduled_tokens;
      s.num_scheduled_tokens = 1;
      s.new_token_ids = {7};
    }
  }
  return us;
}

Status run(const Options& o) {
  if (o.protocol_steps > 0) {  // the protocol's CPU alone (for profiling it)
    ARBOR_ASSIGN_OR_RETURN(const std::vector<double> cpu_us,
                           protocol_cpu_us(o.num_requests, o.protocol_steps));
    std::printf("protocol CPU, no transport: median %.1f us per step of %d requests (%d steps)\n",
                median(cpu_us), o.num_requests, o.protocol_steps);
    return ok_status();
  }
  ShardFlags flags = o.shards;
  if (!flags.remote()) flags.shards = 1;
  ARBOR_ASSIGN_OR_RETURN(auto remote, start_shards(o.model, o.serving, flags));
  shard::RemoteExecutor* r = remote.get();
  std::vector<shard::StepTiming> timings;
  ARBOR_ASSIGN_OR_RETURN(const engine::EngineMetricsSnapshot sharded,
                         drive(o, std::move(remote), [&] { timings = r->step_timings(); }));
  std::vector<double> step_s, exec_s, overhead_s, decode_s, engine_s, to_shard_s, from_shard_s;
  for (const shard::StepTiming& t : timings) {
    if (t.num_requests != o.num_requests) continue;  // prefill and the last, partial steps
    step_s.push_back(t.step_s);
    exec_s.push_back(t.execute_s);
    overhead_s.push_back(t.step_s - t.execute_s);
    decode_s.push_back(t.decode_s);
    engine_s.push_back(t.engine_s);
    to_shard_s.push_back(t.to_shard_s);
    from_shard_s.push_back(t.from_shard_s);
  }
  if (overhead_s.empty()) return internal_error("no step ran all ", o.num_requests, " requests");
  ARBOR_ASSIGN_OR_RETURN(auto local,
                         executor::LocalExecutor::load(o.model, executor_options(o.serving)));
  ARBOR_ASSIGN_OR_RETURN(const engine::EngineMetricsSnapshot in_process,
                         drive(o, std::move(local), [] {}));
  ARBOR_ASSIGN_OR_RETURN(const std::vector<double> cpu_us, protocol_cpu_us(o.num_requests, 1000));
  std::sort(overhead_s.begin(), overhead_s.end());
  const auto pct = [&](double q) {
    return overhead_s[static_cast<size_t>(q * static_cast<double>(overhead_s.size() - 1))];
  };
  std::printf("arbor bench shard: %s, %d requests x %d tokens, %zu decode steps of %d requests "
              "over %s\n",
              o.model.c_str(), o.num_requests, o.steps, overhead_s.size(), o.num_requests,
              flags.shard_uris.empty()
                  ? (flags.shards > 1 ? "launched TP ranks (Unix sockets)" : "a launched shard (Unix socket)")
                  : join_uris(flags).c_str());
  std::printf("  step wall (engine)      median %9.1f us\n", 1e6 * median(step_s));
  std::printf("  shard execute           median %9.1f us\n", 1e6 * median(exec_s));
  std::printf("  control plane (diff)    median %9.1f us   min %.1f  p10 %.1f  p90 %.1f  max %.1f us\n",
              1e6 * median(overhead_s), 1e6 * overhead_s.front(), 1e6 * pct(0.1),
              1e6 * pct(0.9), 1e6 * overhead_s.back());
  std::printf("    medians: engine encode + decode + check %.1f us, shard validate %.1f us; "
              "engine write .. shard read %.1f us, shard reply ready .. engine read %.1f us\n",
              1e6 * median(engine_s), 1e6 * median(decode_s), 1e6 * median(to_shard_s),
              1e6 * median(from_shard_s));
  std::printf("  protocol CPU, no transport (encode, serialise, parse, validate both ways)\n"
              "                          median %9.1f us per step of %d requests\n",
              median(cpu_us), o.num_requests);
  std::printf("  engine executor time    sharded %.3f s, in process %.3f s over %lld / %lld steps\n",
              sharded.executor_s, in_process.executor_s,
              static_cast<long long>(sharded.num_steps), static_cast<long long>(in_process.num_steps));
  return ok_status();
}

void setup(CLI::App& bench) {
  auto* sub = bench.add_subcommand(
      "shard", "Control-plane overhead per step over the shard protocol (docs/shards.md)");
  auto o = std::make_shared<Options>();
  sub->add_option("-m,--model", o->model, "GGUF model file")->required();
  sub->add_option("--requests", o->num_requests, "Requests decoding together")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--steps", o->steps, "Output tokens per request")
      ->check(CLI::Range(2, 100000))
      ->capture_default_str();
  sub->add_option("--protocol-only", o->protocol_steps,
                  "Only the protocol's CPU cost (no shard, no model run), over this many steps "
                  "(0: the whole benchmark)")
      ->check(CLI::Range(0, 10000000))
      ->capture_default_str();
  add_engine_flags(*sub, &o->serving);
  add_shard_flags(*sub, &o->shards);
  sub->callback([o] { exit_on_error(run(*o)); });
}

ARBOR_REGISTER_BENCH_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
