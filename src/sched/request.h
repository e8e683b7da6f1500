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
// its own seed derived from (seed, sample index). Child ids are child_request_id(parent, index).
//
// Speculative decoding: the executor keeps the drafts it proposed after the last step and
// reports their shape (Request::spec.drafts). The scheduler runs [last committed token + the first k
// of them] (k chosen per step by the SpecPolicy); the executor verifies them and returns the
// accepted ones plus one token.
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
#include "sampling/sampling_params.h"
#include "step/step.h"

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

// Why a sample ended, decided once where it is detected: the scheduler for token ids and
// lengths, the engine's OutputProcessor for stop strings, EngineCore for aborts. Everything
// downstream (OpenAI's finish_reason, TGI's, the CLI's message) is derived from it.
enum class StopKind : uint8_t {
  kEos,          // an end-of-generation id (token_id)
  kStopToken,    // one of the request's stop_token_ids (token_id)
  kStopString,   // one of the request's stop strings matched the text (stop_string)
  kMaxTokens,    // max_tokens generated
  kMaxModelLen,  // prompt + generated reached max_model_len
  kAbort,        // the client went away or the engine shut down
};
std::string_view stop_kind_name(StopKind kind);  // "eos", "stop_token", "stop_string", ...

struct StopReason {
  StopKind kind = StopKind::kEos;
  int32_t token_id = -1;      // kEos, kStopToken: the token
  std::string stop_string;    // kStopString: the string that matched
  FinishReason finish_reason() const;  // kStop, kLength or kAbort
  bool operator==(const StopReason&) const = default;
};

// Stop conditions that need no text (the engine's OutputProcessor handles stop strings).
struct StopConditions {
  // Generated tokens, >= 0. 0: the prompt is computed (prompt logprobs, echo) and the request
  // ends with kMaxTokens without sampling anything; n and best_of must then be 1.
  int32_t max_tokens = 16;
  bool ignore_eos = false;             // true: EOS ids do not stop
  std::vector<int32_t> eos_token_ids;  // end-of-generation ids (engine/stop_rules.h)
  std::vector<int32_t> stop_token_ids; // always stop (even with ignore_eos)
};

// Per-request speculative decoding (the API's `speculation` object).
enum class SpecMode : uint8_t {
  kAuto,   // the SpecPolicy chooses k each step (0 when it does not pay)
  kOff,    // never speculate
  kFixed,  // always verify min(k, drafts available, what fits) drafts
};
inline constexpr int32_t kMaxSpecTokens = 16;  // drafts verified per request per step, at most
struct SpecRequest {
  SpecMode mode = SpecMode::kAuto;
  int32_t k = 0;  // kFixed: drafts per step, >= 1; kAuto: cap (0 = the engine's --spec-k)
  // Token trees: at most this many nodes per step (capped by the engine's --spec-tree-budget);
  // 0 = chains; -1 = the engine's budget. With trees, k caps their depth.
  int32_t tree_nodes = -1;
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
  SpecRequest speculation{};
  // A pooling request (embeddings, reranking): computes its prompt, samples nothing and ends
  // with kMaxTokens carrying the pooled vector (RequestOutput::pooled). Needs max_tokens 0,
  // n = best_of = 1 and no prompt logprobs; its prompt may have max_model_len tokens.
  std::optional<step::PoolingType> pooling;
  // A sample resumed where another engine left it (a replica that failed: docs/router.md): its
  // generated tokens so far, committed as outputs before anything runs. They count towards
  // max_tokens, min_tokens, penalties, the grammar and the sampler's position, so the tokens that
  // follow are those the first engine would have produced. Needs n = best_of = 1, no pooling,
  // no prompt logprobs, fewer than max_tokens of them.
  std::vector<int32_t> resumed_output_token_ids;
};

// Speculation counters of one request (reported in the response's usage).
struct SpecStats {
  int64_t num_draft_tokens = 0;     // drafts verified
  int64_t num_accepted_tokens = 0;  // ... of which accepted
  int64_t num_verify_steps = 0;     // steps that verified at least one draft
};

// A request's speculation state (DraftPlanner): what the API asked for, the shape of the drafts
// the executor keeps for it, and what the planner learned of it.
struct SpecState {
  SpecRequest params{};
  // The drafts the executor proposed after the last step and keeps for the next one
  // (step::RequestResult::next_drafts). Never committed: the step runs a prefix of them after
  // the committed tokens in slots allocated for them, and rejected ones are simply overwritten
  // later (num_computed_tokens only counts committed tokens).
  step::DraftShape drafts;
  SpecStats stats{};
  double acceptance = -1.0;     // the SpecPolicy's per-request estimate; < 0: none yet
  int32_t backoff_steps = 0;    // > 0: ask for no drafts for this many more steps
  int32_t backoff_next = 0;     // the next backoff (doubles per decline; 0 = the first)
  bool draft_in_sync = false;   // a draft model proposed for it last step (no catch-up)
  int64_t draft_synced_tokens = 0;  // tokens the draft model had seen when it last proposed
};

struct Request {
  RequestId request_id = 0;
  RequestId parent_id = 0;             // 0 for a user request; the parent for a fork child
  int32_t sample_index = 0;            // this child's index among the parent's best_of
  // A fork child that continues its parent's computed tokens (Scheduler::fork_parent): its first
  // NewRequestData names the parent (NewRequestData::fork_of), once.
  bool fork_pending = false;
  // Admitted on a prefix hit over a recurrent model: the checkpoint slot of the hit's state,
  // named once in its NewRequestData (NewRequestData::state_checkpoint). -1: none.
  int32_t load_checkpoint = -1;
  RequestStatus status = RequestStatus::kWaiting;
  std::vector<int32_t> token_ids;      // [num_tokens] committed: prompt, then generated tokens
  int64_t num_prompt = 0;              // leading prompt tokens of token_ids
  int64_t num_computed_tokens = 0;
  int64_t num_cached_tokens = 0;       // prefix-cache hit of the first admission
  sampling::SamplingParams sampling{};
  uint64_t seed = 0;                   // sampling.seed or a random one; children derive theirs
  StopConditions stop{};
  int32_t n = 1;
  int32_t best_of = 1;
  int32_t priority = 0;
  double arrival_time = 0.0;
  std::string cache_salt;
  SpecState spec{};
  int64_t admit_seq = 0;               // order of (re)admission; FCFS victims are the latest
  int32_t num_preemptions = 0;
  // The executor has been sent token_ids[0, num_tokens_sent) since the last admission (0: it
  // does not know the request: NewRequestData goes with its next ScheduledRequest).
  int64_t num_tokens_sent = 0;
  // Prompt logprobs (sampling.prompt_logprobs set): the first prompt position not yet scored
  // (1 at first, num_prompt when every position is). Never goes back: a recompute after
  // preemption scores only the positions from here on, and prefix-cache hits stop before it.
  int64_t next_prompt_logprob = 1;
  std::optional<step::PoolingType> pooling;  // see RequestSpec::pooling
  std::optional<StopReason> stop_reason;

  bool known_to_executor() const { return num_tokens_sent > 0; }
  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_prompt_tokens() const { return num_prompt; }
  int64_t num_output_tokens() const { return num_tokens() - num_prompt; }
  std::span<const int32_t> prompt_token_ids() const {
    return std::span<const int32_t>(token_ids).first(static_cast<size_t>(num_prompt));
  }
  std::span<const int32_t> output_token_ids() const {
    return std::span<const int32_t>(token_ids).subspan(static_cast<size_t>(num_prompt));
  }
  // A parent that will fork: it computes the prompt but its last token, then forks.
  bool is_fork_parent() const { return best_of > 1 && parent_id == 0; }
  // The committed token count this request computes up to before it samples (or forks).
  int64_t target_tokens() const;
  // The view passed to the KV manager: the committed token ids up to target_tokens().
  kv::KvRequest kv_view() const;
  void append_output(int32_t token_id);
};

// Checks a spec (non-empty prompt, ids in [0, vocab), max_tokens >= 0 (0 only with n = best_of
// = 1), n/best_of, id range, sampling params, a pooling request's restrictions). The message
// names the field and the numbers.
Status validate_request_spec(const RequestSpec& spec, int32_t vocab_size);

// The one rule for a prompt against the context limit: ok when max_model_len is 0 (unbounded)
// or the prompt leaves room for at least one generated token; otherwise kInvalidArgument
// "prompt has N tokens, max_model_len is M (at least one token must be generated)". Used by
// the scheduler's admission, EngineCore::submit (synchronously) and, through the same number,
// the server's context_length_exceeded check.
Status check_prompt_length(int64_t num_prompt_tokens, int64_t max_model_len);
// The same rule for a pooling request, which generates nothing: ok when max_model_len is 0 or
// the input has at most max_model_len tokens; otherwise kInvalidArgument "input has N tokens,
// max_model_len is M".
Status check_input_length(int64_t num_prompt_tokens, int64_t max_model_len);

// A Request built from a validated spec: the seed is sampling.seed or a fresh random one.
Request make_request(RequestSpec spec);

// The seed of sample `index` of a request seeded with `seed` (splitmix64 of both).
uint64_t derive_sample_seed(uint64_t seed, int32_t index);

}  // namespace arbor::sched
