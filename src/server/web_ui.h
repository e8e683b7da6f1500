// The web page at / (docs/web_ui.md): a chat playground over /v1/chat/completions and a live
// engine view over /v1/engine/events. Three static files (src/server/web/: index.html, app.js,
// style.css; no framework, no build step, nothing fetched from the network) are embedded into the
// binary at build time by cmake/embed_files.cmake.
//
//   GET /              index.html, when the client accepts text/html (a browser navigating);
//                      other clients keep TGI's health answer there
//   GET /ui/app.js, GET /ui/style.css
//
// The files hold no data, so they are served without the API key (the page asks for it and
// sends it with its API calls) unless --api-key-all-routes; Host and Origin rules apply as
// everywhere. `arbor serve --no-webui` turns the page off. Answers carry a Content-Security-Policy
// that allows only the server's own scripts, styles and connections.
// Thread-safety: pure functions over constant data.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "http/http_server.h"

namespace arbor::server {

struct EmbeddedFile {
  std::string_view name;   // relative to src/server/web ("app.js")
  std::string_view bytes;
};

// Every embedded file (generated: web_files.cc in the build folder).
std::span<const EmbeddedFile> web_files();

struct WebAsset {
  std::string path;               // "/", "/ui/app.js", ...
  std::string_view content_type;  // "text/html; charset=utf-8", ...
  std::string_view body;
};

// The asset that answers a GET of `path` (the target without its query), or null: "/" only when
// `accept` (the Accept header) names text/html.
const WebAsset* find_web_asset(std::string_view method, std::string_view path,
                               std::string_view accept);

// The 200 answer of `asset`, with its security and caching headers.
http::HttpResponse web_asset_response(const WebAsset& asset);

}  // namespace arbor::server
