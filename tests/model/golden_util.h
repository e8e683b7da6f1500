// Shared helpers of the model tests: golden files, greedy decoding over ModelRunner.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/runner.h"
#include "support/shared_data.h"

namespace arbor::model::testing {

using ::arbor::test::kStories260K;
using ::arbor::test::require_shared_file;
using ::arbor::test::shared_path;

// One greedy golden case: `ids` starts with BOS; ids[0, prompt_len) is the prompt (with BOS), the
// rest was generated; generation ran until ids.size() == max_len or `stop_id` came out.
struct GoldenCase {
  std::string prompt;
  std::vector<int32_t> ids;
  int32_t prompt_len = 0;
  int32_t max_len = 0;
  int32_t stop_id = -1;
};

// The goldens fail the current test, naming the path, when their file is missing.
// stories260K_greedy.json; prompt lengths come from matching the GGUF vocabulary's pieces
// against " " + prompt (the ids are in the file, the split point is not).
std::vector<GoldenCase> load_stories260k_golden(const gguf::GgufFile& vocab_file);
// tinystories656K_greedy.json (prompt ids given).
std::vector<GoldenCase> load_tinystories_golden();

int32_t argmax(const float* logits, int32_t n);

struct GreedyOptions {
  int32_t prefill_chunk = 0;  // 0 = whole prompt in one step
  // Tokens of each case taken as prompt beyond its own prompt_len (teacher forcing a longer
  // prefix); 0 = the case's prompt.
  int32_t forced_prefix = 0;
};

// Runs every case as one sequence of a ragged batch (all of them in each step; each sequence
// on interleaved, non-contiguous blocks), greedy, and returns the produced ids per case.
std::vector<std::vector<int32_t>> greedy_batched(ModelRunner& runner,
                                                 const std::vector<GoldenCase>& cases,
                                                 const GreedyOptions& options);

// The same with SingleSequence, one case at a time.
std::vector<int32_t> greedy_single(ModelRunner& runner, const GoldenCase& c,
                                   int32_t prefill_chunk);

// Length of the common prefix of two id lists.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace arbor::model::testing
