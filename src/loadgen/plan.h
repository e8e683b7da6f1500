// What `arbor bench serve` sends, and when: request plans (prompt + output length) and arrival
// times. Pure and deterministic for a given seed.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "base/status.h"

namespace arbor::loadgen {

struct RequestPlan {
  // The prompt as a JSON value: a string, or an array of token ids (completions only).
  std::string prompt_json;
  int64_t prompt_len = -1;  // prompt tokens when known before sending (token ids), else -1
  int32_t max_tokens = 0;   // exact output length (sent with ignore_eos)
};

struct SyntheticOptions {
  int32_t num_prompts = 100;
  int32_t input_len = 128;  // prompt tokens (token ids) or words (text)
  int32_t output_len = 128;
  // Lengths are drawn uniformly from [len * (1 - r), len * (1 + r)] (vLLM's --random-range-
  // ratio), at least 1; r in [0, 1).
  double range_ratio = 0.0;
  bool token_ids = true;     // prompts as token-id arrays (exact lengths), else text
  int32_t vocab_size = 512;  // token ids are drawn from [3, vocab_size) (0..2: unk/bos/eos)
  uint64_t seed = 0;
};

// Random prompts: token ids, or text made of common English words (~one token each, so the
// length is approximate; the server's usage gives the real count).
Result<std::vector<RequestPlan>> synthetic_plan(const SyntheticOptions& o);

// The shared-prefix workload (`--workload shared-prefix`; docs/router.md, "Benchmark"): many
// users, a few long system prompts, multi-turn chats, as token ids. User u talks under system
// prompt u % num_system_prompts; turn t of a user is the system prompt, then t + 1 blocks of
// turn_len tokens (its earlier turns and the new one), so each turn extends the previous one's
// prompt. Requests go in rounds (every user's turn 0, then every user's turn 1, ...), shuffled
// within a round. num_users * turns requests of output_len tokens.
struct SharedPrefixOptions {
  int32_t num_system_prompts = 4;
  int32_t system_prompt_len = 1024;
  int32_t num_users = 32;
  int32_t turns = 4;
  int32_t turn_len = 64;
  int32_t output_len = 16;
  int32_t vocab_size = 512;
  uint64_t seed = 0;
};
Result<std::vector<RequestPlan>> shared_prefix_plan(const SharedPrefixOptions& o);

// A JSONL file: one object per non-blank line with "prompt" (string, or array of token ids) and
// optional "max_tokens" (default `default_max_tokens`). Takes the first `num_prompts` lines, or
// cycles through the file when it has fewer. Errors name the line.
Result<std::vector<RequestPlan>> load_jsonl_plan(const std::string& path, int32_t num_prompts,
                                                 int32_t default_max_tokens);

// Send offsets in seconds from the start, [n]: the first at 0, then gaps drawn from a gamma
// distribution with mean 1 / rate and shape `burstiness` (1 = exponential, i.e. a Poisson
// process; vLLM's --burstiness). rate = infinity: all at 0.
std::vector<double> arrival_offsets(int32_t n, double rate, double burstiness, uint64_t seed);

struct BodyOptions {
  std::string model;  // "" = leave "model" out
  bool chat = false;  // /v1/chat/completions: the prompt becomes one user message
  bool ignore_eos = true;
  double temperature = 0.0;
  bool include_usage = true;
};

// The JSON body of one streaming request. A chat request needs a string prompt (Status
// otherwise).
Result<std::string> request_body(const RequestPlan& plan, const BodyOptions& o);

constexpr double kInfiniteRate = std::numeric_limits<double>::infinity();

}  // namespace arbor::loadgen
