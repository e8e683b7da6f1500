// The HTTP API's flags, shared by `arbor serve` and `arbor router` (which serve the same routes
// with the same limits, access rules and chat handling: docs/server.md, docs/router.md), and
// what they decide: the ApiServerOptions, the access policy, the served model's names, its
// chat renderer. Header-only, for the cmd_*.cc files.
#pragma once

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/status.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "server/chat_renderer.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace arbor::cli {

struct ApiFlags {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string port_file;
  std::vector<std::string> served_model_names;
  bool accept_any_model_name = false;
  std::string chat_template;
  std::string tool_call_parser = "auto";
  std::string reasoning_format = "auto";
  double body_limit_mib = 8.0;
  double shutdown_timeout_s = 10.0;
  double sse_keepalive_s = 15.0;
  double idle_timeout_s = 120.0;
  int32_t max_n = 16;
  int32_t tokenizer_threads = server::ApiServerOptions{}.tokenizer_threads;
  double log_stats_interval_s = server::ApiServerOptions{}.log_stats_interval_s;
  int64_t max_connections = -1;  // -1: from the open-file limit (connection_cap)
  double write_timeout_s = 60.0;
  double max_output_mib = 512.0;
  bool allow_special_in_content = false;
  std::string api_key;
  bool api_key_all_routes = false;
  std::vector<std::string> allowed_origins;
  std::vector<std::string> allowed_hosts;
  server::ResponseStoreOptions responses;
  double responses_max_mib = static_cast<double>(server::ResponseStoreOptions{}.max_bytes >> 20);
  bool no_webui = false;
};

inline std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

inline void add_api_flags(CLI::App& app, ApiFlags* o) {
  app.add_option("--host", o->host, "Address to bind")->capture_default_str();
  app.add_option("--port", o->port, "Port to bind; 0 = any free port")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--port-file", o->port_file, "Write the bound port to this file once listening");
  app.add_option("--served-model-name", o->served_model_names,
                  "Model names in the API, comma-separated or repeated: responses report the "
                  "first, requests may use any (default: the file name without extension)");
  app.add_flag("--accept-any-model-name", o->accept_any_model_name,
                "Serve requests whatever model they name (clients that send the endpoint URL "
                "as the model); default off: an unknown model is a 404");
  app.add_option("--chat-template", o->chat_template,
                  "Chat template: a builtin name or a file; default: the model's own, or the "
                  "builtin chatml (with a warning) for a model that has none");
  app.add_option("--tool-call-parser", o->tool_call_parser,
                  "How the model writes tool calls: hermes (<tool_call> JSON), llama3_json, "
                  "harmony (gpt-oss's commentary messages), qwen3_coder (Qwen3-Coder and Qwen3.5 "
                  "XML calls), or auto (read from the chat "
                  "template; docs/tool_calling.md)")
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "harmony", "qwen3_coder"}))
      ->capture_default_str();
  std::vector<std::string> reasoning_formats = {"none", "auto"};
  for (std::string_view n : chat::reasoning_syntax_names()) reasoning_formats.emplace_back(n);
  app.add_option("--reasoning-format", o->reasoning_format,
                  "A thinking model's reasoning: auto (the markers read from the chat template, "
                  "e.g. <think>...</think>) goes to message.reasoning_content and a grammar "
                  "applies after it; none: the output is all content; or a syntax name "
                  "(docs/server.md, \"Reasoning\")")
      ->check(CLI::IsMember(reasoning_formats))
      ->capture_default_str();
  app.add_option("--max-body-mib", o->body_limit_mib, "Request body limit (MiB); larger is 413")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--shutdown-timeout", o->shutdown_timeout_s,
                  "Seconds running requests get to finish after SIGTERM/SIGINT")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--sse-keepalive", o->sse_keepalive_s,
                  "Seconds of stream silence before a keep-alive comment; 0 = never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--idle-timeout", o->idle_timeout_s,
                  "Seconds an idle connection stays open between requests; 0 = forever")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-connections", o->max_connections,
                  "Open connections beyond this get 503 and are closed; 0 = no cap (default: "
                  "the open-file limit, raised to its hard maximum at start, minus 64, at most "
                  "10000)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--allow-special-in-content", o->allow_special_in_content,
                "Let control-token text in chat message content (\"<|im_end|>\") act as control "
                "tokens; by default it is plain text");
  app.add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer <key>' or 'x-api-key: <key>' on the API "
                  "routes (env ARBOR_API_KEY)")
      ->envname("ARBOR_API_KEY");
  app.add_flag("--api-key-all-routes", o->api_key_all_routes,
                "Require the API key on /health and /metrics too");
  app.add_option("--allowed-origins", o->allowed_origins,
                  "Browser origins (CORS) allowed to call the API, comma-separated; '*' = any "
                  "(default: loopback origins only; others get 403)")
      ->delimiter(',');
  app.add_option("--allowed-hosts", o->allowed_hosts,
                  "Host header names served, comma-separated; '*' = any (default: loopback "
                  "names when bound to a loopback address, any otherwise)")
      ->delimiter(',');
  app.add_option("--write-timeout", o->write_timeout_s,
                  "Seconds a client may take no byte of its response before the connection is "
                  "closed and its request aborted; 0 = never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-output-mib", o->max_output_mib,
                  "Unsent response bytes over all connections (MiB); a response past it gets "
                  "503 (a connection may hold at most 64 MiB)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-n", o->max_n, "Limit on n and best_of per request")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--tokenizer-threads", o->tokenizer_threads,
                  "Threads that parse, template and tokenise request bodies off the I/O thread")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--log-stats-interval", o->log_stats_interval_s,
                  "Seconds between the engine's info lines (throughput, running and waiting "
                  "requests, KV cache use, speculation acceptance) while it is busy; 0 = never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--responses-max", o->responses.max_responses,
                  "/v1/responses kept for previous_response_id, at most this many (the oldest "
                  "go first); 0 = none are kept")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
      ->capture_default_str();
  app.add_option("--responses-ttl", o->responses.ttl_s,
                  "Seconds a stored /v1/responses response is kept; later its id is a 404")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--responses-max-mib", o->responses_max_mib,
                  "Stored /v1/responses conversations' total size (MiB); the oldest go first")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--no-webui", o->no_webui,
                "Do not serve the web page (a chat playground and a live engine view) at / to "
                "browsers; GET /v1/engine/events stays on");
}

// Fills the access policy and says what it decided (docs/server.md, "Deploying").
inline server::AccessPolicy access_policy(const ApiFlags& o) {
  server::AccessPolicy p;
  p.api_key = o.api_key;
  p.api_key_all_routes = o.api_key_all_routes;
  p.allowed_origins = o.allowed_origins;
  p.allowed_hosts = o.allowed_hosts;
  p.bound_to_loopback = server::is_loopback_host(o.host);
  ARBOR_LOG(kInfo) << "access: "
                   << (p.api_key.empty() ? std::string("no API key")
                       : p.api_key_all_routes
                           ? std::string("API key required on every route")
                           : std::string("API key required (not on /health, /metrics)"))
                   << "; CORS origins "
                   << (p.allowed_origins.empty() ? std::string("loopback only")
                                                 : joined(p.allowed_origins))
                   << "; Host "
                   << (!p.allowed_hosts.empty() ? joined(p.allowed_hosts)
                       : p.bound_to_loopback    ? std::string("loopback names only")
                                                : std::string("any"));
  if (!p.bound_to_loopback && p.api_key.empty()) {
    ARBOR_LOG(kWarn) << "listening on " << o.host
                     << " without --api-key: anyone who can reach the port can generate";
  }
  return p;
}

// --served-model-name a,b (or repeated, or "a b" as in vLLM): served as "a", "b" accepted too
// (vLLM's rule); default: the file name without its extension.
inline Status set_model_names(const ApiFlags& o, const std::string& model, server::ModelInfo* info) {
  std::vector<std::string> names;
  for (const std::string& list : o.served_model_names) {
    for (size_t start = 0, end = 0; end != std::string::npos; start = end + 1) {
      end = list.find(',', start);
      const std::string name = list.substr(start, end - start);
      if (name.empty()) {
        return invalid_argument("--served-model-name '", list, "' has an empty name");
      }
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  if (names.empty()) names.push_back(std::filesystem::path(model).stem().string());
  info->name = names[0];
  info->aliases.assign(names.begin() + 1, names.end());
  info->accept_any_model_name = o.accept_any_model_name;
  return ok_status();
}

// Descriptors kept free of connections: the model file, the listening socket, logs, workers.
constexpr int64_t kReservedDescriptors = 64;
constexpr int64_t kMaxAutoConnections = 10000;

// Raises the soft open-file limit to the hard one (every connection is a descriptor) and
// returns the limit in force.
inline int64_t raise_open_file_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur != rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) {
      ARBOR_LOG(kDebug) << "open-file limit raised from " << rl.rlim_cur << " to " << want.rlim_cur;
      rl = want;
    }
  }
  return rl.rlim_cur == RLIM_INFINITY ? int64_t{1} << 20 : static_cast<int64_t>(rl.rlim_cur);
}

// --max-connections, or by default what the open-file limit leaves room for.
inline int64_t connection_cap(int64_t requested, int64_t open_files) {
  if (requested >= 0) return requested;
  return std::clamp(open_files - kReservedDescriptors, int64_t{16}, kMaxAutoConnections);
}

// The API server's options from the flags (the connection cap from the open-file limit, logged).
inline server::ApiServerOptions api_server_options(const ApiFlags& o, int64_t kv_blocks_total,
                                                   int32_t max_concurrent_requests) {
  server::ApiServerOptions so;
  so.http.host = o.host;
  so.http.port = static_cast<uint16_t>(o.port);
  so.http.body_limit = static_cast<size_t>(o.body_limit_mib * (1 << 20));
  so.http.sse_keepalive_s = o.sse_keepalive_s;
  so.http.idle_timeout_s = o.idle_timeout_s;
  so.http.write_timeout_s = o.write_timeout_s;
  so.http.max_queued_output = static_cast<int64_t>(o.max_output_mib * (1 << 20));
  const int64_t open_files = raise_open_file_limit();
  so.http.max_connections = connection_cap(o.max_connections, open_files);
  ARBOR_LOG(kInfo) << "connections: at most "
                   << (so.http.max_connections > 0 ? std::to_string(so.http.max_connections)
                                                    : std::string("unlimited"))
                   << " (open-file limit " << open_files << "); more are answered 503";
  so.shutdown_timeout_s = o.shutdown_timeout_s;
  so.kv_blocks_total = kv_blocks_total;
  so.max_concurrent_requests = max_concurrent_requests;
  so.tokenizer_threads = o.tokenizer_threads;
  so.log_stats_interval_s = o.log_stats_interval_s;
  so.access = access_policy(o);
  so.responses = o.responses;
  so.responses.max_bytes = static_cast<int64_t>(o.responses_max_mib * (1 << 20));
  so.web_ui = !o.no_webui;
  return so;
}

// The model's API facts that the flags decide: names, the chat renderer (generate task only),
// limits. info->task (setup_task) must be set before.
inline Status fill_model_info(const ApiFlags& o, const std::string& model,
                              const tokenizer::Tokenizer& tok, int32_t vocab_size,
                              server::ModelInfo* info,
                              std::unique_ptr<server::ChatRenderer>* chat) {
  if (info->task == server::ServeTask::kGenerate) {
    ARBOR_ASSIGN_OR_RETURN(
        *chat, server::make_chat_renderer(tok, o.chat_template,
                                          chat::parse_tool_call_format(o.tool_call_parser),
                                          o.reasoning_format));
  }
  ARBOR_RETURN_IF_ERROR(set_model_names(o, model, info));
  info->path = model;
  info->tokenizer = &tok;
  info->vocab_size = vocab_size;
  info->created = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  info->max_n = o.max_n;
  info->chat = chat->get();
  info->allow_special_in_content = o.allow_special_in_content;
  return ok_status();
}

}  // namespace arbor::cli
