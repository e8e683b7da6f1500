#include "shard/remote_executor.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include "base/log.h"
#include "collective/group.h"
#include "shard/grpc_util.h"
#include "shard/process.h"
#include "shard/shard.grpc.pb.h"
#include "shard/wire.h"

namespace arbor::shard {

namespace {

using Clock = std::chrono::steady_clock;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

gpr_timespec deadline_at(double t_s) {
  const double left = std::max(0.0, t_s - now_s());
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_micros(static_cast<int64_t>(left * 1e6), GPR_TIMESPAN));
}

// A process's state letter from /proc/<pid>/stat ('T': stopped), or '?'.
char process_state(int pid) {
  std::ifstream f(str_cat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(f, line)) return '?';
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() ? line[paren + 2] : '?';
}

// What an engine killed with SIGKILL leaves behind (its socket folder, the shared memory of a TP
// group that died before its first call): names that carry the pid of a process of this user
// that no longer exists are removed. "<prefix><pid>-...".
void remove_stale(const std::filesystem::path& dir, std::string_view prefix, bool shm) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    struct stat st {};
    if (pid <= 0 || ::stat(entry.path().c_str(), &st) != 0 || st.st_uid != ::getuid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive
    ARBOR_LOG(kInfo) << "shards: removing " << entry.path().string() << " (left by process "
                     << pid << ", which is gone)";
    if (shm) {
      shm_unlink(("/" + name).c_str());
    } else {
      std::filesystem::remove_all(entry.path(), ec);
    }
  }
}

void remove_stale_launch_files() {
  remove_stale("/tmp", "arbor-shards-", false);
  remove_stale("/dev/shm", "arbor-tp-", true);
}

// Tags of the stream's operations on its completion queue.
void* const kStartTag = reinterpret_cast<void*>(1);
void* const kWriteTag = reinterpret_cast<void*>(2);
void* const kReadTag = reinterpret_cast<void*>(3);
void* const kFinishTag = reinterpret_cast<void*>(4);

}  // namespace

// Named (not anonymous): RemoteExecutor::Impl holds them.
namespace remote_internal {

// One shard's session: the channel and the async bidirectional stream, driven on the caller's
// thread (AsyncNext with the step's deadline), so a hung shard costs a deadline, not a thread.
class Session {
 public:
  ~Session() { close(); }

  // Connects to `uri` and starts the stream; fails when not connected by `until_s`.
  Status open(const std::string& uri, double until_s) {
    close();
    // A launched shard binds its socket after loading the model: retry fast.
    channel_ = make_channel(uri, 20, 100);
    if (!channel_->WaitForConnected(deadline_at(until_s))) {
      channel_.reset();
      return failed_precondition("cannot connect to ", uri);
    }
    stub_ = wire::Shard::NewStub(channel_);
    ctx_ = std::make_unique<grpc::ClientContext>();
    cq_ = std::make_unique<grpc::CompletionQueue>();
    stream_ = stub_->PrepareAsyncSession(ctx_.get(), cq_.get());
    stream_->StartCall(kStartTag);
    pending_ = 1;
    bool ok = false;
    if (!wait_for(kStartTag, until_s, &ok) || !ok) {
      close();
      return failed_precondition("cannot start a session on ", uri);
    }
    return ok_status();
  }

  bool is_open() const { return stream_ != nullptr; }

  // Sends `msg` and waits for the reply. kDeadlineExceeded-like: `*timed_out` set; a broken
  // stream: an error with gRPC's status. Either way the session is closed. abort (optional):
  // another rank's exchange failed; checked every few milliseconds, it ends this one too
  // (the session closed).
  Status exchange(const wire::ToShard& msg, wire::FromShard* reply, double until_s,
                  bool* timed_out, const std::atomic<bool>* abort = nullptr) {
    *timed_out = false;
    if (!is_open()) return failed_precondition("no session");
    stream_->Write(msg, kWriteTag);
    stream_->Read(reply, kReadTag);
    pending_ += 2;
    bool wrote = false, read = false, write_ok = false, read_ok = false;
    while (!(wrote && read)) {
      void* tag = nullptr;
      bool ok = false;
      const double slice = abort != nullptr ? std::min(until_s, now_s() + 0.005) : until_s;
      const auto r = cq_->AsyncNext(&tag, &ok, deadline_at(slice));
      if (r == grpc::CompletionQueue::TIMEOUT) {
        if (abort != nullptr && abort->load(std::memory_order_acquire)) {
          close();
          return failed_precondition("ended: another rank of the group failed");
        }
        if (now_s() < until_s) continue;
        *timed_out = true;
        close();
        return failed_precondition("no answer");
      }
      if (r != grpc::CompletionQueue::GOT_EVENT) break;
      --pending_;
      if (tag == kWriteTag) wrote = true, write_ok = ok;
      if (tag == kReadTag) read = true, read_ok = ok;
    }
    if (!(write_ok && read_ok)) {
      const std::string why = finish_status();
      close();
      return failed_precondition("the stream broke (", why, ")");
    }
    return ok_status();
  }

  // Cancels the stream and drains the queue (bounded: cancelled operations end at once).
  void close() {
    if (stream_ != nullptr) {
      ctx_->TryCancel();
      const double until = now_s() + 2.0;
      while (pending_ > 0) {
        void* tag = nullptr;
        bool ok = false;
        if (cq_->AsyncNext(&tag, &ok, deadline_at(until)) != grpc::CompletionQueue::GOT_EVENT) {
          break;
        }
        --pending_;
      }
      cq_->Shutdown();
      void* tag = nullptr;
      bool ok = false;
      while (cq_->AsyncNext(&tag, &ok, deadline_at(now_s() + 1.0)) ==
             grpc::CompletionQueue::GOT_EVENT) {
      }
    }
    stream_.reset();
    cq_.reset();
    ctx_.reset();
    stub_.reset();
    channel_.reset();
    pending_ = 0;
  }

 private:
  bool wait_for(void* want, double until_s, bool* ok) {
    while (pending_ > 0) {
      void* tag = nullptr;
      const auto r = cq_->AsyncNext(&tag, ok, deadline_at(until_s));
      if (r != grpc::CompletionQueue::GOT_EVENT) return false;
      --pending_;
      if (tag == want) return true;
    }
    return false;
  }

  // The stream's final status, after a failed operation (bounded wait).
  std::string finish_status() {
    grpc::Status status;
    stream_->Finish(&status, kFinishTag);
    ++pending_;
    bool ok = false;
    if (!wait_for(kFinishTag, now_s() + 1.0, &ok)) return "no status";
    return str_cat("gRPC ", static_cast<int>(status.error_code()), ": ", status.error_message());
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<wire::Shard::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::CompletionQueue> cq_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<wire::ToShard, wire::FromShard>> stream_;
  int pending_ = 0;  // operations started and not yet seen on the queue
};

// A thread that runs one rank's exchanges (ranks > 0 of a TP group), so that every rank gets
// its message at once and the engine thread waits for all of them: a rank's forward waits for
// the others in its collectives.
class RankWorker {
 public:
  RankWorker() : thread_([this] { loop(); }) {}
  ~RankWorker() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> l(mu_);
      job_ = std::move(job);
      busy_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !busy_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || (busy_ && job_); });
      if (stop_) return;
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      l.unlock();
      job();
      l.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

// One rank: where it listens, its process when launched, its session and counters.
struct Shard {
  int32_t rank = 0;
  std::string uri;
  std::vector<std::string> argv;  // launched: the command line; empty for --shard-uri
  ChildProcess child;
  Session session;
  wire::HelloReply hello;
  step::ShardStats stats;
  std::unique_ptr<RankWorker> worker;  // ranks > 0 of a group: runs its exchanges
};

}  // namespace remote_internal

using remote_internal::Shard;

struct RemoteExecutor::Impl {
  RemoteExecutorOptions options;
  std::string socket_dir;       // launched shards' sockets; removed at the end
  std::vector<std::unique_ptr<Shard>> shards;
  uint64_t incarnation = 0;
  bool down = false;            // a fault happened and no incarnation took over yet
  std::string last_fault;
  std::string tp_group;         // the incarnation's TP group (collective/group.h); "" at 1 rank
  std::string group_token;      // tells this engine's groups from others' on the host
  StepEncoder encoder;
  double per_token_s = 0;       // decaying max of step seconds per scheduled token; 0 = none yet
  std::deque<StepTiming> timings;
  wire::ToShard msg;            // reused buffers
  std::vector<wire::FromShard> replies;  // [ranks]

  ~Impl() {
    shards.clear();  // closes sessions, kills and reaps launched shards
    collective::remove_group_name(tp_group);
    if (!socket_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(socket_dir, ec);
    }
  }

  int32_t world() const { return static_cast<int32_t>(shards.size()); }

  const wire::HelloReply& geometry() const { return shards[0]->hello; }
  std::string name(const Shard& s) const {
    return str_cat("shard ", s.rank,
                   s.child.running() ? str_cat(" (pid ", s.child.pid(), ")") : std::string(),
                   s.argv.empty() ? str_cat(" at ", s.uri) : std::string());
  }

  Status spawn(Shard& s);
  Status bring_up(Shard& s, double until_s);
  Status bring_up_all(double timeout_s);
  Status fault(Shard& s, const std::string& what);
  double step_deadline(int64_t num_tokens) const;
  // `msg` to every rank at once, every reply by until_s into replies. On failure: the rank that
  // failed first on its own (not ended because another failed; on a timeout, a stopped process
  // first), why, and whether it was the deadline.
  struct Exchange {
    Status status;
    Shard* failed = nullptr;
    bool timed_out = false;
  };
  Exchange exchange_all(double until_s);
  Result<step::StepResult> check_reply(const step::SchedulerOutput& output, Shard& s);
  // A rank > 0's reply to the step: the step and incarnation echoed, no result.
  Status check_follower_reply(Shard& s);
};

Status RemoteExecutor::Impl::spawn(Shard& s) {
  if (s.child.running()) s.child.kill_and_reap();
  std::error_code ec;
  std::filesystem::remove(s.uri.substr(5), ec);  // a dead shard's socket file
  ARBOR_ASSIGN_OR_RETURN(s.child, ChildProcess::spawn(s.argv));
  return ok_status();
}

RemoteExecutor::Impl::Exchange RemoteExecutor::Impl::exchange_all(double until_s) {
  const size_t n = shards.size();
  replies.resize(n);
  std::vector<Status> status(n);
  std::vector<char> timed_out(n, 0);
  std::atomic<bool> abort{false};
  std::atomic<int> first{-1};
  const auto run = [&](size_t r) {
    bool t = false;
    status[r] = shards[r]->session.exchange(msg, &replies[r], until_s, &t,
                                            n > 1 ? &abort : nullptr);
    timed_out[r] = t;
    if (!status[r].ok()) {
      int none = -1;
      if (!abort.load(std::memory_order_acquire)) first.compare_exchange_strong(none, static_cast<int>(r));
      abort.store(true, std::memory_order_release);
    }
  };
  for (size_t r = 1; r < n; ++r) {
    if (shards[r]->worker == nullptr) shards[r]->worker = std::make_unique<remote_internal::RankWorker>();
    shards[r]->worker->post([&run, r] { run(r); });
  }
  run(0);
  for (size_t r = 1; r < n; ++r) shards[r]->worker->wait();
  const int f = first.load();
  if (f < 0) return {};
  Exchange e{status[static_cast<size_t>(f)], shards[static_cast<size_t>(f)].get(),
             timed_out[static_cast<size_t>(f)] != 0};
  if (e.timed_out) {
    // Every rank misses the deadline when one is stopped (the others wait for it in their
    // collectives): name the stopped one.
    for (auto& sh : shards) {
      if (sh->child.running() && process_state(sh->child.pid()) == 'T') {
        e.failed = sh.get();
        break;
      }
    }
  }
  return e;
}

Status RemoteExecutor::Impl::check_follower_reply(Shard& s) {
  const wire::FromShard& r = replies[static_cast<size_t>(s.rank)];
  const int64_t step = msg.step().step();
  if (r.has_error()) {
    ARBOR_LOG(kError) << name(s) << " refused step " << step << ": " << r.error().message();
    return fault(s, str_cat("refused step ", step, " (", r.error().field(), "): ",
                            r.error().message()));
  }
  if (!r.has_step() || r.step().step() != step || r.step().incarnation() != incarnation ||
      r.step().requests_size() != 0 || r.step().prompt_logprobs_size() != 0 ||
      r.step().pooled_size() != 0) {
    const std::string what = str_cat("answered step ", step, " of incarnation ", incarnation,
                                     " with step ", r.step().step(), " of incarnation ",
                                     r.step().incarnation(), " and ", r.step().requests_size(),
                                     " results (rank ", s.rank, " returns none)");
    ARBOR_LOG(kError) << name(s) << " " << what;
    return fault(s, what);
  }
  return ok_status();
}

// Launches (if launched) and connects one shard, then says Hello with the current incarnation.
// A launched shard was spawned by bring_up_all (all ranks load their weights at once).
Status RemoteExecutor::Impl::bring_up(Shard& s, double until_s) {
  Status st = failed_precondition("no attempt");
  // A shard started elsewhere may be restarting: retry until the deadline.
  do {
    st = s.session.open(s.uri, std::min(until_s, now_s() + 1.0));
    if (!s.argv.empty()) {
      if (std::optional<ChildExit> e = s.child.poll()) {
        return failed_precondition("shard ", s.rank, " ", e->describe(), " while starting");
      }
    }
  } while (!st.ok() && now_s() < until_s);
  if (!st.ok()) return st;
  msg.Clear();
  wire::Hello* h = msg.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  h->set_incarnation(incarnation);
  h->set_rank(static_cast<uint32_t>(s.rank));
  h->set_world_size(static_cast<uint32_t>(shards.size()));
  h->set_tp_group(tp_group);
  bool timed_out = false;
  wire::FromShard& reply = replies[static_cast<size_t>(s.rank)];
  ARBOR_RETURN_IF_ERROR(s.session.exchange(msg, &reply, until_s, &timed_out));
  if (reply.has_error()) {
    return failed_precondition("refused hello: ", reply.error().field(), ": ", reply.error().message());
  }
  if (!reply.has_hello() || reply.hello().incarnation() != incarnation ||
      reply.hello().protocol_version() != kProtocolVersion) {
    return failed_precondition("answered hello with another message (protocol version ",
                       reply.hello().protocol_version(), ", incarnation ",
                       reply.hello().incarnation(), ")");
  }
  s.hello = reply.hello();
  s.stats.rank = s.rank;
  s.stats.pid = s.child.running() ? s.child.pid() : 0;
  s.stats.incarnation = incarnation;
  s.stats.up = true;
  return ok_status();
}

Status RemoteExecutor::Impl::bring_up_all(double timeout_s) {
  ++incarnation;
  encoder.reset();
  replies.resize(shards.size());
  for (auto& s : shards) s->session.close();
  collective::remove_group_name(tp_group);  // the last group, if it died before its first call
  tp_group.clear();
  if (world() > 1) {
    const std::string id = str_cat("arbor-tp-", getpid(), "-", group_token, "-", incarnation);
    tp_group = options.tp_store.empty() ? str_cat("shm:/", id)
                                        : str_cat("gloo:", options.tp_store, ":", id);
  }
  for (auto& s : shards) {
    if (s->argv.empty()) continue;
    if (Status st = spawn(*s); !st.ok()) {
      s->stats.up = false;
      return st.with_context(name(*s));
    }
  }
  const double until = now_s() + timeout_s;
  for (auto& s : shards) {
    Status st = bring_up(*s, until);
    if (!st.ok()) {
      s->stats.up = false;
      return st.with_context(str_cat(name(*s), ": not up within ", timeout_s, " s"));
    }
  }
  const wire::HelloReply& g = geometry();
  for (auto& s : shards) {
    if (s->hello.vocab_size() != g.vocab_size() || s->hello.num_kv_blocks() != g.num_kv_blocks() ||
        s->hello.block_size() != g.block_size() ||
        s->hello.max_model_len() != g.max_model_len() ||
        s->hello.kv_group_windows_size() != g.kv_group_windows_size()) {
      return failed_precondition(name(*s), " serves another geometry than shard 0 (",
                                 s->hello.num_kv_blocks(), " KV blocks of ",
                                 s->hello.block_size(), " vs ", g.num_kv_blocks(), " of ",
                                 g.block_size(), "): every rank must be started with the same "
                                 "model and KV flags");
    }
  }
  down = false;
  return ok_status();
}

// Records a fault of shard `s`: ends its session (killing a launched shard that is still alive)
// and returns the kFailedPrecondition that execute() answers, naming the shard and its fate.
Status RemoteExecutor::Impl::fault(Shard& s, const std::string& what) {
  s.session.close();
  std::string fate;
  if (s.child.running()) {
    const int pid = s.child.pid();
    if (std::optional<ChildExit> e = s.child.wait_for(0.2)) {
      fate = e->describe();
    } else {
      const bool stopped = process_state(pid) == 'T';
      s.child.kill_and_reap();
      fate = stopped ? "was stopped (SIGSTOP); killed with SIGKILL" : "killed with SIGKILL";
    }
    fate = str_cat(" (pid ", pid, "): ", fate);
  }
  down = true;
  s.stats.up = false;
  ++s.stats.num_faults;
  last_fault = str_cat("shard ", s.rank, fate, s.argv.empty() ? str_cat(" at ", s.uri) : "",
                       ": ", what);
  s.stats.last_fault = last_fault;
  // The group's incarnation is over: the other ranks' collectives are broken for good, so a
  // launched group is restarted whole (recover()).
  for (auto& other : shards) {
    other->session.close();
    if (other.get() != &s && other->child.running()) other->child.kill_and_reap();
    other->stats.up = false;
  }
  return failed_precondition(last_fault);
}

double RemoteExecutor::Impl::step_deadline(int64_t num_tokens) const {
  if (per_token_s <= 0) return options.start_deadline_s;
  return std::max(options.min_deadline_s, options.deadline_factor * per_token_s *
                                              static_cast<double>(std::max<int64_t>(num_tokens, 1)));
}

Result<step::StepResult> RemoteExecutor::Impl::check_reply(const step::SchedulerOutput& output,
                                                           Shard& s) {
  const wire::FromShard& reply = replies[0];
  const int64_t step = msg.step().step();
  if (reply.has_error()) {
    ARBOR_LOG(kError) << name(s) << " refused step " << step << ": " << reply.error().message();
    return fault(s, str_cat("refused step ", step, " (", reply.error().field(), "): ",
                            reply.error().message()));
  }
  if (!reply.has_step() || reply.step().step() != step ||
      reply.step().incarnation() != incarnation) {
    const std::string what = str_cat("answered step ", step, " of incarnation ", incarnation,
                                     " with step ", reply.step().step(), " of incarnation ",
                                     reply.step().incarnation());
    ARBOR_LOG(kError) << name(s) << " " << what;
    return fault(s, what);
  }
  Result<step::StepResult> result = decode_result(reply.step());
  Status valid = result.ok() ? step::validate_step_result(output, *result, geometry().vocab_size())
                             : result.status();
  if (!valid.ok()) {
    ARBOR_LOG(kError) << name(s) << " sent a malformed reply to step " << step << ": "
                      << valid.message();
    return fault(s, str_cat("malformed reply to step ", step, ": ", valid.message()));
  }
  return result;
}

RemoteExecutor::RemoteExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteExecutor::~RemoteExecutor() = default;

Result<std::unique_ptr<RemoteExecutor>> RemoteExecutor::start(const RemoteExecutorOptions& o) {
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  impl->group_token = str_cat(std::hex, std::random_device()() & 0xffffff);
  if (!o.launch_argv.empty()) {
    remove_stale_launch_files();
    std::string dir = str_cat("/tmp/arbor-shards-", getpid(), "-XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) {
      return io_error("cannot create a folder for shard sockets in /tmp");
    }
    impl->socket_dir = dir;
    for (int32_t r = 0; r < o.num_launched; ++r) {
      auto s = std::make_unique<Shard>();
      s->rank = r;
      s->uri = str_cat("unix:", impl->socket_dir, "/shard-", r, ".sock");
      s->argv = o.launch_argv;
      s->argv.insert(s->argv.end(), {"--listen", s->uri});
      if (o.num_launched > 1) {
        s->argv.insert(s->argv.end(), {"--rank", std::to_string(r), "--world-size",
                                       std::to_string(o.num_launched)});
      }
      impl->shards.push_back(std::move(s));
    }
  } else {
    for (size_t r = 0; r < o.uris.size(); ++r) {
      auto s = std::make_unique<Shard>();
      s->rank = static_cast<int32_t>(r);
      s->uri = o.uris[r];
      impl->shards.push_back(std::move(s));
    }
  }
  if (impl->shards.empty()) return invalid_argument("no shard to launch or connect to");
  ARBOR_RETURN_IF_ERROR(impl->bring_up_all(o.launch_argv.empty() ? o.recover_timeout_s
                                                                 : o.start_timeout_s));
  const wire::HelloReply& g = impl->geometry();
  ARBOR_LOG(kInfo) << "shards: " << impl->shards.size() << " up (" << g.model() << ", pid "
                   << g.pid() << ", " << g.num_kv_blocks() << " KV blocks of "
                   << g.block_size() << ")"
                   << (impl->world() > 1
                           ? str_cat(", tensor parallel over ", impl->world(), " ranks (",
                                     o.tp_store.empty() ? "shared memory" : "gloo", ")")
                           : std::string());
  return std::unique_ptr<RemoteExecutor>(new RemoteExecutor(std::move(impl)));
}

Result<step::StepResult> RemoteExecutor::execute(const step::SchedulerOutput& output) {
  Impl& m = *impl_;
  if (m.down) return failed_precondition(m.last_fault, " (not recovered yet)");
  const double t0 = now_s();
  m.encoder.encode(output, m.incarnation, m.msg.mutable_step());
  const wire::Step& step = m.msg.step();
  if (step.requests_size() == 0 && step.finished_ids_size() == 0 &&
      step.preempted_ids_size() == 0 && step.new_requests_size() == 0) {
    return step::StepResult{};  // nothing the shard must hear of
  }
  const double until = t0 + m.step_deadline(output.total_num_scheduled_tokens);
  // Every rank gets the step; rank 0's reply carries the result.
  const double t_sent = now_s();
  const Impl::Exchange sent = m.exchange_all(until);
  const double t_back = now_s();
  if (!sent.status.ok()) {
    return m.fault(*sent.failed,
                   sent.timed_out ? str_cat("no answer to step ", step.step(), " within ",
                                            until - t0, " s (", m.options.deadline_factor,
                                            " x the measured cost of ",
                                            output.total_num_scheduled_tokens, " tokens)")
                                  : str_cat(sent.status.message(), " during step ", step.step()));
  }
  Result<step::StepResult> result = m.check_reply(output, *m.shards[0]);
  if (!result.ok()) return result;
  const double engine_s = (t_sent - t0) + (now_s() - t_back);
  for (size_t r = 1; r < m.shards.size(); ++r) {
    ARBOR_RETURN_IF_ERROR(m.check_follower_reply(*m.shards[r]));
  }
  const double step_s = now_s() - t0;
  for (size_t r = 0; r < m.shards.size(); ++r) {
    const double exec_s = m.replies[r].step().execute_s();
    step::ShardStats& st = m.shards[r]->stats;
    ++st.num_steps;
    st.step_s += step_s;
    st.forward_s += exec_s;
    st.wait_s += step_s - exec_s;
    st.last_step_s = step_s;
    st.last_forward_s = exec_s;
    st.last_wait_s = step_s - exec_s;
  }
  const double exec_s = m.replies[0].step().execute_s();
  if (output.total_num_scheduled_tokens > 0) {
    const double sample = step_s / output.total_num_scheduled_tokens;
    m.per_token_s = std::max(sample, m.per_token_s * 0.98);
  }
  if (m.timings.size() == 4096) m.timings.pop_front();
  const wire::StepReply& r0 = m.replies[0].step();
  m.timings.push_back(StepTiming{static_cast<int32_t>(output.requests.size()), step_s, exec_s,
                                 r0.decode_s(), engine_s, r0.received_at_s() - t_sent,
                                 t_back - r0.replied_at_s()});
  return result;
}

bool RemoteExecutor::faulted() const { return impl_->down; }

Status RemoteExecutor::recover() {
  Impl& m = *impl_;
  const double t0 = now_s();
  const Status st = m.bring_up_all(m.options.recover_timeout_s);
  if (!st.ok()) {
    m.down = true;
    m.last_fault = str_cat(m.last_fault.empty() ? "" : m.last_fault + "; ", "recovery: ",
                           st.message());
    return failed_precondition(st.message());
  }
  for (auto& s : m.shards) ++s->stats.num_restarts;
  ARBOR_LOG(kInfo) << "shards: incarnation " << m.incarnation << " up in "
                   << static_cast<int>((now_s() - t0) * 1000) << " ms";
  return ok_status();
}

int32_t RemoteExecutor::vocab_size() const { return impl_->geometry().vocab_size(); }
int64_t RemoteExecutor::max_model_len() const { return impl_->geometry().max_model_len(); }
int64_t RemoteExecutor::num_kv_blocks() const { return impl_->geometry().num_kv_blocks(); }
int32_t RemoteExecutor::block_size() const { return impl_->geometry().block_size(); }
std::vector<int32_t> RemoteExecutor::kv_group_windows() const {
  const auto& w = impl_->geometry().kv_group_windows();
  return std::vector<int32_t>(w.begin(), w.end());
}
double RemoteExecutor::draft_token_cost() const { return impl_->geometry().draft_token_cost(); }
bool RemoteExecutor::has_proposer() const { return impl_->geometry().has_proposer(); }
bool RemoteExecutor::proposer_writes_kv() const { return impl_->geometry().proposer_writes_kv(); }
bool RemoteExecutor::proposer_keeps_up() const { return impl_->geometry().proposer_keeps_up(); }
int32_t RemoteExecutor::max_tree_nodes() const { return impl_->geometry().max_tree_nodes(); }
step::ExpertShape RemoteExecutor::expert_shape() const {
  return {impl_->geometry().num_experts(), impl_->geometry().num_experts_used()};
}
int32_t RemoteExecutor::recurrent_state_slots() const {
  return impl_->geometry().recurrent_state_slots();
}
int32_t RemoteExecutor::state_checkpoints() const {
  return impl_->geometry().state_checkpoints();
}
uint64_t RemoteExecutor::incarnation() const { return impl_->incarnation; }

int64_t RemoteExecutor::shard_pid(int32_t rank) const {
  const Shard& s = *impl_->shards.at(static_cast<size_t>(rank));
  return s.child.running() ? s.child.pid() : 0;
}

Status RemoteExecutor::check_max_model_len(int64_t max_model_len) const {
  const wire::HelloReply& g = impl_->geometry();
  if (max_model_len < 0) return invalid_argument("--max-model-len is ", max_model_len);
  if (max_model_len > g.context_length()) {
    return invalid_argument("--max-model-len is ", max_model_len,
                            ", the model's context length is ", g.context_length());
  }
  if (max_model_len > g.max_model_len()) {
    return invalid_argument("--max-model-len is ", max_model_len, ", the shard's KV pool holds ",
                            g.max_model_len(), " tokens (", g.num_kv_blocks() - 1,
                            " blocks of ", g.block_size(), ")");
  }
  return ok_status();
}

Result<std::vector<step::StepCostSample>> RemoteExecutor::measure_step_costs(
    std::span<const step::StepCostProbe> probes) {
  Impl& m = *impl_;
  if (m.down) return failed_precondition(m.last_fault);
  m.msg.Clear();
  m.msg.mutable_measure()->set_incarnation(m.incarnation);
  for (const step::StepCostProbe& p : probes) {
    m.msg.mutable_measure()->add_num_tokens(p.num_tokens);
    m.msg.mutable_measure()->add_repeat_token(p.repeat_token);
  }
  // Every rank measures at once (their forwards meet in collectives); rank 0's times count.
  const Impl::Exchange sent = m.exchange_all(now_s() + m.options.start_timeout_s);
  if (!sent.status.ok()) {
    return m.fault(*sent.failed, str_cat(sent.status.message(), " while measuring step costs"));
  }
  for (size_t r = 0; r < m.shards.size(); ++r) {
    const wire::FromShard& reply = m.replies[r];
    if (reply.has_error()) return invalid_argument(m.name(*m.shards[r]), ": ", reply.error().message());
    if (!reply.has_measure() ||
        reply.measure().seconds_size() != static_cast<int>(probes.size()) ||
        reply.measure().experts_touched_size() != static_cast<int>(probes.size())) {
      return m.fault(*m.shards[r], "answered the step-cost measurement with another message");
    }
  }
  const wire::MeasureReply& reply = m.replies[0].measure();
  std::vector<step::StepCostSample> costs;
  for (int i = 0; i < reply.seconds_size(); ++i) {
    costs.push_back({.seconds = reply.seconds(i), .experts_touched = reply.experts_touched(i)});
    m.per_token_s =
        std::max(m.per_token_s, reply.seconds(i) / std::max(probes[static_cast<size_t>(i)].num_tokens, 1));
  }
  return costs;
}

std::vector<step::ShardStats> RemoteExecutor::shard_stats() const {
  std::vector<step::ShardStats> out;
  for (const auto& s : impl_->shards) out.push_back(s->stats);
  return out;
}

std::vector<StepTiming> RemoteExecutor::step_timings() const {
  return std::vector<StepTiming>(impl_->timings.begin(), impl_->timings.end());
}

}  // namespace arbor::shard
