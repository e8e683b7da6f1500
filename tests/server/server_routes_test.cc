// End to end: the model names a server answers to (--served-model-name aliases,
// --accept-any-model-name), GET /v1/models/{id}, and TGI's POST / (docs/server.md).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server_test_util.h"
#include "support/shared_data.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

json completion_body(const std::string& model) {
  return {{"model", model}, {"prompt", "Once upon a time"}, {"max_tokens", 3},
          {"temperature", 0}, {"ignore_eos", true}};
}

void expect_model_not_found(const HttpResult& r, const std::string& name) {
  EXPECT_EQ(r.status, 404) << r.body;
  const json e = r.json()["error"];
  EXPECT_EQ(e["code"], "model_not_found") << r.body;
  EXPECT_EQ(e["type"], "not_found_error");
  const std::string message = e.value("message", "");
  EXPECT_NE(message.find("'" + name + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("--accept-any-model-name"), std::string::npos) << message;
}

// vLLM's rule: /v1/models lists every name, requests may use any, responses report the first.
TEST(ServerModelNames, AliasesAreListedRetrievableAndAccepted) {
  ServerProcess server(
      {"--served-model-name", "org/model,alias-2", "--served-model-name", "third"});
  ASSERT_TRUE(server.ok());
  const HttpResult list = server.get("/v1/models");
  ASSERT_EQ(list.status, 200) << list.body;
  const json cards = list.json()["data"];
  std::vector<std::string> ids;
  for (const json& card : cards) {
    ids.push_back(card["id"]);
    EXPECT_EQ(card["object"], "model");
    EXPECT_EQ(card["owned_by"], "arbor");
    EXPECT_GT(card["created"].get<int64_t>(), 1600000000);
    EXPECT_EQ(card["root"], "org/model") << "the first name, never the file path";
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"org/model", "alias-2", "third"}));

  // GET /v1/models/{id}: an id with '/' as sent by clients that do not encode it, and encoded.
  for (const auto& [path, id] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/models/org/model", "org/model"},
           {"/v1/models/org%2Fmodel", "org/model"},
           {"/v1/models/org%2fmodel/", "org/model"},
           {"/v1/models/alias-2", "alias-2"},
           {"/v1/models/third", "third"}}) {
    const HttpResult r = server.get(path);
    ASSERT_EQ(r.status, 200) << path << ": " << r.body;
    const json card = r.json();
    EXPECT_EQ(card["id"], id) << path;
    EXPECT_EQ(card["object"], "model");
    EXPECT_EQ(card["owned_by"], "arbor");
    EXPECT_TRUE(card["created"].is_number_integer());
  }
  expect_model_not_found(server.get("/v1/models/nope"), "nope");
  // The file's stem is no longer a name once names are given.
  expect_model_not_found(server.get("/v1/models/stories260K"), "stories260K");
  expect_model_not_found(server.get("/v1/models/org"), "org");
  EXPECT_EQ(server.request("POST", "/v1/models/third", "{}").status, 405);

  for (const char* name : {"org/model", "alias-2", "third"}) {
    const HttpResult r = server.post("/v1/completions", completion_body(name));
    ASSERT_EQ(r.status, 200) << name << ": " << r.body;
    EXPECT_EQ(r.json()["model"], "org/model") << "responses report the first name";
  }
  // The model file's path still names the model, as before.
  EXPECT_EQ(server.post("/v1/completions",
                        completion_body(test::shared_path(test::kStories260K))).status,
            200);
  const HttpResult unknown = server.post("/v1/completions", completion_body("stories260K"));
  expect_model_not_found(unknown, "stories260K");
  const std::string message = unknown.json()["error"].value("message", "");
  EXPECT_NE(message.find("'org/model', 'alias-2', 'third'"), std::string::npos) << message;
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerModelNames, EmptyNameIsRefusedAtStartup) {
  ServerProcess server({"--served-model-name", "a,,b"});
  EXPECT_FALSE(server.ok());
  EXPECT_FALSE(server.running());
}

// Clients such as @huggingface/inference send the endpoint URL as the model.
TEST(ServerModelNames, AcceptAnyModelNameServesUnknownNames) {
  const std::string url_name = "http://127.0.0.1:8080/v1/chat/completions";
  {
    ServerProcess strict;
    ASSERT_TRUE(strict.ok());
    expect_model_not_found(strict.post("/v1/completions", completion_body(url_name)), url_name);
  }
  ServerProcess server({"--accept-any-model-name"});
  ASSERT_TRUE(server.ok());
  for (const std::string& name : {url_name, std::string("gpt-4o"), std::string("stories260K")}) {
    const HttpResult r = server.post("/v1/completions", completion_body(name));
    ASSERT_EQ(r.status, 200) << name << ": " << r.body;
    EXPECT_EQ(r.json()["model"], "stories260K");
    EXPECT_EQ(r.json()["usage"]["completion_tokens"], 3);
  }
  const HttpResult list = server.get("/v1/models");
  ASSERT_EQ(list.status, 200);
  ASSERT_EQ(list.json()["data"].size(), 1u) << "only the served names are listed";
  EXPECT_EQ(list.json()["data"][0]["id"], "stories260K");
  const HttpResult card = server.get("/v1/models/gpt-4o");
  ASSERT_EQ(card.status, 200) << card.body;
  EXPECT_EQ(card.json()["id"], "gpt-4o");
  EXPECT_EQ(server.terminate(), 0);
}

// TGI's POST /: /generate (answer in a one-element array, full text by default) or, with
// "stream": true, /generate_stream.
TEST(ServerTgiRoot, PostRootIsGenerateOrGenerateStream) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const std::string prompt = "Once upon a time";
  const json params = {{"max_new_tokens", 6}, {"ignore_eos", true}, {"details", true}};
  const HttpResult gen = server.post("/generate", {{"inputs", prompt}, {"parameters", params}});
  ASSERT_EQ(gen.status, 200) << gen.body;
  const std::string text = gen.json()["generated_text"];
  ASSERT_FALSE(text.empty());

  const HttpResult root = server.post("/", {{"inputs", prompt}, {"parameters", params}});
  ASSERT_EQ(root.status, 200) << root.body;
  const json arr = root.json();
  ASSERT_TRUE(arr.is_array()) << root.body;
  ASSERT_EQ(arr.size(), 1u);
  EXPECT_EQ(arr[0]["generated_text"], prompt + text) << "return_full_text defaults to true";
  EXPECT_EQ(arr[0]["details"]["generated_tokens"], 6);
  EXPECT_EQ(arr[0]["details"]["finish_reason"], "length");

  json no_full = params;
  no_full["return_full_text"] = false;
  const HttpResult plain = server.post("/", {{"inputs", prompt}, {"parameters", no_full},
                                             {"stream", false}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(plain.json()[0]["generated_text"], text);

  // Streaming: /generate_stream's events (without "details", which streams do not take).
  json stream_params = params;
  stream_params.erase("details");
  const HttpResult st = server.post("/", {{"inputs", prompt}, {"parameters", stream_params},
                                          {"stream", true}});
  ASSERT_EQ(st.status, 200) << st.body;
  const auto payloads = sse_payloads(st.body);
  ASSERT_EQ(payloads.size(), 6u) << st.body;
  std::string joined;
  for (const std::string& p : payloads) {
    joined += json::parse(p)["token"]["text"].get<std::string>();
  }
  EXPECT_EQ(joined, text);
  const json last = json::parse(payloads.back());
  EXPECT_EQ(last["generated_text"], prompt + text);
  EXPECT_EQ(last["details"]["finish_reason"], "length");

  // Validation errors in TGI's shape (422), like the other TGI routes.
  for (const json& bad : {json{{"inputs", prompt}, {"stream", "yes"}},
                          json{{"parameters", params}},
                          json{{"inputs", prompt}, {"parameters", {{"max_new_tokens", 0}}}}}) {
    const HttpResult r = server.post("/", bad);
    EXPECT_EQ(r.status, 422) << bad.dump() << ": " << r.body;
    EXPECT_EQ(r.json()["error_type"], "validation") << r.body;
  }
  EXPECT_EQ(server.get("/").status, 200) << "GET / is TGI's health route";
  EXPECT_EQ(server.request("PUT", "/", "{}").status, 405);
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
