// arbor bench tp: tensor parallelism on this host (docs/tensor_parallel.md, docs/benchmarks.md).
//
//   arbor bench tp -m model.gguf [--tp 2] [-n 64] [-r 3] [--json]
//
// 1. The shared-memory all-reduce's latency among --tp forked ranks at 4 KiB .. 256 KiB (the
//    decode step sends dim * 4 bytes per all-reduce, two per layer): the median of many calls.
// 2. Greedy decode tokens/s of one process with --tp threads against --tp forked ranks (one
//    TP rank each, one thread each) on the same file, after the same 16-token prompt: the
//    medians of -r runs of -n tokens. The two must produce the same tokens (checked).
// 2b. What the canonical K segments cost at TP = 1: the same one-process decode with the
//    row-parallel matrices as one segment (ModelLoadOptions::max_segments = 1), interleaved
//    with the segmented runs so that the host's drift hits both alike.
// 3. The expected TP speed-up where each rank has its own socket (memory bandwidth): the
//    single-rank step time halves (or quarters) and the measured all-reduce time is added:
//    t_tp = t_1 / tp + 2 * layers * allreduce(dim * 4 bytes).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_command.h"
#include "cli/command.h"
#include "collective/shm_collective.h"
#include "model/batch_builder.h"
#include "model/runner.h"

namespace arbor::cli {
namespace cmd_bench_tp {  // named, not anonymous: the commands share unity sources

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model;
  int tp = 2;
  int n_gen = 64;
  int reps = 3;
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Shared anonymous memory that forked ranks report into.
struct Shared {
  explicit Shared(size_t n) : bytes(n) {
    p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ARBOR_CHECK(p != MAP_FAILED);
    std::memset(p, 0, n);
  }
  ~Shared() { munmap(p, bytes); }
  void* p;
  size_t bytes;
};

// Runs fn(rank, collective) in `tp` forked processes; OK when every one returns OK.
template <class Fn>
Status fork_ranks(int tp, const Fn& fn) {
  ARBOR_ASSIGN_OR_RETURN(auto region,
                         collective::ShmRegion::create_anonymous({tp, size_t{1} << 20}));
  std::vector<pid_t> kids;
  for (int r = 0; r < tp; ++r) {
    const pid_t pid = fork();
    if (pid < 0) return io_error("fork failed");
    if (pid == 0) {
      auto c = std::make_shared<collective::ShmCollective>(region, r);
      const Status s = fn(r, c);
      if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", r, s.to_string().c_str());
      _exit(s.ok() ? 0 : 1);
    }
    kids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  if (failed > 0) return internal_error(failed, " of ", tp, " ranks failed");
  return ok_status();
}

// Median microseconds of one all-reduce of each size in `bytes`, measured on rank 0.
Result<std::vector<double>> allreduce_latency(int tp, const std::vector<size_t>& bytes) {
  Shared out(bytes.size() * sizeof(double));
  ARBOR_RETURN_IF_ERROR(fork_ranks(tp, [&](int rank, std::shared_ptr<collective::Collective> c) {
    for (size_t i = 0; i < bytes.size(); ++i) {
      std::vector<float> v(bytes[i] / 4, 1.0f);
      std::vector<double> us;
      for (uint32_t k = 0; k < 2000; ++k) {
        const auto t0 = Clock::now();
        ARBOR_RETURN_IF_ERROR(c->all_reduce_sum(v.data(), (int64_t)v.size(), {i, 0, k}));
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      if (rank == 0) static_cast<double*>(out.p)[i] = median(us);
    }
    return ok_status();
  }));
  const auto* p = static_cast<const double*>(out.p);
  return std::vector<double>(p, p + bytes.size());
}

// Greedy decode on one runner: a 16-token prompt, then n_gen tokens, reps times (each run on
// fresh positions). Writes tokens/s of each run's decode to `tps` and the first run's tokens.
Status decode(const std::string& path, int threads, const model::TpContext& tp, const Options& o,
              double* tps, int32_t* tokens, uint64_t* resident,
              int max_segments = model::kMaxSegments) {
  model::RunnerOptions ro;
  ro.num_threads = threads;
  ro.tp = tp;
  ro.max_segments = max_segments;
  const int32_t per_run = 16 + o.n_gen;
  ro.num_blocks = (per_run + 15) / 16 + 1;
  ARBOR_ASSIGN_OR_RETURN(auto runner, model::ModelRunner::load(path, ro));
  *resident = runner->model().resident_weight_bytes();
  std::vector<int32_t> table(static_cast<size_t>(ro.num_blocks - 1));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i + 1);
  model::BatchBuilder builder(16);
  const model::RowOut want[] = {model::RowOut::kArgmax};
  std::vector<float> logits(static_cast<size_t>(runner->config().vocab_size));
  for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms up
    std::vector<int32_t> seq;
    for (int i = 0; i < 16; ++i) seq.push_back(1 + (i * 37) % 500);
    Clock::time_point t0;
    for (int step = 0; step <= o.n_gen; ++step) {
      if (step == 1) t0 = Clock::now();
      const int32_t done = step == 0 ? 0 : static_cast<int32_t>(seq.size()) - 1;
      builder.clear();
      model::SequenceInput in;
      in.block_table = table;
      in.num_committed = done;
      in.tokens = std::span<const int32_t>(seq).subspan(done);
      builder.add(in);
      int32_t next = 0;
      model::LogitsOut out;
      out.logits = logits.data();  // the CPU computes the row in place
      out.want = want;
      out.argmax = &next;
      ARBOR_RETURN_IF_ERROR(runner->forward(builder.batch(), out));
      // Only rank 0 has the argmax; the engine would send the token to every rank.
      if (tp.size > 1) {
        ARBOR_RETURN_IF_ERROR(tp.collective->broadcast(&next, sizeof(next), {0, 0, 0}));
      }
      seq.push_back(next);
      if (rep == 1 && step < o.n_gen) tokens[step] = next;
    }
    if (rep > 0) {
      tps[rep - 1] = o.n_gen / std::chrono::duration<double>(Clock::now() - t0).count();
    }
  }
  return ok_status();
}

Status run(const Options& o) {
  if (o.tp != 2 && o.tp != 4) return invalid_argument("--tp ", o.tp, ": 2 or 4");
  model::ModelLoadOptions probe_options;
  probe_options.pack_for_cpu = false;
  ARBOR_ASSIGN_OR_RETURN(auto probe, model::LlamaModel::load(o.model, probe_options));
  const model::ModelConfig cfg = probe->config();
  probe.reset();
  const std::vector<size_t> sizes = {4096, 8192, 16384, 32768, 65536, 262144};
  ARBOR_ASSIGN_OR_RETURN(std::vector<double> lat, allreduce_latency(o.tp, sizes));
  // One process, tp threads.
  std::vector<double> one_tps(o.reps);
  std::vector<int32_t> one_tokens(o.n_gen), tp_tokens(o.n_gen);
  uint64_t one_resident = 0;
  ARBOR_RETURN_IF_ERROR(
      decode(o.model, o.tp, {}, o, one_tps.data(), one_tokens.data(), &one_resident));
  // The same with one K segment (what the canonical segments cost at TP = 1), then the
  // segmented runs again: the medians of both segmented series against the whole-K one.
  std::vector<double> whole_tps(o.reps), again_tps(o.reps);
  std::vector<int32_t> whole_tokens(o.n_gen), again_tokens(o.n_gen);
  uint64_t ignored = 0;
  ARBOR_RETURN_IF_ERROR(decode(o.model, o.tp, {}, o, whole_tps.data(), whole_tokens.data(),
                               &ignored, /*max_segments=*/1));
  ARBOR_RETURN_IF_ERROR(
      decode(o.model, o.tp, {}, o, again_tps.data(), again_tokens.data(), &ignored));
  one_tps.insert(one_tps.end(), again_tps.begin(), again_tps.end());
  // tp ranks, one thread each: rank 0 reports.
  const size_t tokens_bytes = (sizeof(int32_t) * o.n_gen + 7) / 8 * 8;
  Shared out(sizeof(double) * o.reps + tokens_bytes + sizeof(uint64_t) * o.tp);
  auto* rank_resident = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(out.p) +
                                                    sizeof(double) * o.reps + tokens_bytes);
  ARBOR_RETURN_IF_ERROR(fork_ranks(o.tp, [&](int rank, std::shared_ptr<collective::Collective> c) {
    std::vector<double> tps(o.reps);
    std::vector<int32_t> toks(o.n_gen);
    ARBOR_RETURN_IF_ERROR(decode(o.model, 1, {rank, o.tp, c}, o, tps.data(), toks.data(),
                                 &rank_resident[rank]));
    if (rank == 0) {
      std::memcpy(out.p, tps.data(), sizeof(double) * o.reps);
      std::memcpy(static_cast<double*>(out.p) + o.reps, toks.data(), sizeof(int32_t) * o.n_gen);
    }
    return ok_status();
  }));
  const auto* tp_tps = static_cast<const double*>(out.p);
  std::memcpy(tp_tokens.data(), tp_tps + o.reps, sizeof(int32_t) * o.n_gen);
  const double one = median(one_tps), tpm = median({tp_tps, tp_tps + o.reps});
  const double whole = median(whole_tps);
  // The decode step's all-reduce: dim floats; interpolate the measured sizes.
  const size_t step_bytes = static_cast<size_t>(cfg.dim) * 4;
  double step_lat = lat.back();
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] >= step_bytes) {
      step_lat = lat[i];
      break;
    }
  }
  const double comm_ms = 2.0 * cfg.num_layers * step_lat / 1000.0;
  // A one-socket run of the single process gives t_1; at TP on tp sockets each rank streams
  // 1/tp of the weights from its own memory.
  const double t1_ms = 1000.0 / one;
  const double expected = t1_ms / (t1_ms / o.tp + comm_ms);
  const bool same = one_tokens == tp_tokens;
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["tp"] = o.tp;
    for (size_t i = 0; i < sizes.size(); ++i) j["allreduce_us"][std::to_string(sizes[i])] = lat[i];
    j["decode_tps_one_process"] = one;
    j["decode_tps_tp"] = tpm;
    j["decode_tps_one_process_one_segment"] = whole;
    j["segment_cost"] = whole / one - 1.0;
    j["ratio"] = tpm / one;
    j["comm_ms_per_token"] = comm_ms;
    j["expected_speedup_multi_socket"] = expected;
    j["same_tokens"] = same;
    j["resident_weight_bytes_one_process"] = one_resident;
    for (int r = 0; r < o.tp; ++r) j["resident_weight_bytes_rank"].push_back(rank_resident[r]);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("shm all-reduce among %d ranks (median of 2000 calls):\n", o.tp);
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::printf("  %7zu bytes  %8.2f us\n", sizes[i], lat[i]);
    }
    std::printf("decode (%d tokens, median of %d runs):\n", o.n_gen, o.reps);
    std::printf("  one process, %d threads    %8.2f tok/s\n", o.tp, one);
    std::printf("  ... with one K segment    %8.2f tok/s  (canonical segments cost %.1f %%)\n",
                whole, 100.0 * (whole / one - 1.0));
    std::printf("  TP=%d, one thread per rank  %8.2f tok/s  (%.3fx)\n", o.tp, tpm, tpm / one);
    std::printf("  communication per token: 2 x %d layers x %.2f us = %.3f ms\n", cfg.num_layers,
                step_lat, comm_ms);
    std::printf("  expected on %d sockets: %.2fx (t_1 / (t_1 / %d + comm), t_1 = %.2f ms)\n",
                o.tp, expected, o.tp, t1_ms);
    std::printf("  same tokens: %s\n", same ? "yes" : "NO");
    std::printf("resident weights: one process %.1f MiB; per rank", one_resident / 1048576.0);
    for (int r = 0; r < o.tp; ++r) std::printf(" %.1f", rank_resident[r] / 1048576.0);
    std::printf(" MiB\n");
  }
  if (!same) return internal_error("TP=", o.tp, " decoded different tokens from one process");
  return ok_status();
}

void setup(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  auto* sub = bench.add_subcommand(
      "tp", "Tensor parallelism on this host: shm all-reduce latency, decode with N forked ranks "
            "(one thread each) against one process with N threads (docs/tensor_parallel.md)");
  sub->add_option("-m,--model", o->model, "GGUF model")->required();
  sub->add_option("--tp", o->tp, "Ranks: 2 or 4")->capture_default_str();
  sub->add_option("-n,--n-gen", o->n_gen, "Generated tokens per run")->capture_default_str();
  sub->add_option("-r,--reps", o->reps, "Timed runs (after one warm-up)")->capture_default_str();
  sub->add_flag("--json", o->json, "Print JSON instead of the table");
  sub->callback([o] { exit_on_error(run(*o)); });
}
ARBOR_REGISTER_BENCH_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
