// The gRPC plumbing shared by the shard protocol and the router's replica protocol: channels
// and servers on a Unix socket ("unix:/path", one host) or TCP ("host:port", across hosts),
// without gRPC's 4 MB message cap (a step or a request carries whole prompts).
//
// Threading: pure helpers; the objects they return follow gRPC's rules.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace arbor::shard {

// A channel to `uri` that reconnects after a backoff in [min_backoff_ms, max_backoff_ms] (a
// peer that restarts is found again quickly).
std::shared_ptr<grpc::Channel> make_channel(const std::string& uri, int min_backoff_ms,
                                            int max_backoff_ms);

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // `listen`, with the chosen port for "host:0"
};

// Builds and starts a server for `service` on `listen`. `configure` (optional) adjusts the
// builder first. Errors: kInvalidArgument naming `what` (the flag) and the address when it
// cannot be bound.
Result<StartedServer> start_server(grpc::Service* service, const std::string& listen,
                                   std::string_view what,
                                   void (*configure)(grpc::ServerBuilder&) = nullptr);

}  // namespace arbor::shard
