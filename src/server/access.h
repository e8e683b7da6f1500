// Who may talk to the server: the Host guard against DNS rebinding, the CORS policy and the API
// key, decided in one place for every request (docs/server.md, "Deploying").
//
//   Host     with --allowed-hosts, only those names; else, when bound to a loopback address,
//            only localhost / 127.0.0.1 / ::1 (a page on a rebound name cannot read answers);
//            bound elsewhere, any. A request without Host (HTTP/1.0) passes.
//   Origin   browsers send it on cross-site requests: allowed when listed in --allowed-origins
//            ("*" = any), by default only loopback origins (http(s)://localhost[:port], ...).
//            Others get 403, so no web page the operator visits can make the server generate.
//            Allowed origins get Access-Control-Allow-Origin on the answer; a preflight
//            (OPTIONS) is answered 204 with the methods and headers a client may use.
//   API key  with --api-key, every route but /health, /metrics and the web page's files (those
//            too with --api-key-all-routes) needs "Authorization: Bearer <key>" (OpenAI's
//            clients) or "x-api-key: <key>" (Anthropic's): else 401, as vLLM and llama-server
//            answer. Compared in constant time.
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/http_server.h"
#include "server/api_errors.h"

namespace arbor::server {

struct AccessPolicy {
  std::string api_key;                       // "" = no key
  bool api_key_all_routes = false;           // /health and /metrics need it too
  std::vector<std::string> allowed_origins;  // empty = loopback origins only; "*" = any
  std::vector<std::string> allowed_hosts;    // empty = see above; "*" = any
  bool bound_to_loopback = true;             // the server listens on a loopback address
};

struct AccessDecision {
  std::optional<ApiError> error;  // refused: answer this
  bool preflight = false;         // an allowed CORS preflight: answer 204 with `headers`
  http::HttpHeaders headers;      // to add to the answer (CORS)
};

// The decision for `req` on `path` (the target without its query). `public_file`: a static file
// of the web page (web_ui.h), which needs no API key unless api_key_all_routes.
AccessDecision check_access(const AccessPolicy& policy, const http::HttpRequest& req,
                            std::string_view path, bool public_file = false);

// True for IPv4 literals in 127.0.0.0/8, ::1, "localhost" and names under ".localhost".
bool is_loopback_host(std::string_view host);

}  // namespace arbor::server
