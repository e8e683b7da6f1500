// EngineCore: the engine thread. It owns the Scheduler, the KvCacheManager and a ModelExecutor
// and runs the step protocol (docs/engine.md):
//
//   loop: take submitted / aborted requests from the inbox
//         out = scheduler.schedule(); res = executor.execute(out);
//         outs = scheduler.update_from_output(out, res)
//         output path: detokenise, stop strings, stream events, metrics
//
// Other threads talk to it only through submit() / abort() (a locked inbox) and the per-request
// RequestStream (a locked queue of StreamEvents); the engine state itself has no locks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "engine/engine_options.h"
#include "engine/metrics.h"
#include "step/model_executor.h"
#include "kv/kv_cache_manager.h"
#include "sampling/sampling_params.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace arbor::engine {

struct GenerateRequest {
  std::string request_id;                // unique among live requests; "" = "req-<n>"
  std::vector<int32_t> prompt_token_ids; // non-empty
  sampling::SamplingParams sampling{};
  int32_t max_tokens = 16;               // generated tokens per sample, >= 1
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;   // end the sample (the id is in token_ids, not text)
  // End the sample before the first occurrence in its text, matched across token boundaries;
  // the stop string is never part of any delta. Needs a tokenizer.
  std::vector<std::string> stop;
  int32_t n = 1;                         // samples returned
  int32_t best_of = 0;                   // samples generated (0 = n); > n: the n with the
                                         // highest cumulative logprob, sent when all finish
  int32_t priority = 0;                  // lower first, with SchedulingPolicy::kPriority
  std::string cache_salt;
};

struct TokenLogprobs {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<sampling::TokenLogprob> top;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // over all best_of samples
  int64_t cached_tokens = 0;      // prompt tokens served by the prefix cache
};

struct StreamEvent {
  int32_t index = 0;                     // sample index in [0, n)
  std::vector<int32_t> token_ids;        // new tokens (EOS / stop ids included)
  std::string text;                      // new text, valid UTF-8
  std::vector<TokenLogprobs> logprobs;   // parallel to token_ids when sampling.logprobs is set
  double cumulative_logprob = 0.0;       // of the sample so far (when logprobs are computed)
  std::optional<sched::FinishReason> finish_reason;  // the sample ended with this event
  bool final = false;                    // the request's last event: usage set, nothing follows
  Usage usage;
  Status error;                          // non-ok on a final event: the request failed
};

// The output channel of one request. The engine thread pushes; one consumer thread pops.
class RequestStream {
 public:
  explicit RequestStream(std::string request_id) : request_id_(std::move(request_id)) {}
  const std::string& request_id() const { return request_id_; }
  // Blocks for the next event; nullopt after the final event has been returned.
  std::optional<StreamEvent> next();
  // Never blocks: the next queued event, or nullopt when none is queued (or after the final
  // event has been returned). For consumers that wait with set_notify() instead of next().
  std::optional<StreamEvent> try_next();
  // Registers `notify`, run after every push() (on the pushing thread, outside the lock, so it
  // must be cheap and must not call back into the engine: post to an event loop and drain with
  // try_next() there). If events are already queued it also runs once at once, on the caller's
  // thread, so no event is missed. Any thread; replaces an earlier callback.
  void set_notify(std::function<void()> notify);
  // Engine side. Pushing after the final event is a CHECK failure.
  void push(StreamEvent event);

 private:
  std::string request_id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> queue_;
  std::function<void()> notify_;
  bool final_pushed_ = false;
  bool final_popped_ = false;
};

struct EngineCoreConfig {
  EngineOptions options{};
  // Optional: without it events carry no text and stop strings are rejected.
  const tokenizer::Tokenizer* tokenizer = nullptr;
  // Ids that end a sample unless ignore_eos; nullopt = default_stop_token_ids() of the
  // tokenizer (stop_rules.h: its end-of-generation ids plus BOS), none without a tokenizer.
  std::optional<std::vector<int32_t>> eos_token_ids;
};

class EngineCore {
 public:
  // Whether `config` can run on `executor`: config.options.max_model_len must be 0 or at most
  // executor.max_model_len() (the error names the limit). Commands call it before constructing.
  static Status validate_config(const step::ModelExecutor& executor, const EngineCoreConfig& config);
  // Sizes the KvCacheManager from the executor's pool and starts the engine thread. The
  // scheduler gets max_model_len(). Precondition (CHECKed): validate_config() is ok.
  EngineCore(std::unique_ptr<step::ModelExecutor> executor, const EngineCoreConfig& config);
  // Stops the thread; requests still running get a final event with a kFailedPrecondition error.
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // Any thread. Validates the request (errors: kInvalidArgument with the field and numbers,
  // among them a prompt of max_model_len() tokens or more; a duplicate live id) and queues it
  // for the engine thread. Admission control happens there: a full waiting queue ends the
  // stream with a final kResourceExhausted event. A sample stops with kLength when prompt +
  // generated tokens reach max_model_len(), even if max_tokens allows more.
  Result<std::shared_ptr<RequestStream>> submit(GenerateRequest request);
  // Any thread. Ends the request (all its samples) with finish reason kAbort and frees its
  // blocks; unknown or finished ids are ignored.
  void abort(const std::string& request_id);

  // Any thread: the snapshot published after the last step.
  EngineMetricsSnapshot metrics() const { return board_.read(); }
  int32_t vocab_size() const { return vocab_size_; }
  // Any thread: the longest sequence (prompt + generated tokens) the engine runs:
  // options.max_model_len, or the executor's max_model_len() when that is 0. Fixed at
  // construction; the server's context-length checks use it.
  int64_t max_model_len() const { return max_model_len_; }
  // Any thread: the KV pool's free blocks as of the last step (for tests).
  int32_t num_free_blocks() const { return num_free_blocks_.load(); }
  // Any thread: blocks until no request is queued or running and the metrics (and
  // num_free_blocks()) of that idle state are published.
  void wait_idle();

 private:
  struct Sample;
  struct Group;
  struct Inbox {
    std::vector<std::pair<std::unique_ptr<Group>, sched::Request>> adds;
    std::vector<std::string> aborts;
    bool stop = false;
  };

  void run();
  Inbox wait_for_work();
  void handle_add(std::unique_ptr<Group> group, sched::Request request);
  void handle_abort(const std::string& request_id);
  void step();
  void process_output(const sched::RequestOutput& o, double now);
  void add_token(Group& g, int32_t index, const sched::SampledToken& t, double now,
                 StreamEvent& ev, bool& stopped);
  void finish_sample(Group& g, int32_t index, sched::FinishReason reason, StreamEvent ev,
                     bool stopped_by_string);
  void release_name(const std::string& name);
  void finish_group(sched::RequestId id, Status error);
  void publish_metrics();

  std::unique_ptr<step::ModelExecutor> executor_;
  EngineCoreConfig config_;
  std::vector<int32_t> eos_ids_;
  int32_t vocab_size_ = 0;
  int64_t max_model_len_ = 0;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<sched::Scheduler> scheduler_;

  // Engine thread only.
  std::unordered_map<sched::RequestId, std::unique_ptr<Group>> groups_;
  std::unordered_map<std::string, sched::RequestId> ids_by_name_;
  EngineMetricsSnapshot metrics_;

  // Shared with other threads.
  std::mutex mu_;
  std::condition_variable cv_;       // inbox has work, or stop
  std::condition_variable idle_cv_;  // the engine became idle
  Inbox inbox_;
  int64_t num_live_ = 0;             // submitted and not yet final
  bool idle_published_ = true;       // metrics published since num_live_ became 0
  std::unordered_set<std::string> live_names_;
  sched::RequestId next_id_ = 1;
  std::atomic<int32_t> num_free_blocks_{0};
  MetricsBoard board_;
  std::thread thread_;
};

}  // namespace arbor::engine
