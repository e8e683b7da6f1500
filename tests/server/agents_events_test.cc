// The answers of /v1/responses and /v1/messages from engine events: the exact event sequences
// (types, order, sequence numbers, indices), the deltas adding up to the final object, the
// non-streamed answer equal to the streamed one's, the stop reasons, the conversation a
// response leaves for previous_response_id, and the ResponseStore's bounds.
#include <gtest/gtest.h>

#include "agents_test_util.h"
#include "server/messages_api.h"
#include "server/responses_api.h"

namespace arbor::server::testing {
namespace {

using json = nlohmann::json;
using sched::StopKind;

// Qwen 3 thinking, then answering, cut across markers.
const std::vector<engine::StreamEvent> kThinkThenAnswer = {
    text_event("<think>"), text_event("\nLet"), text_event(" me think."),
    text_event("\n</think>"), text_event("\n\nSure"), text_event("!", 1, StopKind::kEos)};

const char kCall[] = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                     "\"Paris\"}}\n</tool_call>";

std::vector<engine::StreamEvent> call_events() {
  const std::string call = kCall;
  std::vector<engine::StreamEvent> out;
  for (size_t at = 0; at < call.size(); at += 9) out.push_back(text_event(call.substr(at, 9)));
  out.back().stop_reason = sched::StopReason{.kind = StopKind::kEos, .token_id = -1, .stop_string = ""};
  return out;
}

const json kTool = json::parse(R"({"type": "function", "name": "get_weather", "parameters":
  {"type": "object", "properties": {"city": {"type": "string"}}}})");

std::vector<std::string> types(const std::vector<SseEvent>& events) {
  std::vector<std::string> out;
  for (const SseEvent& e : events) out.push_back(e.event);
  return out;
}

// The ids the server draws at random, blanked for comparisons.
json without_ids(json j) {
  if (j.is_object()) {
    for (const char* key : {"id", "call_id", "created_at"}) {
      if (j.contains(key)) j[key] = "*";
    }
    for (auto& [k, v] : j.items()) v = without_ids(v);
  } else if (j.is_array()) {
    for (json& v : j) v = without_ids(v);
  }
  return j;
}

struct Answer {
  std::vector<SseEvent> events;  // streamed
  json whole;                    // not streamed
};

Answer run_responses(const QwenModel& m, json body, const std::vector<engine::StreamEvent>& evs,
                  engine::StreamEvent final) {
  Answer run;
  body["stream"] = true;
  Prepared s = prepare(prepare_responses, body, m.info);
  EXPECT_FALSE(s.error) << s.error->message;
  if (s.error) return run;
  run.events = parse_sse(run_builder(*s.request.builder, evs, final));
  body["stream"] = false;
  Prepared w = prepare(prepare_responses, body, m.info);
  if (w.error) return run;
  run.whole = json::parse(run_builder(*w.request.builder, evs, final), nullptr, false);
  EXPECT_TRUE(run.whole.is_object());
  return run;
}

void expect_numbered(const std::vector<SseEvent>& events) {
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].data["type"], events[i].event) << i;
    EXPECT_EQ(events[i].data["sequence_number"], i) << events[i].event;
  }
}

TEST(AgentsEvents, ResponsesReasoningThenTextStreamsInOrder) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  const Answer run = run_responses(m, {{"input", "Hi"}}, kThinkThenAnswer, final_event(9, 6));
  EXPECT_EQ(types(run.events),
            (std::vector<std::string>{
                "response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added", "response.reasoning_text.delta",
                "response.reasoning_text.delta", "response.reasoning_text.done",
                "response.content_part.done", "response.output_item.done",
                "response.output_item.added", "response.content_part.added",
                "response.output_text.delta", "response.output_text.delta",
                "response.output_text.done", "response.content_part.done",
                "response.output_item.done", "response.completed"}));
  expect_numbered(run.events);
  std::string reasoning, text;
  for (size_t i = 2; i < run.events.size() - 1; ++i) {
    const SseEvent& e = run.events[i];
    EXPECT_EQ(e.data["output_index"], i < 9 ? 0 : 1) << i << " " << e.event;
    if (e.event == "response.reasoning_text.delta") reasoning += e.data["delta"].get<std::string>();
    if (e.event == "response.output_text.delta") text += e.data["delta"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "Let me think.");
  EXPECT_EQ(text, "Sure!");
  EXPECT_EQ(run.events[0].data["response"]["status"], "in_progress");
  EXPECT_EQ(run.events[0].data["response"]["output"], json::array());
  const json done = run.events.back().data["response"];
  EXPECT_EQ(done["id"], "resp_req1");
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["output"][0]["type"], "reasoning");
  EXPECT_EQ(done["output"][0]["content"], json::parse(R"([{"type": "reasoning_text",
                                                           "text": "Let me think."}])"));
  EXPECT_EQ(done["output"][1]["type"], "message");
  EXPECT_EQ(done["output"][1]["status"], "completed");
  EXPECT_EQ(done["output"][1]["content"][0]["text"], "Sure!");
  EXPECT_EQ(done["usage"]["input_tokens"], 9);
  EXPECT_EQ(done["usage"]["output_tokens"], 6);
  EXPECT_EQ(done["usage"]["total_tokens"], 15);
  // The events before "Sure" (4 of them, one token each) were the thinking.
  EXPECT_EQ(done["usage"]["output_tokens_details"]["reasoning_tokens"], 4);
  EXPECT_EQ(without_ids(run.whole), without_ids(done));
}

TEST(AgentsEvents, ResponsesFunctionCallStreamsItsArguments) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  const Answer run = run_responses(m, {{"input", "Weather?"}, {"tools", {kTool}}}, call_events(),
                                final_event(30, 12));
  const std::vector<std::string> t = types(run.events);
  ASSERT_GE(t.size(), 7u);
  EXPECT_EQ(t[2], "response.output_item.added");
  EXPECT_EQ(t[t.size() - 3], "response.function_call_arguments.done");
  EXPECT_EQ(t[t.size() - 2], "response.output_item.done");
  EXPECT_EQ(t.back(), "response.completed");
  std::string arguments;
  for (size_t i = 3; i + 3 < t.size(); ++i) {
    EXPECT_EQ(t[i], "response.function_call_arguments.delta") << i;
    arguments += run.events[i].data["delta"].get<std::string>();
  }
  expect_numbered(run.events);
  const json added = run.events[2].data["item"];
  EXPECT_EQ(added["type"], "function_call");
  EXPECT_EQ(added["name"], "get_weather");
  EXPECT_EQ(added["arguments"], "");
  EXPECT_EQ(added["status"], "in_progress");
  EXPECT_EQ(json::parse(arguments), json::parse(R"({"city": "Paris"})"));
  const json item = run.events.back().data["response"]["output"][0];
  EXPECT_EQ(item["arguments"], arguments);
  EXPECT_EQ(item["call_id"], added["call_id"]);
  EXPECT_EQ(item["status"], "completed");
  EXPECT_EQ(run.events.back().data["response"]["output"].size(), 1u);
  EXPECT_EQ(run.events[t.size() - 3].data["arguments"], arguments);
  EXPECT_EQ(without_ids(run.whole), without_ids(run.events.back().data["response"]));
}

TEST(AgentsEvents, ResponsesCutByMaxOutputTokensIsIncomplete) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  const Answer run = run_responses(
      m, {{"input", "Hi"}, {"chat_template_kwargs", {{"enable_thinking", false}}}},
      {text_event("Once"), text_event(" upon", 1, StopKind::kMaxTokens)}, final_event(5, 2));
  const json r = run.events.back().data["response"];
  EXPECT_EQ(run.events.back().event, "response.incomplete");
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"], json({{"reason", "max_output_tokens"}}));
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Once upon");
  // enable_thinking false closed the block in the prompt: no reasoning, no reasoning tokens.
  EXPECT_EQ(r["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
  EXPECT_EQ(run.whole["status"], "incomplete");
}

TEST(AgentsEvents, ResponsesEchoTheirRequestFields) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  const json body = {{"input", "Hi"}, {"instructions", "Be brief."}, {"max_output_tokens", 5},
                     {"temperature", 0.25}, {"tools", {kTool}}, {"store", false},
                     {"metadata", {{"k", "v"}}}};
  const Answer run = run_responses(m, body, {text_event("Hey", 1, StopKind::kEos)},
                                final_event(3, 1));
  const json r = run.whole;
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["model"], "qwen");
  EXPECT_EQ(r["instructions"], "Be brief.");
  EXPECT_EQ(r["max_output_tokens"], 5);
  EXPECT_EQ(r["temperature"], 0.25);
  EXPECT_EQ(r["top_p"], 1.0);
  EXPECT_EQ(r["tool_choice"], "auto");
  EXPECT_EQ(r["tools"], json::array({kTool}));
  EXPECT_EQ(r["store"], false);
  EXPECT_EQ(r["metadata"], json({{"k", "v"}}));
  EXPECT_EQ(r["text"], json({{"format", {{"type", "text"}}}}));
  EXPECT_EQ(r["previous_response_id"], nullptr);
  EXPECT_EQ(m.store.size(), 0) << "store: false kept the response";
}

// A response's conversation continues under previous_response_id: the next prompt is the whole
// conversation's (instructions not carried over), and the function call's id matches.
TEST(AgentsEvents, PreviousResponseIdContinuesTheConversation) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  Prepared first = prepare(prepare_responses,
                           {{"input", "Weather in Paris?"}, {"instructions", "Be brief."},
                            {"tools", {kTool}}},
                           m.info);
  ASSERT_FALSE(first.error) << first.error->message;
  const json r1 = json::parse(run_builder(*first.request.builder, call_events(), final_event(1, 1)));
  ASSERT_EQ(r1["output"].size(), 1u);
  const std::string call_id = r1["output"][0]["call_id"];
  EXPECT_EQ(m.store.size(), 1);
  const json next_input = {{{"type", "function_call_output"}, {"call_id", call_id},
                            {"output", "18 C"}}};
  Prepared second = prepare(prepare_responses,
                            {{"input", next_input}, {"previous_response_id", "resp_req1"},
                             {"tools", {kTool}}},
                            m.info);
  ASSERT_FALSE(second.error) << second.error->message;
  const json whole = {
      {"input", {{{"role", "user"}, {"content", "Weather in Paris?"}},
                 {{"type", "function_call"}, {"call_id", call_id}, {"name", "get_weather"},
                  {"arguments", r1["output"][0]["arguments"]}},
                 next_input[0]}},
      {"tools", {kTool}}};
  Prepared reference = prepare(prepare_responses, whole, m.info);
  ASSERT_FALSE(reference.error) << reference.error->message;
  EXPECT_EQ(second.request.request.prompt_token_ids, reference.request.request.prompt_token_ids);
}

std::vector<SseEvent> run_messages(const QwenModel& m, json body,
                                   const std::vector<engine::StreamEvent>& evs,
                                   engine::StreamEvent final, json* whole) {
  if (!body.contains("max_tokens")) body["max_tokens"] = 100;
  body["stream"] = true;
  Prepared s = prepare(prepare_messages, body, m.info);
  EXPECT_FALSE(s.error) << s.error->message;
  if (s.error) return {};
  const std::vector<SseEvent> events = parse_sse(run_builder(*s.request.builder, evs, final));
  body["stream"] = false;
  Prepared w = prepare(prepare_messages, body, m.info);
  *whole = json::parse(run_builder(*w.request.builder, evs, final), nullptr, false);
  return events;
}

const json kHi = {{{"role", "user"}, {"content", "Hi"}}};

TEST(AgentsEvents, MessagesThinkingThenTextStreamsInOrder) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  json whole;
  const std::vector<SseEvent> events =
      run_messages(m, {{"messages", kHi}}, kThinkThenAnswer, final_event(9, 6), &whole);
  EXPECT_EQ(types(events),
            (std::vector<std::string>{"message_start", "ping", "content_block_start",
                                      "content_block_delta", "content_block_delta",
                                      "content_block_stop", "content_block_start",
                                      "content_block_delta", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"}));
  for (const SseEvent& e : events) EXPECT_EQ(e.data["type"], e.event);
  const json start = events[0].data["message"];
  EXPECT_EQ(start["id"], "msg_req1");
  EXPECT_EQ(start["role"], "assistant");
  EXPECT_EQ(start["content"], json::array());
  // The prompt's tokens, known before anything is generated.
  Prepared p = prepare(prepare_messages, {{"messages", kHi}, {"max_tokens", 100}}, m.info);
  EXPECT_EQ(start["usage"]["input_tokens"], p.request.request.prompt_token_ids.size());
  EXPECT_EQ(events[2].data["content_block"],
            json({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}));
  EXPECT_EQ(events[2].data["index"], 0);
  EXPECT_EQ(events[3].data["delta"]["type"], "thinking_delta");
  EXPECT_EQ(events[3].data["delta"]["thinking"].get<std::string>() +
                events[4].data["delta"]["thinking"].get<std::string>(),
            "Let me think.");
  EXPECT_EQ(events[6].data["content_block"], json({{"type", "text"}, {"text", ""}}));
  EXPECT_EQ(events[6].data["index"], 1);
  EXPECT_EQ(events[7].data["delta"]["text"].get<std::string>() +
                events[8].data["delta"]["text"].get<std::string>(),
            "Sure!");
  EXPECT_EQ(events[9].data["index"], 1);
  EXPECT_EQ(events[10].data["delta"],
            json({{"stop_reason", "end_turn"}, {"stop_sequence", nullptr}}));
  EXPECT_EQ(events[10].data["usage"]["output_tokens"], 6);
  EXPECT_EQ(whole["content"], json::parse(R"([{"type": "thinking", "thinking": "Let me think.",
                                              "signature": ""}, {"type": "text", "text": "Sure!"}])"));
  EXPECT_EQ(whole["stop_reason"], "end_turn");
  EXPECT_EQ(whole["usage"]["input_tokens"], 9);
  EXPECT_EQ(whole["usage"]["output_tokens"], 6);
  // Thinking disabled: Qwen 3's template closes the block in the prompt, so the model's text
  // is all content.
  const std::vector<engine::StreamEvent> thinks = {
      text_event("<think>\nhm\n</think>\n\nSure!", 5, StopKind::kEos)};
  const json disabled = {{"type", "disabled"}};
  run_messages(m, {{"messages", kHi}, {"thinking", disabled}}, thinks, final_event(9, 5), &whole);
  EXPECT_EQ(whole["content"], json::parse(R"([{"type": "text",
                                              "text": "<think>\nhm\n</think>\n\nSure!"}])"));
  // A template that ignores enable_thinking (chatml, reasoning read as <think>): the thinking
  // is read and left out; enabled (or absent), it is a thinking block.
  QwenModel chatml({}, "chatml", "think");
  ASSERT_TRUE(chatml.ok());
  run_messages(chatml, {{"messages", kHi}, {"thinking", disabled}}, thinks, final_event(9, 5),
               &whole);
  EXPECT_EQ(whole["content"], json::parse(R"([{"type": "text", "text": "Sure!"}])"));
  const json enabled = {{"type", "enabled"}, {"budget_tokens", 1024}};
  run_messages(chatml, {{"messages", kHi}, {"thinking", enabled}, {"max_tokens", 2000}}, thinks,
               final_event(9, 5), &whole);
  EXPECT_EQ(whole["content"], json::parse(R"([{"type": "thinking", "thinking": "hm",
                                              "signature": ""}, {"type": "text", "text": "Sure!"}])"));
}

TEST(AgentsEvents, MessagesToolUseAndStopReasons) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  const json tools = json::parse(R"([{"name": "get_weather", "input_schema": {"type": "object",
    "properties": {"city": {"type": "string"}}}}])");
  json whole;
  const std::vector<SseEvent> events = run_messages(
      m, {{"messages", kHi}, {"tools", tools}}, call_events(), final_event(20, 12), &whole);
  ASSERT_GE(events.size(), 6u);
  EXPECT_EQ(events[2].event, "content_block_start");
  EXPECT_EQ(events[2].data["content_block"]["type"], "tool_use");
  EXPECT_EQ(events[2].data["content_block"]["name"], "get_weather");
  EXPECT_EQ(events[2].data["content_block"]["input"], json::object());
  std::string partial;
  for (size_t i = 3; i + 3 < events.size(); ++i) {
    EXPECT_EQ(events[i].event, "content_block_delta");
    EXPECT_EQ(events[i].data["delta"]["type"], "input_json_delta");
    partial += events[i].data["delta"]["partial_json"].get<std::string>();
  }
  EXPECT_EQ(json::parse(partial), json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(events[events.size() - 2].data["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(whole["content"], json::array({{{"type", "tool_use"},
                                            {"id", whole["content"][0]["id"]},
                                            {"name", "get_weather"},
                                            {"input", {{"city", "Paris"}}}}}));
  EXPECT_EQ(whole["content"][0]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(whole["stop_reason"], "tool_use");
  // Stop sequences and max_tokens.
  const json off = {{"type", "disabled"}};
  run_messages(m, {{"messages", kHi}, {"thinking", off}, {"stop_sequences", {"!"}}},
               {text_event("Sure", 1, StopKind::kStopString, "!")}, final_event(9, 2), &whole);
  EXPECT_EQ(whole["stop_reason"], "stop_sequence");
  EXPECT_EQ(whole["stop_sequence"], "!");
  run_messages(m, {{"messages", kHi}, {"thinking", off}},
               {text_event("Sure", 1, StopKind::kMaxTokens)}, final_event(9, 1), &whole);
  EXPECT_EQ(whole["stop_reason"], "max_tokens");
  EXPECT_EQ(whole["stop_sequence"], nullptr);
}

TEST(AgentsEvents, StreamErrorsInEachApisShape) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  ApiError e = error_from_status(internal_error("the model produced NaN"));
  Prepared r = prepare(prepare_responses, {{"input", "Hi"}, {"stream", true}}, m.info);
  ASSERT_FALSE(r.error);
  std::string bytes = r.request.builder->on_event(text_event("Hi"));
  bytes += r.request.builder->on_stream_error(e);
  std::vector<SseEvent> events = parse_sse(bytes);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events[events.size() - 2].event, "error");
  EXPECT_EQ(events[events.size() - 2].data["message"], "the model produced NaN");
  EXPECT_EQ(events.back().event, "response.failed");
  EXPECT_EQ(events.back().data["response"]["status"], "failed");
  expect_numbered(events);
  Prepared a = prepare(prepare_messages, {{"messages", kHi}, {"max_tokens", 5}, {"stream", true}},
                       m.info);
  ASSERT_FALSE(a.error);
  events = parse_sse(a.request.builder->on_stream_error(e));
  ASSERT_EQ(events.size(), 3u);  // message_start, ping, error
  EXPECT_EQ(events[2].event, "error");
  EXPECT_EQ(events[2].data, json::parse(R"({"type": "error", "error": {"type": "api_error",
                                            "message": "the model produced NaN"}})"));
}

TEST(ResponseStore, KeepsWithinItsThreeBounds) {
  const auto conv = [](int bytes) {
    return nlohmann::ordered_json::array({{{"role", "user"}, {"content", std::string(bytes, 'x')}}});
  };
  ResponseStore by_count({.max_responses = 2, .ttl_s = 100, .max_bytes = 1 << 20});
  by_count.put("a", conv(1), 0);
  by_count.put("b", conv(1), 1);
  by_count.put("c", conv(1), 2);
  EXPECT_FALSE(by_count.get("a", 2)) << "the oldest goes first";
  EXPECT_TRUE(by_count.get("b", 2));
  EXPECT_TRUE(by_count.get("c", 2));
  EXPECT_EQ(by_count.size(), 2);
  // Replacing an id keeps one entry, now the newest.
  by_count.put("b", conv(2), 3);
  by_count.put("d", conv(1), 4);
  EXPECT_FALSE(by_count.get("c", 4));
  EXPECT_EQ(by_count.get("b", 4)->at(0)["content"], "xx");
  ResponseStore by_age({.max_responses = 10, .ttl_s = 10, .max_bytes = 1 << 20});
  by_age.put("a", conv(1), 0);
  by_age.put("b", conv(1), 5);
  EXPECT_TRUE(by_age.get("a", 10));
  EXPECT_FALSE(by_age.get("a", 10.5)) << "expired after ttl_s";
  EXPECT_TRUE(by_age.get("b", 10.5));
  EXPECT_EQ(by_age.size(), 1);
  const int64_t one = static_cast<int64_t>(conv(100).dump().size());
  ResponseStore by_bytes({.max_responses = 10, .ttl_s = 100, .max_bytes = 2 * one});
  by_bytes.put("a", conv(100), 0);
  by_bytes.put("b", conv(100), 1);
  EXPECT_EQ(by_bytes.bytes(), 2 * one);
  by_bytes.put("c", conv(100), 2);
  EXPECT_FALSE(by_bytes.get("a", 2));
  EXPECT_EQ(by_bytes.bytes(), 2 * one);
  by_bytes.put("huge", conv(1000), 3);
  EXPECT_FALSE(by_bytes.get("huge", 3)) << "larger than the whole store";
  EXPECT_TRUE(by_bytes.get("c", 3));
  ResponseStore none({.max_responses = 0, .ttl_s = 100, .max_bytes = 1 << 20});
  none.put("a", conv(1), 0);
  EXPECT_EQ(none.size(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
