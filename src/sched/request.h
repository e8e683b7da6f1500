// Request: one sequence the scheduler drives from waiting to finished.
//
// vLLM v1's request.py is the model. There are no prefill/decode phases: a request has
// `num_computed_tokens` catching up with `num_tokens()` (prompt + generated). A step schedules
// some of the missing tokens (a prompt chunk, one decode token, or after preemption a long
// recompute of prompt + outputs); the step that computes the last token also samples the next.
//
// n > 1 / best_of: the submitted request is the *parent*. It computes all prompt tokens but the
// last, then the scheduler forks it into best_of *children* (KvCacheManager::fork: shared prompt
// blocks, copy-on-write tail). Each child computes the last prompt token itself and samples with
// its own Rng derived from (seed, sample index). Child ids are child_request_id(parent, index).
//
// Threading: owned by the Scheduler, engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache_manager.h"
#include "sampling/rng.h"
#include "sampling/sampling_params.h"

namespace arbor::sched {

using RequestId = kv::KvRequestId;

// Ids given to add_request() must be below this; ids at or above it are fork children.
inline constexpr RequestId kMaxUserRequestId = RequestId{1} << 48;
// The id of sample `index` (0-based) of parent `parent_id`: ((index + 1) << 48) | parent_id.
RequestId child_request_id(RequestId parent_id, int32_t index);

enum class RequestStatus : uint8_t {
  kWaiting,           // queued, never ran (or a fork child that could not get its CoW block)
  kRunning,           // in the running list, holds blocks
  kPreempted,         // was running, blocks freed, queued again; recomputes prompt + outputs
  kForked,            // a parent whose children took over (terminal for the parent)
  kFinishedStopped,   // EOS, a stop token id, or (decided by the engine) a stop string
  kFinishedLength,    // max_tokens or max_model_len reached
  kFinishedAborted,   // abort() by the client
};
bool is_finished(RequestStatus status);
std::string_view request_status_name(RequestStatus status);

enum class FinishReason : uint8_t { kStop, kLength, kAbort };
std::string_view finish_reason_name(FinishReason reason);  // "stop", "length", "abort"

// Stop conditions that need no text (the engine's OutputProcessor handles stop strings).
struct StopConditions {
  int32_t max_tokens = 16;             // generated tokens, >= 1
  bool ignore_eos = false;             // true: EOS ids do not stop
  std::vector<int32_t> eos_token_ids;  // end-of-generation ids (tokenizer eog_ids())
  std::vector<int32_t> stop_token_ids; // always stop (even with ignore_eos)
};

// Everything add_request() needs; validated there.
struct RequestSpec {
  RequestId request_id = 0;            // < kMaxUserRequestId, unique among live requests
  std::vector<int32_t> prompt_token_ids;  // [num_prompt_tokens], non-empty
  sampling::SamplingParams sampling{};
  StopConditions stop{};
  int32_t n = 1;                       // samples returned, >= 1
  int32_t best_of = 0;                 // samples generated; 0 = n; >= n
  int32_t priority = 0;                // lower runs first and may preempt higher (priority policy)
  double arrival_time = 0.0;           // seconds, any monotonic clock; orders FCFS ties
  std::string cache_salt;              // requests share cached blocks only with equal salts
};

struct Request {
  RequestId request_id = 0;
  RequestId parent_id = 0;             // 0 for a user request; the parent for a fork child
  int32_t sample_index = 0;            // this child's index among the parent's best_of
  RequestStatus status = RequestStatus::kWaiting;
  std::vector<int32_t> prompt_token_ids;  // [num_prompt_tokens]
  std::vector<int32_t> output_token_ids;  // [num_output_tokens] committed samples
  // Tokens proposed by a drafter for the next step (speculative decoding, a later issue): they
  // are scheduled after the committed tokens and allocated as lookahead slots; on rejection the
  // KV manager truncate()s. Always empty today.
  std::vector<int32_t> spec_token_ids;
  std::vector<int32_t> all_token_ids;  // prompt + outputs (the KV manager's view)
  int64_t num_computed_tokens = 0;
  int64_t num_cached_tokens = 0;       // prefix-cache hit of the first admission
  sampling::SamplingParams sampling{};
  uint64_t seed = 0;                   // sampling.seed or a random one; children derive theirs
  sampling::Rng rng{0};
  StopConditions stop{};
  int32_t n = 1;
  int32_t best_of = 1;
  int32_t priority = 0;
  double arrival_time = 0.0;
  std::string cache_salt;
  int64_t admit_seq = 0;               // order of (re)admission; FCFS victims are the latest
  int32_t num_preemptions = 0;
  std::optional<FinishReason> finish_reason;

  int64_t num_tokens() const { return static_cast<int64_t>(all_token_ids.size()); }
  int64_t num_prompt_tokens() const { return static_cast<int64_t>(prompt_token_ids.size()); }
  int64_t num_output_tokens() const { return static_cast<int64_t>(output_token_ids.size()); }
  // A parent that will fork: it computes the prompt but its last token, then forks.
  bool is_fork_parent() const { return best_of > 1 && parent_id == 0; }
  // The token count this request computes up to before it samples (or forks).
  int64_t target_tokens() const;
  // The view passed to the KV manager: token ids up to target_tokens().
  kv::KvRequest kv_view() const;
  void append_output(int32_t token_id);
};

// Checks a spec (non-empty prompt, ids in [0, vocab), max_tokens >= 1, n/best_of, id range,
// sampling params). The message names the field and the numbers.
Status validate_request_spec(const RequestSpec& spec, int32_t vocab_size);

// A Request built from a validated spec: Rng from the seed (or a fresh random one).
Request make_request(RequestSpec spec);

// The Rng seed of sample `index` of a request seeded with `seed` (splitmix64 of both).
uint64_t derive_sample_seed(uint64_t seed, int32_t index);

}  // namespace arbor::sched
