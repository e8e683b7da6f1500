// OutputProcessor: turns the scheduler's per-step RequestOutputs into StreamEvents.
//
// Per submitted request (a *group* of best_of samples) it keeps each sample's text state
// (SampleText: incremental detokenisation primed from the last prompt tokens only, stop strings),
// its logprobs and cumulative logprob, and the latency metrics of its tokens. It handles any
// number of new tokens per sample per step (speculative decoding commits several).
//
// The stop decision is made once, where it is detected: the scheduler's StopReason (EOS, stop
// token, max_tokens, max_model_len) arrives in the RequestOutput; a stop string is detected here
// and returned from process() so that the engine finishes the sample in the scheduler; aborts
// come from the engine. Events carry that StopReason; nothing downstream re-derives it.
//
// best_of == n: every sample streams its events. best_of > n: nothing streams; when every sample
// has finished, the n with the highest cumulative logprob (ties to the lower index) are sent as
// one event each, re-indexed 0..n-1. Every group ends with one final event (usage, error).
//
// Text work stays on the engine thread: it is O(new tokens) per step (a detokenizer step and a
// stop-string scan of the held-back tail), microseconds next to a forward, and a stop string
// must end the sample before the next step is scheduled.
//
// Threading: engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/metrics.h"
#include "engine/request_stream.h"
#include "engine/sample_text.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace arbor::engine {

// What the processor needs of a submitted request.
struct OutputGroupSpec {
  sched::RequestId id = 0;
  std::string name;                       // the caller's request id
  std::shared_ptr<RequestStream> stream;
  int32_t n = 1;
  int32_t best_of = 1;                    // >= n
  bool logprobs = false;                  // events carry per-token logprobs
  bool prompt_logprobs = false;           // first events carry the prompt logprobs
  std::vector<std::string> stop;          // stop strings
  std::vector<int32_t> keep_special_ids;  // sorted: control tokens whose text is written
  std::vector<int32_t> prompt_tail;       // the last <= SampleText::kPrimeTokens prompt tokens
  int64_t num_prompt_tokens = 0;
  double arrival_time = 0.0;
  // A resumed sample (GenerateRequest::resume; n = best_of = 1): its text state after the
  // resumed tokens (SampleText::replay; absent without a tokenizer), their count and
  // cumulative logprob. Usage counts them as completion tokens, as a run without the fault would.
  std::optional<SampleText> resumed_text;
  int64_t num_resumed_tokens = 0;
  double resumed_cumulative_logprob = 0.0;
  bool one_token_per_event = false;       // GenerateRequest::one_token_per_event
};

class OutputProcessor {
 public:
  // `tokenizer` may be null (events carry no text, no stop strings). `metrics` is updated with
  // token counts and latencies; `on_final` runs after a group's final event is pushed (the
  // engine releases the request's name there). Both must outlive the processor.
  OutputProcessor(const tokenizer::Tokenizer* tokenizer, EngineMetricsSnapshot& metrics,
                  std::function<void(const std::string& name)> on_final);

  void add(const OutputGroupSpec& spec);
  // Ends group `id` at once with a final event carrying `error` (ok or not) and no sample
  // events (admission rejected, model failure, shutdown).
  void fail(sched::RequestId id, Status error);
  // Ends every unfinished sample of group `id` with StopKind::kAbort, then the group.
  void abort(sched::RequestId id);

  // Applies one RequestOutput. Returns the stop-string StopReason when a stop string ended the
  // sample in this output and the scheduler had not ended it: the caller must then finish that
  // sample (fork child or request) in the scheduler with it.
  std::optional<sched::StopReason> process(const sched::RequestOutput& o, double now);

  bool contains(sched::RequestId id) const { return groups_.contains(id); }
  std::optional<sched::RequestId> find(const std::string& name) const;
  std::vector<sched::RequestId> ids() const;
  // The caller's name of group `id` (OutputGroupSpec::name); "" when unknown.
  std::string_view name(sched::RequestId id) const;
  bool empty() const { return groups_.empty(); }

 private:
  struct Sample {
    std::optional<SampleText> text;        // absent without a tokenizer
    int64_t num_tokens = 0;
    std::vector<int32_t> token_ids;        // kept only when buffered (best_of > n)
    std::string full_text;                 // kept only when buffered
    std::vector<TokenLogprobs> logprobs;   // kept only when buffered and asked for
    std::shared_ptr<const PromptLogprobs> prompt_logprobs;  // kept only when buffered
    double cumulative_logprob = 0.0;
    double last_token_time = 0.0;
    std::optional<sched::StopReason> stop;
    bool sent_prompt_logprobs = false;
  };
  struct Group {
    OutputGroupSpec spec;
    bool scheduled = false;
    bool got_token = false;
    bool streaming = true;                 // best_of == n
    int64_t num_cached_tokens = 0;
    int64_t num_draft_tokens = 0;
    int64_t num_accepted_draft_tokens = 0;
    int32_t num_finished = 0;
    std::vector<Sample> samples;           // [best_of]
    PromptLogprobs prompt_logprobs;        // positions 1 .. scored so far
    std::shared_ptr<const PromptLogprobs> prompt_logprobs_done;  // all of them, once complete
  };
  void add_prompt_logprobs(Group& g, const sched::RequestOutput& o);
  void attach_prompt_logprobs(Group& g, Sample& s, StreamEvent& ev);

  void add_token(Group& g, Sample& s, const sched::SampledToken& t, bool text, double now,
                 StreamEvent& ev, std::optional<sched::StopReason>& stop_string);
  void finish_sample(Group& g, int32_t index, sched::StopReason reason, StreamEvent ev);
  void finish_group(sched::RequestId id, Status error);
  static void buffer(Sample& s, StreamEvent ev);

  const tokenizer::Tokenizer* tokenizer_;
  EngineMetricsSnapshot& metrics_;
  std::function<void(const std::string&)> on_final_;
  std::unordered_map<sched::RequestId, Group> groups_;
  std::unordered_map<std::string, sched::RequestId> ids_by_name_;
};

}  // namespace arbor::engine
