#include "shard/remote_executor.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include "base/log.h"
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
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    // A launched shard binds its socket after loading the model: retry fast.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
    channel_ = grpc::CreateCustomChannel(uri, grpc::InsecureChannelCredentials(), args);
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
  // stream: an error with gRPC's status. Either way the session is closed.
  Status exchange(const wire::ToShard& msg, wire::FromShard* reply, double until_s,
                  bool* timed_out) {
    *timed_out = false;
    if (!is_open()) return failed_precondition("no session");
    stream_->Write(msg, kWriteTag);
    stream_->Read(reply, kReadTag);
    pending_ += 2;
    bool wrote = false, read = false, write_ok = false, read_ok = false;
    while (!(wrote && read)) {
      void* tag = nullptr;
      bool ok = false;
      const auto r = cq_->AsyncNext(&tag, &ok, deadline_at(until_s));
      if (r == grpc::CompletionQueue::TIMEOUT) {
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

// One rank: where it listens, its process when launched, its session and counters.
struct Shard {
  int32_t rank = 0;
  std::string uri;
  std::vector<std::string> argv;  // launched: the command line; empty for --shard-uri
  ChildProcess child;
  Session session;
  wire::HelloReply hello;
  step::ShardStats stats;
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
  StepEncoder encoder;
  double per_token_s = 0;       // decaying max of step seconds per scheduled token; 0 = none yet
  std::deque<StepTiming> timings;
  wire::ToShard msg;            // reused buffers
  wire::FromShard reply;

  ~Impl() {
    shards.clear();  // closes sessions, kills and reaps launched shards
    if (!socket_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(socket_dir, ec);
    }
  }

  const wire::HelloReply& geometry() const { return shards[0]->hello; }
  std::string name(const Shard& s) const {
    return str_cat("shard ", s.rank,
                   s.child.running() ? str_cat(" (pid ", s.child.pid(), ")") : std::string(),
                   s.argv.empty() ? str_cat(" at ", s.uri) : std::string());
  }

  Status bring_up(Shard& s, double until_s);
  Status bring_up_all(double timeout_s);
  Status fault(Shard& s, const std::string& what);
  double step_deadline(int64_t num_tokens) const;
  Result<step::StepResult> check_reply(const step::SchedulerOutput& output, Shard& s);
};

// Launches (if launched) and connects one shard, then says Hello with the current incarnation.
Status RemoteExecutor::Impl::bring_up(Shard& s, double until_s) {
  s.session.close();
  if (!s.argv.empty()) {
    if (s.child.running()) s.child.kill_and_reap();
    std::error_code ec;
    std::filesystem::remove(s.uri.substr(5), ec);  // a dead shard's socket file
    ARBOR_ASSIGN_OR_RETURN(s.child, ChildProcess::spawn(s.argv));
  }
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
  bool timed_out = false;
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
        s->hello.block_size() != g.block_size()) {
      return failed_precondition(name(*s), " serves another geometry than shard 0");
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
  for (auto& other : shards) other->session.close();  // the group's incarnation is over
  return failed_precondition(last_fault);
}

double RemoteExecutor::Impl::step_deadline(int64_t num_tokens) const {
  if (per_token_s <= 0) return options.start_deadline_s;
  return std::max(options.min_deadline_s, options.deadline_factor * per_token_s *
                                              static_cast<double>(std::max<int64_t>(num_tokens, 1)));
}

Result<step::StepResult> RemoteExecutor::Impl::check_reply(const step::SchedulerOutput& output,
                                                           Shard& s) {
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
  if (!o.launch_argv.empty()) {
    char dir[] = "/tmp/arbor-shards-XXXXXX";
    if (mkdtemp(dir) == nullptr) return io_error("cannot create a folder for shard sockets in /tmp");
    impl->socket_dir = dir;
    for (int32_t r = 0; r < o.num_launched; ++r) {
      auto s = std::make_unique<Shard>();
      s->rank = r;
      s->uri = str_cat("unix:", impl->socket_dir, "/shard-", r, ".sock");
      s->argv = o.launch_argv;
      s->argv.push_back("--listen");
      s->argv.push_back(s->uri);
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
                   << g.block_size() << ")";
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
  // Every rank gets the step; rank 0's reply carries the result (one rank until TP).
  Shard& s = *m.shards[0];
  bool timed_out = false;
  const Status sent = s.session.exchange(m.msg, &m.reply, until, &timed_out);
  if (!sent.ok()) {
    return m.fault(s, timed_out ? str_cat("no answer to step ", step.step(), " within ",
                                          until - t0, " s (", m.options.deadline_factor,
                                          " x the measured cost of ",
                                          output.total_num_scheduled_tokens, " tokens)")
                                : str_cat(sent.message(), " during step ", step.step()));
  }
  Result<step::StepResult> result = m.check_reply(output, s);
  if (!result.ok()) return result;
  const double step_s = now_s() - t0;
  const double exec_s = m.reply.step().execute_s();
  step::ShardStats& st = s.stats;
  ++st.num_steps;
  st.step_s += step_s;
  st.forward_s += exec_s;
  st.wait_s += step_s - exec_s;
  st.last_step_s = step_s;
  st.last_forward_s = exec_s;
  st.last_wait_s = step_s - exec_s;
  if (output.total_num_scheduled_tokens > 0) {
    const double sample = step_s / output.total_num_scheduled_tokens;
    m.per_token_s = std::max(sample, m.per_token_s * 0.98);
  }
  if (m.timings.size() == 4096) m.timings.pop_front();
  m.timings.push_back(StepTiming{static_cast<int32_t>(output.requests.size()), step_s, exec_s});
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
int32_t RemoteExecutor::max_tree_nodes() const { return impl_->geometry().max_tree_nodes(); }
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

Result<std::vector<double>> RemoteExecutor::measure_step_costs(
    std::span<const int32_t> num_tokens) {
  Impl& m = *impl_;
  if (m.down) return failed_precondition(m.last_fault);
  m.msg.Clear();
  m.msg.mutable_measure()->set_incarnation(m.incarnation);
  m.msg.mutable_measure()->mutable_num_tokens()->Add(num_tokens.begin(), num_tokens.end());
  Shard& s = *m.shards[0];
  bool timed_out = false;
  const Status sent =
      s.session.exchange(m.msg, &m.reply, now_s() + m.options.start_timeout_s, &timed_out);
  if (!sent.ok()) return m.fault(s, str_cat(sent.message(), " while measuring step costs"));
  if (m.reply.has_error()) return invalid_argument(m.reply.error().message());
  if (!m.reply.has_measure() ||
      m.reply.measure().seconds_size() != static_cast<int>(num_tokens.size())) {
    return m.fault(s, "answered the step-cost measurement with another message");
  }
  std::vector<double> costs(m.reply.measure().seconds().begin(), m.reply.measure().seconds().end());
  for (size_t i = 0; i < costs.size(); ++i) {
    m.per_token_s = std::max(m.per_token_s, costs[i] / std::max(num_tokens[i], 1));
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
