// SSE event ids of resumable streams (server/sse_ids.h): the id format round-trips, every
// malformed Last-Event-ID is refused, and labelling numbers events per token count, leaves
// comments alone and drops exactly the events at or before a resume point.
#include "server/sse_ids.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace arbor::server {
namespace {

TEST(SseIds, FormatAndParseRoundTrip) {
  const SseEventId id{18446744073709551615ull, 42, 3};
  EXPECT_EQ(format_sse_event_id(id), "18446744073709551615.42.3");
  Result<SseEventId> back = parse_sse_event_id("18446744073709551615.42.3");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, id);
  for (const char* bad : {"", "1", "1.2", "1.2.", ".1.2", "1.2.3.4", "a.1.2", "1.-2.3", "1.2.-3",
                          "18446744073709551616.1.1", "1 .2.3", "1.2.3 "}) {
    EXPECT_FALSE(parse_sse_event_id(bad).ok()) << "'" << bad << "'";
  }
}

// Two engine events: one token with two SSE events, then one more token with one.
std::string label(SseIdCursor* cursor, const std::optional<SseEventId>& after) {
  std::string out;
  cursor->tokens += 1;
  out += label_sse_events("data: a\n\ndata: b\n\n", cursor, after);
  out += label_sse_events(": keep-alive\n\n", cursor, after);
  cursor->tokens += 1;
  out += label_sse_events("event: x\ndata: c\n\n", cursor, after);
  return out;
}

TEST(SseIds, EventsAreNumberedPerTokenCountAndCommentsPassUnlabelled) {
  SseIdCursor cursor{.seed = 7};
  EXPECT_EQ(label(&cursor, std::nullopt),
            "id: 7.1.0\ndata: a\n\nid: 7.1.1\ndata: b\n\n: keep-alive\n\n"
            "id: 7.2.0\nevent: x\ndata: c\n\n");
}

TEST(SseIds, EventsAtOrBeforeTheResumePointAreDropped) {
  const std::vector<std::pair<SseEventId, std::string>> cases = {
      {{7, 1, 0}, "id: 7.1.1\ndata: b\n\n: keep-alive\n\nid: 7.2.0\nevent: x\ndata: c\n\n"},
      {{7, 1, 1}, ": keep-alive\n\nid: 7.2.0\nevent: x\ndata: c\n\n"},
      {{7, 2, 0}, ": keep-alive\n\n"},
      {{7, 0, 5}, "id: 7.1.0\ndata: a\n\nid: 7.1.1\ndata: b\n\n: keep-alive\n\n"
                  "id: 7.2.0\nevent: x\ndata: c\n\n"},
  };
  for (const auto& [after, want] : cases) {
    SseIdCursor cursor{.seed = 7};
    EXPECT_EQ(label(&cursor, after), want) << format_sse_event_id(after);
  }
}

}  // namespace
}  // namespace arbor::server
