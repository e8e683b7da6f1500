// Tool calling through the real server (issue 18): a random-weight model over Qwen 3's vocabulary
// with Qwen 3's own chat template (so nothing but the grammar makes the calls valid; with
// --reasoning-format none, since a random model that opened a <think> block would never close it
// and the grammar would never start: server_reasoning_test.cc covers thinking), required and
// named choices, parallel calls, streaming deltas that add up to the non-streamed message, the
// Llama 3 JSON format, a template that does not render tools (stories260K with llama2), auto
// reading calls out of free output, speculation, and the 400s.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "chat/tool_calls.h"
#include "grammar/grammar_spec.h"
#include "grammar/matcher.h"
#include "server/tool_calling_api.h"
#include "server_test_util.h"
#include "support/json_schema_validator.h"
#include "support/shared_data.h"

namespace arbor::server::testing {
namespace {

using json = nlohmann::json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
   "parameters": {"type": "object", "properties": {
     "city": {"type": "string", "minLength": 1, "maxLength": 12},
     "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}},
  {"type": "function", "function": {"name": "add", "description": "Adds two integers",
   "parameters": {"type": "object", "properties": {
     "a": {"type": "integer", "minimum": -100, "maximum": 100},
     "b": {"type": "integer"}}, "required": ["a", "b"]}}},
  {"type": "function", "function": {"name": "now"}}])");

const json& schema_of(const std::string& name) {
  static const json kEmptyObject = json::parse(R"({"type":"object","properties":{}})");
  for (const json& t : kTools) {
    if (t["function"]["name"] == name) {
      return t["function"].contains("parameters") ? t["function"]["parameters"] : kEmptyObject;
    }
  }
  ADD_FAILURE() << "no tool " << name;
  return kEmptyObject;
}

json chat_body(const json& tool_choice, int seed, bool stream = false) {
  json b{{"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
         {"tools", kTools}, {"max_tokens", 160}, {"seed", seed},
         {"temperature", seed == 0 ? 0.0 : 1.0}, {"stream", stream}};
  if (!tool_choice.is_null()) b["tool_choice"] = tool_choice;
  return b;
}

struct Call {
  std::string name;
  std::string arguments;
  bool operator==(const Call&) const = default;
};

struct Message {
  json content;  // a string or null
  std::vector<Call> calls;
  std::string finish_reason;
};

Message message_of(const HttpResult& r, size_t choice = 0) {
  const json j = r.json();
  Message m;
  if (j.is_discarded() || !j.contains("choices")) {
    ADD_FAILURE() << r.body;
    return m;
  }
  const json& c = j["choices"][choice];
  m.finish_reason = c["finish_reason"];
  m.content = c["message"]["content"];
  if (c["message"].contains("tool_calls")) {
    for (const json& t : c["message"]["tool_calls"]) {
      EXPECT_EQ(t["type"], "function");
      EXPECT_TRUE(t["id"].get<std::string>().starts_with("call_")) << t;
      m.calls.push_back({t["function"]["name"], t["function"]["arguments"]});
    }
  }
  return m;
}

// Assembles a stream as the openai clients do: content concatenated, calls by index (id, type
// and name once, arguments concatenated).
Message assemble_stream(const HttpResult& r) {
  Message m;
  std::string content;
  std::map<int, Call> calls;
  std::map<int, int> ids;
  for (const std::string& payload : sse_payloads(r.body)) {
    if (payload == "[DONE]") continue;
    const json j = json::parse(payload);
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    const json& d = c["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const json& t : d["tool_calls"]) {
        const int i = t["index"];
        if (t.contains("id")) {
          ++ids[i];
          EXPECT_EQ(t["type"], "function");
          calls[i].name = t["function"]["name"];
        }
        calls[i].arguments += t["function"]["arguments"].get<std::string>();
      }
    }
    if (!c["finish_reason"].is_null()) m.finish_reason = c["finish_reason"];
  }
  for (const auto& [i, n] : ids) EXPECT_EQ(n, 1) << "call " << i << " announced " << n << " times";
  for (const auto& [i, call] : calls) {
    EXPECT_EQ(i, static_cast<int>(m.calls.size()));
    m.calls.push_back(call);
  }
  m.content = content.empty() && !m.calls.empty() ? json(nullptr) : json(content);
  return m;
}

// cut_allowed: parallel calls, where a random model may go on calling until max_tokens cuts the
// last call short; every call before it must still be valid.
void expect_valid_calls(const Message& m, const std::string& only = "", bool cut_allowed = false) {
  const bool cut = cut_allowed && m.finish_reason == "length";
  if (!cut) EXPECT_EQ(m.finish_reason, "tool_calls");
  EXPECT_TRUE(m.content.is_null()) << m.content;
  ASSERT_FALSE(m.calls.empty());
  for (size_t i = 0; i + (cut ? 1 : 0) < m.calls.size(); ++i) {
    const Call& c = m.calls[i];
    if (!only.empty()) EXPECT_EQ(c.name, only);
    const json args = json::parse(c.arguments, nullptr, false);
    ASSERT_FALSE(args.is_discarded()) << c.name << ": '" << c.arguments << "'";
    EXPECT_EQ(::arbor::test::validate_json(args, schema_of(c.name)), std::nullopt)
        << c.name << ": " << c.arguments;
  }
}

// gpt-oss's harmony form (no server): one commentary call to one of the tools, each name with
// its own arguments' schema, the shared JSON rules once; a named choice allows that one only.
TEST(ServerTools, HarmonyCallGrammarMatchesEachToolWithItsOwnArguments) {
  ToolRequest request;
  request.tools = nlohmann::ordered_json::parse(kTools.dump());
  for (const json& t : kTools) request.names.push_back(t["function"]["name"]);
  request.choice = ToolChoice::kRequired;
  auto accepts = [](const ToolRequest& r, const std::string& text) {
    Result<std::string> gbnf = tool_call_grammar(r, chat::ToolCallFormat::kHarmony);
    EXPECT_TRUE(gbnf.ok()) << gbnf.status().to_string();
    if (!gbnf.ok()) return false;
    Result<grammar::Automaton> a =
        grammar::compile_spec({grammar::GrammarKind::kGbnf, std::move(gbnf).value()});
    EXPECT_TRUE(a.ok()) << a.status().to_string();
    if (!a.ok()) return false;
    grammar::Matcher m(std::make_shared<const grammar::Automaton>(std::move(a).value()));
    return m.accept(text) && m.can_end();
  };
  const std::string head = "<|channel|>commentary to=functions.";
  const std::string json_open = " <|constrain|>json<|message|>";
  EXPECT_TRUE(accepts(request, head + "get_weather" + json_open +
                                   R"({"city": "Paris", "unit": "celsius"})"));
  EXPECT_TRUE(accepts(request, head + "add" + json_open + R"({"a": 3, "b": -4})"));
  EXPECT_TRUE(accepts(request, head + "now" + json_open + "{}"));
  // Another tool's arguments, an unknown name, two calls, a missing header: refused.
  EXPECT_FALSE(accepts(request, head + "add" + json_open + R"({"city": "Paris", "unit": "celsius"})"));
  EXPECT_FALSE(accepts(request, head + "get_weather" + json_open + R"({"a": 3, "b": -4})"));
  EXPECT_FALSE(accepts(request, head + "sub" + json_open + R"({"a": 3, "b": -4})"));
  EXPECT_FALSE(accepts(request, head + "now" + json_open + "{}" + head + "now" + json_open + "{}"));
  EXPECT_FALSE(accepts(request, R"({"a": 3, "b": -4})"));
  request.choice = ToolChoice::kNamed;
  request.named = "add";
  EXPECT_TRUE(accepts(request, head + "add" + json_open + R"({"a": 3, "b": -4})"));
  EXPECT_FALSE(accepts(request, head + "now" + json_open + "{}"));
}

TEST(ServerTools, RequiredAndNamedCallsAreValidAndStreamAsTheyDoWhole) {
  ServerProcess server({"--reasoning-format", "none"}, 0, random_qwen3_model());
  ASSERT_TRUE(server.ok());
  std::map<std::string, int> names;
  int several = 0;
  for (const json& choice : {json("required"),
                             json{{"type", "function"}, {"function", {{"name", "add"}}}},
                             json{{"type", "function"}, {"function", {{"name", "now"}}}}}) {
    const std::string only = choice.is_object() ? choice["function"]["name"] : "";
    for (int seed : {0, 1, 2, 3, 4, 5}) {
      const HttpResult whole = server.post("/v1/chat/completions", chat_body(choice, seed));
      ASSERT_EQ(whole.status, 200) << whole.body;
      const Message m = message_of(whole);
      expect_valid_calls(m, only, /*cut_allowed=*/true);
      if (!only.empty()) EXPECT_EQ(m.calls.size(), 1u);  // a named choice is one call
      several += m.calls.size() > 1;
      for (const Call& c : m.calls) ++names[c.name];
      const HttpResult streamed = server.post("/v1/chat/completions", chat_body(choice, seed, true));
      ASSERT_EQ(streamed.status, 200) << streamed.body;
      const Message s = assemble_stream(streamed);
      EXPECT_EQ(s.calls, m.calls) << "seed " << seed << " " << choice;
      EXPECT_EQ(s.finish_reason, m.finish_reason);
      EXPECT_EQ(s.content, m.content);
    }
  }
  EXPECT_GE(names.size(), 2u);  // required chooses among the tools
  EXPECT_GT(several, 0);        // and parallel calls happen
  // parallel_tool_calls false: required makes exactly one call.
  for (int seed : {1, 2, 3}) {
    json body = chat_body("required", seed);
    body["parallel_tool_calls"] = false;
    const HttpResult r = server.post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const Message m = message_of(r);
    expect_valid_calls(m);
    EXPECT_EQ(m.calls.size(), 1u);
  }
  // n = 3: every choice is calls.
  json body = chat_body("required", 7);
  body["n"] = 3;
  const HttpResult r = server.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  for (size_t i = 0; i < 3; ++i) expect_valid_calls(message_of(r, i), "", /*cut_allowed=*/true);
  EXPECT_TRUE(server.wait_no_blocks_used());
}

// auto reads calls out of whatever the model wrote: the same output as tool_choice "none" (the
// same prompt, no grammar), parsed.
TEST(ServerTools, AutoParsesWhatTheModelWrote) {
  ServerProcess server({"--reasoning-format", "none"}, 0, random_qwen3_model());
  ASSERT_TRUE(server.ok());
  for (int seed : {0, 1, 2}) {
    const HttpResult none = server.post("/v1/chat/completions", chat_body("none", seed));
    ASSERT_EQ(none.status, 200) << none.body;
    const Message raw = message_of(none);
    EXPECT_TRUE(raw.calls.empty());
    const HttpResult automatic = server.post("/v1/chat/completions", chat_body(nullptr, seed));
    ASSERT_EQ(automatic.status, 200) << automatic.body;
    const Message m = message_of(automatic);
    const std::vector<std::string> names = {"get_weather", "add", "now"};
    const chat::ParsedToolOutput expected = chat::parse_tool_calls(
        chat::ToolCallFormat::kHermes, raw.content.get<std::string>(), true, names);
    EXPECT_EQ(m.calls.size(), expected.calls.size());
    if (expected.calls.empty()) EXPECT_EQ(m.content, raw.content);
  }
  // A model's call written out by hand in an assistant turn goes back through the template, and
  // the conversation continues with tool results.
  json body = chat_body(nullptr, 1);
  body["messages"].push_back(
      {{"role", "assistant"}, {"content", nullptr},
       {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                        {"function", {{"name", "get_weather"},
                                      {"arguments", R"({"city": "Paris", "unit": "celsius"})"}}}}}}});
  body["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C"}});
  const HttpResult r = server.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const HttpResult without_tools = server.post(
      "/v1/chat/completions",
      json{{"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
           {"max_tokens", 1}});
  // The template rendered the tools, the call and the result: a much longer prompt.
  EXPECT_GT(r.json()["usage"]["prompt_tokens"].get<int>(),
            without_tools.json()["usage"]["prompt_tokens"].get<int>() + 150)
      << r.body;
}

TEST(ServerTools, Llama3JsonFormat) {
  ServerProcess server({"--tool-call-parser", "llama3_json", "--reasoning-format", "none"}, 0,
                       random_qwen3_model());
  ASSERT_TRUE(server.ok());
  for (int seed : {0, 1, 2}) {
    const HttpResult r = server.post("/v1/chat/completions", chat_body("required", seed));
    ASSERT_EQ(r.status, 200) << r.body;
    const Message m = message_of(r);
    expect_valid_calls(m, "", /*cut_allowed=*/true);
    const Message s = assemble_stream(server.post("/v1/chat/completions", chat_body("required", seed, true)));
    EXPECT_EQ(s.calls, m.calls);
  }
}

// Qwen3-Coder / Qwen3.5 XML calls (--tool-call-parser qwen3_coder; auto picks it for Qwen3.5's
// template, tests/chat): the grammar writes <function=NAME> blocks whose <parameter=P> values
// follow each property's schema (enum, integer range, string length), the parser types them back
// into JSON arguments that validate against the tool's schema, streamed as they are whole.
TEST(ServerTools, Qwen3CoderXmlFormat) {
  ServerProcess server({"--tool-call-parser", "qwen3_coder", "--reasoning-format", "none"}, 0,
                       random_qwen3_model());
  ASSERT_TRUE(server.ok());
  std::map<std::string, int> names;
  for (const json& choice : {json("required"),
                             json{{"type", "function"}, {"function", {{"name", "add"}}}},
                             json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
    const std::string only = choice.is_object() ? choice["function"]["name"] : "";
    for (int seed : {0, 1, 2, 3}) {
      const HttpResult whole = server.post("/v1/chat/completions", chat_body(choice, seed));
      ASSERT_EQ(whole.status, 200) << whole.body;
      const Message m = message_of(whole);
      expect_valid_calls(m, only, /*cut_allowed=*/true);
      for (const Call& c : m.calls) ++names[c.name];
      const Message s = assemble_stream(
          server.post("/v1/chat/completions", chat_body(choice, seed, true)));
      EXPECT_EQ(s.calls, m.calls) << "seed " << seed << " " << choice;
      EXPECT_EQ(s.finish_reason, m.finish_reason);
    }
  }
  EXPECT_GE(names.size(), 2u);
  EXPECT_TRUE(server.wait_no_blocks_used());
}

// stories260K's llama2 template does not render tools: they reach the model as text, and the
// grammar still makes the calls. Greedy output is the same with speculation as without.
// (stories260K's 512-token context and its 512-token vocabulary leave room for one short tool.)
TEST(ServerTools, TemplatesWithoutToolsAndSpeculation) {
  std::vector<Call> plain;
  for (const char* spec : {"off", "ngram"}) {
    ServerProcess server({"--chat-template", "llama2", "--spec", spec});
    ASSERT_TRUE(server.ok());
    json body = chat_body("required", 0);
    body["tools"] = json::array({kTools[1]});
    body["tools"][0]["function"]["parameters"]["properties"]["b"]["maximum"] = 99;
    body["max_tokens"] = 100;
    body["parallel_tool_calls"] = false;  // greedy, this model would call again and again
    const HttpResult r = server.post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const Message m = message_of(r);
    expect_valid_calls(m);
    if (plain.empty()) {
      plain = m.calls;
    } else {
      EXPECT_EQ(m.calls, plain) << "speculation changed greedy tool calls";
    }
    EXPECT_TRUE(server.wait_no_blocks_used());
  }
}

TEST(ServerTools, BadToolRequestsAre400sNamingTheField) {
  ServerProcess server({"--reasoning-format", "none"}, 0, random_qwen3_model());
  ASSERT_TRUE(server.ok());
  const auto expect_400 = [&](const json& body, const std::string& param, const std::string& what) {
    const HttpResult r = server.post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << what << ": " << r.body;
    const json j = r.json();
    ASSERT_FALSE(j.is_discarded()) << r.body;
    EXPECT_EQ(j["error"]["param"], param) << what << ": " << r.body;
  };
  json b = chat_body("required", 0);
  b["tools"] = "get_weather";
  expect_400(b, "tools", "tools not an array");
  b = chat_body("required", 0);
  b["tools"][0]["function"]["name"] = "get weather";
  expect_400(b, "tools", "a name with a space");
  b = chat_body("required", 0);
  b["tools"][1]["function"]["name"] = "get_weather";
  expect_400(b, "tools", "two tools with one name");
  b = chat_body("required", 0);
  b["tools"][0]["type"] = "code_interpreter";
  expect_400(b, "tools", "not a function");
  expect_400(chat_body(json{{"type", "function"}, {"function", {{"name", "missing"}}}}, 0),
             "tool_choice", "naming a function not in tools");
  expect_400(chat_body("always", 0), "tool_choice", "an unknown choice");
  b = chat_body("required", 0);
  b.erase("tools");
  expect_400(b, "tool_choice", "required without tools");
  b = chat_body("required", 0);
  b["response_format"] = {{"type", "json_object"}};
  expect_400(b, "tool_choice", "two constraints");
  b = chat_body("required", 0);
  b["parallel_tool_calls"] = "yes";
  expect_400(b, "parallel_tool_calls", "not a boolean");
  b = chat_body("required", 0);
  b["tools"][0]["function"]["parameters"]["patternProperties"] = {{"^x", {{"type", "string"}}}};
  expect_400(b, "tools", "a schema the grammar cannot enforce");
  b["tool_choice"] = "auto";  // nothing to enforce: fine
  EXPECT_EQ(server.post("/v1/chat/completions", b).status, 200);
  b = chat_body(nullptr, 0);
  b["messages"].push_back({{"role", "assistant"}, {"tool_calls", {{{"function", {{"name", "add"}}}}}},
                           {"content", nullptr}});
  expect_400(b, "messages", "a tool call without arguments");
  b = chat_body(nullptr, 0);
  b["chat_template_kwargs"] = {{"tools", json::array()}};
  expect_400(b, "chat_template_kwargs", "kwargs that replace a request field");
  // chat_template_kwargs reach the template: Qwen 3 writes an empty think block.
  b = chat_body(nullptr, 0);
  b["max_tokens"] = 1;
  const int base = server.post("/v1/chat/completions", b).json()["usage"]["prompt_tokens"];
  b["chat_template_kwargs"] = {{"enable_thinking", false}};
  const HttpResult r = server.post("/v1/chat/completions", b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(r.json()["usage"]["prompt_tokens"].get<int>(), base);
  EXPECT_TRUE(server.wait_no_blocks_used());
}

}  // namespace
}  // namespace arbor::server::testing
