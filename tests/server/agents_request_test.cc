// /v1/responses and /v1/messages requests: each is rendered to exactly the prompt of the
// /v1/chat/completions request it means (the chat path is the reference: its templates, tool
// rendering and content handling are tested against transformers elsewhere), reads its fields
// into the engine request as chat does, and refuses what it does not support with a 400 naming
// the field. Qwen 3's tokenizer and template (agents_test_util.h).
#include <gtest/gtest.h>

#include "agents_test_util.h"
#include "server/messages_api.h"
#include "server/openai_api.h"
#include "server/responses_api.h"

namespace arbor::server::testing {
namespace {

// Bodies keep their key order, as a client's (tools reach the template as written).
using json = nlohmann::ordered_json;

const json kWeatherTool = json::parse(R"({"type": "function", "name": "get_weather",
  "description": "Current weather", "parameters": {"type": "object", "properties":
  {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}})");

json chat_tool() {
  json f = kWeatherTool;
  f.erase("type");
  return {{"type", "function"}, {"function", f}};
}

// The chat request's prompt tokens (the reference).
std::vector<int32_t> chat_prompt(const QwenModel& m, json chat) {
  if (!chat.contains("max_tokens")) chat["max_tokens"] = 8;
  Prepared p = prepare_raw(prepare_chat, chat.dump(), m.info);
  EXPECT_FALSE(p.error) << p.error->message;
  return p.request.request.prompt_token_ids;
}

// Equal prompts; the texts show where they differ.
void expect_same_prompt(const QwenModel& m, const std::vector<int32_t>& got,
                        const std::vector<int32_t>& want) {
  EXPECT_EQ(m.info.tokenizer->decode(got), m.info.tokenizer->decode(want));
  EXPECT_EQ(got, want);
}

Prepared responses(const QwenModel& m, const json& body) {
  return prepare_raw(prepare_responses, body.dump(), m.info);
}

Prepared messages(const QwenModel& m, json body) {
  if (!body.contains("max_tokens")) body["max_tokens"] = 8;
  return prepare_raw(prepare_messages, body.dump(), m.info);
}

TEST(AgentsRequest, ResponsesInputRendersAsTheChatMessages) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  Prepared p = responses(m, {{"input", "Hi there"}, {"instructions", "Be brief."}});
  ASSERT_FALSE(p.error) << p.error->message;
  expect_same_prompt(m, p.request.request.prompt_token_ids,
                     chat_prompt(m, {{"messages", {{{"role", "system"}, {"content", "Be brief."}},
                                                   {{"role", "user"}, {"content", "Hi there"}}}}}));
  // No max_output_tokens: what fits in the context, as OpenAI.
  EXPECT_EQ(p.request.request.max_tokens,
            4096 - static_cast<int32_t>(p.request.request.prompt_token_ids.size()));
  // A function-call turn: a reasoning item, the calls, their outputs, input_text parts.
  const json input = json::parse(R"([
    {"role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                 {"type": "input_text", "text": "Paris?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [],
     "content": [{"type": "reasoning_text", "text": "I should call it."}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
     "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}]},
    {"role": "user", "content": "Thanks"}])");
  p = responses(m, {{"input", input}, {"tools", {kWeatherTool}}});
  ASSERT_FALSE(p.error) << p.error->message;
  const json chat = json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "Weather in "},
                                 {"type": "text", "text": "Paris?"}]},
    {"role": "assistant", "content": null, "reasoning_content": "I should call it.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "assistant", "content": [{"type": "text", "text": "It is sunny."}]},
    {"role": "user", "content": "Thanks"}])");
  expect_same_prompt(m, p.request.request.prompt_token_ids,
                     chat_prompt(m, {{"messages", chat}, {"tools", {chat_tool()}}}));
}

TEST(AgentsRequest, ResponsesFieldsReachTheEngineRequest) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  Prepared p = responses(m, {{"input", "Hi"}, {"max_output_tokens", 7}, {"temperature", 0.5},
                             {"top_p", 0.9}, {"seed", 42}, {"top_k", 3}});
  ASSERT_FALSE(p.error) << p.error->message;
  const engine::GenerateRequest& r = p.request.request;
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_FALSE(r.sampling.grammar);
  // text.format json_schema: the schema, properties in the client's order.
  p = prepare_raw(prepare_responses, R"({"input": "Hi", "text": {"format": {"type": "json_schema",
    "name": "w", "strict": true, "schema": {"type": "object", "properties": {"z": {"type":
    "string"}, "a": {"type": "integer"}}, "required": ["z", "a"], "additionalProperties":
    false}}}})", m.info);
  ASSERT_FALSE(p.error) << p.error->message;
  ASSERT_TRUE(p.request.request.sampling.grammar);
  EXPECT_EQ(p.request.request.sampling.grammar->kind, grammar::GrammarKind::kJsonSchema);
  const std::string& schema = p.request.request.sampling.grammar->source;
  EXPECT_LT(schema.find("\"z\""), schema.find("\"a\"")) << schema;
  // tool_choice required: the calls' grammar, behind Qwen 3's thinking block.
  p = responses(m, {{"input", "Hi"}, {"tools", {kWeatherTool}}, {"tool_choice", "required"}});
  ASSERT_FALSE(p.error) << p.error->message;
  ASSERT_TRUE(p.request.request.sampling.grammar);
  EXPECT_EQ(p.request.request.sampling.grammar->kind, grammar::GrammarKind::kGbnf);
  EXPECT_NE(p.request.request.sampling.grammar->source.find("<tool_call>"), std::string::npos);
  EXPECT_TRUE(p.request.request.sampling.grammar->thinking.has_value());
  // tool_choice auto without tools asks nothing.
  EXPECT_FALSE(responses(m, {{"input", "Hi"}, {"tool_choice", "auto"}}).error);
}

struct BadCase {
  const char* name;
  json body;
  int status;
  std::string param;
};

void expect_refused(const Prepared& p, const BadCase& k) {
  ASSERT_TRUE(p.error) << k.name << " was accepted";
  EXPECT_EQ(p.error->http_status, k.status) << k.name << ": " << p.error->message;
  EXPECT_EQ(p.error->param, k.param) << k.name << ": " << p.error->message;
  EXPECT_FALSE(p.error->message.empty());
}

TEST(AgentsRequest, ResponsesRefusalsNameTheField) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  const json in = "Hi";
  const std::vector<BadCase> cases = {
      {"no input", json::object(), 400, "input"},
      {"input number", {{"input", 3}}, 400, "input"},
      {"image part", {{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"},
                                                                {"image_url", "x"}}}}}}}},
       400, "input[0].content[0].type"},
      {"item_reference", {{"input", {{{"type", "item_reference"}, {"id", "x"}}}}}, 400,
       "input[0].type"},
      {"bad role", {{"input", {{{"role", "tool"}, {"content", "x"}}}}}, 400, "input[0].role"},
      {"call without call_id", {{"input", {{{"type", "function_call"}, {"name", "f"},
                                           {"arguments", "{}"}}}}}, 400, "input[0].call_id"},
      {"encrypted reasoning", {{"input", {{{"type", "reasoning"},
                                           {"encrypted_content", "abc"}}}}}, 400,
       "input[0].encrypted_content"},
      {"web_search tool", {{"input", in}, {"tools", {{{"type", "web_search"}}}}}, 400,
       "tools[0].type"},
      {"bad tool name", {{"input", in}, {"tools", {{{"type", "function"}, {"name", "a b"}}}}},
       400, "tools[0].name"},
      {"tool_choice allowed_tools", {{"input", in}, {"tools", {kWeatherTool}},
                                     {"tool_choice", {{"type", "allowed_tools"}}}}, 400,
       "tool_choice.type"},
      {"tool_choice unknown function", {{"input", in}, {"tools", {kWeatherTool}},
                                        {"tool_choice", {{"type", "function"}, {"name", "nope"}}}},
       400, "tool_choice"},
      {"background", {{"input", in}, {"background", true}}, 400, "background"},
      {"reasoning effort", {{"input", in}, {"reasoning", {{"effort", "high"}}}}, 400,
       "reasoning"},
      {"include", {{"input", in}, {"include", {"reasoning.encrypted_content"}}}, 400, "include"},
      {"truncation auto", {{"input", in}, {"truncation", "auto"}}, 400, "truncation"},
      {"text.verbosity", {{"input", in}, {"text", {{"verbosity", "low"}}}}, 400,
       "text.verbosity"},
      {"text.format type", {{"input", in}, {"text", {{"format", {{"type", "xml"}}}}}}, 400,
       "text.format.type"},
      {"json_schema without schema", {{"input", in},
                                      {"text", {{"format", {{"type", "json_schema"}}}}}}, 400,
       "text.format.schema"},
      {"max_output_tokens 0", {{"input", in}, {"max_output_tokens", 0}}, 400,
       "max_output_tokens"},
      {"max_output_tokens over context", {{"input", in}, {"max_output_tokens", 4096}}, 400,
       "max_output_tokens"},
      {"unknown previous response", {{"input", in}, {"previous_response_id", "resp_nope"}}, 404,
       "previous_response_id"},
      {"instructions list", {{"input", in}, {"instructions", {1}}}, 400, "instructions"},
      {"chat field", {{"input", in}, {"messages", json::array()}}, 400, "messages"},
  };
  for (const BadCase& k : cases) expect_refused(responses(m, k.body), k);
  const Prepared gone = responses(m, {{"input", in}, {"previous_response_id", "resp_nope"}});
  ASSERT_TRUE(gone.error);
  EXPECT_EQ(gone.error->code, "previous_response_not_found");
}

TEST(AgentsRequest, MessagesRenderAsTheChatMessages) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  const json tools = json::parse(R"([{"name": "get_weather", "description": "Current weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit":
    {"enum": ["c", "f"]}}, "required": ["city"]}, "cache_control": {"type": "ephemeral"}}])");
  const json msgs = json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "I should call it.",
                                       "signature": "x"},
                                      {"type": "text", "text": "Let me check."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                       "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                  "content": [{"type": "text", "text": "18 C"}]},
                                 {"type": "text", "text": "And tomorrow?",
                                  "cache_control": {"type": "ephemeral"}}]}])");
  Prepared p = messages(m, {{"system", {{{"type", "text"}, {"text", "Be brief."}}}},
                            {"messages", msgs}, {"tools", tools}});
  ASSERT_FALSE(p.error) << p.error->message;
  const json chat = json::parse(R"([
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}],
     "reasoning_content": "I should call it.",
     "tool_calls": [{"id": "toolu_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
    {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}])");
  expect_same_prompt(m, p.request.request.prompt_token_ids,
                     chat_prompt(m, {{"messages", chat}, {"tools", {chat_tool()}}}));
  // thinking disabled is the template's enable_thinking false.
  const json hi = {{{"role", "user"}, {"content", "Hi"}}};
  p = messages(m, {{"messages", hi}, {"thinking", {{"type", "disabled"}}}});
  ASSERT_FALSE(p.error) << p.error->message;
  expect_same_prompt(m, p.request.request.prompt_token_ids,
                     chat_prompt(m, {{"messages", hi},
                                     {"chat_template_kwargs", {{"enable_thinking", false}}}}));
  // count_tokens counts that prompt.
  std::string answer;
  ASSERT_FALSE(count_message_tokens(
      nlohmann::json::parse(json({{"messages", hi}, {"thinking", {{"type", "disabled"}}}}).dump()),
      "", m.info, &answer));
  EXPECT_EQ(nlohmann::json::parse(answer),
            nlohmann::json({{"input_tokens", p.request.request.prompt_token_ids.size()}}));
}

TEST(AgentsRequest, MessagesFieldsReachTheEngineRequest) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  const json hi = {{{"role", "user"}, {"content", "Hi"}}};
  Prepared p = messages(m, {{"messages", hi}, {"max_tokens", 9}, {"temperature", 0.2},
                            {"top_k", 5}, {"stop_sequences", {"END", "!"}}});
  ASSERT_FALSE(p.error) << p.error->message;
  EXPECT_EQ(p.request.request.max_tokens, 9);
  EXPECT_FLOAT_EQ(p.request.request.sampling.temperature, 0.2f);
  EXPECT_EQ(p.request.request.sampling.top_k, 5);
  EXPECT_EQ(p.request.request.stop, (std::vector<std::string>{"END", "!"}));
  // tool_choice any: the calls' grammar; tool: one named call; disable_parallel_tool_use.
  const json tools = json::parse(R"([{"name": "f", "input_schema": {"type": "object"}},
                                     {"name": "g", "input_schema": {"type": "object"}}])");
  p = messages(m, {{"messages", hi}, {"tools", tools}, {"tool_choice", {{"type", "any"}}}});
  ASSERT_FALSE(p.error) << p.error->message;
  ASSERT_TRUE(p.request.request.sampling.grammar);
  const std::string many = p.request.request.sampling.grammar->source;
  p = messages(m, {{"messages", hi}, {"tools", tools},
                   {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}}});
  ASSERT_FALSE(p.error) << p.error->message;
  EXPECT_NE(p.request.request.sampling.grammar->source, many);
  p = messages(m, {{"messages", hi}, {"tools", tools},
                   {"tool_choice", {{"type", "tool"}, {"name", "g"}}}});
  ASSERT_FALSE(p.error) << p.error->message;
  const std::string& named = p.request.request.sampling.grammar->source;
  EXPECT_NE(named.find("\\\"g\\\""), std::string::npos) << named;
  EXPECT_EQ(named.find("\\\"f\\\""), std::string::npos) << named;
}

TEST(AgentsRequest, MessagesRefusalsNameTheField) {
  QwenModel m;
  ASSERT_TRUE(m.ok());
  const json hi = {{{"role", "user"}, {"content", "Hi"}}};
  const auto with = [&](json extra) {
    json b = {{"messages", hi}, {"max_tokens", 8}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
  };
  const std::vector<BadCase> cases = {
      {"no max_tokens", {{"messages", hi}}, 400, "max_tokens"},
      {"max_tokens 0", with({{"max_tokens", 0}}), 400, "max_tokens"},
      {"no messages", {{"max_tokens", 8}}, 400, "messages"},
      {"system role", with({{"messages", {{{"role", "system"}, {"content", "x"}}}}}), 400,
       "messages[0].role"},
      {"image block", with({{"messages", {{{"role", "user"}, {"content", {{{"type", "image"}}}}}}}}),
       400, "messages[0].content[0].type"},
      {"tool_use in user", with({{"messages", {{{"role", "user"}, {"content", {{{"type",
       "tool_use"}, {"id", "a"}, {"name", "f"}, {"input", json::object()}}}}}}}}), 400,
       "messages[0].content[0].type"},
      {"tool_use input string", with({{"messages", {{{"role", "assistant"}, {"content", {{{"type",
       "tool_use"}, {"id", "a"}, {"name", "f"}, {"input", "x"}}}}}}}}), 400,
       "messages[0].content[0].input"},
      {"server tool", with({{"tools", {{{"type", "bash_20250124"}, {"name", "bash"}}}}}), 400,
       "tools[0].type"},
      {"tool without schema", with({{"tools", {{{"name", "f"}}}}}), 400,
       "tools[0].input_schema"},
      {"tool_choice string", with({{"tool_choice", "auto"}}), 400, "tool_choice"},
      {"tool_choice any without tools", with({{"tool_choice", {{"type", "any"}}}}), 400,
       "tool_choice"},
      {"thinking without budget", with({{"thinking", {{"type", "enabled"}}}}), 400,
       "thinking.budget_tokens"},
      {"thinking budget over max_tokens", with({{"max_tokens", 1500}, {"thinking", {{"type",
       "enabled"}, {"budget_tokens", 2000}}}}), 400, "thinking.budget_tokens"},
      {"stop_sequences number", with({{"stop_sequences", 3}}), 400, "stop_sequences"},
      {"container", with({{"container", "c"}}), 400, "container"},
      {"prefill", with({{"messages", {{{"role", "user"}, {"content", "Hi"}},
                                      {{"role", "assistant"}, {"content", "Once"}}}}}), 400,
       "messages[1].role"},
      {"unknown field", with({{"max_token", 3}}), 400, "max_token"},
  };
  for (const BadCase& k : cases) expect_refused(prepare_raw(prepare_messages, k.body.dump(), m.info), k);
  std::string answer;
  const std::optional<ApiError> e = count_message_tokens(
      nlohmann::json::parse(json({{"messages", hi}, {"max_tokens", 3}}).dump()), "", m.info,
      &answer);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "max_tokens");
}

}  // namespace
}  // namespace arbor::server::testing
