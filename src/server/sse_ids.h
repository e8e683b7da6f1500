// SSE event ids of resumable streams (docs/router.md, "Resumable streams").
//
// A streamed request with one prompt and one sample runs with one token per engine event
// (engine::GenerateRequest::one_token_per_event), so its SSE events are a function of its
// tokens; each gets the id "<seed>.<tokens>.<index>": the request's seed, the tokens streamed
// through the engine event that produced it, and its index among the SSE events since the token
// count last changed. A client that reconnects with Last-Event-ID (the same request again) gets
// the same seed, so the same tokens and events, and is sent only those after that id.
//
// Threading: pure functions; a cursor belongs to one stream (the I/O thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace arbor::server {

struct SseEventId {
  uint64_t seed = 0;
  int64_t tokens = 0;
  int64_t index = 0;
  friend bool operator==(const SseEventId&, const SseEventId&) = default;
};

// "<seed>.<tokens>.<index>", decimal.
std::string format_sse_event_id(const SseEventId& id);
// Errors (kInvalidArgument, naming the header): not three decimal numbers joined by '.'.
Result<SseEventId> parse_sse_event_id(std::string_view text);

// Where a stream's ids stand. The caller adds each engine event's tokens to `tokens` before it
// labels the bytes built from that event.
struct SseIdCursor {
  uint64_t seed = 0;
  int64_t tokens = 0;
  int64_t labelled_tokens = -1;  // `tokens` of the last id given
  int64_t next_index = 0;
};

// `bytes`: whole SSE events ("...\n\n" each). Returns them with an "id: ..." line first in
// each, dropping every event whose (tokens, index) is at or before `after`. Comment-only events
// (": keep-alive") pass unlabelled. O(bytes).
std::string label_sse_events(std::string_view bytes, SseIdCursor* cursor,
                             const std::optional<SseEventId>& after);

}  // namespace arbor::server
