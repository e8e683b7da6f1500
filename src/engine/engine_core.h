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
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "engine/activity.h"
#include "engine/engine.h"
#include "engine/engine_options.h"
#include "engine/kv_event_log.h"
#include "engine/metrics.h"
#include "engine/output_processor.h"
#include "engine/request_stream.h"
#include "step/model_executor.h"
#include "kv/kv_cache_manager.h"
#include "sampling/sampling_params.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace arbor::engine {

struct EngineCoreConfig {
  EngineOptions options{};
  // Optional: without it events carry no text and stop strings are rejected.
  const tokenizer::Tokenizer* tokenizer = nullptr;
  // Ids that end a sample unless ignore_eos; nullopt = default_stop_token_ids() of the
  // tokenizer (stop_rules.h: its end-of-generation ids plus BOS), none without a tokenizer.
  std::optional<std::vector<int32_t>> eos_token_ids;
  // Optional: the prefix cache's changes are appended here after every step (the replica
  // service's stream to routers). Must outlive the EngineCore.
  KvEventLog* kv_events = nullptr;
};

class EngineCore final : public Engine {
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
  // among them a prompt of max_model_len() tokens or more, more than max_model_len() for a
  // pooling request; a duplicate live id) and queues it
  // for the engine thread. Admission control happens there: a full waiting queue ends the
  // stream with a final kResourceExhausted event. A sample stops with kLength when prompt +
  // generated tokens reach max_model_len(), even if max_tokens allows more.
  Result<std::shared_ptr<RequestStream>> submit(GenerateRequest request) override;
  // Any thread. Ends the request (all its samples) with finish reason kAbort and frees its
  // blocks; unknown or finished ids are ignored.
  void abort(const std::string& request_id) override;

  // Any thread: the snapshot published after the last step.
  EngineMetricsSnapshot metrics() const override { return board_.read(); }
  // Any thread: the latest steps and the live requests, as of the last step (activity.h).
  EngineActivity activity() const override { return activity_.read(); }
  int32_t vocab_size() const { return vocab_size_; }
  // Any thread: the longest sequence (prompt + generated tokens) the engine runs:
  // options.max_model_len, or the executor's max_model_len() when that is 0. Fixed at
  // construction; the server's context-length checks use it.
  int64_t max_model_len() const override { return max_model_len_; }
  // Any thread: drafts verified per request per step, at most (0: no speculation).
  int32_t max_spec_tokens() const override { return config_.options.max_spec_tokens; }
  // Token-tree speculation: most nodes per request and step (--spec-tree-budget); 0 = chains.
  int32_t max_tree_nodes() const override {
    return config_.options.max_spec_tokens > 0 ? executor_->max_tree_nodes() : 0;
  }
  // Any thread: the KV pool's free blocks as of the last step (for tests).
  int32_t num_free_blocks() const override { return num_free_blocks_.load(); }
  // Any thread: blocks until no request is queued or running and the metrics (and
  // num_free_blocks()) of that idle state are published.
  void wait_idle() override;

 private:
  struct Inbox {
    std::vector<std::pair<OutputGroupSpec, sched::Request>> adds;
    std::vector<std::string> aborts;
    bool stop = false;
  };

  void run();
  Inbox wait_for_work();
  void handle_add(OutputGroupSpec group, sched::Request request);
  void handle_abort(const std::string& request_id);
  // The SpecPolicy's step-cost curve, measured; a mixture's again (up to kCurveTries in all)
  // while its expert term is impossible (Experts::one_token_share() > 1: measured in a stall),
  // keeping the measurement with the lowest share.
  sched::SpecCostModel measure_spec_costs();
  sched::SpecCostModel measure_spec_costs_once();
  static constexpr int kCurveTries = 3;
  void step();
  void forget_finished();
  void observe_speculation(const sched::RequestOutput& o);
  void fail_all(const Status& error);
  void handle_executor_fault(const Status& fault);
  void release_name(const std::string& name);
  void publish_metrics();
  void record_step(const sched::SchedulerOutput& out, std::span<const sched::RequestOutput> outs,
                   double exec_s);
  void publish_activity(const kv::KvCacheStats& kv);

  std::unique_ptr<step::ModelExecutor> executor_;
  EngineCoreConfig config_;
  std::vector<int32_t> eos_ids_;
  int32_t vocab_size_ = 0;
  int64_t max_model_len_ = 0;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<sched::Scheduler> scheduler_;

  // Engine thread only.
  EngineMetricsSnapshot metrics_;
  std::unique_ptr<OutputProcessor> outputs_;
  std::optional<StepSummary> last_step_;  // the step of this loop iteration, until published
  std::unordered_map<sched::RequestId, int32_t> step_drafts_;  // ... drafts verified per request
  int32_t consecutive_faults_ = 0;  // executor faults since the last step that ran

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
  ActivityBoard activity_;
  std::thread thread_;
};

}  // namespace arbor::engine
