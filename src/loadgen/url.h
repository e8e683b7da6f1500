// The server address of `arbor bench serve`, restricted to this machine.
//
// The load generator can open thousands of connections a second; pointed at someone else's
// server it is a denial-of-service tool. So it only accepts loopback hosts: 127.0.0.0/8, ::1 and
// "localhost" (which is taken to mean 127.0.0.1 and never looked up).
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace arbor::loadgen {

struct ServerUrl {
  std::string host;     // as written: "127.0.0.1", "::1", "localhost"
  std::string address;  // numeric address to connect to: "127.0.0.1", "::1"
  uint16_t port = 80;
  std::string base_path;  // path prefix without a trailing '/': "" or "/api"
};

// True for a dotted-quad 127.a.b.c (each part 0..255), "::1" (also "[::1]"), "localhost".
bool is_loopback_host(const std::string& host);

// Parses "http://HOST[:PORT][/PATH]". Errors: not http:// (https is refused: no TLS client), a
// bad port, or a host that is not loopback (the message names the host and what is allowed).
Result<ServerUrl> parse_server_url(const std::string& url);

}  // namespace arbor::loadgen
