// Malformed input: every case gets the expected status and a JSON error in the route's shape
// (OpenAI: {"error": {"message", "type", "param", "code"}}; TGI: {"error", "error_type"}), the
// server stays up, and no KV block is leaked afterwards.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "server_test_util.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

struct Case {
  std::string name;
  std::string method;
  std::string path;
  std::string body;
  int status;
  std::string param;  // expected error.param ("" = not checked)
};

std::string many_ids(int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ",5" : "5");
  return s + "]";
}

std::vector<Case> cases() {
  const std::string c = "/v1/completions";
  auto p = [](const std::string& extra) {
    return std::string("{\"prompt\":\"Once upon a time\",\"max_tokens\":2") + extra + "}";
  };
  std::string seventeen = "[";
  for (int i = 0; i < 17; ++i) seventeen += (i ? ",\"s" : "\"s") + std::to_string(i) + "\"";
  seventeen += "]";
  const std::string r = "/v1/responses";
  const std::string a = "/v1/messages";
  auto msg = [](const std::string& extra) {
    return std::string(R"({"max_tokens":2,"messages":[{"role":"user","content":"Hi"}])") + extra +
           "}";
  };
  std::string sixty_five;
  for (int i = 0; i < 65; ++i) sixty_five += i ? ",\"x\"" : "\"x\"";
  return {
      {"empty body", "POST", c, "", 400, ""},
      {"deeply nested json", "POST", c,
       "{\"prompt\":" + std::string(100000, '[') + std::string(100000, ']') + "}", 400, ""},
      {"prompt of one nested list", "POST", c, "{\"prompt\":[[\"a\"]]}", 400, "prompt"},
      {"truncated json", "POST", c, "{\"prompt\":", 400, ""},
      {"not json", "POST", c, "hello", 400, ""},
      {"array body", "POST", c, "[1,2]", 400, ""},
      {"null body", "POST", c, "null", 400, ""},
      {"trailing garbage", "POST", c, "{\"prompt\":\"a\"} x", 400, ""},
      {"invalid utf-8", "POST", c, "{\"prompt\":\"\xff\xfe\"}", 400, ""},
      {"missing prompt", "POST", c, "{}", 400, "prompt"},
      {"prompt number", "POST", c, "{\"prompt\":5}", 400, "prompt"},
      {"prompt object", "POST", c, "{\"prompt\":{}}", 400, "prompt"},
      {"empty prompt", "POST", c, "{\"prompt\":\"\"}", 400, "prompt"},
      {"empty prompt list", "POST", c, "{\"prompt\":[]}", 400, "prompt"},
      {"mixed prompt list", "POST", c, "{\"prompt\":[1,\"a\"]}", 400, "prompt"},
      {"token id too large", "POST", c, "{\"prompt\":[1,100000]}", 400, "prompt"},
      {"negative token id", "POST", c, "{\"prompt\":[-1]}", 400, "prompt"},
      {"batch of 65 prompts", "POST", c, "{\"prompt\":[" + sixty_five + "]}", 400, "prompt"},
      {"batch mixing strings and numbers", "POST", c, "{\"prompt\":[\"a\",5]}", 400, "prompt"},
      {"batch with an empty prompt", "POST", c, "{\"prompt\":[\"a\",\"\"]}", 400, "prompt"},
      {"prompt longer than context", "POST", c, "{\"prompt\":" + many_ids(2100) + "}", 400,
       "prompt"},
      {"prompt + max_tokens over context", "POST", c,
       "{\"prompt\":" + many_ids(2000) + ",\"max_tokens\":100}", 400, "max_tokens"},
      {"max_tokens negative", "POST", c, p(",\"max_tokens\":-1"), 400, "max_tokens"},
      {"max_tokens string", "POST", c, "{\"prompt\":\"a\",\"max_tokens\":\"10\"}", 400,
       "max_tokens"},
      {"max_tokens float", "POST", c, "{\"prompt\":\"a\",\"max_tokens\":1e30}", 400,
       "max_tokens"},
      {"max_tokens huge", "POST", c, "{\"prompt\":\"a\",\"max_tokens\":99999999999999999999}",
       400, "max_tokens"},
      {"temperature negative", "POST", c, p(",\"temperature\":-1"), 400, "temperature"},
      {"temperature string", "POST", c, p(",\"temperature\":\"hot\""), 400, "temperature"},
      {"temperature huge", "POST", c, p(",\"temperature\":1e9"), 400, "temperature"},
      {"top_p zero", "POST", c, p(",\"top_p\":0"), 400, "top_p"},
      {"top_p above one", "POST", c, p(",\"top_p\":1.5"), 400, "top_p"},
      {"top_k negative", "POST", c, p(",\"top_k\":-5"), 400, "top_k"},
      {"top_k above vocab", "POST", c, p(",\"top_k\":100000"), 400, "top_k"},
      {"min_p above one", "POST", c, p(",\"min_p\":2"), 400, "min_p"},
      {"repetition_penalty zero", "POST", c, p(",\"repetition_penalty\":0"), 400,
       "repetition_penalty"},
      {"presence_penalty out of range", "POST", c, p(",\"presence_penalty\":3"), 400,
       "presence_penalty"},
      {"frequency_penalty out of range", "POST", c, p(",\"frequency_penalty\":-2.5"), 400,
       "frequency_penalty"},
      {"n zero", "POST", c, p(",\"n\":0"), 400, "n"},
      {"n huge", "POST", c, p(",\"n\":1000"), 400, "n"},
      {"best_of below n", "POST", c, p(",\"n\":3,\"best_of\":2"), 400, "best_of"},
      {"stop number", "POST", c, p(",\"stop\":5"), 400, "stop"},
      {"stop empty string", "POST", c, p(",\"stop\":[\"\"]"), 400, "stop"},
      {"stop too many", "POST", c, p(",\"stop\":" + seventeen), 400, "stop"},
      {"seed string", "POST", c, p(",\"seed\":\"x\""), 400, "seed"},
      {"logit_bias array", "POST", c, p(",\"logit_bias\":[]"), 400, "logit_bias"},
      {"logit_bias bad key", "POST", c, p(",\"logit_bias\":{\"abc\":1}"), 400, "logit_bias"},
      {"logit_bias huge value", "POST", c, p(",\"logit_bias\":{\"1\":500}"), 400, "logit_bias"},
      {"logprobs too many", "POST", c, p(",\"logprobs\":21"), 400, "logprobs"},
      {"logprobs bool", "POST", c, p(",\"logprobs\":true"), 400, "logprobs"},
      {"prompt_logprobs too many", "POST", c, p(",\"prompt_logprobs\":21"), 400,
       "prompt_logprobs"},
      {"prompt_logprobs negative", "POST", c, p(",\"prompt_logprobs\":-1"), 400,
       "prompt_logprobs"},
      {"prompt_logprobs string", "POST", c, p(",\"prompt_logprobs\":\"2\""), 400,
       "prompt_logprobs"},
      {"max_tokens 0 with n 2", "POST", c, "{\"prompt\":\"a\",\"max_tokens\":0,\"n\":2}", 400,
       "max_tokens"},
      {"stream string", "POST", c, p(",\"stream\":\"yes\""), 400, "stream"},
      {"stream_options without stream", "POST", c,
       p(",\"stream_options\":{\"include_usage\":true}"), 400, "stream_options"},
      {"suffix", "POST", c, p(",\"suffix\":\"x\""), 400, "suffix"},
      {"truncate_prompt_tokens zero", "POST", c, p(",\"truncate_prompt_tokens\":0"), 400,
       "truncate_prompt_tokens"},
      {"unknown model", "POST", c, p(",\"model\":\"gpt-9\""), 404, "model"},
      {"model number", "POST", c, p(",\"model\":5"), 400, "model"},
      {"unknown field is refused", "POST", c, p(",\"frobnicate\":1"), 400, "frobnicate"},
      {"tools are a chat field", "POST", c, p(",\"tools\":[]"), 400, "tools"},
      {"metadata passes", "POST", c, p(",\"user\":\"u1\",\"metadata\":{\"a\":\"b\"}"), 200, ""},
      {"chat missing messages", "POST", "/v1/chat/completions", "{}", 400, "messages"},
      {"chat empty messages", "POST", "/v1/chat/completions", "{\"messages\":[]}", 400,
       "messages"},
      {"chat bad role", "POST", "/v1/chat/completions",
       "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400, "messages"},
      {"chat content number", "POST", "/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages"},
      {"tgi missing inputs", "POST", "/generate", "{}", 422, ""},
      {"tgi inputs number", "POST", "/generate", "{\"inputs\":5}", 422, ""},
      {"tgi max_new_tokens negative", "POST", "/generate",
       "{\"inputs\":\"a\",\"parameters\":{\"max_new_tokens\":-1}}", 422, ""},
      {"tgi temperature zero", "POST", "/generate_stream",
       "{\"inputs\":\"a\",\"parameters\":{\"temperature\":0}}", 422, ""},
      {"tgi parameters string", "POST", "/generate", "{\"inputs\":\"a\",\"parameters\":\"x\"}",
       422, ""},
      {"tokenize prompt number", "POST", "/tokenize", "{\"prompt\":5}", 400, "prompt"},
      {"detokenize bad id", "POST", "/detokenize", "{\"tokens\":[99999]}", 400, "tokens"},
      // OpenAI's Responses API: the OpenAI shape, the param naming the field (or the item).
      {"responses empty body", "POST", r, "", 400, ""},
      {"responses not json", "POST", r, "{\"input\":", 400, ""},
      {"responses deeply nested", "POST", r,
       "{\"input\":" + std::string(1000, '[') + std::string(1000, ']') + "}", 400, ""},
      {"responses missing input", "POST", r, "{}", 400, "input"},
      {"responses input number", "POST", r, "{\"input\":5}", 400, "input"},
      {"responses input empty list", "POST", r, "{\"input\":[]}", 400, "input"},
      {"responses item not an object", "POST", r, "{\"input\":[5]}", 400, "input[0]"},
      {"responses image part", "POST", r,
       "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
       "\"image_url\":\"x\"}]}]}", 400, "input[0].content[0].type"},
      {"responses call without call_id", "POST", r,
       "{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}",
       400, "input[0].call_id"},
      {"responses output without output", "POST", r,
       "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}", 400,
       "input[0].output"},
      {"responses encrypted reasoning", "POST", r,
       "{\"input\":[{\"type\":\"reasoning\",\"encrypted_content\":\"x\"}]}", 400,
       "input[0].encrypted_content"},
      {"responses built-in tool", "POST", r, R"({"input":"Hi","tools":[{"type":"web_search_preview"}]})",
       400, "tools[0].type"},
      {"responses tools object", "POST", r, R"({"input":"Hi","tools":{}})", 400, "tools"},
      {"responses tool_choice mcp", "POST", r, R"({"input":"Hi","tool_choice":{"type":"mcp"}})",
       400, "tool_choice.type"},
      {"responses background", "POST", r, R"({"input":"Hi","background":true})", 400,
       "background"},
      {"responses max_output_tokens negative", "POST", r,
       R"({"input":"Hi","max_output_tokens":-1})", 400, "max_output_tokens"},
      {"responses max_output_tokens string", "POST", r,
       R"({"input":"Hi","max_output_tokens":"5"})", 400, "max_output_tokens"},
      {"responses schema not an object", "POST", r,
       R"({"input":"Hi","text":{"format":{"type":"json_schema","schema":5}}})", 400,
       "text.format.schema"},
      {"responses unknown previous response", "POST", r,
       R"({"input":"Hi","previous_response_id":"resp_gone"})", 404, "previous_response_id"},
      {"responses previous_response_id number", "POST", r,
       R"({"input":"Hi","previous_response_id":5})", 400, "previous_response_id"},
      {"responses temperature negative", "POST", r, R"({"input":"Hi","temperature":-1})", 400,
       "temperature"},
      {"responses stream string", "POST", r, R"({"input":"Hi","stream":"yes"})", 400, "stream"},
      {"responses store string", "POST", r, R"({"input":"Hi","store":"no"})", 400, "store"},
      {"responses instructions number", "POST", r, R"({"input":"Hi","instructions":5})", 400,
       "instructions"},
      {"responses reasoning effort", "POST", r, R"({"input":"Hi","reasoning":{"effort":"high"}})",
       400, "reasoning"},
      {"responses unknown field", "POST", r, R"({"input":"Hi","frobnicate":1})", 400,
       "frobnicate"},
      {"responses unknown model", "POST", r, R"({"input":"Hi","model":"gpt-9"})", 404, "model"},
      {"responses a valid request", "POST", r, R"({"input":"Once","max_output_tokens":2})", 200,
       ""},
      // Anthropic's Messages API: Anthropic's shape, the message naming the field.
      {"messages empty body", "POST", a, "", 400, ""},
      {"messages missing messages", "POST", a, "{}", 400, "messages"},
      {"messages missing max_tokens", "POST", a, R"({"messages":[{"role":"user","content":"Hi"}]})",
       400, "max_tokens"},
      {"messages max_tokens zero", "POST", a, msg(R"(,"max_tokens":0)"), 400, "max_tokens"},
      {"messages max_tokens string", "POST", a, msg(R"(,"max_tokens":"8")"), 400, "max_tokens"},
      {"messages messages number", "POST", a, R"({"max_tokens":8,"messages":5})", 400,
       "messages"},
      {"messages messages empty", "POST", a, R"({"max_tokens":8,"messages":[]})", 400,
       "messages"},
      {"messages system role", "POST", a,
       R"({"max_tokens":8,"messages":[{"role":"system","content":"x"}]})", 400,
       "messages[0].role"},
      {"messages content number", "POST", a,
       R"({"max_tokens":8,"messages":[{"role":"user","content":5}]})", 400,
       "messages[0].content"},
      {"messages image block", "POST", a,
       R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"image"}]}]})", 400,
       "messages[0].content[0].type"},
      {"messages tool_result without id", "POST", a,
       R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]})",
       400, "messages[0].content[0].tool_use_id"},
      {"messages tool without schema", "POST", a, msg(R"(,"tools":[{"name":"f"}])"), 400,
       "tools[0].input_schema"},
      {"messages server tool", "POST", a,
       msg(R"(,"tools":[{"type":"web_search_20250305","name":"web_search"}])"), 400,
       "tools[0].type"},
      {"messages tool_choice unknown tool", "POST", a,
       msg(R"(,"tools":[{"name":"f","input_schema":{"type":"object"}}],)"
           R"("tool_choice":{"type":"tool","name":"nope"})"), 400, "tool_choice"},
      {"messages thinking without budget", "POST", a, msg(R"(,"thinking":{"type":"enabled"})"),
       400, "thinking.budget_tokens"},
      {"messages thinking string", "POST", a, msg(R"(,"thinking":"on")"), 400, "thinking"},
      {"messages empty stop sequence", "POST", a, msg(R"(,"stop_sequences":[""])"), 400,
       "stop_sequences"},
      {"messages temperature string", "POST", a, msg(R"(,"temperature":"x")"), 400,
       "temperature"},
      {"messages system number", "POST", a, msg(R"(,"system":5)"), 400, "system"},
      {"messages stream string", "POST", a, msg(R"(,"stream":"yes")"), 400, "stream"},
      {"messages unknown field", "POST", a, msg(R"(,"frobnicate":1)"), 400, "frobnicate"},
      {"messages unknown model", "POST", a, msg(R"(,"model":"claude-9")"), 404, "claude-9"},
      {"count_tokens max_tokens", "POST", a + "/count_tokens",
       R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":8})", 400, "max_tokens"},
      {"count_tokens missing messages", "POST", a + "/count_tokens", "{}", 400, "messages"},
      {"count_tokens not json", "POST", a + "/count_tokens", "[1]", 400, ""},
      {"messages wrong method", "GET", a, "", 405, ""},
      {"messages a valid request", "POST", a, msg(""), 200, ""},
      {"wrong method on completions", "GET", c, "", 405, ""},
      {"wrong method on models", "POST", "/v1/models", "{}", 405, ""},
      {"unknown route", "GET", "/v2/nothing", "", 404, ""},
      {"embeddings on a generate server", "POST", "/v1/embeddings", "{\"input\":\"a\"}", 404,
       ""},
      {"rerank on a generate server", "POST", "/v1/rerank",
       "{\"query\":\"a\",\"documents\":[\"b\"]}", 404, ""},
  };
}

// /v1/embeddings bodies on an embed server (64-dimensional vectors, context 2048, at most 1024
// inputs: --max-waiting-requests' default) and the routes it does not serve.
std::vector<Case> embedding_cases() {
  const std::string e = "/v1/embeddings";
  std::string inputs_1025;
  for (int i = 0; i < 1025; ++i) inputs_1025 += i ? ",\"x\"" : "\"x\"";
  return {
      {"embeddings empty body", "POST", e, "", 400, ""},
      {"embeddings not json", "POST", e, "input", 400, ""},
      {"embeddings missing input", "POST", e, "{}", 400, "input"},
      {"embeddings null input", "POST", e, "{\"input\":null}", 400, "input"},
      {"embeddings empty string", "POST", e, "{\"input\":\"\"}", 400, "input"},
      {"embeddings empty list", "POST", e, "{\"input\":[]}", 400, "input"},
      {"embeddings input number", "POST", e, "{\"input\":5}", 400, "input"},
      {"embeddings input object", "POST", e, "{\"input\":{\"text\":\"a\"}}", 400, "input"},
      {"embeddings input boolean", "POST", e, "{\"input\":true}", 400, "input"},
      {"embeddings list with an empty string", "POST", e, "{\"input\":[\"a\",\"\"]}", 400,
       "input"},
      {"embeddings strings mixed with lists", "POST", e, "{\"input\":[\"a\",[1]]}", 400,
       "input"},
      {"embeddings token ids with a string", "POST", e, "{\"input\":[1,\"a\"]}", 400,
       "input"},
      {"embeddings token id out of range", "POST", e, "{\"input\":[1,99999999]}", 400,
       "input"},
      {"embeddings negative token id", "POST", e, "{\"input\":[[1],[-3]]}", 400, "input"},
      {"embeddings empty token list", "POST", e, "{\"input\":[[1],[]]}", 400, "input"},
      {"embeddings input longer than the context", "POST", e,
       "{\"input\":" + many_ids(2049) + "}", 400, "input"},
      {"embeddings 1025 inputs", "POST", e, "{\"input\":[" + inputs_1025 + "]}", 400, "input"},
      {"embeddings dimensions zero", "POST", e, "{\"input\":\"a\",\"dimensions\":0}", 400,
       "dimensions"},
      {"embeddings dimensions over the model's", "POST", e,
       "{\"input\":\"a\",\"dimensions\":65}", 400, "dimensions"},
      {"embeddings dimensions string", "POST", e, "{\"input\":\"a\",\"dimensions\":\"8\"}",
       400, "dimensions"},
      {"embeddings dimensions float", "POST", e, "{\"input\":\"a\",\"dimensions\":8.5}", 400,
       "dimensions"},
      {"embeddings encoding_format int8", "POST", e,
       "{\"input\":\"a\",\"encoding_format\":\"int8\"}", 400, "encoding_format"},
      {"embeddings encoding_format number", "POST", e,
       "{\"input\":\"a\",\"encoding_format\":5}", 400, "encoding_format"},
      {"embeddings unknown field", "POST", e, "{\"input\":\"a\",\"truncate\":true}", 400,
       "truncate"},
      {"embeddings unknown model", "POST", e, "{\"input\":\"a\",\"model\":\"gpt-4\"}", 404,
       "model"},
      {"embeddings wrong method", "GET", e, "", 405, ""},
      {"chat on an embed server", "POST", "/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 404, ""},
      {"completions on an embed server", "POST", "/v1/completions", "{\"prompt\":\"a\"}", 404,
       ""},
      {"rerank on an embed server", "POST", "/v1/rerank",
       "{\"query\":\"a\",\"documents\":[\"b\"]}", 404, ""},
  };
}

// /v1/rerank bodies on a rerank server.
std::vector<Case> rerank_cases() {
  const std::string r = "/v1/rerank";
  auto q = [](const std::string& rest) { return "{\"query\":\"what\"," + rest + "}"; };
  std::string long_doc;
  for (int i = 0; i < 2100; ++i) long_doc += " a";
  return {
      {"rerank empty body", "POST", r, "", 400, ""},
      {"rerank without documents", "POST", r, "{\"query\":\"what\"}", 400, "documents"},
      {"rerank empty documents", "POST", r, q("\"documents\":[]"), 400, "documents"},
      {"rerank documents string", "POST", r, q("\"documents\":\"a\""), 400, "documents"},
      {"rerank document number", "POST", r, q("\"documents\":[\"a\",5]"), 400, "documents"},
      {"rerank document object without text", "POST", r, q("\"documents\":[{\"title\":\"a\"}]"),
       400, "documents"},
      {"rerank without query", "POST", r, "{\"documents\":[\"a\"]}", 400, "query"},
      {"rerank empty query", "POST", r, "{\"query\":\"\",\"documents\":[\"a\"]}", 400,
       "query"},
      {"rerank query number", "POST", r, "{\"query\":5,\"documents\":[\"a\"]}", 400, "query"},
      {"rerank top_n zero", "POST", r, q("\"documents\":[\"a\"],\"top_n\":0"), 400, "top_n"},
      {"rerank top_n string", "POST", r, q("\"documents\":[\"a\"],\"top_n\":\"1\""), 400,
       "top_n"},
      {"rerank return_documents string", "POST", r,
       q("\"documents\":[\"a\"],\"return_documents\":\"yes\""), 400, "return_documents"},
      {"rerank document longer than the context", "POST", r,
       q("\"documents\":[\"a\",\"" + long_doc + "\"]"), 400, "documents"},
      {"rerank unknown field", "POST", r, q("\"documents\":[\"a\"],\"rank_fields\":[\"x\"]"),
       400, "rank_fields"},
      {"embeddings on a rerank server", "POST", "/v1/embeddings", "{\"input\":\"a\"}", 404, ""},
      {"generate on a rerank server", "POST", "/v1/completions", "{\"prompt\":\"a\"}", 404, ""},
  };
}

void expect_error_shape(const Case& k, const HttpResult& r) {
  const json j = r.json();
  ASSERT_TRUE(j.is_object()) << "error body is not JSON: " << r.body;
  if (k.path.starts_with("/v1/messages")) {
    // Anthropic's: {"type": "error", "error": {"type", "message"}}, the field in the message.
    EXPECT_EQ(j["type"], "error") << r.body;
    ASSERT_TRUE(j["error"].is_object()) << r.body;
    EXPECT_TRUE(j["error"]["type"].is_string()) << r.body;
    EXPECT_EQ(j["error"]["type"], k.status == 404 ? "not_found_error"
                                  : k.status == 405 ? "api_error"
                                                    : "invalid_request_error")
        << r.body;
    const std::string message = j["error"].value("message", "");
    EXPECT_FALSE(message.empty()) << r.body;
    if (!k.param.empty()) {
      EXPECT_NE(message.find(k.param), std::string::npos) << r.body;
    }
    return;
  }
  if (k.status == 422) {
    EXPECT_TRUE(j["error"].is_string()) << r.body;
    EXPECT_EQ(j["error_type"], "validation") << r.body;
    return;
  }
  ASSERT_TRUE(j["error"].is_object()) << r.body;
  EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"].contains("param"));
  EXPECT_TRUE(j["error"].contains("code"));
  if (!k.param.empty()) {
    EXPECT_EQ(j["error"]["param"], k.param) << r.body;
  }
}

TEST(ServerMalformed, EveryCaseGetsItsStatusAndAJsonError) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const std::vector<Case> all = cases();
  ASSERT_GE(all.size(), 130u);
  for (const Case& k : all) {
    SCOPED_TRACE(k.name);
    const HttpResult r = server.request(k.method, k.path, k.body);
    EXPECT_EQ(r.status, k.status) << r.body;
    if (k.status != 200) expect_error_shape(k, r);
  }
  EXPECT_EQ(server.get("/health").status, 200) << "the server must stay up";
  EXPECT_TRUE(server.wait_no_blocks_used()) << "KV blocks leaked";
  EXPECT_EQ(server.terminate(), 0);
}

// Embeddings and rerank bodies (and the routes of other tasks) on embed and rerank servers: the
// same rules, and no KV block left in use.
TEST(ServerMalformed, EmbeddingAndRerankBodies) {
  const std::pair<std::vector<std::string>, const std::string*> servers[] = {
      {{"--task", "embed"}, &random_qwen3_embed_model()},
      {{"--task", "rerank"}, &random_qwen3_rank_model()}};
  for (const auto& [args, model] : servers) {
    ServerProcess server(args, 0, *model);
    ASSERT_TRUE(server.ok());
    const std::vector<Case> all = args[1] == "embed" ? embedding_cases() : rerank_cases();
    for (const Case& k : all) {
      SCOPED_TRACE(k.name);
      const HttpResult r = server.request(k.method, k.path, k.body);
      EXPECT_EQ(r.status, k.status) << r.body;
      expect_error_shape(k, r);
    }
    EXPECT_EQ(server.get("/health").status, 200) << "the server must stay up";
    EXPECT_TRUE(server.wait_no_blocks_used()) << "KV blocks leaked";
    EXPECT_EQ(server.terminate(), 0);
  }
  // The limits are named: the input's length and the context, the model's dimensions.
  ServerProcess embed({"--task", "embed"}, 0, random_qwen3_embed_model());
  ASSERT_TRUE(embed.ok());
  HttpResult r = embed.request("POST", "/v1/embeddings", "{\"input\":[[1]," + many_ids(2049) + "]}");
  ASSERT_EQ(r.status, 400);
  EXPECT_EQ(r.json()["error"]["message"],
            "'input[1]' has 2049 tokens, the maximum is 2048 (max_model_len)");
  EXPECT_EQ(r.json()["error"]["code"], "context_length_exceeded");
  r = embed.request("POST", "/v1/embeddings", "{\"input\":\"a\",\"dimensions\":65}");
  EXPECT_EQ(r.json()["error"]["message"], "'dimensions' is 65, must be in [1, 64]");
  EXPECT_EQ(embed.terminate(), 0);
}

TEST(ServerMalformed, LimitsNameTheNumbers) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  HttpResult r = server.request("POST", "/v1/completions", "{\"prompt\":" + many_ids(2100) + "}");
  ASSERT_EQ(r.status, 400);
  std::string msg = r.json()["error"]["message"];
  EXPECT_NE(msg.find("2100"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2048"), std::string::npos) << msg;
  EXPECT_EQ(r.json()["error"]["code"], "context_length_exceeded");
  r = server.request("POST", "/v1/completions", "{\"prompt\":\"a\",\"top_p\":1.5}");
  msg = r.json()["error"]["message"];
  EXPECT_NE(msg.find("1.5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1]"), std::string::npos) << msg;
}

TEST(ServerMalformed, TenMegabyteBodyIs413) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const std::string big = "{\"prompt\":\"" + std::string(10u << 20, 'a') + "\"}";
  const HttpResult r = server.request("POST", "/v1/completions", big);
  EXPECT_EQ(r.status, 413) << r.body.substr(0, 200);
  EXPECT_TRUE(r.json()["error"].is_object());
  EXPECT_EQ(server.get("/health").status, 200);
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerMalformed, QueueFullIs429) {
  ServerProcess server({"--max-waiting-requests", "1", "--max-num-seqs", "1"});
  ASSERT_TRUE(server.ok());
  // Many concurrent long requests with one running slot and one waiting slot: some get 429.
  const std::string body =
      "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"ignore_eos\":true}";
  std::string cmd = "for i in $(seq 1 8); do curl -s -o /dev/null -w '%{http_code}\\n' -X POST "
                    "-H 'Content-Type: application/json' -d '" + body + "' " +
                    server.url("/v1/completions") + " & done; wait";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  pclose(p);
  EXPECT_NE(out.find("429"), std::string::npos) << out;
  EXPECT_NE(out.find("200"), std::string::npos) << out;
  EXPECT_TRUE(server.wait_no_blocks_used());
}

}  // namespace
}  // namespace arbor::server::testing

namespace arbor::server::testing {
namespace {

// Seeded mutations of valid bodies (byte flips, cuts, inserted JSON punctuation and numbers),
// /v1/responses and /v1/messages among them: the server answers every one with 200 or a 4xx
// JSON error and never goes down.
TEST(ServerMalformed, MutatedBodiesNeverCrashTheServer) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"/v1/completions",
       "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"n\":2,\"stop\":[\"x\"],"
       "\"logit_bias\":{\"5\":1},\"logprobs\":2,\"temperature\":0.5}"},
      {"/v1/completions", "{\"prompt\":[1,2,3],\"max_tokens\":2,\"stream\":true}"},
      {"/generate", "{\"inputs\":\"Once\",\"parameters\":{\"max_new_tokens\":2,\"details\":true}}"},
      {"/tokenize", "{\"prompt\":\"hello\"}"},
      {"/v1/responses",
       R"({"input":[{"role":"user","content":[{"type":"input_text","text":"Once"}]},)"
       R"({"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},)"
       R"({"type":"function_call_output","call_id":"c1","output":"ok"}],)"
       R"("tools":[{"type":"function","name":"f"}],"max_output_tokens":3,"stream":true})"},
      {"/v1/messages",
       R"({"max_tokens":3,"system":"Be brief.","messages":[{"role":"user","content":"Once"},)"
       R"({"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},)"
       R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}],)"
       R"("tools":[{"name":"f","input_schema":{"type":"object"}}],"stop_sequences":["x"]})"}};
  const char* inserts[] = {"[", "]", "{", "}", "\"", ",", ":", "-1", "1e999", "null", "\\u0000",
                           "\xff", "99999999999999999999"};
  const unsigned seed = 12345;
  std::srand(seed);
  for (int i = 0; i < 210; ++i) {
    const auto& [path, base] = seeds[i % seeds.size()];
    std::string body = base;
    for (int m = 0; m < 1 + std::rand() % 3; ++m) {
      const size_t at = std::rand() % (body.size() + 1);
      switch (std::rand() % 3) {
        case 0:
          body.insert(at, inserts[std::rand() % (sizeof(inserts) / sizeof(inserts[0]))]);
          break;
        case 1:
          body = body.substr(0, at);
          break;
        case 2:
          if (at < body.size()) body[at] = static_cast<char>(std::rand() % 256);
          break;
      }
    }
    const HttpResult r = server.request("POST", path, body);
    SCOPED_TRACE("seed " + std::to_string(seed) + " case " + std::to_string(i) + ": " + body);
    ASSERT_TRUE(r.status == 200 || (r.status >= 400 && r.status < 500)) << r.status << r.body;
    if (r.status != 200) {
      EXPECT_TRUE(r.json().is_object()) << r.body;
    }
  }
  EXPECT_EQ(server.get("/health").status, 200);
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
