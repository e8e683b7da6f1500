// arbor bench router: the router's figures in one run on this machine (docs/router.md,
// "Benchmark"): N replicas of one model (one thread each) behind `arbor router`, under the
// shared-prefix workload of `arbor bench serve --workload shared-prefix`, once per policy
// (prefix, round_robin, routed_text), against one replica serving everything with the pool of
// all N; then the router's overhead: time to first token through the router minus direct.
//
//   arbor bench router -m MODEL [--replicas 4] [--num-kv-blocks 256] [--max-concurrency 8]
//
// Every configuration starts fresh processes (empty caches). Prints a table and the ratios the
// router is held to: prefix throughput / round_robin >= 1.8, / routed_text >= 1.2; its prefix
// hit rate >= 90 % of the single replica's; overhead <= 1 ms median.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "cli/bench_command.h"
#include "cli/command.h"
#include "loadgen/client.h"
#include "loadgen/metrics.h"
#include "loadgen/plan.h"
#include "loadgen/url.h"
#include "shard/process.h"

namespace arbor::cli {
namespace cmd_bench_router {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string model;
  int32_t replicas = 4;
  int32_t threads = 1;
  int64_t num_kv_blocks = 256;
  int32_t max_concurrency = 8;
  std::vector<std::string> policies = {"prefix", "round_robin", "routed_text"};
  loadgen::SharedPrefixOptions workload;
  int32_t overhead_requests = 50;
  bool skip_single = false;
  std::vector<std::string> router_flags;  // more `arbor router` flags
};

std::string self_exe() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/exe", ec).string();
}

// The processes of one configuration, killed and reaped when it goes.
struct Fleet {
  std::string dir;
  std::vector<shard::ChildProcess> children;
  std::vector<int> replica_ports;
  int router_port = 0;
  ~Fleet() {
    for (auto& c : children) c.kill_and_reap();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

Result<int> wait_port(const std::string& file, shard::ChildProcess& child, const std::string& what) {
  for (int i = 0; i < 1200; ++i) {
    std::ifstream f(file);
    int port = 0;
    if (f >> port && port > 0) return port;
    if (auto exit = child.poll()) {
      return failed_precondition(what, " exited before listening: ", exit->describe());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return failed_precondition(what, " did not listen within 60 s");
}

// `replicas` replicas of `blocks` KV blocks each, and a router with `policy` unless empty.
Result<std::unique_ptr<Fleet>> start_fleet(const Options& o, int32_t replicas, int64_t blocks,
                                           const std::string& policy) {
  auto fleet = std::make_unique<Fleet>();
  fleet->dir = str_cat("/tmp/arbor-bench-router-", ::getpid(), "-", policy.empty() ? "single" : policy);
  std::filesystem::create_directories(fleet->dir);
  const std::string exe = self_exe();
  std::vector<std::string> sockets;
  for (int32_t i = 0; i < replicas; ++i) {
    const std::string port_file = str_cat(fleet->dir, "/p", i);
    sockets.push_back(str_cat("unix:", fleet->dir, "/r", i, ".sock"));
    ARBOR_ASSIGN_OR_RETURN(
        shard::ChildProcess c,
        shard::ChildProcess::spawn({exe, "--log-level", "warn", "serve", "-m", o.model, "--port",
                                    "0", "--port-file", port_file, "--threads",
                                    std::to_string(o.threads), "--num-kv-blocks",
                                    std::to_string(blocks), "--replica-listen", sockets.back(),
                                    "--log-stats-interval", "0"}));
    fleet->children.push_back(std::move(c));
    ARBOR_ASSIGN_OR_RETURN(int port, wait_port(port_file, fleet->children.back(),
                                                str_cat("replica ", i)));
    fleet->replica_ports.push_back(port);
  }
  if (!policy.empty()) {
    const std::string port_file = fleet->dir + "/pr";
    std::vector<std::string> argv = {exe, "--log-level", "warn", "router", "-m", o.model,
                                     "--port", "0", "--port-file", port_file, "--policy", policy,
                                     "--log-stats-interval", "0"};
    for (const std::string& s : sockets) argv.insert(argv.end(), {"--replica", s});
    argv.insert(argv.end(), o.router_flags.begin(), o.router_flags.end());
    ARBOR_ASSIGN_OR_RETURN(shard::ChildProcess c, shard::ChildProcess::spawn(argv));
    fleet->children.push_back(std::move(c));
    ARBOR_ASSIGN_OR_RETURN(fleet->router_port,
                           wait_port(port_file, fleet->children.back(), "the router"));
  }
  return fleet;
}

// The sum of a Prometheus counter over the samples named `name` (any labels).
double scrape(int port, const std::string& name) {
  auto url = loadgen::parse_server_url(str_cat("http://127.0.0.1:", port));
  if (!url.ok()) return 0;
  auto reply = loadgen::http_request(*url, "GET", "/metrics", "", 10.0);
  if (!reply.ok()) return 0;
  std::istringstream in(reply->body);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (!line.starts_with(name)) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    sum += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return sum;
}

struct Row {
  std::string name;
  int32_t replicas = 0;
  double hit_rate = 0;
  loadgen::ServingMetrics m;
};

Result<loadgen::ServingMetrics> run_workload(int port, const std::vector<loadgen::RequestPlan>& plans,
                                             int32_t concurrency) {
  ARBOR_ASSIGN_OR_RETURN(loadgen::ServerUrl server,
                         loadgen::parse_server_url(str_cat("http://127.0.0.1:", port)));
  std::vector<std::string> requests;
  std::vector<int64_t> lens;
  loadgen::BodyOptions body;
  for (const loadgen::RequestPlan& p : plans) {
    ARBOR_ASSIGN_OR_RETURN(std::string b, loadgen::request_body(p, body));
    requests.push_back(loadgen::http_post_text(server, "/v1/completions", b));
    lens.push_back(p.prompt_len);
  }
  loadgen::LoadOptions lo;
  lo.server = server;
  lo.max_concurrency = concurrency;
  ARBOR_ASSIGN_OR_RETURN(loadgen::LoadResult r,
                         loadgen::run_load(lo, requests, std::vector<double>(requests.size(), 0.0), lens));
  return loadgen::compute_metrics(r.records, r.duration_s, loadgen::SloSpec{});
}

Result<Row> measure(const Options& o, const std::vector<loadgen::RequestPlan>& plans,
                    const std::string& policy) {
  const bool single = policy.empty();
  const int32_t replicas = single ? 1 : o.replicas;
  const int64_t blocks = single ? o.num_kv_blocks * o.replicas : o.num_kv_blocks;
  ARBOR_ASSIGN_OR_RETURN(auto fleet, start_fleet(o, replicas, blocks, policy));
  Row row;
  row.name = single ? str_cat("one replica (", o.replicas, "x the pool)") : policy;
  row.replicas = replicas;
  ARBOR_ASSIGN_OR_RETURN(row.m, run_workload(single ? fleet->replica_ports[0] : fleet->router_port,
                                             plans, o.max_concurrency));
  double queries = 0, hits = 0;
  for (int port : fleet->replica_ports) {
    queries += scrape(port, "arbor_prefix_cache_queries_total");
    hits += scrape(port, "arbor_prefix_cache_hits_total");
  }
  row.hit_rate = queries > 0 ? hits / queries : 0;
  if (row.m.failed > 0) {
    ARBOR_LOG(kWarn) << row.name << ": " << row.m.failed << " request(s) failed";
  }
  return row;
}

// Median TTFT of one short streamed request at a time, direct and through the router
// (alternating, so both see the same machine).
Result<std::pair<double, double>> overhead(const Options& o) {
  ARBOR_ASSIGN_OR_RETURN(auto fleet, start_fleet(o, 1, o.num_kv_blocks, "prefix"));
  loadgen::RequestPlan plan;
  plan.prompt_json = "[10,11,12,13,14,15,16,17]";
  plan.prompt_len = 8;
  plan.max_tokens = 1;
  std::vector<double> direct, routed;
  for (int32_t i = 0; i < o.overhead_requests; ++i) {
    for (int which = 0; which < 2; ++which) {
      ARBOR_ASSIGN_OR_RETURN(
          loadgen::ServingMetrics m,
          run_workload(which == 0 ? fleet->replica_ports[0] : fleet->router_port, {plan}, 1));
      if (m.completed == 1) (which == 0 ? direct : routed).push_back(m.ttft.median);
    }
  }
  return std::pair{loadgen::percentile(direct, 50), loadgen::percentile(routed, 50)};
}

Status run(const Options& o) {
  std::vector<loadgen::RequestPlan> plans;
  ARBOR_ASSIGN_OR_RETURN(plans, loadgen::shared_prefix_plan(o.workload));
  int64_t prompt_tokens = 0;
  for (const auto& p : plans) prompt_tokens += p.prompt_len;
  std::printf("workload: %zu requests (%d users x %d turns; %d system prompts of %d tokens, "
              "turns of %d), %lld prompt tokens, %d output tokens each; concurrency %d; "
              "%d replicas x %lld KV blocks, %d thread(s) each\n",
              plans.size(), o.workload.num_users, o.workload.turns, o.workload.num_system_prompts,
              o.workload.system_prompt_len, o.workload.turn_len,
              static_cast<long long>(prompt_tokens), o.workload.output_len, o.max_concurrency,
              o.replicas, static_cast<long long>(o.num_kv_blocks), o.threads);
  std::vector<Row> rows;
  std::vector<std::string> configs;
  if (!o.skip_single) configs.push_back("");
  configs.insert(configs.end(), o.policies.begin(), o.policies.end());
  for (const std::string& policy : configs) {
    std::fprintf(stderr, "running %s ...\n", policy.empty() ? "one replica" : policy.c_str());
    ARBOR_ASSIGN_OR_RETURN(Row row, measure(o, plans, policy));
    rows.push_back(std::move(row));
  }
  std::printf("\n| configuration | replicas | prefix hit rate | req/s | prompt+output tok/s | "
              "TTFT p50 ms | TTFT p90 ms | failed |\n|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %d | %.1f %% | %.2f | %.0f | %.1f | %.1f | %lld |\n", r.name.c_str(),
                r.replicas, 100 * r.hit_rate, r.m.request_throughput, r.m.total_token_throughput,
                1e3 * r.m.ttft.median, 1e3 * r.m.ttft.p90, static_cast<long long>(r.m.failed));
  }
  auto find = [&](const std::string& name) -> const Row* {
    for (const Row& r : rows) {
      if (r.name == name) return &r;
    }
    return nullptr;
  };
  const Row* prefix = find("prefix");
  if (prefix != nullptr) {
    if (const Row* rr = find("round_robin")) {
      std::printf("prefix / round_robin throughput: %.2fx (target >= 1.8)\n",
                  prefix->m.request_throughput / rr->m.request_throughput);
    }
    if (const Row* rt = find("routed_text")) {
      std::printf("prefix / routed_text throughput: %.2fx (target >= 1.2)\n",
                  prefix->m.request_throughput / rt->m.request_throughput);
    }
    if (!o.skip_single) {
      std::printf("prefix hit rate / one replica's: %.1f %% (target >= 90 %%)\n",
                  100 * prefix->hit_rate / std::max(rows[0].hit_rate, 1e-9));
    }
  }
  if (o.overhead_requests > 0) {
    ARBOR_ASSIGN_OR_RETURN(auto ttft, overhead(o));
    std::printf("router overhead: TTFT median %.3f ms direct, %.3f ms through the router: "
                "+%.3f ms (target <= 1 ms; %d requests each, one at a time)\n",
                1e3 * ttft.first, 1e3 * ttft.second, 1e3 * (ttft.second - ttft.first),
                o.overhead_requests);
  }
  return ok_status();
}

void setup(CLI::App& bench) {
  auto* sub = bench.add_subcommand(
      "router", "The router's throughput, prefix hit rate and overhead: replicas behind `arbor "
                "router` under the shared-prefix workload, per routing policy (docs/router.md)");
  auto o = std::make_shared<Options>();
  o->workload.num_users = 32;
  sub->add_option("-m,--model", o->model, "GGUF model every replica serves")->required();
  sub->add_option("--replicas", o->replicas, "Replicas behind the router")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("-t,--threads", o->threads, "Threads per replica")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  sub->add_option("--num-kv-blocks", o->num_kv_blocks,
                  "KV blocks per replica (the single replica gets --replicas times as many)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 30))
      ->capture_default_str();
  sub->add_option("--max-concurrency", o->max_concurrency, "Requests in flight at most")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--policies", o->policies, "Routing policies to run, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"prefix", "round_robin", "routed_text"}))
      ->capture_default_str();
  sub->add_flag("--skip-single", o->skip_single, "Do not run the one-replica reference");
  sub->add_option("--router-flag", o->router_flags,
                  "A flag for `arbor router` (repeat; e.g. --router-flag=--balance-abs "
                  "--router-flag=8)")
      ->allow_extra_args(false);
  sub->add_option("--num-system-prompts", o->workload.num_system_prompts, "Distinct system prompts")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--system-prompt-len", o->workload.system_prompt_len, "Tokens per system prompt")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--num-users", o->workload.num_users, "Users (one chat each)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--turns", o->workload.turns, "Turns per chat")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--turn-len", o->workload.turn_len, "Tokens each turn adds")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--output-len", o->workload.output_len, "Output tokens per request")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--vocab-size", o->workload.vocab_size,
                  "Token ids are drawn from [3, N); at most the model's vocabulary")
      ->check(CLI::Range(4, 1 << 24))
      ->capture_default_str();
  sub->add_option("--seed", o->workload.seed, "Seed of the workload")->capture_default_str();
  sub->add_option("--overhead-requests", o->overhead_requests,
                  "Requests each way for the router's TTFT overhead; 0 = skip")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  sub->callback([o] { exit_on_error(run(*o)); });
}
ARBOR_REGISTER_BENCH_COMMAND(setup);

}  // namespace cmd_bench_router
}  // namespace arbor::cli
