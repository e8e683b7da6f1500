#include "router/replica_service.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

#include "base/log.h"
#include "router/replica.grpc.pb.h"
#include "router/wire.h"
#include "shard/grpc_util.h"

namespace arbor::router {
namespace {

grpc::Status version_error(uint32_t got) {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      str_cat("replica protocol version ", got, ", this replica speaks ",
                              kReplicaProtocolVersion));
}

// One Generate call, on gRPC's callback API: the engine thread's notify starts each write and
// gRPC's thread continues after it, so no thread waits for events (a thread hand-off fewer on
// each leg than a blocking handler). A cancelled call (or a failed write) aborts the request;
// its remaining events are drained unsent and the call finishes with the final one.
class GenerateReactor final : public grpc::ServerWriteReactor<wire::GenerateEvent> {
 public:
  GenerateReactor(engine::Engine& engine, const wire::GenerateCall& call)
      : engine_(engine), shared_(std::make_shared<Shared>()) {
    shared_->reactor = this;
    if (call.protocol_version() != kReplicaProtocolVersion) {
      finish(version_error(call.protocol_version()));
      return;
    }
    Result<engine::GenerateRequest> request = decode_request(call);
    Result<std::shared_ptr<engine::RequestStream>> stream =
        request.ok() ? engine_.submit(std::move(*request))
                     : Result<std::shared_ptr<engine::RequestStream>>(request.status());
    if (!stream.ok()) {
      engine::StreamEvent final_ev;
      final_ev.final = true;
      final_ev.error = stream.status();
      encode_event(final_ev, &msg_);
      final_written_ = true;
      shared_->writing = true;
      StartWrite(&msg_);
      return;
    }
    stream_ = std::move(*stream);
    std::shared_ptr<Shared> shared = shared_;
    stream_->set_notify([shared] { shared->pump(); });
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->writing = false;
      if (!ok && !cancelled_) {
        cancelled_ = true;
        if (stream_) engine_.abort(stream_->request_id());
      }
      if (final_written_) {
        finish_locked(ok ? grpc::Status::OK : grpc::Status::CANCELLED);
        return;
      }
    }
    shared_->pump();
  }

  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (cancelled_ || stream_ == nullptr) return;
      cancelled_ = true;
      engine_.abort(stream_->request_id());
    }
    shared_->pump();
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->reactor = nullptr;
    }
    if (stream_) stream_->set_notify([] {});
    delete this;
  }

 private:
  // Shared with the stream's notify callback, which may run after the reactor is gone.
  struct Shared {
    std::mutex mu;
    GenerateReactor* reactor = nullptr;  // null once done
    bool writing = false;
    // Takes the next event: written (one write at a time), or after a cancellation dropped,
    // until the final one finishes the call. Any thread.
    void pump() {
      GenerateReactor* r = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (reactor == nullptr || writing || reactor->finished_) return;
        r = reactor;
        while (true) {
          std::optional<engine::StreamEvent> ev = r->stream_->try_next();
          if (!ev) return;
          if (r->cancelled_) {
            if (ev->final) {
              r->finish_locked(grpc::Status::CANCELLED);
              return;
            }
            continue;
          }
          r->msg_.Clear();
          encode_event(*ev, &r->msg_);
          r->final_written_ = ev->final;
          writing = true;
          break;
        }
      }
      // Outside the lock: the write may complete (OnWriteDone) on another thread at once. The
      // reactor lives until OnDone, which needs Finish, which waits for this write.
      r->StartWrite(&r->msg_);
    }
  };

  void finish(grpc::Status status) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    finish_locked(std::move(status));
  }
  void finish_locked(grpc::Status status) {  // shared_->mu held
    if (finished_) return;
    finished_ = true;
    Finish(std::move(status));
  }

  engine::Engine& engine_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<engine::RequestStream> stream_;
  wire::GenerateEvent msg_;
  bool final_written_ = false;
  bool cancelled_ = false;
  bool finished_ = false;
};

class Service final : public wire::Replica::WithCallbackMethod_Generate<wire::Replica::Service> {
 public:
  Service(engine::Engine& engine, engine::KvEventLog& log, ReplicaFacts facts)
      : engine_(engine), log_(log), facts_(std::move(facts)) {}

  void stop() {
    stopping_ = true;
    log_.close();
  }

  grpc::ServerWriteReactor<wire::GenerateEvent>* Generate(grpc::CallbackServerContext* ctx,
                                                          const wire::GenerateCall* call) override {
    return new GenerateReactor(engine_, *call);
  }

  grpc::Status KvEvents(grpc::ServerContext* ctx, const wire::KvEventsCall* call,
                        grpc::ServerWriter<wire::KvEventBatch>* writer) override {
    if (call->protocol_version() != kReplicaProtocolVersion) {
      return version_error(call->protocol_version());
    }
    uint64_t seq = 0;
    bool need_snapshot = true;
    while (!ctx->IsCancelled() && !stopping_) {
      wire::KvEventBatch m;
      if (need_snapshot) {
        const engine::KvEventLog::Snapshot s = log_.snapshot();
        m.set_reset(true);
        m.set_seq(s.seq);
        for (const kv::BlockHash& h : s.hashes) {
          m.add_low(h.low);
          m.add_high(h.high);
          m.add_stored(true);
        }
        seq = s.seq;
        need_snapshot = false;
      } else {
        engine::KvEventLog::Batch b = log_.wait_after(seq, 0.5);
        if (b.lost) {
          need_snapshot = true;
          continue;
        }
        if (b.events.empty()) continue;
        seq = b.first_seq + b.events.size() - 1;
        m.set_seq(seq);
        encode_kv_events(b.events, &m);
      }
      if (!writer->Write(m)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status Status(grpc::ServerContext*, const wire::StatusCall* call,
                      wire::StatusReply* reply) override {
    if (call->protocol_version() != kReplicaProtocolVersion) {
      return version_error(call->protocol_version());
    }
    const engine::EngineMetricsSnapshot m = engine_.metrics();
    reply->set_protocol_version(kReplicaProtocolVersion);
    reply->set_model(facts_.model);
    reply->set_vocab_size(facts_.vocab_size);
    reply->set_max_model_len(engine_.max_model_len());
    reply->set_block_size(facts_.block_size);
    reply->set_num_kv_blocks(facts_.num_kv_blocks);
    reply->set_prefix_caching(facts_.prefix_caching);
    reply->set_max_spec_tokens(engine_.max_spec_tokens());
    reply->set_max_tree_nodes(engine_.max_tree_nodes());
    reply->set_num_running(m.num_running);
    reply->set_num_waiting(m.num_waiting);
    reply->set_num_free_blocks(engine_.num_free_blocks());
    reply->set_executor_healthy(m.executor_healthy);
    reply->set_executor_error(m.executor_error);
    reply->set_pid(static_cast<int64_t>(::getpid()));
    reply->set_num_steps(m.num_steps);
    reply->set_seconds_since_step(
        m.last_step_time_s > 0
            ? std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
                      .count() -
                  m.last_step_time_s
            : -1.0);
    return grpc::Status::OK;
  }

 private:
  engine::Engine& engine_;
  engine::KvEventLog& log_;
  const ReplicaFacts facts_;
  std::atomic<bool> stopping_{false};
};

}  // namespace

struct ReplicaServer::Impl {
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

ReplicaServer::ReplicaServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ReplicaServer::~ReplicaServer() { shutdown(); }

const std::string& ReplicaServer::address() const { return impl_->address; }

void ReplicaServer::shutdown() {
  if (impl_->server == nullptr) return;
  impl_->service->stop();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  impl_->server.reset();
}

Result<std::unique_ptr<ReplicaServer>> ReplicaServer::start(engine::Engine& engine,
                                                            engine::KvEventLog& kv_events,
                                                            const ReplicaFacts& facts,
                                                            const std::string& listen) {
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<Service>(engine, kv_events, facts);
  ARBOR_ASSIGN_OR_RETURN(shard::StartedServer started,
                         shard::start_server(impl->service.get(), listen, "--replica-listen"));
  impl->server = std::move(started.server);
  impl->address = std::move(started.address);
  ARBOR_LOG(kInfo) << "replica protocol on " << impl->address << " (for arbor router)";
  return std::unique_ptr<ReplicaServer>(new ReplicaServer(std::move(impl)));
}

}  // namespace arbor::router
