#include "loadgen/url.h"

#include <cstdlib>

namespace arbor::loadgen {
namespace {

bool parse_octet(const std::string& s, int* out) {
  if (s.empty() || s.size() > 3) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return v <= 255;
}

bool is_loopback_ipv4(const std::string& host) {
  int parts[4];
  size_t start = 0;
  for (int i = 0; i < 4; ++i) {
    const size_t dot = host.find('.', start);
    if ((i < 3) != (dot != std::string::npos)) return false;
    const std::string part = host.substr(start, i < 3 ? dot - start : std::string::npos);
    if (!parse_octet(part, &parts[i])) return false;
    start = dot + 1;
  }
  return parts[0] == 127;
}

std::string lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  const std::string h = lower(host);
  return h == "localhost" || h == "::1" || h == "[::1]" || is_loopback_ipv4(h);
}

Result<ServerUrl> parse_server_url(const std::string& url) {
  const std::string scheme = "http://";
  if (lower(url.substr(0, scheme.size())) != scheme) {
    return invalid_argument("--url '", url, "' must start with http:// (no TLS client)");
  }
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  ServerUrl out;
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) out.base_path = rest.substr(slash);
  while (!out.base_path.empty() && out.base_path.back() == '/') out.base_path.pop_back();
  std::string port;
  if (!authority.empty() && authority[0] == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) return invalid_argument("--url '", url, "': unclosed '['");
    out.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return invalid_argument("--url '", url, "': bad port");
      port = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.rfind(':');
    const bool bare_v6 = authority.find(':') != colon;  // "::1" without brackets
    if (colon != std::string::npos && !bare_v6) {
      out.host = authority.substr(0, colon);
      port = authority.substr(colon + 1);
    } else {
      out.host = authority;
    }
  }
  if (out.host.empty()) return invalid_argument("--url '", url, "' has no host");
  if (!port.empty()) {
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (*end != '\0' || p < 1 || p > 65535) {
      return invalid_argument("--url '", url, "': port '", port, "' is not in 1..65535");
    }
    out.port = static_cast<uint16_t>(p);
  }
  if (!is_loopback_host(out.host)) {
    return invalid_argument("--url host '", out.host,
                            "' is not a loopback address: arbor bench serve only drives servers "
                            "on this machine (127.0.0.0/8, ::1 or localhost)");
  }
  const std::string h = lower(out.host);
  out.address = h == "localhost" ? "127.0.0.1" : (h == "[::1]" ? "::1" : h);
  return out;
}

}  // namespace arbor::loadgen
