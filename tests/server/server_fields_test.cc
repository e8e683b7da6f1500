// No silent no-ops (issue 18): every field of the OpenAI and vLLM request schemas, sent to the
// real server, is either read (200, and the field is in arbor's table of fields it reads),
// metadata that asks nothing of the output, or a 400 naming the field — never a 200 that
// ignores it. OpenAI's Responses and Anthropic's Messages requests likewise; TGI's parameters
// too (422 naming it).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "server/request_fields.h"
#include "server_test_util.h"

namespace arbor::server::testing {
namespace {

using json = nlohmann::json;

struct Field {
  std::string name;
  json value;
};

// OpenAI's chat completions request (2025 schema), then vLLM's extensions, with a value each.
const std::vector<Field> kChatFields = {
    {"audio", {{"voice", "alloy"}, {"format", "wav"}}}, {"frequency_penalty", 0.5},
    {"function_call", "auto"}, {"functions", json::array({{{"name", "f"}}})},
    {"logit_bias", {{"5", 1}}}, {"logprobs", true}, {"max_completion_tokens", 4},
    {"max_tokens", 4}, {"metadata", {{"k", "v"}}}, {"modalities", {"text", "audio"}}, {"n", 2},
    {"parallel_tool_calls", false}, {"prediction", {{"type", "content"}, {"content", "x"}}},
    {"presence_penalty", 0.5}, {"prompt_cache_key", "k"}, {"reasoning_effort", "low"},
    {"response_format", {{"type", "json_object"}}}, {"safety_identifier", "s"}, {"seed", 3},
    {"service_tier", "flex"}, {"stop", "x"}, {"store", true}, {"stream", false},
    {"stream_options", nullptr}, {"temperature", 0.5}, {"tool_choice", "auto"},
    {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
    {"top_logprobs", 2}, {"top_p", 0.9}, {"user", "u"}, {"verbosity", "low"},
    {"web_search_options", json::object()},
    // vLLM
    {"best_of", 2}, {"use_beam_search", true}, {"top_k", 5}, {"min_p", 0.1},
    {"repetition_penalty", 1.1}, {"length_penalty", 1.2}, {"stop_token_ids", {5}},
    {"include_stop_str_in_output", true}, {"ignore_eos", true}, {"min_tokens", 1},
    {"skip_special_tokens", false}, {"spaces_between_special_tokens", false},
    {"truncate_prompt_tokens", 8}, {"prompt_logprobs", 1}, {"allowed_token_ids", {5, 6}},
    {"bad_words", {"x"}}, {"echo", true}, {"add_generation_prompt", true},
    {"continue_final_message", true}, {"add_special_tokens", true}, {"documents", json::array()},
    {"chat_template", "{{ messages }}"}, {"chat_template_kwargs", json::object()},
    {"mm_processor_kwargs", json::object()}, {"structured_outputs", {{"regex", "[a-z]+"}}},
    {"guided_json", {{"type", "string"}}}, {"guided_regex", "[a-z]+"},
    {"guided_choice", {"a", "b"}}, {"guided_grammar", "root ::= \"a\""},
    {"guided_decoding_backend", "xgrammar"}, {"guided_whitespace_pattern", " "},
    {"priority", 0}, {"request_id", "r"}, {"logits_processors", json::array()},
    {"return_tokens_as_token_ids", true}, {"return_token_ids", true}, {"cache_salt", "s"},
    {"kv_transfer_params", json::object()}, {"vllm_xargs", json::object()},
    // llama.cpp
    {"grammar", "root ::= \"a\""}, {"json_schema", {{"type", "string"}}},
};

// The completions request (OpenAI), then the fields vLLM adds there beyond the chat ones.
const std::vector<Field> kCompletionFields = {
    {"best_of", 2}, {"echo", true}, {"frequency_penalty", 0.5}, {"logit_bias", {{"5", 1}}},
    {"logprobs", 2}, {"max_tokens", 4}, {"n", 2}, {"presence_penalty", 0.5}, {"seed", 3},
    {"stop", "x"}, {"stream", false}, {"stream_options", nullptr}, {"suffix", "x"},
    {"temperature", 0.5}, {"top_p", 0.9}, {"user", "u"}, {"top_k", 5}, {"min_p", 0.1},
    {"min_tokens", 1}, {"prompt_logprobs", 1}, {"add_special_tokens", true},
    {"response_format", {{"type", "json_object"}}}, {"guided_regex", "[a-z]+"},
    {"truncate_prompt_tokens", 2}, {"ignore_eos", true}, {"priority", 0},
    {"max_completion_tokens", 4}, {"repetition_penalty", 1.1},
    {"structured_outputs", {{"choice", {"a", "b"}}}}, {"guided_json", {{"type", "string"}}},
    {"guided_choice", {"a", "b"}}, {"guided_grammar", "root ::= \"a\""},
    {"grammar", "root ::= \"a\""}, {"json_schema", {{"type", "string"}}},
};

// Fields arbor reads beyond the schemas: its own, the route basics, and TGI's do_sample, which
// @huggingface/inference's textGeneration sends to /v1/completions (hf_inference.test.mjs).
const std::set<std::string> kArborExtensions = {"speculation", "model", "messages", "prompt",
                                                "do_sample"};

void walk(const ServerProcess& server, const std::string& path, const json& base,
          const std::vector<Field>& fields, RequestRoute route) {
  std::set<std::string> read;
  for (std::string_view f : read_fields(route)) read.insert(std::string(f));
  std::set<std::string> walked;
  for (const Field& f : fields) {
    walked.insert(f.name);
    json body = base;
    body[f.name] = f.value;
    const HttpResult r = server.post(path, body);
    if (r.status == 200) {
      // Passed: it must be read, or be metadata / a no-op by the table.
      EXPECT_TRUE(read.contains(f.name) || f.name == "user" || f.name == "metadata" ||
                  f.name == "safety_identifier" || f.name == "prompt_cache_key" ||
                  f.name == "parallel_tool_calls")
          << path << ": '" << f.name << "' passed but arbor does not read it";
      continue;
    }
    EXPECT_EQ(r.status, 400) << path << " " << f.name << ": " << r.body;
    const json j = r.json();
    ASSERT_FALSE(j.is_discarded()) << r.body;
    EXPECT_EQ(j["error"]["param"], f.name) << path << ": " << r.body;
    // A read field may still be refused for its value, never for being there.
    if (read.contains(f.name)) {
      EXPECT_EQ(j["error"]["message"].get<std::string>().find("not supported ("),
                std::string::npos)
          << r.body;
    }
  }
  // Every field arbor reads appears in the schemas walked (or is arbor's own).
  for (const std::string& f : read) {
    EXPECT_TRUE(walked.contains(f) || kArborExtensions.contains(f))
        << "arbor reads '" << f << "', which no schema above lists";
  }
}

TEST(ServerFields, EveryOpenAiAndVllmFieldIsReadOrRefused) {
  ServerProcess server({"--chat-template", "llama2", "--spec", "ngram"});
  ASSERT_TRUE(server.ok());
  walk(server, "/v1/chat/completions",
       {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}, {"max_tokens", 4}},
       kChatFields, RequestRoute::kChat);
  walk(server, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}}, kCompletionFields,
       RequestRoute::kCompletions);
  EXPECT_TRUE(server.wait_no_blocks_used());
}

// OpenAI's Responses request (2025 schema) and Anthropic's Messages request, with a value each;
// arbor's extensions follow.
const std::vector<Field> kResponsesFields = {
    {"background", true}, {"conversation", "conv_1"}, {"include", {"reasoning.encrypted_content"}},
    {"instructions", "Be brief."}, {"max_output_tokens", 4}, {"max_tool_calls", 2},
    {"metadata", {{"k", "v"}}}, {"parallel_tool_calls", false}, {"prompt", {{"id", "pmpt_1"}}},
    {"prompt_cache_key", "k"}, {"reasoning", {{"effort", "low"}}}, {"safety_identifier", "s"},
    {"service_tier", "flex"}, {"store", false}, {"stream", false},
    {"stream_options", {{"include_obfuscation", true}}}, {"temperature", 0.5},
    {"text", {{"format", {{"type", "json_object"}}}}}, {"tool_choice", "none"},
    {"tools", json::array({{{"type", "function"}, {"name", "f"}}})}, {"top_logprobs", 2},
    {"top_p", 0.9}, {"truncation", "auto"}, {"user", "u"}, {"context_management", {{"k", 1}}},
    // arbor's (the chat route's sampling extensions)
    {"seed", 3}, {"top_k", 5}, {"min_p", 0.1}, {"repetition_penalty", 1.1},
    {"presence_penalty", 0.5}, {"frequency_penalty", 0.5}, {"priority", 0},
    {"speculation", {{"mode", "off"}}}, {"chat_template_kwargs", json::object()},
    {"frobnicate", 1},
};
const std::vector<Field> kMessagesFields = {
    {"container", "c"}, {"context_management", {{"edits", json::array()}}},
    {"mcp_servers", json::array({{{"type", "url"}, {"url", "http://x"}, {"name", "x"}}})},
    {"metadata", {{"user_id", "u"}}}, {"service_tier", "standard_only"},
    {"stop_sequences", {"x"}}, {"stream", false}, {"system", "Be brief."},
    {"temperature", 0.5}, {"thinking", {{"type", "disabled"}}},
    {"tool_choice", {{"type", "auto"}}},
    {"tools", json::array({{{"name", "f"}, {"input_schema", {{"type", "object"}}}}})},
    {"top_k", 5}, {"top_p", 0.9},
    // arbor's
    {"seed", 3}, {"min_p", 0.1}, {"repetition_penalty", 1.1}, {"presence_penalty", 0.5},
    {"frequency_penalty", 0.5}, {"priority", 0}, {"speculation", {{"mode", "off"}}},
    {"output_format", {{"type", "json_schema"}}}, {"frobnicate", 1},
};

// As walk(), for the routes of the agents' APIs: a 200 is a field read or metadata, a 400
// names the field (OpenAI: error.param; Anthropic: in the message, its body having no param).
void walk_agents(const ServerProcess& server, const std::string& path, const json& base,
                 const std::vector<Field>& fields, RequestRoute route,
                 const std::set<std::string>& metadata) {
  std::set<std::string> read;
  for (std::string_view f : read_fields(route)) read.insert(std::string(f));
  std::set<std::string> walked;
  const bool anthropic = route == RequestRoute::kMessages;
  for (const Field& f : fields) {
    walked.insert(f.name);
    json body = base;
    body[f.name] = f.value;
    const HttpResult r = server.post(path, body);
    if (r.status == 200) {
      EXPECT_TRUE(read.contains(f.name) || metadata.contains(f.name))
          << path << ": '" << f.name << "' passed but arbor does not read it";
      continue;
    }
    EXPECT_EQ(r.status, 400) << path << " " << f.name << ": " << r.body;
    const json j = r.json();
    ASSERT_FALSE(j.is_discarded()) << r.body;
    const std::string message = j["error"].value("message", "");
    if (anthropic) {
      EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r.body;
      EXPECT_NE(message.find("'" + f.name), std::string::npos) << path << ": " << r.body;
    } else {
      EXPECT_EQ(j["error"]["param"], f.name) << path << ": " << r.body;
    }
    if (read.contains(f.name)) {
      EXPECT_EQ(message.find("not supported ("), std::string::npos) << r.body;
    }
  }
  for (const std::string& f : read) {
    EXPECT_TRUE(walked.contains(f) || kArborExtensions.contains(f) || f == "input" ||
                f == "max_tokens" || f == "previous_response_id")
        << path << ": arbor reads '" << f << "', which no schema above lists";
  }
}

TEST(ServerFields, EveryResponsesAndMessagesFieldIsReadOrRefused) {
  ServerProcess server({"--spec", "ngram"});
  ASSERT_TRUE(server.ok());
  walk_agents(server, "/v1/responses", {{"input", "Hi"}, {"max_output_tokens", 4}},
              kResponsesFields, RequestRoute::kResponses,
              {"user", "metadata", "safety_identifier", "prompt_cache_key"});
  walk_agents(server, "/v1/messages",
              {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})},
               {"max_tokens", 4}},
              kMessagesFields, RequestRoute::kMessages, {"metadata", "service_tier"});
  EXPECT_TRUE(server.wait_no_blocks_used());
}

TEST(ServerFields, TgiParametersAreReadOrRefused) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const std::vector<Field> params = {
      {"best_of", 2}, {"decoder_input_details", true}, {"details", true}, {"do_sample", true},
      {"frequency_penalty", 0.5}, {"grammar", {{"type", "regex"}, {"value", "[a-z]+"}}},
      {"max_new_tokens", 4}, {"repetition_penalty", 1.1}, {"return_full_text", true},
      {"seed", 3}, {"stop", {"x"}}, {"temperature", 0.5}, {"top_k", 5}, {"top_n_tokens", 2},
      {"top_p", 0.9}, {"truncate", 4}, {"typical_p", 0.5}, {"watermark", true},
      {"adapter_id", "a"}, {"frobnicate", 1}};
  const std::set<std::string> refused = {"top_n_tokens", "typical_p",
                                         "watermark", "adapter_id", "frobnicate"};
  for (const Field& f : params) {
    json body = {{"inputs", "Once"}, {"parameters", {{"max_new_tokens", 4}}}};
    body["parameters"][f.name] = f.value;
    const HttpResult r = server.post("/generate", body);
    if (refused.contains(f.name)) {
      EXPECT_EQ(r.status, 422) << f.name << ": " << r.body;
      EXPECT_NE(r.body.find(f.name), std::string::npos) << r.body;
    } else {
      EXPECT_EQ(r.status, 200) << f.name << ": " << r.body;
    }
  }
}

}  // namespace
}  // namespace arbor::server::testing
