// arbor bench router: the router's figures in one run on this machine (docs/router.md,
// "Benchmark"): N replicas of one model (one thread each) behind `arbor router`, under the
// shared-prefix workload of `arbor bench serve --workload shared-prefix`, once per policy
// (prefix, round_robin, routed_text), against one replica serving everything with the pool of
// all N; then the router's overhead: time to first token through the router minus direct.
// Each policy runs behind one router and behind several (--routers 1,2: the clients split
// evenly over R routers in front of the same replicas, as a Service spreads connections over
// router pods; a chat's turns land on any of them).
//
//   arbor bench router -m MODEL [--replicas 4] [--routers 1,2] [--num-kv-blocks 400]
//                      [--max-concurrency 8]
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
  std::vector<int32_t> routers = {1, 2};  // router counts to run each policy behind
  int32_t threads = 1;
  int64_t num_kv_blocks = 400;
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
  std::vector<int> router_ports;
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

// `replicas` replicas of `blocks` KV blocks each, and `routers` routers with `policy` in front
// of all of them unless `policy` is empty.
Result<std::unique_ptr<Fleet>> start_fleet(const Options& o, int32_t replicas, int64_t blocks,
                                           const std::string& policy, int32_t routers) {
  auto fleet = std::make_unique<Fleet>();
  fleet->dir = str_cat("/tmp/arbor-bench-router-", ::getpid(), "-",
                       policy.empty() ? "single" : str_cat(policy, "-", routers));
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
  for (int32_t k = 0; k < routers && !policy.empty(); ++k) {
    const std::string port_file = str_cat(fleet->dir, "/pr", k);
    std::vector<std::string> argv = {exe, "--log-level", "warn", "router", "-m", o.model,
                                     "--port", "0", "--port-file", port_file, "--policy", policy,
                                     "--log-stats-interval", "0"};
    for (const std::string& s : sockets) argv.insert(argv.end(), {"--replica", s});
    argv.insert(argv.end(), o.router_flags.begin(), o.router_flags.end());
    ARBOR_ASSIGN_OR_RETURN(shard::ChildProcess c, shard::ChildProcess::spawn(argv));
    fleet->children.push_back(std::move(c));
    ARBOR_ASSIGN_OR_RETURN(int port,
                           wait_port(port_file, fleet->children.back(), str_cat("router ", k)));
    fleet->router_ports.push_back(port);
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
  std::string policy;  // "" for the one-replica reference
  int32_t replicas = 0;
  int32_t routers = 0;
  double hit_rate = 0;
  std::string decisions;  // the routers' decisions by reason: "prefix 120, load 8, ..."
  loadgen::ServingMetrics m;
};

// Request i goes to ports[i % ports.size()] (plans are shuffled within each round of turns, so
// a chat's turns land on different ports); each port's clients keep concurrency / ports
// requests in flight (at least one). Throughput is over the slowest port's duration.
Result<loadgen::ServingMetrics> run_workload(const std::vector<int>& ports,
                                             const std::vector<loadgen::RequestPlan>& plans,
                                             int32_t concurrency) {
  const size_t n = ports.size();
  std::vector<loadgen::LoadOptions> options(n);
  std::vector<std::vector<std::string>> requests(n);
  std::vector<std::vector<int64_t>> lens(n);
  for (size_t k = 0; k < n; ++k) {
    ARBOR_ASSIGN_OR_RETURN(options[k].server,
                           loadgen::parse_server_url(str_cat("http://127.0.0.1:", ports[k])));
    options[k].max_concurrency = std::max<int32_t>(1, concurrency / static_cast<int32_t>(n));
  }
  loadgen::BodyOptions body;
  for (size_t i = 0; i < plans.size(); ++i) {
    ARBOR_ASSIGN_OR_RETURN(std::string b, loadgen::request_body(plans[i], body));
    requests[i % n].push_back(loadgen::http_post_text(options[i % n].server, "/v1/completions", b));
    lens[i % n].push_back(plans[i].prompt_len);
  }
  std::vector<Result<loadgen::LoadResult>> results(n, failed_precondition("not run"));
  std::vector<std::thread> threads;
  for (size_t k = 0; k < n; ++k) {
    threads.emplace_back([&, k] {
      results[k] = loadgen::run_load(options[k], requests[k],
                                     std::vector<double>(requests[k].size(), 0.0), lens[k]);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<loadgen::RequestRecord> records;
  double duration = 0;
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    records.insert(records.end(), r->records.begin(), r->records.end());
    duration = std::max(duration, r->duration_s);
  }
  for (const loadgen::RequestRecord& r : records) {
    if (r.outcome == loadgen::Outcome::kFailed) {
      ARBOR_LOG(kWarn) << "a request failed: " << r.error;
      break;
    }
  }
  return loadgen::compute_metrics(records, duration, loadgen::SloSpec{});
}

Result<Row> measure(const Options& o, const std::vector<loadgen::RequestPlan>& plans,
                    const std::string& policy, int32_t routers) {
  const bool single = policy.empty();
  const int32_t replicas = single ? 1 : o.replicas;
  const int64_t blocks = single ? o.num_kv_blocks * o.replicas : o.num_kv_blocks;
  ARBOR_ASSIGN_OR_RETURN(auto fleet, start_fleet(o, replicas, blocks, policy, routers));
  Row row;
  row.name = single ? str_cat("one replica (", o.replicas, "x the pool)") : policy;
  row.policy = policy;
  row.replicas = replicas;
  row.routers = single ? 0 : routers;
  ARBOR_ASSIGN_OR_RETURN(row.m, run_workload(single ? fleet->replica_ports : fleet->router_ports,
                                             plans, o.max_concurrency));
  double queries = 0, hits = 0;
  for (int port : fleet->replica_ports) {
    queries += scrape(port, "arbor_prefix_cache_queries_total");
    hits += scrape(port, "arbor_prefix_cache_hits_total");
  }
  row.hit_rate = queries > 0 ? hits / queries : 0;
  for (const char* reason : {"prefix", "load", "imbalance", "session"}) {
    double n = 0;
    for (int port : fleet->router_ports) {
      n += scrape(port, str_cat("arbor_router_routed_total{reason=\"", reason, "\"}"));
    }
    if (n > 0) row.decisions += str_cat(row.decisions.empty() ? "" : ", ", reason, " ", n);
  }
  if (row.m.failed > 0) {
    ARBOR_LOG(kWarn) << row.name << ": " << row.m.failed << " request(s) failed";
  }
  return row;
}

// Median TTFT of one short streamed request at a time, direct and through the router
// (alternating, so both see the same machine).
Result<std::pair<double, double>> overhead(const Options& o) {
  ARBOR_ASSIGN_OR_RETURN(auto fleet, start_fleet(o, 1, o.num_kv_blocks, "prefix", 1));
  loadgen::RequestPlan plan;
  plan.prompt_json = "[10,11,12,13,14,15,16,17]";
  plan.prompt_len = 8;
  plan.max_tokens = 1;
  std::vector<double> direct, routed;
  for (int32_t i = 0; i < o.overhead_requests; ++i) {
    for (int which = 0; which < 2; ++which) {
      ARBOR_ASSIGN_OR_RETURN(
          loadgen::ServingMetrics m,
          run_workload({which == 0 ? fleet->replica_ports[0] : fleet->router_ports[0]}, {plan}, 1));
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
  if (!o.skip_single) {
    std::fprintf(stderr, "running one replica ...\n");
    ARBOR_ASSIGN_OR_RETURN(Row row, measure(o, plans, "", 0));
    rows.push_back(std::move(row));
  }
  for (int32_t routers : o.routers) {
    for (const std::string& policy : o.policies) {
      std::fprintf(stderr, "running %s behind %d router(s) ...\n", policy.c_str(), routers);
      ARBOR_ASSIGN_OR_RETURN(Row row, measure(o, plans, policy, routers));
      rows.push_back(std::move(row));
    }
  }
  std::printf("\n| configuration | replicas | routers | prefix hit rate | req/s | "
              "prompt+output tok/s | TTFT p50 ms | TTFT p90 ms | failed | decisions |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %d | %d | %.1f %% | %.2f | %.0f | %.1f | %.1f | %lld | %s |\n",
                r.name.c_str(), r.replicas, r.routers, 100 * r.hit_rate, r.m.request_throughput,
                r.m.total_token_throughput, 1e3 * r.m.ttft.median, 1e3 * r.m.ttft.p90,
                static_cast<long long>(r.m.failed), r.decisions.c_str());
  }
  auto find = [&](const std::string& policy, int32_t routers) -> const Row* {
    for (const Row& r : rows) {
      if (r.policy == policy && r.routers == routers) return &r;
    }
    return nullptr;
  };
  for (int32_t routers : o.routers) {
    const Row* prefix = find("prefix", routers);
    if (prefix == nullptr) continue;
    if (const Row* rr = find("round_robin", routers)) {
      std::printf("%d router(s): prefix / round_robin throughput: %.2fx (target >= 1.8)\n",
                  routers, prefix->m.request_throughput / rr->m.request_throughput);
    }
    if (const Row* rt = find("routed_text", routers)) {
      std::printf("%d router(s): prefix / routed_text throughput: %.2fx (target >= 1.2)\n",
                  routers, prefix->m.request_throughput / rt->m.request_throughput);
    }
    if (!o.skip_single) {
      std::printf("%d router(s): prefix hit rate / one replica's: %.1f %% (target >= 90 %%)\n",
                  routers, 100 * prefix->hit_rate / std::max(rows[0].hit_rate, 1e-9));
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
  // The default workload (docs/benchmarks.md, "Router and replicas"): 8 system prompts of 1024
  // tokens, 32 chats of 6 turns of 128 tokens; 4 replicas of 400 blocks hold the system prompts
  // once and part of the chats, so the routing decides what is recomputed.
  o->workload.num_users = 32;
  o->workload.num_system_prompts = 8;
  o->workload.system_prompt_len = 1024;
  o->workload.turns = 6;
  o->workload.turn_len = 128;
  sub->add_option("-m,--model", o->model, "GGUF model every replica serves")->required();
  sub->add_option("--replicas", o->replicas, "Replicas behind the router")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--routers", o->routers,
                  "Router counts to run each policy behind, comma-separated (clients split "
                  "evenly over the routers)")
      ->delimiter(',')
      ->check(CLI::Range(1, 16))
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
