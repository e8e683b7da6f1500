// Reasoning output through the real server (issue 33). Real tiny models never think, so these
// tests serve a script model (script_model.h: Qwen 3's vocabulary, one token in, one token out
// by a table) whose greedy output is "<think>\n\nLet me think.</think> Sure!", and, when a
// grammar refuses " Sure", '{"answer": "yes"}'. With Qwen 3's own template (the model opens the
// block), a template that opens it in the prompt, enable_thinking false, --reasoning-format
// none, max_tokens inside the block, response_format and tool_choice required after the block,
// streaming, and speculation (greedy output the same with it as without; the openai client test
// runs with n-gram speculation on).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "script_model.h"
#include "server_test_util.h"
#include "support/json_schema_validator.h"
#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::server::testing {
namespace {

using json = nlohmann::json;

// Opens the block in the prompt (as Qwen 3.5 and DeepSeek-R1 do); enable_thinking=false closes
// it there.
constexpr const char* kOpeningTemplate =
    "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n<think>\\n\\n' }}{%- if enable_thinking is defined and "
    "enable_thinking is false %}{{ '</think>\\n\\n' }}{%- endif %}{%- endif %}";

struct Files {
  std::string model;
  std::string opening_template;
};

// Made once per test process.
const Files& files() {
  static test::TempDir dir("server_reasoning");
  static const Files f = [] {
    Files out{thinking_script_model(), dir.path() + "/opening.jinja"};
    std::ofstream(out.opening_template) << kOpeningTemplate;
    return out;
  }();
  return f;
}

json body(bool stream = false) {
  return {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 40},
          {"temperature", 0}, {"stream", stream}};
}

const json kSchema = json::parse(
    R"({"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]})");

json with_schema(json b) {
  b["response_format"] = {{"type", "json_schema"},
                          {"json_schema", {{"name", "a"}, {"schema", kSchema}}}};
  return b;
}

struct Message {
  json reasoning;  // absent: null
  json content;
  std::string finish_reason;
  int completion_tokens = 0;
  int draft_tokens = 0;  // usage.speculation.draft_tokens
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
  m.finish_reason = j["choices"][0]["finish_reason"];
  m.completion_tokens = j["usage"]["completion_tokens"];
  if (j["usage"].contains("speculation")) m.draft_tokens = j["usage"]["speculation"]["draft_tokens"];
  return m;
}

// The stream assembled as clients do; also checks that no delta mixes markup into content.
Message streamed(const ServerProcess& server, json b) {
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  const HttpResult r = server.post("/v1/chat/completions", b);
  EXPECT_EQ(r.status, 200) << r.body;
  std::string reasoning, content;
  bool any_reasoning = false;
  Message m;
  for (const std::string& payload : sse_payloads(r.body)) {
    if (payload == "[DONE]") continue;
    const json j = json::parse(payload);
    if (j.contains("usage") && j["usage"].is_object()) m.completion_tokens = j["usage"]["completion_tokens"];
    if (j["choices"].empty()) continue;
    const json& d = j["choices"][0]["delta"];
    if (d.contains("reasoning_content")) {
      any_reasoning = true;
      reasoning += d["reasoning_content"].get<std::string>();
    }
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) m.finish_reason = j["choices"][0]["finish_reason"];
  }
  m.reasoning = any_reasoning ? json(reasoning) : json();
  m.content = content;
  return m;
}

void expect_message(const Message& m, const json& reasoning, const json& content,
                    const std::string& finish, const std::string& what) {
  EXPECT_EQ(m.reasoning, reasoning) << what;
  EXPECT_EQ(m.content, content) << what;
  EXPECT_EQ(m.finish_reason, finish) << what;
}

TEST(ServerReasoning, ThinkingGoesToReasoningContentStreamedAsWhole) {
  ServerProcess server({}, 0, files().model);
  ASSERT_TRUE(server.ok());
  const Message m = whole(server, body());
  expect_message(m, "Let me think.", "Sure!", "stop", "Qwen 3's template, whole");
  EXPECT_EQ(m.completion_tokens, 10);
  const Message s = streamed(server, body());
  expect_message(s, "Let me think.", "Sure!", "stop", "Qwen 3's template, streamed");
  EXPECT_EQ(s.completion_tokens, 10);
  // Cut inside the block: all reasoning, no content.
  json cut = body();
  cut["max_tokens"] = 4;
  expect_message(whole(server, cut), "Let me", "", "length", "max_tokens 4, whole");
  expect_message(streamed(server, cut), "Let me", "", "length", "max_tokens 4, streamed");
  // enable_thinking=false: the template closes an empty block, so nothing is read as
  // reasoning, and this model's text (which does not know) is all content.
  json off = body();
  off["chat_template_kwargs"] = {{"enable_thinking", false}};
  expect_message(whole(server, off), json(), "Let me think.</think> Sure!", "stop",
                 "enable_thinking false");
  expect_message(streamed(server, off), json(), "Let me think.</think> Sure!", "stop",
                 "enable_thinking false, streamed");
  // A previous turn's reasoning_content is accepted (the template may render it); a non-string
  // is a 400 naming it.
  json turns = body();
  turns["messages"] = json::parse(R"([{"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Sure!", "reasoning_content": "Let me think."},
    {"role": "user", "content": "Again"}])");
  expect_message(whole(server, turns), "Let me think.", "Sure!", "stop", "a second turn");
  turns["messages"][1]["reasoning_content"] = 3;
  const HttpResult bad = server.post("/v1/chat/completions", turns);
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("reasoning_content"), std::string::npos) << bad.body;
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerReasoning, ATemplateThatOpensTheBlockAndTheNoneFormat) {
  {
    const std::string log = files().model + ".opening.log";
    ServerProcess server({"--chat-template", files().opening_template}, 0, files().model, log);
    ASSERT_TRUE(server.ok());
    expect_message(whole(server, body()), "Let me think.", "Sure!", "stop", "opened, whole");
    expect_message(streamed(server, body()), "Let me think.", "Sure!", "stop", "opened, streamed");
    json off = body();
    off["chat_template_kwargs"] = {{"enable_thinking", false}};
    expect_message(whole(server, off), json(), "Let me think.</think> Sure!", "stop", "closed");
    EXPECT_EQ(server.terminate(), 0);
    const std::string text = test::read_file(log);
    EXPECT_NE(text.find("reasoning: think format (<think>...</think>"), std::string::npos) << text;
  }
  ServerProcess server({"--reasoning-format", "none"}, 0, files().model);
  ASSERT_TRUE(server.ok());
  expect_message(whole(server, body()), json(), "<think>\n\nLet me think.</think> Sure!", "stop",
                 "--reasoning-format none");
  expect_message(streamed(server, body()), json(), "<think>\n\nLet me think.</think> Sure!", "stop",
                 "--reasoning-format none, streamed");
  EXPECT_EQ(server.terminate(), 0);
}

// The grammar starts after the block: the thinking is free text, the content valid JSON (the
// model's first choice after </think>, " Sure", is refused there, so it takes its second).
TEST(ServerReasoning, JsonSchemaAppliesAfterTheThinking) {
  ServerProcess server({}, 0, files().model);
  ASSERT_TRUE(server.ok());
  for (bool stream : {false, true}) {
    const Message m = stream ? streamed(server, with_schema(body())) : whole(server, with_schema(body()));
    const std::string what = stream ? "streamed" : "whole";
    EXPECT_EQ(m.reasoning, "Let me think.") << what;
    EXPECT_EQ(m.finish_reason, "stop") << what;
    ASSERT_TRUE(m.content.is_string()) << what;
    const json value = json::parse(m.content.get<std::string>(), nullptr, false);
    ASSERT_FALSE(value.is_discarded()) << what << ": " << m.content;
    EXPECT_EQ(::arbor::test::validate_json(value, kSchema), std::nullopt) << what;
    EXPECT_EQ(value, json({{"answer", "yes"}})) << what;
  }
  // tool_choice required: the calls' grammar, after the block too.
  json tools = body();
  tools["tools"] = json::parse(R"([{"type": "function", "function": {"name": "pick", "parameters":
      {"type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"]}}}])");
  tools["tool_choice"] = "required";
  tools["parallel_tool_calls"] = false;
  tools["max_tokens"] = 200;
  const HttpResult r = server.post("/v1/chat/completions", tools);
  ASSERT_EQ(r.status, 200) << r.body;
  const json msg = r.json()["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "Let me think.") << r.body;
  ASSERT_TRUE(msg.contains("tool_calls")) << r.body;
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "pick") << r.body;
  const json args = json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>(),
                                nullptr, false);
  EXPECT_TRUE(args == json({{"n", 1}}) || args == json({{"n", 2}})) << r.body;
  EXPECT_EQ(server.terminate(), 0);
}

// Greedy output with speculation equals greedy output without, thinking phase included. The
// suffix proposer drafts from earlier outputs, so the repeated requests verify drafts through the
// block, its end and the grammar.
TEST(ServerReasoning, SpeculationIsLossless) {
  std::vector<std::vector<Message>> runs;
  std::vector<int> drafts;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{}, {"--spec", "suffix", "--spec-k", "4"}}) {
    ServerProcess server(args, 0, files().model);
    ASSERT_TRUE(server.ok());
    std::vector<Message>& run = runs.emplace_back();
    int& drafted = drafts.emplace_back(0);
    for (int repeat = 0; repeat < 2; ++repeat) {
      for (json b : {body(), with_schema(body())}) {
        if (!args.empty()) b["speculation"] = {{"mode", "fixed"}, {"k", 4}};
        run.push_back(whole(server, b));
        drafted += run.back().draft_tokens;
        run.push_back(streamed(server, b));
      }
    }
    EXPECT_EQ(server.terminate(), 0);
  }
  EXPECT_GT(drafts[1], 0) << "the suffix proposer drafted nothing: the test verifies no draft";
  for (size_t i = 1; i < runs.size(); ++i) {
    ASSERT_EQ(runs[i].size(), runs[0].size());
    for (size_t j = 0; j < runs[0].size(); ++j) {
      EXPECT_EQ(runs[i][j].reasoning, runs[0][j].reasoning) << "run " << i << " request " << j;
      EXPECT_EQ(runs[i][j].content, runs[0][j].content) << "run " << i << " request " << j;
      EXPECT_EQ(runs[i][j].completion_tokens, runs[0][j].completion_tokens) << i << " " << j;
    }
  }
}

// The official openai npm client (tests/server/js/reasoning.test.mjs).
TEST(ServerReasoning, OfficialOpenAiClient) {
  const std::string js = std::string(ARBOR_SOURCE_DIR) + "/tests/server/js";
  ASSERT_TRUE(std::filesystem::exists(js + "/node_modules/openai/package.json"))
      << js << "/node_modules is absent: run scripts/install_js_deps.sh (or `make deps`)";
  ServerProcess server({"--spec", "ngram", "--served-model-name", "script"}, 0, files().model);
  ASSERT_TRUE(server.ok());
  const test::CommandResult r = test::run_shell(
      "cd '" + js + "' && ARBOR_MODEL=script ARBOR_BASE_URL='" + server.url("/v1") +
      "' node --test --test-reporter=spec reasoning.test.mjs 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
