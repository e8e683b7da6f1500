#include "shard/shard_server.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <utility>

#include "base/log.h"
#include "shard/grpc_util.h"
#include "shard/shard.grpc.pb.h"
#include "shard/wire.h"

namespace arbor::shard {

namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void set_error(wire::FromShard* out, int64_t step, const std::string& field,
               const std::string& message) {
  out->Clear();
  wire::Error* e = out->mutable_error();
  e->set_step(step);
  e->set_field(field);
  e->set_message(message);
}

}  // namespace

// Named (not anonymous): ShardServer::Impl holds one.
namespace server_internal {

// One session at a time over the executor; the state of the session in progress.
class ShardService final : public wire::Shard::Service {
 public:
  ShardService(std::unique_ptr<executor::LocalExecutor> exec, const ShardServerOptions& options)
      : exec_(std::move(exec)),
        model_(options.model_name),
        tp_rank_(options.tp_rank),
        tp_size_(options.tp_size),
        group_(options.group),
        decoder_(DecoderLimits{.vocab_size = exec_->vocab_size(),
                               .num_kv_blocks = exec_->num_kv_blocks(),
                               .block_size = exec_->block_size(),
                               .num_kv_groups =
                                   static_cast<int32_t>(exec_->kv_group_windows().size())}) {}

  grpc::Status Session(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<wire::FromShard, wire::ToShard>* stream) override {
    bool idle = false;
    if (!busy_.compare_exchange_strong(idle, true)) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this shard already serves a session (one stream per shard)");
    }
    std::lock_guard<std::mutex> lock(mu_);
    run_session(stream);
    forget_all();
    hello_ = false;
    busy_ = false;
    return grpc::Status::OK;
  }

 private:
  void run_session(grpc::ServerReaderWriter<wire::FromShard, wire::ToShard>* stream) {
    wire::ToShard in;
    wire::FromShard out;
    while (stream->Read(&in)) {
      received_at_ = seconds_now();
      out.Clear();
      switch (in.msg_case()) {
        case wire::ToShard::kHello: hello(in.hello(), &out); break;
        case wire::ToShard::kStep: step(in.step(), &out); break;
        case wire::ToShard::kMeasure: measure(in.measure(), &out); break;
        case wire::ToShard::MSG_NOT_SET:
          set_error(&out, 0, "msg", "an empty message (no hello, step or measure)");
          break;
      }
      const bool refused = out.has_error();
      if (refused) {
        ARBOR_LOG(kWarn) << "shard: refused a message, ending the session: "
                         << out.error().message();
      }
      if (!stream->Write(out) || refused) return;
    }
  }

  void hello(const wire::Hello& h, wire::FromShard* out) {
    if (h.protocol_version() != kProtocolVersion) {
      return set_error(out, 0, "hello.protocol_version",
                       str_cat("is ", h.protocol_version(), ", this shard speaks ",
                               kProtocolVersion));
    }
    if (h.incarnation() == 0) return set_error(out, 0, "hello.incarnation", "is 0");
    if (static_cast<int>(h.world_size()) != tp_size_ || static_cast<int>(h.rank()) != tp_rank_) {
      return set_error(out, 0, "hello.rank",
                       str_cat("rank ", h.rank(), " of ", h.world_size(), ": this shard was "
                               "started as rank ", tp_rank_, " of ", tp_size_,
                               " (arbor shard --rank R --world-size N)"));
    }
    if (tp_size_ > 1) {
      if (Status st = group_->join(h.tp_group()); !st.ok()) {
        return set_error(out, 0, "hello.tp_group", st.message());
      }
    }
    forget_all();
    decoder_.reset(h.incarnation());
    hello_ = true;
    wire::HelloReply* r = out->mutable_hello();
    r->set_protocol_version(kProtocolVersion);
    r->set_incarnation(h.incarnation());
    r->set_pid(getpid());
    r->set_model(model_);
    r->set_vocab_size(exec_->vocab_size());
    r->set_max_model_len(exec_->max_model_len());
    r->set_context_length(exec_->runner().config().context_length);
    r->set_num_kv_blocks(exec_->num_kv_blocks());
    r->set_block_size(exec_->block_size());
    for (int32_t w : exec_->kv_group_windows()) r->add_kv_group_windows(w);
    r->set_has_proposer(exec_->has_proposer());
    r->set_proposer_writes_kv(exec_->proposer_writes_kv());
    r->set_proposer_keeps_up(exec_->proposer_keeps_up());
    r->set_max_tree_nodes(exec_->max_tree_nodes());
    r->set_draft_token_cost(exec_->draft_token_cost());
    r->set_num_experts(exec_->expert_shape().num_experts);
    r->set_num_experts_used(exec_->expert_shape().num_used);
    r->set_recurrent_state_slots(exec_->recurrent_state_slots());
    r->set_state_checkpoints(exec_->state_checkpoints());
    r->set_rank(h.rank());
    r->set_world_size(h.world_size());
    ARBOR_LOG(kInfo) << "shard: session with incarnation " << h.incarnation()
                     << (tp_size_ > 1 ? str_cat(", rank ", tp_rank_, " of ", tp_size_, " in ",
                                                h.tp_group())
                                      : std::string());
  }

  void step(const wire::Step& s, wire::FromShard* out) {
    if (!hello_) return set_error(out, s.step(), "step", "a step before hello");
    const double t0 = seconds_now();
    if (std::optional<WireError> e = decoder_.decode(s, &output_)) {
      return set_error(out, s.step(), e->field, e->status.message());
    }
    const double t1 = seconds_now();
    Result<step::StepResult> res = exec_->execute(output_);
    const double t2 = seconds_now();
    if (!res.ok()) {
      return set_error(out, s.step(), "",
                       str_cat("step ", s.step(), ": the executor failed: ",
                               res.status().to_string()));
    }
    wire::StepReply* r = out->mutable_step();
    r->set_incarnation(decoder_.incarnation());
    r->set_step(s.step());
    encode_result(*res, r);
    r->set_execute_s(t2 - t1);
    r->set_decode_s(t1 - t0);
    r->set_received_at_s(received_at_);
    r->set_replied_at_s(seconds_now());
  }

  void measure(const wire::Measure& m, wire::FromShard* out) {
    if (!hello_ || m.incarnation() != decoder_.incarnation()) {
      return set_error(out, 0, "measure.incarnation",
                       str_cat("is ", m.incarnation(), ", this shard runs incarnation ",
                               decoder_.incarnation()));
    }
    if (m.repeat_token_size() != 0 && m.repeat_token_size() != m.num_tokens_size()) {
      return set_error(out, 0, "measure.repeat_token",
                       str_cat("has ", m.repeat_token_size(), " entries for ",
                               m.num_tokens_size(), " sizes"));
    }
    std::vector<step::StepCostProbe> probes;
    for (int i = 0; i < m.num_tokens_size(); ++i) {
      probes.push_back({.num_tokens = m.num_tokens(i),
                        .repeat_token = m.repeat_token_size() > 0 && m.repeat_token(i)});
    }
    Result<std::vector<step::StepCostSample>> costs = exec_->measure_step_costs(probes);
    if (!costs.ok()) return set_error(out, 0, "measure", costs.status().message());
    for (const step::StepCostSample& c : *costs) {
      out->mutable_measure()->add_seconds(c.seconds);
      out->mutable_measure()->add_experts_touched(c.experts_touched);
    }
  }

  // The executor forgets every request of the session (an empty step naming them finished).
  void forget_all() {
    step::SchedulerOutput forget;
    forget.finished_ids = decoder_.reset(decoder_.incarnation());
    if (forget.finished_ids.empty()) return;
    Result<step::StepResult> r = exec_->execute(forget);
    if (!r.ok()) ARBOR_LOG(kError) << "shard: forgetting the session's requests: " << r.status().to_string();
  }

  std::unique_ptr<executor::LocalExecutor> exec_;
  std::string model_;
  int tp_rank_ = 0;
  int tp_size_ = 1;
  std::shared_ptr<collective::GroupCollective> group_;
  std::atomic<bool> busy_{false};
  std::mutex mu_;
  StepDecoder decoder_;
  bool hello_ = false;
  step::SchedulerOutput output_;  // the step being run (reused)
  double received_at_ = 0;        // when the message being answered was read
};

}  // namespace server_internal

struct ShardServer::Impl {
  std::unique_ptr<server_internal::ShardService> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

ShardServer::ShardServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ShardServer::~ShardServer() { shutdown(); }

const std::string& ShardServer::address() const { return impl_->address; }

void ShardServer::shutdown() {
  if (impl_ && impl_->server) {
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    impl_->server.reset();
  }
}

Result<std::unique_ptr<ShardServer>> ShardServer::start(
    std::unique_ptr<executor::LocalExecutor> executor, const ShardServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  if (options.tp_size > 1 && options.group == nullptr) {
    return invalid_argument("shard: rank ", options.tp_rank, " of ", options.tp_size,
                            " needs its group collective");
  }
  impl->service = std::make_unique<server_internal::ShardService>(std::move(executor), options);
  ARBOR_ASSIGN_OR_RETURN(StartedServer started,
                         start_server(impl->service.get(), options.listen, "shard"));
  impl->server = std::move(started.server);
  impl->address = std::move(started.address);
  return std::unique_ptr<ShardServer>(new ShardServer(std::move(impl)));
}

}  // namespace arbor::shard
