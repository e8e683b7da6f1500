// EngineCore's per-request output state, shared by engine_core.cc and engine_loop.cc.
// Engine thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine/output_processor.h"

namespace arbor::engine {

struct EngineCore::Sample {
  std::optional<SampleText> text;        // absent without a tokenizer
  std::vector<int32_t> token_ids;        // all generated tokens
  std::string full_text;                 // all emitted text (buffered for best_of > n)
  std::vector<TokenLogprobs> logprobs;   // all, when asked for
  double cumulative_logprob = 0.0;
  double last_token_time = 0.0;
  std::optional<sched::FinishReason> finish_reason;
};

// One submitted request: its stream, parameters and samples.
struct EngineCore::Group {
  sched::RequestId id = 0;
  std::string name;                      // the caller's request_id
  std::shared_ptr<RequestStream> stream;
  GenerateRequest request;               // prompt moved out into the sched::Request
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;
  double arrival_time = 0.0;
  bool scheduled = false;
  bool got_token = false;
  bool streaming = true;                 // best_of == n: events as tokens come
  int32_t num_finished = 0;
  std::vector<Sample> samples;           // [best_of]
};

double engine_now();  // steady clock, seconds

}  // namespace arbor::engine
