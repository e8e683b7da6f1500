// gpt-oss's harmony format through the real server (issue 36): script models (script_model.h:
// Qwen 3's vocabulary plus harmony's markers, the shared gpt-oss template) whose greedy outputs
// are an analysis message then a final one, or an analysis message then a call to
// functions.get_weather. The analysis channel becomes reasoning_content, final content, the call
// tool_calls (finish_reason "tool_calls"), streamed and whole alike; reasoning_effort reaches the
// template ("Reasoning: high" in the prompt) and is refused where the template does not read it;
// forced calls and structured output apply after the analysis message (the grammar gate reads
// it as a thinking block and the following header as the content's opening). The official openai client runs harmony.test.mjs against both models.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "script_model.h"
#include "server_test_util.h"
#include "support/subprocess.h"

namespace arbor::server::testing {
namespace {

using json = nlohmann::json;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "description": "Current weather", "parameters": {"type": "object",
  "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");

json body(bool tools = false) {
  json b = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 40},
            {"temperature", 0}};
  if (tools) b["tools"] = kTools;
  return b;
}

struct Message {
  json reasoning;  // null when absent
  json content;
  json calls = json::array();  // [{name, arguments}]
  std::string finish;
};

Message whole(const ServerProcess& server, const json& b) {
  const HttpResult r = server.post("/v1/chat/completions", b);
  EXPECT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  Message m;
  if (j.is_discarded() || !j.contains("choices")) return m;
  const json& msg = j["choices"][0]["message"];
  m.reasoning = msg.value("reasoning_content", json());
  m.content = msg["content"];
  for (const json& c : msg.value("tool_calls", json::array())) {
    m.calls.push_back({{"name", c["function"]["name"]}, {"arguments", c["function"]["arguments"]}});
  }
  m.finish = j["choices"][0]["finish_reason"];
  return m;
}

// The stream assembled as clients do; no delta may carry harmony markup.
Message streamed(const ServerProcess& server, json b) {
  b["stream"] = true;
  const HttpResult r = server.post("/v1/chat/completions", b);
  EXPECT_EQ(r.status, 200) << r.body;
  Message m;
  std::string reasoning, content;
  bool any_reasoning = false;
  for (const std::string& payload : sse_payloads(r.body)) {
    if (payload == "[DONE]") continue;
    const json j = json::parse(payload);
    if (j["choices"].empty()) continue;
    const json& d = j["choices"][0]["delta"];
    if (d.contains("reasoning_content")) {
      any_reasoning = true;
      reasoning += d["reasoning_content"].get<std::string>();
    }
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    for (const json& c : d.value("tool_calls", json::array())) {
      const size_t i = c["index"].get<size_t>();
      if (i == m.calls.size()) m.calls.push_back({{"name", c["function"]["name"]}, {"arguments", ""}});
      EXPECT_LT(i, m.calls.size());
      if (i >= m.calls.size()) continue;
      m.calls[i]["arguments"] =
          m.calls[i]["arguments"].get<std::string>() + c["function"].value("arguments", "");
    }
    if (!j["choices"][0]["finish_reason"].is_null()) m.finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning.find("<|"), std::string::npos) << reasoning;
  EXPECT_EQ(content.find("<|"), std::string::npos) << content;
  m.reasoning = any_reasoning ? json(reasoning) : json();
  m.content = content;
  return m;
}

TEST(ServerHarmony, AnalysisIsReasoningAndFinalIsContentStreamedAndWhole) {
  ServerProcess server({}, 0, harmony_answer_script_model());
  ASSERT_TRUE(server.ok());
  const Message w = whole(server, body());
  EXPECT_EQ(w.reasoning, "Let me think.");
  EXPECT_EQ(w.content, "Sure!");
  EXPECT_EQ(w.finish, "stop");
  EXPECT_TRUE(w.calls.empty());
  const Message s = streamed(server, body());
  EXPECT_EQ(s.reasoning, w.reasoning);
  EXPECT_EQ(s.content, w.content);
  EXPECT_EQ(s.finish, "stop");
  // max_tokens inside the analysis: all reasoning so far.
  json short_body = body();
  short_body["max_tokens"] = 5;
  const Message cut = whole(server, short_body);
  EXPECT_EQ(cut.reasoning, "Let me");
  EXPECT_EQ(cut.finish, "length");
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerHarmony, CommentaryCallsAreToolCallsStreamedAndWhole) {
  ServerProcess server({}, 0, harmony_tool_script_model());
  ASSERT_TRUE(server.ok());
  const json want_calls = json::parse(R"([{"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}])");
  const Message w = whole(server, body(true));
  EXPECT_EQ(w.reasoning, "Need weather.");
  EXPECT_EQ(w.calls, want_calls);
  EXPECT_EQ(w.finish, "tool_calls");
  const Message s = streamed(server, body(true));
  EXPECT_EQ(s.reasoning, "Need weather.");
  EXPECT_EQ(s.calls, want_calls);
  EXPECT_EQ(s.content, "");
  EXPECT_EQ(s.finish, "tool_calls");
  // Without tools the call's body is content (there is no function to call).
  const Message no_tools = whole(server, body(false));
  EXPECT_EQ(no_tools.content, "{\"city\": \"Paris\"}");
  EXPECT_TRUE(no_tools.calls.empty());
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

// The answer model writes a final message unless a grammar refuses it: tool_choice "required"
// or a named function turns it into the commentary call (its header is the model's second
// choice), response_format into a JSON final message; the analysis is reasoning throughout, and
// streamed equals whole.
TEST(ServerHarmony, ForcedCallsAndStructuredOutputFollowTheAnalysis) {
  ServerProcess server({}, 0, harmony_answer_script_model());
  ASSERT_TRUE(server.ok());
  const Message free = whole(server, body(true));
  EXPECT_EQ(free.content, "Sure!");
  EXPECT_TRUE(free.calls.empty());
  const json want_calls =
      json::parse(R"([{"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}])");
  for (const json& choice :
       {json("required"), json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
    json forced = body(true);
    forced["tool_choice"] = choice;
    const Message w = whole(server, forced);
    EXPECT_EQ(w.reasoning, "Let me think.") << choice;
    EXPECT_EQ(w.calls, want_calls) << choice;
    EXPECT_EQ(w.finish, "tool_calls") << choice;
    const Message s = streamed(server, forced);
    EXPECT_EQ(s.reasoning, "Let me think.") << choice;
    EXPECT_EQ(s.calls, want_calls) << choice;
    EXPECT_EQ(s.content, "") << choice;
  }
  for (const json& format :
       {json{{"type", "json_object"}},
        json{{"type", "json_schema"},
             {"json_schema",
              {{"name", "a"},
               {"schema",
                {{"type", "object"},
                 {"properties", {{"answer", {{"type", "string"}}}}},
                 {"required", {"answer"}}}}}}}}) {
    json constrained = body();
    constrained["response_format"] = format;
    const Message w = whole(server, constrained);
    EXPECT_EQ(w.reasoning, "Let me think.") << format;
    EXPECT_EQ(w.content, "{\"answer\": \"Paris\"}") << format;
    EXPECT_EQ(w.finish, "stop") << format;
    const Message s = streamed(server, constrained);
    EXPECT_EQ(s.content, w.content) << format;
    EXPECT_EQ(s.reasoning, w.reasoning) << format;
  }
  // Forced calls and another constraint together are refused, as for every model.
  json both = body(true);
  both["tool_choice"] = "required";
  both["response_format"] = {{"type", "json_object"}};
  EXPECT_EQ(server.post("/v1/chat/completions", both).status, 400);
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

// reasoning_effort becomes the template's variable: the prompt (read back through
// prompt_logprobs' decoded tokens) says "Reasoning: high"; bad values and templates that do not
// read it are refused.
TEST(ServerHarmony, ReasoningEffortReachesTheTemplate) {
  ServerProcess server({}, 0, harmony_answer_script_model());
  ASSERT_TRUE(server.ok());
  for (const char* effort : {"high", "low"}) {
    json b = body();
    b["reasoning_effort"] = effort;
    b["prompt_logprobs"] = 0;
    b["max_tokens"] = 1;
    const HttpResult r = server.post("/v1/chat/completions", b);
    ASSERT_EQ(r.status, 200) << r.body;
    std::string prompt;
    // prompt_logprobs 0: each position holds its own token alone (the first is null).
    const json j = r.json();
    for (const json& entry : j["prompt_logprobs"]) {
      if (entry.is_object() && entry.size() == 1) {
        prompt += entry.begin().value()["decoded_token"].get<std::string>();
      }
    }
    EXPECT_NE(prompt.find(std::string("Reasoning: ") + effort), std::string::npos)
        << prompt;
  }
  json bad = body();
  bad["reasoning_effort"] = "extreme";
  HttpResult r = server.post("/v1/chat/completions", bad);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("reasoning_effort"), std::string::npos) << r.body;
  EXPECT_EQ(server.terminate(), 0);
  ServerProcess qwen({}, 0, thinking_script_model());  // Qwen 3's template: no such variable
  ASSERT_TRUE(qwen.ok());
  json effort = body();
  effort["reasoning_effort"] = "high";
  r = qwen.post("/v1/chat/completions", effort);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("not read by this model's chat template"), std::string::npos) << r.body;
  EXPECT_EQ(qwen.terminate(), 0);
}

// The official openai client (harmony.test.mjs) against both models, with n-gram speculation.
TEST(ServerHarmony, OfficialOpenAiClient) {
  const std::string js = std::string(ARBOR_SOURCE_DIR) + "/tests/server/js";
  ASSERT_TRUE(std::filesystem::exists(js + "/node_modules/openai/package.json"))
      << js << "/node_modules is absent: run scripts/install_js_deps.sh (or `make deps`)";
  ServerProcess answer({"--spec", "ngram", "--served-model-name", "script"}, 0,
                       harmony_answer_script_model());
  ServerProcess tools({"--spec", "ngram", "--served-model-name", "script"}, 0,
                      harmony_tool_script_model());
  ASSERT_TRUE(answer.ok() && tools.ok());
  const test::CommandResult r = test::run_shell(
      "cd '" + js + "' && ARBOR_MODEL=script ARBOR_BASE_URL='" + answer.url("/v1") +
      "' ARBOR_TOOL_BASE_URL='" + tools.url("/v1") +
      "' node --test --test-reporter=spec harmony.test.mjs 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_EQ(answer.terminate(), 0);
  EXPECT_EQ(tools.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
