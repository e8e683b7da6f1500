#include "router/router_engine.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "base/log.h"
#include "router/prefix_index.h"
#include "router/replica.grpc.pb.h"
#include "router/wire.h"
#include "shard/grpc_util.h"
#include "sampling/rng.h"

namespace arbor::router {
namespace {

using Clock = std::chrono::steady_clock;

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

std::chrono::system_clock::time_point deadline_after(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

// Replica errors that say the request itself is wrong: the same anywhere, so passed on.
bool request_error(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfRange ||
         s.code() == StatusCode::kNotFound || s.code() == StatusCode::kUnimplemented;
}

struct Call;

// One replica: its connection, what the probes and its KvEvents stream say, what the router
// has in flight there. Fields below `mu` are guarded by RouterEngine::Impl::mu.
struct Replica {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<wire::Replica::Stub> stub;
  std::atomic<bool> stop{false};
  std::thread probe_thread;
  std::thread kv_thread;
  std::mutex kv_ctx_mu;
  grpc::ClientContext* kv_ctx = nullptr;  // the KvEvents call in progress (for cancellation)

  // Guarded by Impl::mu.
  bool healthy = false;
  bool removed = false;
  bool indexed = false;            // the KvEvents snapshot arrived
  std::string state = "not yet probed";
  wire::StatusReply status;
  bool have_status = false;
  int64_t last_steps = -1;
  double steps_changed_at = 0.0;
  int64_t in_flight = 0;
  CachedBlockSet cached;
  RoutedBlockSet routed{0};
  // The prompt blocks of the requests the router has in flight here, counted: they are cached
  // once computed, so a request that shares them is routed here before the events arrive.
  std::unordered_map<kv::BlockHash, int32_t, kv::BlockHashHasher> inflight_blocks;
  std::unordered_set<Call*> calls;
  int64_t num_routed = 0;
  int64_t num_faults = 0;
};

// One client request in flight.
struct Call {
  std::string id;
  engine::GenerateRequest request;
  std::shared_ptr<engine::RequestStream> stream;
  int32_t n = 1;
  bool resumable = true;                 // n = best_of = 1, not pooling
  std::vector<int32_t> delivered;        // tokens sent to the client (resumable calls)
  int64_t text_bytes = 0;
  double cumulative_logprob = 0.0;
  int64_t num_tokens = 0;                // over all samples
  bool any_event = false;
  std::vector<bool> sample_done;         // [n]
  double arrival_s = 0.0;
  double last_token_s = 0.0;
  // Guarded by Impl::mu.
  grpc::ClientContext* ctx = nullptr;    // the attempt in progress
  Replica* replica = nullptr;            // ... on this replica
  std::vector<kv::BlockHash> chain;      // the prompt's block hashes (prefix policy)
  bool client_aborted = false;
  bool failover = false;                 // the router cancelled the attempt to move it
};

// Threads for relays: a request's relay runs on an idle one, or a new one when none is idle
// (each relay blocks on its gRPC stream for the request's life); finished ones wait for the next.
class RelayPool {
 public:
  ~RelayPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void run(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    if (static_cast<int64_t>(jobs_.size()) > idle_) {
      threads_.emplace_back([this] { loop(); });
    } else {
      cv_.notify_one();
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // stop
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  int64_t idle_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

// What this router process puts before the ids it sends replicas: several routers (or one
// restarted) in front of the same replicas must not send two requests under one id, and their
// clients' ids (http-N, or the client's own) are unique per router only.
std::string router_id_tag() {
  std::random_device rd;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(rd()));
  return str_cat("rt", ::getpid(), "-", hex);
}

struct RouterEngine::Impl {
  RouterOptions options;
  const std::string id_tag = router_id_tag();
  mutable std::mutex mu;
  std::condition_variable idle_cv;
  std::condition_variable health_cv;     // a replica became healthy
  std::vector<std::shared_ptr<Replica>> replicas;
  std::unordered_map<std::string, std::shared_ptr<Call>> calls;
  RouterStats stats;
  engine::EngineMetricsSnapshot metrics;
  uint64_t round_robin = 0;
  // Sessions -> the replica each went to last; the least recently used dropped beyond
  // kMaxSessions (a bound on the router's memory).
  static constexpr size_t kMaxSessions = 100000;
  std::list<std::string> session_order;  // least recent first
  std::unordered_map<std::string, std::pair<Replica*, std::list<std::string>::iterator>> sessions;
  int32_t block_size = 0;
  int64_t max_model_len = 0;
  int32_t max_spec_tokens = 0;
  int32_t max_tree_nodes = 0;
  uint64_t next_id = 1;
  std::atomic<bool> stopping{false};
  std::thread watcher;
  std::mutex watcher_mu;
  std::condition_variable watcher_cv;
  // Last member: joined first, once no relay runs (the destructor waits for calls to end).
  std::unique_ptr<RelayPool> relays = std::make_unique<RelayPool>();

  ~Impl();
  void add_replica(const std::string& address);
  void remove_missing(const std::vector<std::string>& keep);
  void probe_loop(Replica* r);
  void probe_once(Replica* r);
  void kv_loop(Replica* r);
  void watch_file();
  void mark_unhealthy(Replica* r, const std::string& why);  // mu held
  std::string replica_states() const;                        // mu held

  // Relay of one request: attempts until a final event reaches the client.
  void run_call(std::shared_ptr<Call> c);
  Replica* choose(Call& c, const std::unordered_set<Replica*>& tried, int64_t* new_tokens);
  void remember_session(const std::string& session, Replica* r);  // mu held
  enum class Outcome { kDone, kFault, kBusy };
  Outcome attempt(Call& c, Replica* r, int32_t attempt_no, Status* fault);
  void deliver(Call& c, engine::StreamEvent ev);
  void end_with_error(Call& c, const Status& error);
  void end_aborted(Call& c);
  void finish_call(const std::shared_ptr<Call>& c);
};

RouterEngine::Impl::~Impl() {
  stopping = true;
  watcher_cv.notify_all();
  if (watcher.joinable()) watcher.join();
  {
    std::unique_lock<std::mutex> lock(mu);
    for (auto& [id, c] : calls) {
      c->client_aborted = true;
      if (c->ctx != nullptr) c->ctx->TryCancel();
    }
    idle_cv.wait(lock, [&] { return calls.empty(); });
  }
  for (auto& r : replicas) {
    r->stop = true;
    {
      std::lock_guard<std::mutex> lock(r->kv_ctx_mu);
      if (r->kv_ctx != nullptr) r->kv_ctx->TryCancel();
    }
  }
  health_cv.notify_all();
  for (auto& r : replicas) {
    if (r->probe_thread.joinable()) r->probe_thread.join();
    if (r->kv_thread.joinable()) r->kv_thread.join();
  }
}

void RouterEngine::Impl::add_replica(const std::string& address) {
  auto r = std::make_shared<Replica>();
  r->address = address;
  // A replica that restarts is reconnected to quickly.
  r->channel = shard::make_channel(address, 50, 500);
  r->stub = wire::Replica::NewStub(r->channel);
  Replica* raw = r.get();
  {
    std::lock_guard<std::mutex> lock(mu);
    replicas.push_back(r);
  }
  r->probe_thread = std::thread([this, raw] { probe_loop(raw); });
  r->kv_thread = std::thread([this, raw] { kv_loop(raw); });
  ARBOR_LOG(kInfo) << "router: replica " << address << " added";
}

void RouterEngine::Impl::remove_missing(const std::vector<std::string>& keep) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& r : replicas) {
    if (r->removed || std::find(keep.begin(), keep.end(), r->address) != keep.end()) continue;
    r->removed = true;
    r->healthy = false;
    r->state = "removed from the replicas file";
    ARBOR_LOG(kInfo) << "router: replica " << r->address
                     << " removed (its running requests finish there)";
  }
}

void RouterEngine::Impl::mark_unhealthy(Replica* r, const std::string& why) {
  const bool was = r->healthy;
  r->healthy = false;
  r->state = why;
  if (!was) return;
  ++r->num_faults;
  ARBOR_LOG(kWarn) << "router: replica " << r->address << " unhealthy: " << why << "; its "
                   << r->calls.size() << " request(s) move to other replicas";
  for (Call* c : r->calls) {
    c->failover = true;
    if (c->ctx != nullptr) c->ctx->TryCancel();
  }
}

void RouterEngine::Impl::probe_once(Replica* r) {
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline_after(options.probe_timeout_s));
  wire::StatusCall call;
  call.set_protocol_version(kReplicaProtocolVersion);
  wire::StatusReply reply;
  const grpc::Status s = r->stub->Status(&ctx, call, &reply);
  std::lock_guard<std::mutex> lock(mu);
  if (r->removed) return;
  if (!s.ok()) {
    ++stats.probe_failures;
    mark_unhealthy(r, str_cat("probe failed: ", s.error_message()));
    return;
  }
  const double now = now_s();
  if (reply.num_steps() != r->last_steps) {
    r->last_steps = reply.num_steps();
    r->steps_changed_at = now;
  }
  r->status = reply;
  r->have_status = true;
  r->cached.set_max_blocks(reply.num_kv_blocks());
  r->routed.set_max_blocks(reply.num_kv_blocks());
  std::string why;
  if (options.vocab_size > 0 && reply.vocab_size() != options.vocab_size) {
    why = str_cat("serves a model with ", reply.vocab_size(), " tokens, the router's tokenizer has ",
                  options.vocab_size);
  } else if (block_size > 0 && reply.block_size() != block_size) {
    why = str_cat("KV blocks of ", reply.block_size(), " tokens, the other replicas' have ",
                  block_size);
  } else if (!reply.executor_healthy()) {
    why = str_cat("its executor is down: ", reply.executor_error());
  } else if (reply.num_running() > 0 && now - r->steps_changed_at > options.stall_timeout_s) {
    why = str_cat("no step in ", now - r->steps_changed_at, " s with ", reply.num_running(),
                  " request(s) running");
  }
  if (!why.empty()) {
    mark_unhealthy(r, why);
    return;
  }
  if (block_size == 0) block_size = reply.block_size();
  if (!r->healthy) {
    r->healthy = true;
    r->state = "healthy";
    ARBOR_LOG(kInfo) << "router: replica " << r->address << " healthy (pid " << reply.pid()
                     << ", " << reply.num_kv_blocks() << " KV blocks of " << reply.block_size()
                     << " tokens, max_model_len " << reply.max_model_len() << ")";
    health_cv.notify_all();
  }
}

void RouterEngine::Impl::probe_loop(Replica* r) {
  while (!r->stop) {
    probe_once(r);
    std::unique_lock<std::mutex> lock(watcher_mu);
    watcher_cv.wait_for(lock, std::chrono::duration<double>(options.probe_interval_s),
                        [&] { return r->stop.load() || stopping.load(); });
    if (stopping) return;
  }
}

// Follows the replica's KvEvents stream; on any break the replica's set is cleared (nothing is
// known of its cache until the next snapshot) and the stream is reopened.
void RouterEngine::Impl::kv_loop(Replica* r) {
  while (!r->stop) {
    grpc::ClientContext ctx;
    {
      std::lock_guard<std::mutex> lock(r->kv_ctx_mu);
      if (r->stop) return;
      r->kv_ctx = &ctx;
    }
    wire::KvEventsCall call;
    call.set_protocol_version(kReplicaProtocolVersion);
    std::unique_ptr<grpc::ClientReader<wire::KvEventBatch>> reader = r->stub->KvEvents(&ctx, call);
    wire::KvEventBatch batch;
    while (reader->Read(&batch)) {
      Result<std::vector<kv::KvEvent>> events = decode_kv_events(batch);
      std::lock_guard<std::mutex> lock(mu);
      Status applied = events.status();
      if (events.ok()) {
        if (batch.reset()) r->cached.clear();
        applied = r->cached.apply(*events);
      }
      if (!applied.ok()) {
        ARBOR_LOG(kWarn) << "router: replica " << r->address << "'s cache events: "
                         << applied.message() << "; resubscribing";
        r->cached.clear();
        r->indexed = false;
        ctx.TryCancel();
        break;
      }
      r->indexed = true;
    }
    reader->Finish();
    {
      std::lock_guard<std::mutex> lock(r->kv_ctx_mu);
      r->kv_ctx = nullptr;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      r->cached.clear();
      r->indexed = false;
    }
    if (r->stop) return;
    std::unique_lock<std::mutex> lock(watcher_mu);
    watcher_cv.wait_for(lock, std::chrono::duration<double>(options.probe_interval_s),
                        [&] { return stopping.load(); });
    if (stopping) return;
  }
}

std::vector<std::string> read_replicas_file(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string address;
    while (words >> address) out.push_back(address);
  }
  return out;
}

void RouterEngine::Impl::watch_file() {
  int64_t seen_mtime = -1;
  while (!stopping) {
    struct stat st{};
    if (::stat(options.replicas_file.c_str(), &st) == 0) {
      const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
      if (mtime != seen_mtime) {
        seen_mtime = mtime;
        std::vector<std::string> listed = read_replicas_file(options.replicas_file);
        std::vector<std::string> keep = options.replicas;
        keep.insert(keep.end(), listed.begin(), listed.end());
        std::vector<std::string> known;
        {
          std::lock_guard<std::mutex> lock(mu);
          for (auto& r : replicas) {
            if (!r->removed) known.push_back(r->address);
          }
        }
        for (const std::string& a : listed) {
          if (std::find(known.begin(), known.end(), a) == known.end()) {
            add_replica(a);
            known.push_back(a);
          }
        }
        remove_missing(keep);
      }
    }
    std::unique_lock<std::mutex> lock(watcher_mu);
    watcher_cv.wait_for(lock, std::chrono::duration<double>(options.probe_interval_s),
                        [&] { return stopping.load(); });
  }
}

std::string RouterEngine::Impl::replica_states() const {
  std::string out;
  for (const auto& r : replicas) {
    if (r->removed) continue;
    out += str_cat(out.empty() ? "" : "; ", r->address, ": ", r->state);
  }
  return out.empty() ? std::string("no replica") : out;
}

// How many leading blocks of `chain` requests in flight on `r` share. mu held.
int64_t inflight_matched(const Replica& r, const std::vector<kv::BlockHash>& chain) {
  int64_t n = 0;
  while (n < static_cast<int64_t>(chain.size()) &&
         r.inflight_blocks.contains(chain[static_cast<size_t>(n)])) {
    ++n;
  }
  return n;
}

Replica* RouterEngine::Impl::choose(Call& c, const std::unordered_set<Replica*>& tried,
                                    int64_t* new_tokens) {
  // mu held by the caller.
  std::vector<RouteCandidate> cands;
  std::vector<Replica*> order;
  if (c.chain.empty() && options.policy != RoutePolicy::kRoundRobin) {
    c.chain = prompt_block_hashes(c.request.prompt_token_ids, block_size, c.request.cache_salt);
  }
  const std::vector<kv::BlockHash>& chain = c.chain;
  Replica* sticky = nullptr;
  if (!c.request.session.empty() && options.policy != RoutePolicy::kRoundRobin) {
    if (auto it = sessions.find(c.request.session); it != sessions.end()) sticky = it->second.first;
  }
  // Untried replicas first; a tried one only when no other is healthy (it may have restarted).
  for (int pass = 0; pass < 2 && order.empty(); ++pass) {
    cands.clear();
    for (auto& r : replicas) {
      const bool eligible = r->healthy && !r->removed && (pass == 1 || !tried.contains(r.get()));
      RouteCandidate cand;
      cand.eligible = eligible;
      cand.in_flight = r->in_flight;
      cand.sticky = r.get() == sticky;
      cand.affinity_blocks = r->routed.matched(chain);  // what this router sent there
      cand.matched_blocks = options.policy == RoutePolicy::kRoutedText
                                ? cand.affinity_blocks
                                : std::max(r->cached.matched(chain), inflight_matched(*r, chain));
      cands.push_back(cand);
      if (eligible) order.push_back(r.get());
    }
  }
  if (order.empty()) return nullptr;
  const RouteChoice choice =
      choose_replica(options.policy, cands, static_cast<int64_t>(c.request.prompt_token_ids.size()),
                     block_size, options.weights, round_robin);
  if (choice.index < 0) return nullptr;
  if (options.policy == RoutePolicy::kRoundRobin) round_robin = static_cast<uint64_t>(choice.index) + 1;
  Replica* r = replicas[static_cast<size_t>(choice.index)].get();
  if (options.policy != RoutePolicy::kRoundRobin) r->routed.add(chain);
  if (tried.empty()) {
    switch (choice.reason) {
      case RouteReason::kPrefix: ++stats.routed_prefix; break;
      case RouteReason::kLoad: ++stats.routed_load; break;
      case RouteReason::kImbalance: ++stats.routed_imbalance; break;
      case RouteReason::kRoundRobin: ++stats.routed_round_robin; break;
      case RouteReason::kSession: ++stats.routed_session; break;
    }
    const auto prompt = static_cast<int64_t>(c.request.prompt_token_ids.size());
    stats.prompt_tokens += prompt;
    stats.predicted_hit_tokens += prompt - choice.new_tokens;
  }
  *new_tokens = choice.new_tokens;
  ++r->num_routed;
  if (!c.request.session.empty()) remember_session(c.request.session, r);
  return r;
}

void RouterEngine::Impl::remember_session(const std::string& session, Replica* r) {
  if (auto it = sessions.find(session); it != sessions.end()) {
    it->second.first = r;
    session_order.splice(session_order.end(), session_order, it->second.second);
    return;
  }
  session_order.push_back(session);
  sessions.emplace(session, std::pair{r, std::prev(session_order.end())});
  if (sessions.size() > kMaxSessions) {
    sessions.erase(session_order.front());
    session_order.pop_front();
  }
}

void RouterEngine::Impl::deliver(Call& c, engine::StreamEvent ev) {
  const double now = now_s();
  if (!ev.final) {
    c.any_event = true;
    if (!ev.token_ids.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      if (c.num_tokens == 0) {
        metrics.ttft_s.observe(now - c.arrival_s);
      } else {
        metrics.inter_token_s.observe(now - c.last_token_s);
      }
      metrics.num_generation_tokens += static_cast<int64_t>(ev.token_ids.size());
    }
    c.last_token_s = now;
    c.num_tokens += static_cast<int64_t>(ev.token_ids.size());
    if (c.resumable) {
      c.delivered.insert(c.delivered.end(), ev.token_ids.begin(), ev.token_ids.end());
      c.text_bytes += static_cast<int64_t>(ev.text.size());
      c.cumulative_logprob = ev.cumulative_logprob;
    }
    if (ev.stop_reason && ev.index >= 0 && ev.index < c.n) {
      c.sample_done[static_cast<size_t>(ev.index)] = true;
    }
  }
  c.stream->push(std::move(ev));
}

void RouterEngine::Impl::end_with_error(Call& c, const Status& error) {
  engine::StreamEvent final_ev;
  final_ev.final = true;
  final_ev.error = error;
  final_ev.usage.prompt_tokens = static_cast<int64_t>(c.request.prompt_token_ids.size());
  final_ev.usage.completion_tokens = c.num_tokens;
  c.stream->push(std::move(final_ev));
}

void RouterEngine::Impl::end_aborted(Call& c) {
  for (int32_t i = 0; i < c.n; ++i) {
    if (c.sample_done[static_cast<size_t>(i)]) continue;
    engine::StreamEvent ev;
    ev.index = i;
    ev.stop_reason = sched::StopReason{.kind = sched::StopKind::kAbort};
    c.stream->push(std::move(ev));
  }
  end_with_error(c, ok_status());
}

// One attempt's event stream on gRPC's callback API: each event is handed on from the gRPC
// thread that read it (no relay-thread wake-up per event); the relay thread waits for the end.
class EventReader final : public grpc::ClientReadReactor<wire::GenerateEvent> {
 public:
  explicit EventReader(std::function<bool(const wire::GenerateEvent&)> on_event)
      : on_event_(std::move(on_event)) {}
  void start(wire::Replica::Stub* stub, grpc::ClientContext* ctx, const wire::GenerateCall* call) {
    stub->async()->Generate(ctx, call, this);
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (ok && on_event_(msg_)) StartRead(&msg_);
  }
  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
    cv_.notify_all();
  }
  // Blocks until the call is over (OnDone); its status.
  grpc::Status wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }

 private:
  std::function<bool(const wire::GenerateEvent&)> on_event_;
  wire::GenerateEvent msg_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  grpc::Status status_;
};

RouterEngine::Impl::Outcome RouterEngine::Impl::attempt(Call& c, Replica* r, int32_t attempt_no,
                                                        Status* fault) {
  engine::GenerateRequest req = c.request;
  req.request_id = str_cat(id_tag, "/", c.id, attempt_no == 0 ? "" : str_cat("~", attempt_no));
  if (!c.delivered.empty()) {
    req.resume = engine::ResumeFrom{.output_token_ids = c.delivered,
                                    .text_bytes = c.text_bytes,
                                    .cumulative_logprob = c.cumulative_logprob};
    req.sampling.prompt_logprobs.reset();  // the first event carried them
  }
  wire::GenerateCall call;
  encode_request(req, &call);
  grpc::ClientContext ctx;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (c.client_aborted) return Outcome::kDone;
    c.ctx = &ctx;
    c.failover = false;
  }
  Outcome outcome = Outcome::kFault;
  // Runs on gRPC's threads, one event at a time; false stops reading.
  EventReader reader([&](const wire::GenerateEvent& m) {
    Result<engine::StreamEvent> ev = decode_event(m);
    if (!ev.ok()) {
      *fault = ev.status();
      ctx.TryCancel();
      return false;
    }
    if (ev->final && !ev->error.ok() && !request_error(ev->error)) {
      // The replica could not run it (shutting down, a dead executor, a full queue): elsewhere.
      *fault = ev->error;
      outcome = ev->error.code() == StatusCode::kResourceExhausted ? Outcome::kBusy
                                                                   : Outcome::kFault;
      return false;
    }
    const bool final = ev->final;
    deliver(c, std::move(*ev));
    if (final) outcome = Outcome::kDone;
    return !final;
  });
  reader.start(r->stub.get(), &ctx, &call);
  const grpc::Status st = reader.wait();
  std::lock_guard<std::mutex> lock(mu);
  c.ctx = nullptr;
  if (outcome == Outcome::kDone) return outcome;
  if (c.client_aborted) {
    end_aborted(c);
    return Outcome::kDone;
  }
  if (fault->ok()) {
    *fault = failed_precondition("replica ", r->address, ": ",
                                 c.failover ? std::string("moved off an unhealthy replica")
                                            : str_cat("stream broke: ", st.error_message()));
  }
  if (!c.failover && outcome == Outcome::kFault) {
    mark_unhealthy(r, str_cat("a request's stream broke: ", fault->message()));
  }
  return outcome;
}

void RouterEngine::Impl::run_call(std::shared_ptr<Call> c) {
  std::unordered_set<Replica*> tried;
  Status last_fault = ok_status();
  // Attempts since the request last made progress (an event reached the client): a request
  // that keeps streaming between faults is never given up on; one that gets nowhere on
  // max_attempts replicas in a row ends with an error.
  int32_t fruitless = 0;
  for (int32_t attempt_no = 0;; ++attempt_no) {
    Replica* r = nullptr;
    int64_t new_tokens = 0;
    {
      std::unique_lock<std::mutex> lock(mu);
      if (c->client_aborted) {
        end_aborted(*c);
        break;
      }
      // The replica died after the last token but before its final event: the client has every
      // token, so the request ends here as it would have (nothing is left to resume).
      if (attempt_no > 0 && c->resumable && c->any_event && !c->sample_done[0] &&
          static_cast<int64_t>(c->delivered.size()) >= c->request.max_tokens) {
        engine::StreamEvent last;
        last.stop_reason = sched::StopReason{.kind = sched::StopKind::kMaxTokens};
        last.cumulative_logprob = c->cumulative_logprob;
        c->stream->push(std::move(last));
        c->sample_done[0] = true;
        end_with_error(*c, ok_status());
        break;
      }
      if (fruitless >= options.max_attempts) {
        ++stats.failed;
        end_with_error(*c, failed_precondition("the request failed on ", fruitless,
                                               " replica(s) in a row; last: ",
                                               last_fault.message()));
        break;
      }
      const double give_up = now_s() + options.no_replica_wait_s;
      while ((r = choose(*c, tried, &new_tokens)) == nullptr && now_s() < give_up &&
             !c->client_aborted && !stopping) {
        health_cv.wait_for(lock, std::chrono::milliseconds(100));
      }
      if (r == nullptr) {
        if (c->client_aborted) {
          end_aborted(*c);
        } else {
          ++stats.failed;
          end_with_error(*c, failed_precondition("no healthy replica (", replica_states(), ")",
                                                 last_fault.ok() ? std::string()
                                                                 : str_cat("; last fault: ",
                                                                           last_fault.message())));
        }
        break;
      }
      if (attempt_no > 0) {
        if (!c->any_event) {
          ++stats.retries;
        } else if (c->resumable) {
          ++stats.resumes;
          stats.resumed_tokens += static_cast<int64_t>(c->delivered.size());
        }
      }
      if (attempt_no > 0 && c->any_event && !c->resumable) {
        ++stats.failed;
        end_with_error(*c, failed_precondition("replica failed after the request's first event; "
                                               "a request with n > 1 cannot be resumed (",
                                               last_fault.message(), ")"));
        break;
      }
      tried.insert(r);
      ++r->in_flight;
      r->calls.insert(c.get());
      for (const kv::BlockHash& h : c->chain) ++r->inflight_blocks[h];
      c->replica = r;
    }
    if (attempt_no > 0) {
      ARBOR_LOG(kInfo) << "router: request " << c->id << " "
                       << (c->any_event ? str_cat("resumed after ", c->delivered.size(), " tokens")
                                        : std::string("retried"))
                       << " on " << r->address << " (" << last_fault.message() << ")";
    }
    Status fault = ok_status();
    const int64_t tokens_before = c->num_tokens;
    const bool events_before = c->any_event;
    const Outcome outcome = attempt(*c, r, attempt_no, &fault);
    const bool progressed = c->num_tokens > tokens_before || (c->any_event && !events_before);
    fruitless = progressed ? 0 : fruitless + 1;
    // A replica that failed the request is tried again only when no other is healthy.
    if (progressed) tried = {r};
    {
      std::lock_guard<std::mutex> lock(mu);
      --r->in_flight;
      r->calls.erase(c.get());
      for (const kv::BlockHash& h : c->chain) {
        auto it = r->inflight_blocks.find(h);
        if (--it->second == 0) r->inflight_blocks.erase(it);
      }
      c->replica = nullptr;
    }
    if (outcome == Outcome::kDone) break;
    last_fault = fault;
  }
  finish_call(c);
}

void RouterEngine::Impl::finish_call(const std::shared_ptr<Call>& c) {
  std::lock_guard<std::mutex> lock(mu);
  metrics.e2e_s.observe(now_s() - c->arrival_s);
  ++metrics.num_requests_finished;
  if (c->client_aborted) ++metrics.num_requests_aborted;
  calls.erase(c->id);
  if (calls.empty()) idle_cv.notify_all();
}

RouterEngine::RouterEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RouterEngine::~RouterEngine() = default;

Result<std::unique_ptr<RouterEngine>> RouterEngine::create(const RouterOptions& options) {
  if (options.replicas.empty() && options.replicas_file.empty()) {
    return invalid_argument("the router needs replicas: --replica ADDR (repeated) or "
                            "--replicas-file FILE");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  for (const std::string& a : options.replicas) impl->add_replica(a);
  if (!options.replicas_file.empty()) {
    impl->watcher = std::thread([p = impl.get()] { p->watch_file(); });
  }
  const double give_up = now_s() + options.startup_timeout_s;
  double next_log = now_s() + 5.0;
  std::unique_lock<std::mutex> lock(impl->mu);
  while (true) {
    int64_t len = 0;
    for (auto& r : impl->replicas) {
      if (!r->healthy) continue;
      const int64_t l = r->status.max_model_len();
      len = len == 0 ? l : std::min(len, l);
      impl->max_spec_tokens = std::max(impl->max_spec_tokens, r->status.max_spec_tokens());
      impl->max_tree_nodes = std::max(impl->max_tree_nodes, r->status.max_tree_nodes());
    }
    if (len > 0) {
      impl->max_model_len = len;
      break;
    }
    if (now_s() >= give_up) {
      return failed_precondition("no replica became healthy in ", options.startup_timeout_s,
                                 " s (", impl->replica_states(), ")");
    }
    if (now_s() >= next_log) {
      ARBOR_LOG(kInfo) << "router: waiting for a healthy replica (" << impl->replica_states() << ")";
      next_log = now_s() + 5.0;
    }
    impl->health_cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  lock.unlock();
  return std::unique_ptr<RouterEngine>(new RouterEngine(std::move(impl)));
}

Result<std::shared_ptr<engine::RequestStream>> RouterEngine::submit(engine::GenerateRequest request) {
  Impl& s = *impl_;
  if (request.prompt_token_ids.empty()) return invalid_argument("prompt has 0 tokens");
  if (!request.sampling.seed) request.sampling.seed = sampling::Rng::random_seed();
  auto c = std::make_shared<Call>();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopping) return failed_precondition("the router is shutting down");
    if (request.request_id.empty()) request.request_id = str_cat("req-", s.next_id++);
    if (s.calls.contains(request.request_id)) {
      return invalid_argument("request id '", request.request_id, "' is already in use");
    }
    c->id = request.request_id;
    c->n = request.pooling ? 1 : std::max(1, request.n);
    const int32_t best_of = request.best_of == 0 ? request.n : request.best_of;
    c->resumable = !request.pooling && c->n == 1 && best_of <= 1;
    c->sample_done.assign(static_cast<size_t>(c->n), false);
    c->arrival_s = now_s();
    c->stream = std::make_shared<engine::RequestStream>(c->id);
    c->request = std::move(request);
    s.calls.emplace(c->id, c);
    ++s.metrics.num_requests_submitted;
    s.metrics.num_prompt_tokens += static_cast<int64_t>(c->request.prompt_token_ids.size());
  }
  std::shared_ptr<engine::RequestStream> stream = c->stream;
  impl_->relays->run([p = impl_.get(), c] { p->run_call(c); });
  return stream;
}

void RouterEngine::abort(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->calls.find(request_id);
  if (it == impl_->calls.end()) return;
  it->second->client_aborted = true;
  if (it->second->ctx != nullptr) it->second->ctx->TryCancel();
  impl_->health_cv.notify_all();
}

engine::EngineMetricsSnapshot RouterEngine::metrics() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  engine::EngineMetricsSnapshot m = impl_->metrics;
  m.num_running = static_cast<int32_t>(impl_->calls.size());
  bool any_healthy = false;
  int64_t usable = 0, used = 0;
  for (const auto& r : impl_->replicas) {
    if (r->removed || !r->have_status) continue;
    any_healthy = any_healthy || r->healthy;
    usable += r->status.num_kv_blocks();
    used += r->status.num_kv_blocks() - r->status.num_free_blocks();
    m.num_waiting += r->status.num_waiting();
  }
  m.kv_usable_blocks = static_cast<int32_t>(usable);
  m.kv_usage = usable > 0 ? static_cast<double>(used) / static_cast<double>(usable) : 0.0;
  m.executor_healthy = any_healthy;
  if (!any_healthy) m.executor_error = str_cat("no healthy replica (", impl_->replica_states(), ")");
  const RouterStats& st = impl_->stats;
  m.num_prefix_cache_query_tokens = st.prompt_tokens;
  m.num_prefix_cache_hit_tokens = st.predicted_hit_tokens;
  m.prefix_cache_hit_rate = st.prompt_tokens > 0 ? static_cast<double>(st.predicted_hit_tokens) /
                                                       static_cast<double>(st.prompt_tokens)
                                                 : 0.0;
  return m;
}

int64_t RouterEngine::max_model_len() const { return impl_->max_model_len; }
int32_t RouterEngine::max_spec_tokens() const { return impl_->max_spec_tokens; }
int32_t RouterEngine::max_tree_nodes() const { return impl_->max_tree_nodes; }

int32_t RouterEngine::num_free_blocks() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  int64_t free = 0;
  for (const auto& r : impl_->replicas) {
    if (!r->removed && r->have_status) free += r->status.num_free_blocks();
  }
  return static_cast<int32_t>(free);
}

void RouterEngine::wait_idle() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->idle_cv.wait(lock, [&] { return impl_->calls.empty(); });
}

RouterStats RouterEngine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

int32_t RouterEngine::block_size() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->block_size;
}

std::string RouterEngine::extra_metrics() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const RouterStats& st = impl_->stats;
  std::ostringstream out;
  out << "# HELP arbor_router_routed_total Requests routed, by the reason for the replica chosen.\n"
         "# TYPE arbor_router_routed_total counter\n";
  for (auto [reason, n] : {std::pair{"prefix", st.routed_prefix}, {"load", st.routed_load},
                           {"imbalance", st.routed_imbalance}, {"round_robin", st.routed_round_robin},
                           {"session", st.routed_session}}) {
    out << "arbor_router_routed_total{reason=\"" << reason << "\"} " << n << "\n";
  }
  auto counter = [&](const char* name, const char* help, int64_t v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
        << name << " " << v << "\n";
  };
  counter("arbor_router_prompt_tokens_total", "Prompt tokens of routed requests.", st.prompt_tokens);
  counter("arbor_router_predicted_hit_tokens_total",
          "Prompt tokens predicted to come from the chosen replica's prefix cache.",
          st.predicted_hit_tokens);
  counter("arbor_router_retries_total", "Requests restarted on another replica before any event.",
          st.retries);
  counter("arbor_router_resumes_total",
          "Streaming requests resumed on another replica from the tokens already sent.", st.resumes);
  counter("arbor_router_resumed_tokens_total", "Tokens handed to resumed requests.",
          st.resumed_tokens);
  counter("arbor_router_failed_total", "Requests ended with an error event by a replica fault.",
          st.failed);
  counter("arbor_router_probe_failures_total", "Health probes that failed.", st.probe_failures);
  out << "# HELP arbor_router_replica_healthy Whether the replica is healthy (1) or not (0).\n"
         "# TYPE arbor_router_replica_healthy gauge\n";
  for (const auto& r : impl_->replicas) {
    if (r->removed) continue;
    out << "arbor_router_replica_healthy{replica=\"" << r->address << "\"} " << (r->healthy ? 1 : 0)
        << "\n";
  }
  out << "# HELP arbor_router_replica_in_flight Requests the router has running on the replica.\n"
         "# TYPE arbor_router_replica_in_flight gauge\n";
  for (const auto& r : impl_->replicas) {
    if (r->removed) continue;
    out << "arbor_router_replica_in_flight{replica=\"" << r->address << "\"} " << r->in_flight
        << "\n";
  }
  out << "# HELP arbor_router_replica_index_blocks Block hashes the router holds for the replica's "
         "prefix cache.\n# TYPE arbor_router_replica_index_blocks gauge\n";
  for (const auto& r : impl_->replicas) {
    if (r->removed) continue;
    out << "arbor_router_replica_index_blocks{replica=\"" << r->address << "\"} "
        << (impl_->options.policy == RoutePolicy::kRoutedText ? r->routed.size() : r->cached.size())
        << "\n";
  }
  out << "# HELP arbor_router_replica_routed_total Requests (attempts) sent to the replica.\n"
         "# TYPE arbor_router_replica_routed_total counter\n";
  for (const auto& r : impl_->replicas) {
    out << "arbor_router_replica_routed_total{replica=\"" << r->address << "\"} " << r->num_routed
        << "\n";
  }
  return out.str();
}

}  // namespace arbor::router
