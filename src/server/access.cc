#include "server/access.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>

#include "base/strings.h"

namespace arbor::server {
namespace {

bool listed(const std::vector<std::string>& list, std::string_view value) {
  return std::any_of(list.begin(), list.end(), [&](const std::string& item) {
    return item == "*" || equal_ignore_case(item, value);
  });
}

// "example.com:8080" -> "example.com"; "[::1]:8080" -> "::1".
std::string_view host_name(std::string_view authority) {
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    return close == std::string_view::npos ? authority : authority.substr(1, close - 1);
  }
  const size_t colon = authority.rfind(':');
  return colon == std::string_view::npos ? authority : authority.substr(0, colon);
}

// "http://localhost:3000" -> "localhost"; "" for an origin without a scheme ("null").
std::string_view origin_host(std::string_view origin) {
  const size_t scheme = origin.find("://");
  if (scheme == std::string_view::npos) return {};
  std::string_view rest = origin.substr(scheme + 3);
  rest = rest.substr(0, rest.find('/'));
  return host_name(rest);
}

bool equal_in_constant_time(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

ApiError forbidden(std::string code, std::string message) {
  ApiError e;
  e.http_status = 403;
  e.code = std::move(code);
  e.message = std::move(message);
  return e;
}

std::optional<ApiError> check_host(const AccessPolicy& p, const http::HttpRequest& req) {
  if (!req.has_header("Host")) return std::nullopt;
  const std::string_view host = host_name(req.header("Host"));
  if (!p.allowed_hosts.empty()) {
    if (listed(p.allowed_hosts, host)) return std::nullopt;
  } else if (!p.bound_to_loopback || is_loopback_host(host)) {
    return std::nullopt;
  }
  return forbidden("host_not_allowed", str_cat("Host '", host,
                                               "' is not allowed (a guard against DNS rebinding); "
                                               "start the server with --allowed-hosts ",
                                               host, " to serve it"));
}

std::optional<ApiError> check_key(const AccessPolicy& p, const http::HttpRequest& req,
                                  std::string_view path, bool public_file) {
  if (p.api_key.empty()) return std::nullopt;
  if (!p.api_key_all_routes && (path == "/health" || path == "/metrics" || public_file)) {
    return std::nullopt;
  }
  ApiError e;
  e.http_status = 401;
  e.code = "invalid_api_key";
  // OpenAI clients send "Authorization: Bearer <key>", Anthropic's "x-api-key: <key>".
  const std::string_view auth = req.header("Authorization");
  const std::string_view x_api_key = req.header("x-api-key");
  if (auth.empty() && x_api_key.empty()) {
    e.message = "missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'";
    return e;
  }
  constexpr std::string_view kBearer = "bearer ";
  const bool bearer_ok = auth.size() > kBearer.size() &&
                         equal_ignore_case(auth.substr(0, kBearer.size()), kBearer) &&
                         equal_in_constant_time(auth.substr(kBearer.size()), p.api_key);
  const bool x_api_key_ok = !x_api_key.empty() && equal_in_constant_time(x_api_key, p.api_key);
  if (!bearer_ok && !x_api_key_ok) {
    e.message = "incorrect API key provided";
    return e;
  }
  return std::nullopt;
}

}  // namespace

bool is_loopback_host(std::string_view host) {
  const std::string h = ascii_lower(host);
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return h == "localhost" || (h.size() > 10 && h.substr(h.size() - 10) == ".localhost");
}

AccessDecision check_access(const AccessPolicy& policy, const http::HttpRequest& req,
                            std::string_view path, bool public_file) {
  AccessDecision d;
  d.error = check_host(policy, req);
  if (d.error) return d;
  const std::string_view origin = req.header("Origin");
  if (!origin.empty()) {
    const bool allowed = policy.allowed_origins.empty() ? is_loopback_host(origin_host(origin))
                                                        : listed(policy.allowed_origins, origin);
    if (!allowed) {
      d.error = forbidden("origin_not_allowed",
                          str_cat("requests from origin '", origin,
                                  "' are not allowed; start the server with --allowed-origins ",
                                  origin, " to accept them"));
      return d;
    }
    d.headers.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    d.headers.emplace_back("Vary", "Origin");
  }
  if (req.method == "OPTIONS") {  // a preflight: browsers send no credentials with it
    d.preflight = true;
    d.headers.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const std::string_view asked = req.header("Access-Control-Request-Headers");
    d.headers.emplace_back(
        "Access-Control-Allow-Headers",
        asked.empty() ? std::string("Authorization, Content-Type, X-Api-Key") : std::string(asked));
    d.headers.emplace_back("Access-Control-Max-Age", "600");
    d.headers.emplace_back("Allow", "GET, POST, OPTIONS");
    return d;
  }
  d.error = check_key(policy, req, path, public_file);
  return d;
}

}  // namespace arbor::server
