// The output channel of a request: StreamEvents pushed by the engine thread, popped by one
// consumer (an HTTP session, the CLI).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "sampling/sampler.h"
#include "sched/request.h"

namespace arbor::engine {

struct TokenLogprobs {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<sampling::TokenLogprob> top;
};

// A request's prompt logprobs: entry i scores prompt position i + 1 (position 0 has none).
using PromptLogprobs = std::vector<sampling::PromptLogprob>;

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // over all best_of samples
  int64_t cached_tokens = 0;      // prompt tokens served by the prefix cache
  int64_t draft_tokens = 0;       // speculative drafts verified, over all samples
  int64_t accepted_draft_tokens = 0;  // ... of which accepted
};

struct StreamEvent {
  int32_t index = 0;                     // sample index in [0, n)
  std::vector<int32_t> token_ids;        // new tokens (EOS / stop ids included)
  std::string text;                      // new text, valid UTF-8
  std::vector<TokenLogprobs> logprobs;   // parallel to token_ids when sampling.logprobs is set
  double cumulative_logprob = 0.0;       // of the sample so far (when logprobs are computed)
  // Set (sampling.prompt_logprobs asked) on each sample's first event, which comes after the
  // whole prompt has been scored: num_prompt_tokens - 1 entries. Shared by the samples.
  std::shared_ptr<const PromptLogprobs> prompt_logprobs;
  // A pooling request's vector (GenerateRequest::pooling; step::PoolingResult::values: not
  // normalised), on its one sample event, which ends it with kMaxTokens.
  std::vector<float> pooled;
  std::optional<sched::StopReason> stop_reason;  // the sample ended with this event, for this
                                                 // reason (decided once; see sched::StopReason)
  bool final = false;                    // the request's last event: usage set, nothing follows
  Usage usage;
  Status error;                          // non-ok on a final event: the request failed

  std::optional<sched::FinishReason> finish_reason() const {
    if (!stop_reason) return std::nullopt;
    return stop_reason->finish_reason();
  }
};

// The output channel of one request. The engine thread pushes; one consumer thread pops.
class RequestStream {
 public:
  explicit RequestStream(std::string request_id) : request_id_(std::move(request_id)) {}
  const std::string& request_id() const { return request_id_; }
  // Blocks for the next event; nullopt after the final event has been returned.
  std::optional<StreamEvent> next();
  // Blocks at most timeout_s for the next event; nullopt when none came in time (or after the
  // final event has been returned). For consumers that must look at something else meanwhile
  // (a gRPC call's cancellation).
  std::optional<StreamEvent> next_for(double timeout_s);
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

}  // namespace arbor::engine
