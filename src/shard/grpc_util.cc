#include "shard/grpc_util.h"

namespace arbor::shard {

std::shared_ptr<grpc::Channel> make_channel(const std::string& uri, int min_backoff_ms,
                                            int max_backoff_ms) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, min_backoff_ms);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, min_backoff_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  return grpc::CreateCustomChannel(uri, grpc::InsecureChannelCredentials(), args);
}

Result<StartedServer> start_server(grpc::Service* service, const std::string& listen,
                                   std::string_view what,
                                   void (*configure)(grpc::ServerBuilder&)) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  if (configure != nullptr) configure(builder);
  StartedServer s;
  s.server = builder.BuildAndStart();
  if (s.server == nullptr || (!listen.starts_with("unix:") && port == 0)) {
    return invalid_argument(what, ": cannot listen on '", listen,
                            "' (a Unix socket \"unix:/path\" whose folder exists and is "
                            "writable, or \"host:port\")");
  }
  s.address = listen;
  if (!listen.starts_with("unix:") && listen.ends_with(":0")) {
    s.address = str_cat(listen.substr(0, listen.size() - 1), port);
  }
  return s;
}

}  // namespace arbor::shard
