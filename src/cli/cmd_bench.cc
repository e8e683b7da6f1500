// arbor bench: CPU model benchmark (and the parent of other benchmarks, see bench_command.h).
//
//   pp<P>      one sequence, a prompt of P random tokens in one forward
//   tg<N>      one sequence, N single-token forwards after a 1-token prompt
//   batch <B>  B sequences (prompts of --batch-prompt tokens), then --batch-steps steps that each
//              run one ragged forward with one new token per sequence; aggregate tokens/s
//   verify <K> the cost of checking K speculative tokens: one sequence with --verify-context
//              cached tokens runs a (K+1)-token multi-query step with logits for every token,
//              then truncates back (as rejected drafts are dropped); ms per step and the ratio
//              r(K+1) to a 1-token step (K = 0), which bounds the speed-up speculation can give.
//              The K run in interleaved rounds (each round times every K once), so the machine's
//              drift hits all of them alike; the default is the whole curve K = 1..16, the
//              shape the speculation policy's cost model measures at server start.
// Each test runs once untimed (pages the mmapped weights in, sizes the scratch), then --reps
// timed runs; the table shows min / median / max tokens/s. Decode is memory bound, so it is also
// stated as a fraction of the measured read bandwidth: (weight bytes + KV bytes read per step)
// x steps/s / bandwidth. Prefill and batched decode (>= 2 sequences) are compute bound and are
// stated as a fraction of the measured arithmetic peak (kernels/peak.h: int8 dot products for
// Q8_0/Q4_0 models, f32 FMA otherwise), counting 2 ops per weight element per token.
// Tokens are random ids from a fixed seed; no sampling is timed.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/progress.h"
#include "cli/bench_command.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cuda/runtime.h"
#include "executor/device.h"
#include "kernels/bandwidth.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/peak.h"
#include "model/runner.h"
#include "sampling/rng.h"

namespace arbor::cli {
namespace cmd_bench {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string model;
  int threads = 0;
  int reps = 5;
  int32_t prompt = 512;
  int32_t gen = 128;
  std::vector<int32_t> batches = {1, 2, 4, 8, 16};
  std::vector<int32_t> verify = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  int32_t verify_context = 256;
  int32_t batch_prompt = 16;
  int32_t batch_steps = 32;
  int32_t block_size = 16;
  std::string kv_dtype = "f16";
  executor::Device device = executor::Device::kAuto;
  int cuda_device = 0;
  int bandwidth_mib = 256;
  bool json = false;
};

using Clock = std::chrono::steady_clock;

struct TestResult {
  std::string name;
  int64_t tokens = 0;        // tokens per timed run
  std::vector<double> rates;  // tokens/s of each timed run
  double bytes_per_step = 0;  // bytes read per forward (decode tests), 0 for prefill
  int32_t seqs = 1;           // tokens per forward step (decode tests)
  bool compute_bound = false;  // stated against the arithmetic peak
  // Read bandwidth (GB/s) probed right before each timed run of a memory-bound CPU test, [reps];
  // empty: the test is stated against the bandwidth probed at start.
  std::vector<double> probed_gbs;

  double stat(double q) const {  // q = 0 min, 0.5 median, 1 max
    std::vector<double> v = rates;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    if (q == 0.5 && n % 2 == 0) return (v[n / 2 - 1] + v[n / 2]) / 2;
    return v[static_cast<size_t>(q * (n - 1))];
  }
};

class ModelBench {
 public:
  ModelBench(model::ModelRunner& runner, const Options& o, int32_t blocks_per_seq)
      : runner_(runner), o_(o), blocks_per_seq_(blocks_per_seq), rng_(1234) {}

  Result<double> prefill_rate();
  Result<double> decode_rate();
  Result<double> batch_rate(int32_t num_seqs);
  // Seconds per (k+1)-token verification step (see the file comment).
  // Seconds per step for each of ks (one round: the context prefilled once, then every k).
  Result<std::vector<double>> verify_round(const std::vector<int32_t>& ks);

 private:
  std::vector<int32_t> random_tokens(int32_t n) {
    std::vector<int32_t> t(n);
    for (int32_t& id : t) id = static_cast<int32_t>(rng_.next_u64() % runner_.config().vocab_size);
    return t;
  }
  std::vector<int32_t> blocks_of(int32_t seq) const {
    return model::SingleSequence::contiguous_blocks(seq * blocks_per_seq_, blocks_per_seq_);
  }

  model::ModelRunner& runner_;
  const Options& o_;
  int32_t blocks_per_seq_;
  sampling::Rng rng_;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Result<double> ModelBench::prefill_rate() {
  model::SingleSequence seq(runner_, blocks_of(0));
  const std::vector<int32_t> tokens = random_tokens(o_.prompt);
  const Clock::time_point start = Clock::now();
  ARBOR_ASSIGN_OR_RETURN(auto logits, seq.append(tokens));
  (void)logits;
  return o_.prompt / seconds_since(start);
}

Result<double> ModelBench::decode_rate() {
  model::SingleSequence seq(runner_, blocks_of(0));
  const std::vector<int32_t> tokens = random_tokens(o_.gen + 1);
  ARBOR_ASSIGN_OR_RETURN(auto logits, seq.append({tokens.data(), 1}));
  const Clock::time_point start = Clock::now();
  for (int32_t i = 1; i <= o_.gen; ++i) {
    ARBOR_ASSIGN_OR_RETURN(logits, seq.append({&tokens[i], 1}));
  }
  return o_.gen / seconds_since(start);
}

Result<double> ModelBench::batch_rate(int32_t num_seqs) {
  std::vector<std::vector<int32_t>> tables(num_seqs), prompts(num_seqs);
  model::BatchBuilder builder(runner_.kv_cache().block_size());
  const bool recurrent = runner_.recurrent_states() != nullptr;
  for (int32_t b = 0; b < num_seqs; ++b) {
    tables[b] = blocks_of(b);
    prompts[b] = random_tokens(o_.batch_prompt);
    model::SequenceInput in{tables[b], 0, prompts[b], {}, {}, model::LogitsMode::kLast};
    if (recurrent) in.state_slot = b;
    builder.add(in);
  }
  std::vector<float> logits(static_cast<size_t>(num_seqs) * runner_.config().vocab_size);
  ARBOR_RETURN_IF_ERROR(runner_.forward(builder.batch(), logits.data()));  // prefill, untimed
  const std::vector<int32_t> steps = random_tokens(num_seqs * o_.batch_steps);
  const Clock::time_point start = Clock::now();
  for (int32_t step = 0; step < o_.batch_steps; ++step) {
    builder.clear();
    for (int32_t b = 0; b < num_seqs; ++b) {
      model::SequenceInput in{tables[b], o_.batch_prompt + step, {&steps[step * num_seqs + b], 1},
                              {}, {}, model::LogitsMode::kLast};
      if (recurrent) in.state_slot = b;
      builder.add(in);
    }
    ARBOR_RETURN_IF_ERROR(runner_.forward(builder.batch(), logits.data()));
  }
  return static_cast<double>(num_seqs) * o_.batch_steps / seconds_since(start);
}

Result<std::vector<double>> ModelBench::verify_round(const std::vector<int32_t>& ks) {
  constexpr int32_t kSteps = 16;
  model::SingleSequence seq(runner_, blocks_of(0));
  const std::vector<int32_t> context = random_tokens(o_.verify_context);
  ARBOR_ASSIGN_OR_RETURN(auto logits, seq.append(context));
  (void)logits;
  std::vector<double> seconds;
  // A recurrent model verifies as the executor does: into scratch slot 1, its state (slot 0)
  // untouched, so no truncation is needed (the K/V slots are simply written again).
  const std::vector<int32_t> table = blocks_of(0);
  model::BatchBuilder builder(runner_.kv_cache().block_size());
  std::vector<float> logits_all;
  for (int32_t k : ks) {
    const std::vector<int32_t> drafts = random_tokens(k + 1);
    const Clock::time_point start = Clock::now();
    for (int32_t step = 0; step < kSteps; ++step) {
      if (runner_.recurrent_states() == nullptr) {
        ARBOR_ASSIGN_OR_RETURN(auto all, seq.append_all_logits(drafts));
        (void)all;
        seq.truncate(o_.verify_context);
        continue;
      }
      builder.clear();
      model::SequenceInput in{table, o_.verify_context, drafts, {}, {}, model::LogitsMode::kAll};
      in.state_slot = 0;
      in.state_scratch = 1;
      builder.add(in);
      logits_all.resize(static_cast<size_t>(k + 1) * runner_.config().vocab_size);
      ARBOR_RETURN_IF_ERROR(runner_.forward(builder.batch(), logits_all.data()));
    }
    seconds.push_back(seconds_since(start) / kSteps);
  }
  return seconds;
}

// Bytes a decode step streams: every weight matrix once (the embedding only one row per token,
// unless it doubles as the classifier; of a mixture of experts' 3-D tensors, the k experts a
// token uses: k / E of them) plus K and V of `kv_tokens` cached positions.
struct ByteModel {
  double weight_bytes = 0;
  double kv_bytes_per_token = 0;
  double ops_per_token = 0;  // 2 x weight elements of the matrices a token goes through
  bool int8 = false;         // the largest matrices have int8 dot-product kernels
  bool bf16 = false;         // ... bf16 dot-product kernels (BF16 on AVX-512 BF16)
};

ByteModel byte_model(model::ModelRunner& runner) {
  ByteModel m;
  const auto& file = runner.model().file();
  const model::ModelConfig& c = runner.config();
  // A mixture of experts: a token goes through k of the E experts of each 3-D tensor.
  const double active = c.is_moe() ? double(c.num_experts_used) / c.num_experts : 1.0;
  uint64_t largest = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (t.name == "token_embd.weight" && !runner.model().weights().tied_output) continue;
    const double share = t.dims.size() == 3 ? active : 1.0;
    m.weight_bytes += share * static_cast<double>(t.size_bytes);
    if (t.dims.size() != 2 && t.dims.size() != 3) continue;
    m.ops_per_token += 2.0 * share * static_cast<double>(t.num_elements());
    if (t.size_bytes > largest) {
      largest = t.size_bytes;
      m.int8 = kernels::int8_kernels(t.type);
      m.bf16 = kernels::rounds_acts_to_bf16(t.type);
    }
  }
  const model::KvCacheShape& kv = runner.kv_cache().shape();
  m.kv_bytes_per_token =
      2.0 * kv.num_layers * kv.num_kv_heads * kv.head_dim * kernels::kv_dtype_size(kv.dtype);
  return m;
}


Result<kernels::KvDtype> parse_kv_dtype(const std::string& name) {
  if (name == "f16") return kernels::KvDtype::kF16;
  if (name == "f32") return kernels::KvDtype::kF32;
  return invalid_argument("--kv-dtype is ", name, ", must be f16 or f32");
}

Status validate(const Options& o) {
  if (o.reps < 1) return invalid_argument("--reps is ", o.reps, ", must be >= 1");
  if (o.prompt < 1 || o.gen < 1 || o.batch_prompt < 1 || o.batch_steps < 1) {
    return invalid_argument("-p, -n, --batch-prompt and --batch-steps must be >= 1 (got ", o.prompt,
                            ", ", o.gen, ", ", o.batch_prompt, ", ", o.batch_steps, ")");
  }
  for (int32_t b : o.batches) {
    if (b < 1 || b > 256) return invalid_argument("--batch entry ", b, " must be in [1, 256]");
  }
  for (int32_t k : o.verify) {
    if (k < 1 || k > 64) return invalid_argument("--verify entry ", k, " must be in [1, 64]");
  }
  if (o.verify_context < 1) {
    return invalid_argument("--verify-context is ", o.verify_context, ", must be >= 1");
  }
  if (o.block_size < 1) return invalid_argument("--block-size is ", o.block_size, ", must be >= 1");
  return ok_status();
}

// One untimed run, then o.reps timed ones. With a probe, a memory-bound test probes the read
// bandwidth before each timed run (3 reads of the probe's buffer, ~15 ms).
template <typename Fn>
Status run_test(TestResult& t, const Options& o, ProgressBar& bar, Fn fn,
                kernels::ReadBandwidthProbe* probe = nullptr) {
  for (int rep = 0; rep <= o.reps; ++rep) {
    if (rep > 0 && probe != nullptr && t.bytes_per_step > 0) {
      t.probed_gbs.push_back(probe->measure(3));
    }
    Result<double> rate = fn();
    if (!rate.ok()) return rate.status().with_context(t.name);
    if (rep > 0) t.rates.push_back(*rate);
    bar.add(1);
  }
  return ok_status();
}

// The bytes a test's steps read per second over the read bandwidth: the median over its runs of
// each run against the bandwidth probed just before it when there are probes (a shared host's
// bandwidth moves within seconds, so a reading taken minutes earlier says little), else the
// median run against `gbs`.
double bandwidth_fraction(const TestResult& t, double gbs) {
  if (t.bytes_per_step == 0) return 0;
  if (t.probed_gbs.size() == t.rates.size() && !t.rates.empty()) {
    TestResult per_run;
    for (size_t i = 0; i < t.rates.size(); ++i) {
      per_run.rates.push_back(t.bytes_per_step * (t.rates[i] / t.seqs) / (t.probed_gbs[i] * 1e9));
    }
    return per_run.stat(0.5);
  }
  if (gbs <= 0) return 0;
  return t.bytes_per_step * (t.stat(0.5) / t.seqs) / (gbs * 1e9);
}

// "median M (min-max) GB/s over N probes" of every probe the tests took, or "" without probes.
std::string probe_summary(const std::vector<TestResult>& tests) {
  TestResult all;
  for (const TestResult& t : tests) all.rates.insert(all.rates.end(), t.probed_gbs.begin(), t.probed_gbs.end());
  if (all.rates.empty()) return "";
  char buf[128];
  std::snprintf(buf, sizeof(buf), "median %.1f (%.1f-%.1f) GB/s over %zu probes", all.stat(0.5),
                all.stat(0), all.stat(1), all.rates.size());
  return buf;
}

// The peak a model's matrices run against, in ops/s.
double model_peak(const ByteModel& m, const kernels::ComputePeak& peak) {
  return (m.int8 ? peak.int8_gops : m.bf16 ? peak.bf16_gflops : peak.f32_gflops) * 1e9;
}

double peak_fraction(const TestResult& t, const ByteModel& m, double peak_ops) {
  if (!t.compute_bound || peak_ops <= 0) return 0;
  return t.stat(0.5) * m.ops_per_token / peak_ops;
}

void print_table(const std::vector<TestResult>& tests, double gbs, const ByteModel& m,
                 double peak_ops) {
  std::printf("| %-12s | %7s | %10s | %10s | %10s | %12s | %9s | %9s |\n", "test", "tokens",
              "min t/s", "median t/s", "max t/s", "MB read/step", "% of bw", "% of peak");
  std::printf("|--------------|---------|------------|------------|------------|--------------|"
              "-----------|-----------|\n");
  for (const TestResult& t : tests) {
    std::printf("| %-12s | %7lld | %10.2f | %10.2f | %10.2f |", t.name.c_str(),
                static_cast<long long>(t.tokens), t.stat(0), t.stat(0.5), t.stat(1));
    if (t.bytes_per_step > 0) {
      std::printf(" %12.1f | %8.1f%% |", t.bytes_per_step / 1e6, 100 * bandwidth_fraction(t, gbs));
    } else {
      std::printf(" %12s | %9s |", "-", "-");
    }
    if (t.compute_bound) {
      std::printf(" %8.1f%% |\n", 100 * peak_fraction(t, m, peak_ops));
    } else {
      std::printf(" %9s |\n", "-");
    }
  }
}

// verify[0] is the 1-token step; each row's cost is relative to it.
void print_verify_table(const std::vector<TestResult>& verify, const Options& o) {
  if (verify.empty()) return;
  std::printf("\nverification over %d cached tokens (median of %d):\n\n", o.verify_context,
              o.reps);
  std::printf("| %-12s | %11s | %10s | %13s |\n", "test", "tokens/step", "ms/step",
              "x decode step");
  std::printf("|--------------|-------------|------------|---------------|\n");
  const double base = verify[0].stat(0.5);
  for (const TestResult& t : verify) {
    std::printf("| %-12s | %11lld | %10.2f | %13.2f |\n", t.name.c_str(),
                static_cast<long long>(t.tokens), 1e3 * t.stat(0.5), t.stat(0.5) / base);
  }
}

void print_json(const std::vector<TestResult>& tests, const std::vector<TestResult>& verify,
                double gbs, const kernels::ComputePeak& peak,
                const ByteModel& m, const Options& o, model::ModelRunner& runner) {
  nlohmann::json j;
  j["model"] = o.model;
  j["config"] = runner.config().summary();
  j["threads"] = runner.pool().num_threads();
  j["device"] = std::string(runner.device_name());
  j["cpu"] = kernels::cpu_summary();
  j["isa"] = kernels::isa_summary();
  j["bandwidth_gbs"] = gbs;
  j["peak_f32_gflops"] = peak.f32_gflops;
  j["peak_int8_gops"] = peak.int8_gops;
  j["peak_bf16_gflops"] = peak.bf16_gflops;
  j["ops_per_token"] = m.ops_per_token;
  for (const TestResult& t : tests) {
    j["tests"].push_back({{"name", t.name},
                          {"tokens", t.tokens},
                          {"tokens_per_second", t.rates},
                          {"min", t.stat(0)},
                          {"median", t.stat(0.5)},
                          {"max", t.stat(1)},
                          {"bytes_per_step", t.bytes_per_step},
                          {"bandwidth_fraction", bandwidth_fraction(t, gbs)},
                          {"probed_bandwidth_gbs", t.probed_gbs},
                          {"peak_fraction", peak_fraction(t, m, model_peak(m, peak))}});
  }
  for (const TestResult& t : verify) {
    j["verify"].push_back({{"name", t.name},
                           {"tokens_per_step", t.tokens},
                           {"seconds_per_step", t.rates},
                           {"median_seconds", t.stat(0.5)},
                           {"cost_vs_decode_step", t.stat(0.5) / verify[0].stat(0.5)}});
  }
  std::printf("%s\n", j.dump(2).c_str());
}

Result<std::unique_ptr<model::ModelRunner>> load_runner(const Options& o,
                                                       const executor::DeviceChoice& device,
                                                       int32_t* blocks_per_seq) {
  ARBOR_ASSIGN_OR_RETURN(kernels::KvDtype kv_dtype, parse_kv_dtype(o.kv_dtype));
  ARBOR_ASSIGN_OR_RETURN(
      auto model,
      model::LlamaModel::load(o.model, {.pack_for_cpu = device.make_ops == nullptr}));
  const int32_t max_verify = o.verify.empty() ? 0 : *std::max_element(o.verify.begin(), o.verify.end());
  const int32_t longest = std::max({o.prompt, o.gen + 1, o.batch_prompt + o.batch_steps,
                                    o.verify.empty() ? 0 : o.verify_context + max_verify + 1});
  if (longest > model->config().context_length) {
    return out_of_range("a test needs ", longest, " positions; the model's context_length is ",
                        model->config().context_length);
  }
  *blocks_per_seq = (longest + o.block_size - 1) / o.block_size;
  const int32_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  model::RunnerOptions r;
  r.block_size = o.block_size;
  r.num_blocks = static_cast<int64_t>(*blocks_per_seq) * std::max(1, max_batch);
  r.kv_dtype = kv_dtype;
  r.num_threads = o.threads;
  r.reserve_tokens = std::max(o.prompt, max_batch * o.batch_prompt);
  r.make_ops = device.make_ops;
  // A recurrent model: a state slot per batched sequence, and slot 1 the verify test's scratch.
  r.state_slots = std::max(2, max_batch);
  return model::ModelRunner::create(std::move(model), r);
}

Status run(const Options& o) {
  ARBOR_RETURN_IF_ERROR(validate(o));
  ARBOR_ASSIGN_OR_RETURN(executor::DeviceChoice device,
                         executor::choose_device(o.device, o.cuda_device, o.model));
  ARBOR_LOG(kInfo) << "device: " << executor::device_name(device.device) << " (" << device.reason
                   << ")";
  const bool gpu = device.device == executor::Device::kCuda;
  int32_t blocks_per_seq = 0;
  ARBOR_ASSIGN_OR_RETURN(auto runner, load_runner(o, device, &blocks_per_seq));
  ARBOR_LOG(kInfo) << "model " << o.model << ": " << runner->config().summary();
  ARBOR_LOG(kInfo) << "threads " << runner->pool().num_threads() << ", cpu "
                   << kernels::cpu_summary() << ": " << kernels::isa_summary();
  // "% of bw" is against the device the weights are read from; "% of peak" only on the CPU.
  // On the CPU the decode tests also probe the bandwidth before each timed run (a GPU's does
  // not move with other tenants' traffic).
  double gbs = 0.0;
  kernels::ComputePeak peak;
  std::unique_ptr<kernels::ReadBandwidthProbe> probe;
  if (gpu) {
    ARBOR_ASSIGN_OR_RETURN(gbs, cuda::measure_read_bandwidth_gbs(o.cuda_device));
  } else {
    probe = std::make_unique<kernels::ReadBandwidthProbe>(
        runner->pool(), static_cast<size_t>(o.bandwidth_mib) << 20);
    gbs = probe->measure(5);
    peak = kernels::measure_compute_peak(runner->pool());
  }
  const ByteModel bytes = byte_model(*runner);
  ModelBench bench(*runner, o, blocks_per_seq);
  std::vector<TestResult> tests;
  tests.push_back({"pp" + std::to_string(o.prompt), o.prompt, {}, 0.0, 1, true, {}});
  tests.push_back({"tg" + std::to_string(o.gen), o.gen, {},
                   bytes.weight_bytes + bytes.kv_bytes_per_token * (1 + o.gen / 2.0), 1, false, {}});
  for (int32_t b : o.batches) {
    const double kv = bytes.kv_bytes_per_token * b * (o.batch_prompt + o.batch_steps / 2.0);
    tests.push_back({"batch " + std::to_string(b), int64_t{b} * o.batch_steps, {},
                     bytes.weight_bytes + kv, b, b >= 2, {}});
  }
  // Verification: K = 0 (a plain decode step) first, then every --verify entry.
  std::vector<int32_t> verify_ks = {0};
  verify_ks.insert(verify_ks.end(), o.verify.begin(), o.verify.end());
  std::vector<TestResult> verify(verify_ks.size());
  for (size_t i = 0; i < verify_ks.size(); ++i) {
    verify[i].name = "verify " + std::to_string(verify_ks[i]);
    verify[i].tokens = verify_ks[i] + 1;
  }
  ProgressBar bar("benchmarking",
                  static_cast<uint64_t>(tests.size() + (o.verify.empty() ? 0 : verify.size())) *
                      (o.reps + 1),
                  "runs");
  ARBOR_RETURN_IF_ERROR(run_test(tests[0], o, bar, [&] { return bench.prefill_rate(); }));
  ARBOR_RETURN_IF_ERROR(
      run_test(tests[1], o, bar, [&] { return bench.decode_rate(); }, probe.get()));
  for (size_t i = 0; i < o.batches.size(); ++i) {
    const int32_t b = o.batches[i];
    ARBOR_RETURN_IF_ERROR(
        run_test(tests[2 + i], o, bar, [&] { return bench.batch_rate(b); }, probe.get()));
  }
  if (o.verify.empty()) verify.clear();
  // "rates" hold seconds per step here; one untimed round first, as for the other tests.
  for (int round = 0; !verify.empty() && round <= o.reps; ++round) {
    ARBOR_ASSIGN_OR_RETURN(const std::vector<double> secs, bench.verify_round(verify_ks));
    for (size_t i = 0; round > 0 && i < verify.size(); ++i) verify[i].rates.push_back(secs[i]);
    bar.add(verify.size());
  }
  bar.finish();
  if (o.json) {
    print_json(tests, verify, gbs, peak, bytes, o, *runner);
    return ok_status();
  }
  std::printf("model: %s\n%s\ndevice: %s; threads: %d, cpu: %s; %s\n%s read bandwidth: %.1f "
              "GB/s; weights read per decode step: %.1f MB\n",
              o.model.c_str(), runner->config().summary().c_str(),
              std::string(runner->device_name()).c_str(), runner->pool().num_threads(),
              kernels::cpu_summary().c_str(), kernels::isa_summary().c_str(),
              gpu ? "device" : "host", gbs,
              bytes.weight_bytes / 1e6);
  if (const std::string probes = probe_summary(tests); !probes.empty()) {
    std::printf("probed before each decode run: %s; each run's %% of bw is against the probe "
                "just before it (median of the runs)\n",
                probes.c_str());
  }
  char bf16_peak[64] = "";
  if (peak.bf16_gflops > 0) {
    std::snprintf(bf16_peak, sizeof(bf16_peak), ", bf16 dot %.0f GFLOP/s", peak.bf16_gflops);
  }
  if (gpu) std::printf("compute peak: not measured on a GPU\n\n");
  if (!gpu) std::printf("compute peak: f32 FMA %.0f GFLOP/s, int8 dot %.0f GOP/s%s; %.2f GOP per token, "
              "stated against the %s peak\n\n",
              peak.f32_gflops, peak.int8_gops, bf16_peak, bytes.ops_per_token / 1e9,
              bytes.int8 ? "int8" : bytes.bf16 ? "bf16" : "f32");
  print_table(tests, gbs, bytes, model_peak(bytes, peak));
  print_verify_table(verify, o);
  return ok_status();
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "bench", "Benchmark a model: prefill, decode, batched decode, memory bandwidth");
  auto o = std::make_shared<Options>();
  sub->add_option("-m,--model", o->model, "GGUF model (required without a subcommand)");
  sub->add_option("-t,--threads", o->threads, "Threads; 0 = all cores")->capture_default_str();
  add_device_flags(*sub, &o->device, &o->cuda_device);
  sub->add_option("-r,--reps", o->reps, "Timed runs per test (after one warm-up)")
      ->capture_default_str();
  sub->add_option("-p,--n-prompt", o->prompt, "Prompt tokens of the prefill test")
      ->capture_default_str();
  sub->add_option("-n,--n-gen", o->gen, "Generated tokens of the decode test")
      ->capture_default_str();
  sub->add_option("--batch", o->batches, "Sequence counts of the batched decode tests")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--batch-prompt", o->batch_prompt, "Prompt tokens per batched sequence")
      ->capture_default_str();
  sub->add_option("--batch-steps", o->batch_steps, "Decode steps of each batched test")
      ->capture_default_str();
  sub->add_option("--verify", o->verify,
                  "Draft lengths K of the verification tests (K+1-token multi-query steps)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--verify-context", o->verify_context, "Cached tokens before each verification")
      ->capture_default_str();
  sub->add_option("--block-size", o->block_size, "KV block size")->capture_default_str();
  sub->add_option("--kv-dtype", o->kv_dtype, "KV element type: f16 or f32")->capture_default_str();
  sub->add_option("--bandwidth-mib", o->bandwidth_mib, "Buffer of the bandwidth test (MiB)")
      ->capture_default_str();
  sub->add_flag("--json", o->json, "Print JSON instead of the table");
  for (BenchSetup bench_setup : bench_commands()) bench_setup(*sub);
  sub->require_subcommand(0, 1);
  sub->callback([o, sub] {
    if (!sub->get_subcommands().empty()) return;  // `arbor bench <name>` ran its own callback
    if (o->model.empty()) exit_on_error(invalid_argument("arbor bench needs -m MODEL"));
    exit_on_error(run(*o));
  });
}
ARBOR_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
