#include "server/web_ui.h"

#include <string>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/strings.h"

namespace arbor::server {
namespace {

std::string_view content_type_of(std::string_view name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (name.ends_with(".css")) return "text/css; charset=utf-8";
  ARBOR_CHECK(false) << "no content type for embedded file " << name;
  return "";
}

const std::vector<WebAsset>& assets() {
  static const std::vector<WebAsset> all = [] {
    std::vector<WebAsset> out;
    for (const EmbeddedFile& f : web_files()) {
      // The page is "/"; the others are under "/ui/" (paths the API never uses).
      std::string path = f.name == "index.html" ? std::string("/") : "/ui/" + std::string(f.name);
      out.push_back(WebAsset{std::move(path), content_type_of(f.name), f.bytes});
    }
    return out;
  }();
  return all;
}

bool accepts_html(std::string_view accept) {
  return ascii_lower(accept).find("text/html") != std::string::npos;
}

}  // namespace

const WebAsset* find_web_asset(std::string_view method, std::string_view path,
                               std::string_view accept) {
  if (method != "GET") return nullptr;
  if (path == "/" && !accepts_html(accept)) return nullptr;
  for (const WebAsset& a : assets()) {
    if (a.path == path) return &a;
  }
  return nullptr;
}

http::HttpResponse web_asset_response(const WebAsset& asset) {
  http::HttpResponse r(200, std::string(asset.content_type), std::string(asset.body));
  r.headers = {
      // Only the server's own files and API; no inline script, no frames, no other origin.
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "no-referrer"},
      // Small files: always revalidated, so a new binary's page is picked up at once.
      {"Cache-Control", "no-cache"},
  };
  return r;
}

}  // namespace arbor::server
