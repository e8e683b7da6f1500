// Structured output through the real server (issue 18): OpenAI response_format, vLLM
// structured_outputs and guided_*, llama.cpp's grammar, TGI's parameters.grammar; streaming;
// speculation on; and the 400s that name what cannot be run.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "server_test_util.h"
#include "support/json_schema_validator.h"

namespace arbor::server::testing {
namespace {

using json = nlohmann::json;

// Property order on purpose not alphabetical: the output must follow the schema's order.
const char* kSchema =
    R"({"type":"object","properties":{"zeta":{"type":"integer","minimum":0,"maximum":99},)"
    R"("alpha":{"type":"string","maxLength":6},"mid":{"enum":["x","y"]}},)"
    R"("required":["zeta","alpha","mid"]})";

std::string completion_body(const std::string& constraint, bool stream = false) {
  return std::string(R"({"prompt":"Once upon a time","max_tokens":120,"temperature":0,)") +
         (stream ? R"("stream":true,)" : "") + constraint + "}";
}

std::string completion_text(const HttpResult& r) {
  const json j = r.json();
  if (j.is_discarded() || !j.contains("choices")) return "<no choices: " + r.body + ">";
  return j["choices"][0]["text"].get<std::string>();
}

void expect_schema_output(const std::string& text) {
  const json value = json::parse(text, nullptr, false);
  ASSERT_FALSE(value.is_discarded()) << "not JSON: '" << text << "'";
  EXPECT_EQ(test::validate_json(value, json::parse(kSchema)), std::nullopt) << text;
  // Keys in the schema's order.
  const size_t z = text.find("\"zeta\""), a = text.find("\"alpha\""), m = text.find("\"mid\"");
  EXPECT_TRUE(z < a && a < m) << text;
}

TEST(ServerStructured, EveryDialectConstrainsTheOutput) {
  ServerProcess server({"--spec", "ngram", "--chat-template", "llama2"});
  ASSERT_TRUE(server.ok());
  const std::string schema = kSchema;
  for (const std::string& constraint :
       {R"("response_format":{"type":"json_schema","json_schema":{"name":"t","strict":true,"schema":)" +
            schema + "}}",
        R"("structured_outputs":{"json":)" + schema + "}", R"("guided_json":)" + schema,
        R"("json_schema":)" + schema}) {
    const HttpResult r = server.request("POST", "/v1/completions", completion_body(constraint));
    ASSERT_EQ(r.status, 200) << constraint << ": " << r.body;
    expect_schema_output(completion_text(r));
    EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "stop") << r.body;
  }
  const HttpResult choice = server.request(
      "POST", "/v1/completions", completion_body(R"("guided_choice":["happy","sad","gone fishing"])"));
  ASSERT_EQ(choice.status, 200) << choice.body;
  const std::string c = completion_text(choice);
  EXPECT_TRUE(c == "happy" || c == "sad" || c == "gone fishing") << c;
  const HttpResult regex = server.request(
      "POST", "/v1/completions",
      completion_body(R"("structured_outputs":{"regex":"[a-z]{2,5}-[0-9]{2}"})"));
  ASSERT_EQ(regex.status, 200) << regex.body;
  EXPECT_TRUE(std::regex_match(completion_text(regex), std::regex("[a-z]{2,5}-[0-9]{2}")))
      << completion_text(regex);
  const HttpResult gbnf = server.request(
      "POST", "/v1/completions",
      completion_body(R"("grammar":"root ::= \"The \" (\"cat\" | \"dog\") \" sat.\"")"));
  ASSERT_EQ(gbnf.status, 200) << gbnf.body;
  const std::string g = completion_text(gbnf);
  EXPECT_TRUE(g == "The cat sat." || g == "The dog sat.") << g;
  // Chat, with a schema.
  const HttpResult chat = server.request(
      "POST", "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"Give me JSON"}],"max_tokens":200,"temperature":0,)"
      R"("seed":3,"response_format":{"type":"json_schema","json_schema":{"name":"t","schema":)" +
          schema + "}}}");
  ASSERT_EQ(chat.status, 200) << chat.body;
  expect_schema_output(chat.json()["choices"][0]["message"]["content"].get<std::string>());
  // TGI.
  const HttpResult tgi = server.request(
      "POST", "/generate",
      R"({"inputs":"Once","parameters":{"max_new_tokens":40,"grammar":{"type":"regex","value":"(yes|no)!"}}})");
  ASSERT_EQ(tgi.status, 200) << tgi.body;
  const std::string t = tgi.json()["generated_text"].get<std::string>();
  EXPECT_TRUE(t == "yes!" || t == "no!") << t;
  EXPECT_TRUE(server.wait_no_blocks_used());
}

TEST(ServerStructured, StreamingAssemblesTheSameOutput) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const std::string constraint = std::string(R"("guided_json":)") + kSchema;
  const HttpResult whole = server.request("POST", "/v1/completions", completion_body(constraint));
  const HttpResult stream =
      server.request("POST", "/v1/completions", completion_body(constraint, /*stream=*/true));
  ASSERT_EQ(stream.status, 200) << stream.body;
  std::string text;
  for (const std::string& p : sse_payloads(stream.body)) {
    if (p == "[DONE]") continue;
    const json j = json::parse(p);
    if (!j["choices"].empty()) text += j["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, completion_text(whole));
  expect_schema_output(text);
}

TEST(ServerStructured, WhatCannotRunIsA400NamingTheField) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  struct Bad {
    std::string constraint;
    std::string param;
    std::string message;
  };
  for (const Bad& b : std::vector<Bad>{
           {R"("response_format":{"type":"json_schema","json_schema":{"name":"t","schema":{"type":"object","patternProperties":{"a":{}}}}})",
            "response_format.json_schema.schema", "patternProperties"},
           {R"("response_format":{"type":"yaml"})", "response_format.type",
            "'response_format.type' is 'yaml'; supported: text, json_object, json_schema"},
           {R"("response_format":{"type":"json_schema"})", "response_format.json_schema",
            "'response_format.json_schema' is required for type 'json_schema'"},
           {R"("guided_regex":"a","guided_choice":["b"])", "guided_choice",
            "'guided_regex' and 'guided_choice' both constrain the output; send one"},
           {R"("grammar":"root ::= \"a\" undefined")", "grammar",
            "'grammar': grammar: rule 'undefined' is used in rule 'root' but never defined"},
           {R"("guided_regex":"(a")", "guided_regex", "guided_regex"},
           {R"("structured_outputs":{"yaml":"x"})", "structured_outputs.yaml",
            "'structured_outputs.yaml' is not a structured_outputs field (json, regex, choice, "
            "grammar, json_object)"},
           {R"("guided_choice":[])", "guided_choice",
            "'guided_choice' must be a non-empty array of strings"},
       }) {
    const HttpResult r = server.request("POST", "/v1/completions", completion_body(b.constraint));
    EXPECT_EQ(r.status, 400) << b.constraint << ": " << r.body;
    const json j = r.json();
    ASSERT_FALSE(j.is_discarded()) << r.body;
    EXPECT_EQ(j["error"]["param"], b.param) << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(b.message), std::string::npos)
        << r.body;
  }
  // min_tokens (vLLM): a count in [0, max_tokens].
  for (const auto& [body, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt":"Once","max_tokens":10,"min_tokens":-5})", "'min_tokens' is -5"},
           {R"({"prompt":"Once","max_tokens":10,"min_tokens":11})",
            "'min_tokens' is 11, more than max_tokens (10)"}}) {
    const HttpResult r = server.request("POST", "/v1/completions", body);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.json()["error"]["param"], "min_tokens") << r.body;
    EXPECT_NE(r.body.find(message), std::string::npos) << r.body;
  }
  const HttpResult held = server.request(
      "POST", "/v1/completions", R"({"prompt":"The cat","max_tokens":250,"min_tokens":230,"temperature":0})");
  ASSERT_EQ(held.status, 200) << held.body;
  EXPECT_GE(held.json()["usage"]["completion_tokens"].get<int>(), 230) << held.body;
  const HttpResult tgi = server.request(
      "POST", "/generate", R"({"inputs":"Once","parameters":{"grammar":{"type":"ebnf","value":"x"}}})");
  EXPECT_EQ(tgi.status, 422) << tgi.body;
  EXPECT_TRUE(server.wait_no_blocks_used());
}

}  // namespace
}  // namespace arbor::server::testing
