// What one streamed OpenAI chunk (the data of one SSE event) says, found without building a
// JSON tree.
//
// The load generator reads every chunk of every stream on one thread: at 2,000 requests/s with
// 64 tokens each that is 128k chunks a second, and a full JSON parse per chunk would be a large
// part of its own overhead. classify_chunk() walks the text once, without allocating, and looks
// only at the top-level keys "choices", "usage" and "error" (validating the JSON syntax as it
// goes, so a truncated or garbled chunk is reported, not guessed at).
#pragma once

#include <cstdint>
#include <string_view>

namespace arbor::loadgen {

struct ChunkInfo {
  bool malformed = false;  // not a JSON object (or nested deeper than 64)
  bool done = false;       // the "[DONE]" sentinel
  bool error = false;      // a top-level "error" member that is not null
  // The chunk carries generated output (vLLM's rule):
  //   completions: "choices" is a non-empty array;
  //   chat: the first choice's "delta" has a non-empty "content" or "reasoning_content" string,
  //         or "tool_calls" (so the role-only first chunk and an empty finish chunk are not
  //         tokens).
  bool has_token = false;
  int64_t prompt_tokens = -1;      // "usage.prompt_tokens", -1 when absent
  int64_t completion_tokens = -1;  // "usage.completion_tokens", -1 when absent
};

// `data`: one SSE event's data. `chat`: the stream is /v1/chat/completions.
ChunkInfo classify_chunk(std::string_view data, bool chat);

}  // namespace arbor::loadgen
