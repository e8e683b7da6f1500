// arbor router: the HTTP API of `arbor serve` in front of N replicas (docs/router.md).
//
//   arbor router -m MODEL --replica ADDR [--replica ADDR ...] [--replicas-file FILE]
//                [--policy prefix|round_robin|routed_text] [HTTP flags as arbor serve]
//
// Each replica is an `arbor serve -m MODEL --replica-listen ADDR` (the same model file). The
// router reads only the file's tokenizer, chat template and task facts (no weights): it parses,
// templates and tokenises every request itself, routes it to the replica whose prefix cache
// holds most of it (exactly: each replica streams its cache's changes), moves requests off
// replicas that fail, and resumes streams there token for token.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "cli/api_flags.h"
#include "cli/command.h"
#include "cli/serve_task.h"
#include "gguf/gguf.h"
#include "router/router_engine.h"
#include "server/server.h"

namespace arbor::cli {
namespace cmd_router {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string model;
  ApiFlags api;
  TaskOptions task;
  router::RouterOptions router;
  std::string policy = "prefix";
};

Status run(Options o) {
  ARBOR_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::from_file(o.model));
  ARBOR_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::open(o.model));
  ARBOR_ASSIGN_OR_RETURN(TaskFacts facts, task_facts(file));
  server::ModelInfo info;
  ARBOR_RETURN_IF_ERROR(setup_task(o.task, facts, *tok, &info));
  info.max_pooling_inputs = 2048;
  std::unique_ptr<server::ChatRenderer> chat;
  ARBOR_RETURN_IF_ERROR(fill_model_info(o.api, o.model, *tok, tok->vocab_size(), &info, &chat));
  o.router.policy = *router::parse_route_policy(o.policy);
  o.router.vocab_size = tok->vocab_size();
  ARBOR_LOG(kInfo) << "router: " << o.router.replicas.size() << " replica(s) from flags"
                   << (o.router.replicas_file.empty()
                           ? std::string()
                           : str_cat(", more from ", o.router.replicas_file))
                   << "; policy " << o.policy << " (load " << o.router.weights.load_tokens
                   << " tokens per running request; imbalance beyond "
                   << o.router.weights.imbalance << "x and +" << o.router.weights.balance_abs
                   << " requests)";
  ARBOR_ASSIGN_OR_RETURN(auto engine, router::RouterEngine::create(o.router));
  const server::ApiServerOptions so = api_server_options(o.api, engine->num_free_blocks(), 0);
  ARBOR_ASSIGN_OR_RETURN(auto server, server::ApiServer::create(*engine, info, so));
  ARBOR_LOG(kInfo) << "router for " << o.model << " listening on http://" << o.api.host << ":"
                   << server->port() << "; max_model_len " << engine->max_model_len()
                   << ", KV blocks of " << engine->block_size() << " tokens";
  if (!o.api.port_file.empty()) {
    ARBOR_RETURN_IF_ERROR(write_file_atomic(o.api.port_file, std::to_string(server->port())));
  }
  const Status stopped = server->run();
  ARBOR_LOG(kInfo) << "router stopped";
  return stopped;
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "router", "Serve the HTTP API in front of `arbor serve --replica-listen` replicas, "
                "routing each request to the replica that has its prefix cached and moving "
                "streams off replicas that fail");
  auto o = std::make_shared<Options>();
  sub->add_option("-m,--model", o->model,
                  "The replicas' GGUF model file (its tokenizer and chat template are read; no "
                  "weights)")
      ->required();
  sub->add_option("--replica", o->router.replicas,
                  "A replica's --replica-listen address (\"unix:/path\" or \"host:port\"); "
                  "repeat for more");
  sub->add_option("--replicas-file", o->router.replicas_file,
                  "A file of replica addresses, one per line ('#' comments), re-read when it "
                  "changes: replicas are added and removed at run time");
  sub->add_option("--policy", o->policy,
                  "prefix: the replica whose cache holds most of the prompt, weighed against "
                  "load; round_robin; routed_text: the prefix policy over what was routed where "
                  "(an approximate tree, the baseline)")
      ->check(CLI::IsMember({"prefix", "round_robin", "routed_text"}))
      ->capture_default_str();
  sub->add_option("--load-tokens", o->router.weights.load_tokens,
                  "Prompt tokens one running request weighs against a cache hit")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  sub->add_option("--imbalance", o->router.weights.imbalance,
                  "A replica with more requests in flight than this x the least loaded one's "
                  "(and than --balance-abs more) gets no request: load takes over from affinity")
      ->check(CLI::Range(1.0, 1000.0))
      ->capture_default_str();
  sub->add_option("--balance-abs", o->router.weights.balance_abs,
                  "... and than this many more than the least loaded one's")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  sub->add_option("--probe-interval", o->router.probe_interval_s,
                  "Seconds between health probes of each replica")
      ->check(CLI::Range(0.01, 60.0))
      ->capture_default_str();
  sub->add_option("--probe-timeout", o->router.probe_timeout_s,
                  "Seconds a probe may take; a replica that does not answer in time is unhealthy "
                  "and its requests move")
      ->check(CLI::Range(0.01, 60.0))
      ->capture_default_str();
  sub->add_option("--stall-timeout", o->router.stall_timeout_s,
                  "Seconds a replica running requests may go without a step before it is "
                  "unhealthy")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  sub->add_option("--max-attempts", o->router.max_attempts,
                  "Attempts a request may make in a row without an event reaching its client "
                  "(each on another replica where one is healthy) before it ends with an error")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--no-replica-wait", o->router.no_replica_wait_s,
                  "Seconds a request waits for a healthy replica before it ends with an error")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  sub->add_option("--startup-timeout", o->router.startup_timeout_s,
                  "Seconds to wait at start for a first healthy replica")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  add_api_flags(*sub, &o->api);
  add_task_flags(*sub, &o->task);
  sub->callback([o] { exit_on_error(run(*o)); });
}

ARBOR_REGISTER_COMMAND(setup);

}  // namespace cmd_router
}  // namespace arbor::cli
