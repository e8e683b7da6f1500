// Engine: what the API server (and the CLI) needs of an engine: submit requests, abort them,
// read metrics. EngineCore runs a model in this process; the router's engine
// (router/router_engine.h) forwards each request to one of several replicas.
//
// Threading: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/activity.h"
#include "engine/metrics.h"
#include "engine/request_stream.h"
#include "sampling/sampling_params.h"
#include "sched/request.h"

namespace arbor::engine {

// Where a resumed sample stands: what its client has already received.
struct ResumeFrom {
  std::vector<int32_t> output_token_ids;  // [k] generated so far, k >= 1, in order
  // Bytes of text the client has received: checked against the replay of output_token_ids
  // through the detokenizer and stop strings (the events carry what follows); -1 = unchecked.
  int64_t text_bytes = -1;
  double cumulative_logprob = 0.0;        // of output_token_ids, continued by the events
};

struct GenerateRequest {
  std::string request_id;                // unique among live requests; "" = "req-<n>"
  std::vector<int32_t> prompt_token_ids; // non-empty
  sampling::SamplingParams sampling{};
  int32_t max_tokens = 16;               // generated tokens per sample, >= 0 (0: n = 1, the
                                         // prompt is only scored; finishes with kMaxTokens)
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;   // end the sample (the id is in token_ids, not text)
  // End the sample before the first occurrence in its text, matched across token boundaries;
  // the stop string is never part of any delta. Needs a tokenizer.
  std::vector<std::string> stop;
  // Control tokens whose text the events carry (skipped otherwise): the reasoning markers of
  // models whose markers are control tokens ([THINK], [/THINK]).
  std::vector<int32_t> keep_special_ids;
  int32_t n = 1;                         // samples returned
  int32_t best_of = 0;                   // samples generated (0 = n); > n: the n with the
                                         // highest cumulative logprob, sent when all finish
  int32_t priority = 0;                  // lower first, with SchedulingPolicy::kPriority
  std::string cache_salt;
  sched::SpecRequest speculation{};      // per-request speculative decoding (mode, k)
  // An embedding or rerank request (docs/engine.md, "Pooling requests"): the prompt is computed, nothing is
  // generated, and the sample's one event carries the pooled vector (StreamEvent::pooled).
  // max_tokens, n and best_of are ignored (0, 1, 1); the prompt may fill max_model_len.
  std::optional<step::PoolingType> pooling;
  // Continue a sample another engine began and failed to finish (the router's failover,
  // docs/router.md). With batch-invariant kernels and counter-based sampling the tokens that
  // follow are those the first engine would have produced, greedy or seeded. Needs n = best_of
  // = 1, sampling.seed set unless greedy, no prompt logprobs, fewer than max_tokens tokens.
  std::optional<ResumeFrom> resume;
  // Every event carries at most one token (speculation commits several per step): a stream's
  // events are then a function of its tokens alone, so a client that reconnects mid-stream can
  // be sent exactly what follows the last event it received (docs/router.md, "Resumable
  // streams").
  bool one_token_per_event = false;
  // The client's session (OpenAI `user`, Anthropic metadata.user_id, or X-Session-Id): a router
  // keeps a session's requests on one replica while the load allows (docs/router.md). Engines
  // ignore it.
  std::string session;
};


class Engine {
 public:
  virtual ~Engine() = default;
  // Validates and queues a request (errors: kInvalidArgument naming the field and the numbers,
  // kUnavailable when no engine can take it). Its events arrive on the returned stream, which
  // always ends with one final event.
  virtual Result<std::shared_ptr<RequestStream>> submit(GenerateRequest request) = 0;
  // Ends the request with finish reason kAbort; unknown or finished ids are ignored.
  virtual void abort(const std::string& request_id) = 0;
  virtual EngineMetricsSnapshot metrics() const = 0;
  virtual EngineActivity activity() const = 0;
  // The longest sequence (prompt + generated tokens) a request may reach.
  virtual int64_t max_model_len() const = 0;
  virtual int32_t max_spec_tokens() const = 0;  // drafts per request and step (0: none)
  virtual int32_t max_tree_nodes() const = 0;   // token-tree nodes per step (0: chains)
  virtual int32_t num_free_blocks() const = 0;  // free KV blocks (summed over replicas)
  // Blocks until nothing is queued or running.
  virtual void wait_idle() = 0;
  // More Prometheus text for /metrics (the router's decisions); "" for none.
  virtual std::string extra_metrics() const { return {}; }
};

}  // namespace arbor::engine
