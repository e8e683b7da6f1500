// arbor serve: the OpenAI-, Anthropic- and TGI-compatible HTTP server (docs/server.md).
//
//   arbor serve -m MODEL [--host 127.0.0.1] [--port 8080] [engine flags]
//               [--shards 1 | --shard-uri URI] [--recover-timeout S] [--replica-listen ADDR]
//
// The model runs in this process by default; with --shards or --shard-uri it runs in shard
// processes over gRPC (docs/shards.md).
//
// Loads the model and its tokenizer, starts the engine thread, and serves HTTP on one I/O
// thread (request bodies are tokenised on --tokenizer-threads workers) until SIGINT/SIGTERM,
// then drains (--shutdown-timeout) and exits 0.
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/mapped_file.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "cli/command.h"
#include "cli/api_flags.h"
#include "cli/engine_flags.h"
#include "cli/serve_task.h"
#include "cli/shard_flags.h"
#include "executor/local_executor.h"
#include "engine/engine_core.h"
#include "kernels/cpu_features.h"
#include "model/weight_check.h"
#include "server/chat_renderer.h"
#include "router/replica_service.h"
#include "server/server.h"

namespace arbor::cli {
namespace cmd_serve {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string model;
  ApiFlags api;       // the HTTP API (api_flags.h)
  ServingOptions serving;
  bool check_weights = false;
  TaskOptions task;   // --task, --pooling (serve_task.h)
  ShardFlags shards;  // --shards, --shard-uri, --recover-timeout (shard_flags.h)
  std::string replica_listen;  // --replica-listen: the replica protocol for `arbor router`
  double stall_timeout_s = server::ApiServerOptions{}.stall_timeout_s;
};


// exec: the in-process executor, or null when shards run the model.
void log_configuration(const Options& o, executor::LocalExecutor* exec,
                       const engine::EngineCore& core, const server::ModelInfo& info,
                       uint16_t port) {
  std::string names = str_cat("'", info.name, "'");
  for (const std::string& alias : info.aliases) names += str_cat(", '", alias, "'");
  ARBOR_LOG(kInfo) << "model " << o.model << " served as " << names
                   << (info.accept_any_model_name ? " (and any other name)" : "") << ": "
                   << (exec != nullptr ? exec->runner().config().summary()
                       : o.shards.shards > 0
                           ? str_cat("run by ", o.shards.shards, " shard process(es)",
                                     o.shards.shards > 1 ? " (tensor parallel)" : "")
                           : str_cat("run by the shard(s) at ", join_uris(o.shards)));
  ARBOR_LOG(kInfo) << "kv cache: " << core.num_free_blocks() << " usable blocks; max_num_seqs "
                   << o.serving.engine.max_num_seqs
                   << ", max_num_batched_tokens " << o.serving.engine.max_num_batched_tokens
                   << ", max_waiting_requests " << o.serving.engine.max_waiting_requests
                   << ", prefix caching " << (o.serving.engine.enable_prefix_caching ? "on" : "off");
  ARBOR_LOG(kInfo) << "threads "
                   << (exec != nullptr ? std::to_string(exec->runner().pool().num_threads())
                                       : std::string("(in the shards)"))
                   << ", cpu " << kernels::cpu_summary() << ": " << kernels::isa_summary()
                   << "; task " << server::serve_task_name(info.task)
                   << ", max_model_len " << core.max_model_len()
                   << ", chat template " << (info.chat != nullptr ? "yes" : "none")
                   << ", tokenizer threads " << o.api.tokenizer_threads;
  ARBOR_LOG(kInfo) << "listening on http://" << o.api.host << ":" << port
                   << (o.api.no_webui ? "" : " (open it in a browser for the chat page and engine view)");
}

// Large buffers (request bodies, tokenised prompts, responses) come from mmap and go back to
// the system when freed: glibc's default threshold rises after the first such free and then
// keeps freed multi-MB buffers in the heap, so a burst of big requests would stay in RSS.
void return_big_buffers_to_the_system() { mallopt(M_MMAP_THRESHOLD, 1 << 20); }

// The executor: in process, or shards (--shards, --shard-uri; they are given --task too).
// *local: the in-process one, null for shards.
Result<std::unique_ptr<step::ModelExecutor>> make_executor(const Options& o,
                                                            executor::LocalExecutor** local) {
  *local = nullptr;
  if (o.shards.remote()) {
    if (o.check_weights) {
      return invalid_argument("--check-weights scans weights in process; with shards run "
                              "`arbor serve --check-weights` once without them");
    }
    ShardFlags shards = o.shards;
    shards.extra_args = task_shard_args(o.task);
    ARBOR_ASSIGN_OR_RETURN(auto remote, start_shards(o.model, o.serving, shards));
    return std::unique_ptr<step::ModelExecutor>(std::move(remote));
  }
  ARBOR_ASSIGN_OR_RETURN(auto exec,
                         executor::LocalExecutor::load(o.model, executor_options(o.serving)));
  if (o.check_weights) {
    ARBOR_RETURN_IF_ERROR(model::check_all_weights(exec->runner().model().file()));
    ARBOR_LOG(kInfo) << "every weight is finite";
  }
  *local = exec.get();
  return std::unique_ptr<step::ModelExecutor>(std::move(exec));
}

Status run(const Options& o) {
  return_big_buffers_to_the_system();
  const engine::EngineOptions eo = engine_options(o.serving);
  executor::LocalExecutor* local = nullptr;
  ARBOR_ASSIGN_OR_RETURN(auto exec, make_executor(o, &local));
  ARBOR_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::from_file(o.model));
  server::ModelInfo info;
  TaskFacts facts;
  if (local != nullptr) {
    ARBOR_RETURN_IF_ERROR(apply_task(o.task, *local, *tok));
    ARBOR_ASSIGN_OR_RETURN(facts, task_facts(local->runner().model().file()));
  } else {
    ARBOR_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::open(o.model));
    ARBOR_ASSIGN_OR_RETURN(facts, task_facts(file));
  }
  ARBOR_RETURN_IF_ERROR(setup_task(o.task, facts, *tok, &info));
  info.max_pooling_inputs = std::min(2048, eo.max_waiting_requests);
  std::unique_ptr<server::ChatRenderer> chat;  // none for embedding and rerank servers
  ARBOR_RETURN_IF_ERROR(fill_model_info(o.api, o.model, *tok, exec->vocab_size(), &info, &chat));
  info.priority_scheduling = eo.policy == sched::SchedulingPolicy::kPriority;
  const int32_t block_size = exec->block_size();
  const int64_t num_kv_blocks = exec->num_kv_blocks();
  engine::KvEventLog kv_events;
  engine::EngineCoreConfig cfg;
  cfg.options = eo;
  cfg.tokenizer = tok.get();
  if (!o.replica_listen.empty()) cfg.kv_events = &kv_events;
  ARBOR_RETURN_IF_ERROR(engine::EngineCore::validate_config(*exec, cfg));
  engine::EngineCore core(std::move(exec), cfg);
  server::ApiServerOptions so = api_server_options(o.api, core.num_free_blocks(), eo.max_num_seqs);
  so.stall_timeout_s = o.stall_timeout_s;
  ARBOR_ASSIGN_OR_RETURN(auto server, server::ApiServer::create(core, info, so));
  log_configuration(o, local, core, info, server->port());
  std::unique_ptr<router::ReplicaServer> replica;
  if (!o.replica_listen.empty()) {
    const router::ReplicaFacts facts{.model = o.model,
                                     .vocab_size = info.vocab_size,
                                     .block_size = block_size,
                                     .num_kv_blocks = num_kv_blocks,
                                     .prefix_caching = eo.enable_prefix_caching};
    ARBOR_ASSIGN_OR_RETURN(replica,
                           router::ReplicaServer::start(core, kv_events, facts, o.replica_listen));
  }
  if (!o.api.port_file.empty()) {
    ARBOR_RETURN_IF_ERROR(write_file_atomic(o.api.port_file, std::to_string(server->port())));
  }
  const Status stopped = server->run();
  if (replica != nullptr) replica->shutdown();
  kv_events.close();
  ARBOR_LOG(kInfo) << "server stopped";
  return stopped;
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "serve", "Serve a model over HTTP (OpenAI chat, completions and responses, Anthropic "
               "messages, TGI; embeddings and rerank with --task)");
  auto o = std::make_shared<Options>();
  sub->add_option("-m,--model", o->model, "GGUF model file")->required();
  add_api_flags(*sub, &o->api);
  sub->add_flag("--check-weights", o->check_weights,
                "Scan every weight for NaN/Inf before serving (norms and the classifier are "
                "always checked)");
  sub->add_option("--stall-timeout", o->stall_timeout_s,
                  "/health answers 503 when requests run and no engine step ended for this many "
                  "seconds (a hung forward); 0 = never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--replica-listen", o->replica_listen,
                  "Also serve the replica protocol for `arbor router` here: \"unix:/path\" or "
                  "\"host:port\" (port 0: any); default off (docs/router.md)");
  add_task_flags(*sub, &o->task);
  add_engine_flags(*sub, &o->serving);
  add_shard_flags(*sub, &o->shards);
  sub->callback([o] { exit_on_error(run(*o)); });
}

ARBOR_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
