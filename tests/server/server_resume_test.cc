// Resumable streams (docs/router.md, "Resumable streams"): every streamed request with one
// prompt and one sample carries SSE event ids "<seed>.<tokens>.<index>" and its seed in
// X-Arbor-Seed; the same request sent again with Last-Event-ID gets exactly the events after
// that id (same ids, same payloads but the timestamps), on every streaming route, with
// speculation committing several tokens per step; what cannot be resumed is refused with 400.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/sse_ids.h"
#include "server_test_util.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

struct SseEvent {
  std::string id;
  std::string event;  // the "event:" line (Anthropic, Responses), "" if none
  std::string data;
};

std::vector<SseEvent> sse_events(const std::string& body) {
  std::vector<SseEvent> out;
  SseEvent cur;
  bool any = false;
  size_t start = 0;
  while (start <= body.size()) {
    size_t end = body.find('\n', start);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {
      if (any) out.push_back(cur);
      cur = SseEvent{};
      any = false;
      if (end == body.size()) break;
      continue;
    }
    if (line.starts_with(":")) continue;
    any = true;
    if (line.starts_with("id: ")) cur.id = line.substr(4);
    if (line.starts_with("event: ")) cur.event = line.substr(7);
    if (line.starts_with("data: ")) cur.data = line.substr(6);
  }
  return out;
}

// The payload without what differs between two runs of one request: timestamps, the ids a
// builder draws at random (message and item ids of the Anthropic and Responses APIs), and the
// usage figures that describe the run that served it (prefix-cache hits, speculation).
std::string normalized(const std::string& data) {
  json j = json::parse(data, nullptr, false);
  if (j.is_discarded()) return data;
  std::function<void(json&)> strip = [&](json& v) {
    if (v.is_object()) {
      for (const char* k : {"created", "created_at", "id", "item_id", "system_fingerprint",
                            "prompt_tokens_details", "input_tokens_details", "speculation",
                            "cache_read_input_tokens", "cache_creation_input_tokens"}) {
        v.erase(k);
      }
      for (auto& [k, x] : v.items()) strip(x);
    } else if (v.is_array()) {
      for (auto& x : v) strip(x);
    }
  };
  strip(j);
  return j.dump();
}

struct Case {
  std::string path;
  json body;
};

std::vector<Case> cases() {
  const json seed = 77;
  return {
      {"/v1/completions",
       {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"stream", true}, {"temperature", 0.9}}},
      {"/v1/chat/completions",
       {{"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}},
        {"max_tokens", 40}, {"stream", true}, {"seed", seed}, {"temperature", 0.7},
        {"stream_options", {{"include_usage", true}}}}},
      {"/generate_stream", {{"inputs", "Once upon a time"},
                            {"parameters", {{"max_new_tokens", 40}, {"do_sample", true}}}}},
      {"/v1/messages",
       {{"model", "stories260K"}, {"max_tokens", 40}, {"stream", true},
        {"messages", {{{"role", "user"}, {"content", "Hello"}}}}}},
      {"/v1/responses", {{"input", "Tell me a story"}, {"max_output_tokens", 40}, {"stream", true}}},
  };
}

class ServerResume : public ::testing::TestWithParam<bool> {};

TEST_P(ServerResume, AReconnectedStreamContinuesAfterItsLastEventId) {
  // With n-gram speculation several tokens commit per step; events stay one token each.
  std::vector<std::string> args;
  if (GetParam()) args = {"--spec", "ngram", "--spec-k", "4"};
  ServerProcess server(args);
  ASSERT_TRUE(server.ok());
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.path);
    const std::string rid = "-H 'X-Request-Id: resume-test-1'";
    // Requests without a seed get a random one, and a sampled story may end early: a few tries
    // find a stream long enough to cut in several places (P(short) per try is well under 0.1).
    HttpResult full;
    std::vector<SseEvent> events;
    for (int attempt = 0; attempt < 8 && events.size() < 20; ++attempt) {
      full = server.request("POST", c.path, c.body.dump(), rid + " -D -");
      ASSERT_EQ(full.status, 200) << full.body;
      ASSERT_NE(full.body.find("X-Arbor-Seed: "), std::string::npos) << "the seed is echoed";
      events = sse_events(full.body.substr(full.body.find("\r\n\r\n") + 4));
    }
    ASSERT_GE(events.size(), 20u);
    for (const SseEvent& e : events) {
      if (e.data == "[DONE]") continue;
      ASSERT_FALSE(e.id.empty()) << "an event without an id: " << e.data;
      ASSERT_TRUE(parse_sse_event_id(e.id).ok()) << e.id;
    }
    // Cut after the first event, in the middle, and before the last.
    for (const size_t cut : {size_t{0}, events.size() / 3, events.size() / 2 + 1, events.size() - 2}) {
      SCOPED_TRACE(cut);
      const std::string last = events[cut].id;
      ASSERT_FALSE(last.empty());
      const HttpResult rest = server.request("POST", c.path, c.body.dump(),
                                             rid + " -H 'Last-Event-ID: " + last + "'");
      ASSERT_EQ(rest.status, 200) << rest.body;
      const std::vector<SseEvent> got = sse_events(rest.body);
      ASSERT_EQ(got.size(), events.size() - cut - 1);
      for (size_t i = 0; i < got.size(); ++i) {
        const SseEvent& want = events[cut + 1 + i];
        EXPECT_EQ(got[i].id, want.id) << i;
        EXPECT_EQ(got[i].event, want.event) << i;
        EXPECT_EQ(normalized(got[i].data), normalized(want.data)) << i;
      }
    }
  }
  EXPECT_TRUE(server.wait_no_blocks_used());
}

INSTANTIATE_TEST_SUITE_P(Speculation, ServerResume, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Ngram" : "Plain"; });

TEST(ServerResumeRefusals, WhatCannotBeResumedIsA400NamingLastEventId) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const json body = {{"prompt", "Once"}, {"max_tokens", 8}, {"stream", true}, {"seed", 5}};
  auto with_id = [&](const json& b, const std::string& id) {
    return server.request("POST", "/v1/completions", b.dump(), "-H 'Last-Event-ID: " + id + "'");
  };
  for (const std::string bad : {"abc", "5.3", "5.3.x", "5..1", "-1.2.3"}) {
    const HttpResult r = with_id(body, bad);
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
    EXPECT_NE(r.body.find("Last-Event-ID"), std::string::npos) << r.body;
  }
  const HttpResult other_seed = with_id(body, "6.2.0");
  EXPECT_EQ(other_seed.status, 400);
  EXPECT_NE(other_seed.body.find("names seed 6"), std::string::npos) << other_seed.body;
  json n2 = body;
  n2["n"] = 2;
  EXPECT_EQ(with_id(n2, "5.2.0").status, 400);
  json whole = body;
  whole["stream"] = false;
  EXPECT_EQ(with_id(whole, "5.2.0").status, 400);
  // Streams of n = 2 carry no ids (they cannot be resumed); every request still gets a seed.
  const HttpResult plain = server.request("POST", "/v1/completions", n2.dump(), "-D -");
  ASSERT_EQ(plain.status, 200);
  EXPECT_EQ(plain.body.find("\nid: "), std::string::npos);
  EXPECT_NE(plain.body.find("X-Arbor-Seed: 5"), std::string::npos);
}

}  // namespace
}  // namespace arbor::server::testing
