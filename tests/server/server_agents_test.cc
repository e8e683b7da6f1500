// /v1/responses and /v1/messages through the real server with curl: the response store's
// bounds as the flags set them (evicted and expired responses are 404s naming
// previous_response_id), the API key as x-api-key or Bearer with each route's error shape, the
// streams' bytes (event names), and count_tokens against the usage of the same request. The official clients' tests are server_js_test.cc's.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "server_test_util.h"

namespace arbor::server::testing {
namespace {

using json = nlohmann::json;

json create(const ServerProcess& server, const json& body, int want = 200) {
  const HttpResult r = server.post("/v1/responses", body);
  EXPECT_EQ(r.status, want) << r.body;
  return r.json();
}

TEST(ServerAgents, StoredResponsesAreBoundedByCountAndTime) {
  ServerProcess server({"--responses-max", "2", "--responses-ttl", "1.5"});
  ASSERT_TRUE(server.ok());
  const json base = {{"max_output_tokens", 3}, {"temperature", 0}};
  json b = base;
  b["input"] = "Once upon a time";
  const json r1 = create(server, b);
  const json r2 = create(server, b);
  const json r3 = create(server, b);
  ASSERT_TRUE(r1.contains("id") && r2.contains("id") && r3.contains("id"));
  // The third evicted the first (at most 2 kept).
  b = base;
  b["input"] = "and then";
  b["previous_response_id"] = r1["id"];
  const json gone = create(server, b, 404);
  EXPECT_EQ(gone["error"]["param"], "previous_response_id");
  EXPECT_EQ(gone["error"]["code"], "previous_response_not_found");
  EXPECT_NE(gone["error"]["message"].get<std::string>().find("at most 2"), std::string::npos);
  // The newest continues: its conversation (input and output) comes before the new input.
  b["previous_response_id"] = r3["id"];
  const json next = create(server, b);
  EXPECT_EQ(next["previous_response_id"], r3["id"]);
  json alone = base;
  alone["input"] = "and then";
  EXPECT_GT(next["usage"]["input_tokens"].get<int>(),
            r3["usage"]["input_tokens"].get<int>() + r3["usage"]["output_tokens"].get<int>() -
                1);
  EXPECT_GT(next["usage"]["input_tokens"].get<int>(),
            create(server, alone)["usage"]["input_tokens"].get<int>());
  // store: false keeps nothing; after the TTL nothing is left.
  alone["store"] = false;
  const json unstored = create(server, alone);
  b["previous_response_id"] = unstored["id"];
  create(server, b, 404);
  std::this_thread::sleep_for(std::chrono::milliseconds(1700));
  b["previous_response_id"] = next["id"];
  create(server, b, 404);
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerAgents, ApiKeyAsXApiKeyOrBearerWithEachRoutesErrorShape) {
  ServerProcess server({"--api-key", "sk-agents"});
  ASSERT_TRUE(server.ok());
  const std::string messages =
      R"({"max_tokens":2,"messages":[{"role":"user","content":"Once"}]})";
  const std::string responses = R"({"input":"Once","max_output_tokens":2})";
  for (const std::string& header : {"-H 'x-api-key: sk-agents'",
                                    "-H 'Authorization: Bearer sk-agents'"}) {
    EXPECT_EQ(server.request("POST", "/v1/messages", messages, header).status, 200) << header;
    EXPECT_EQ(server.request("POST", "/v1/responses", responses, header).status, 200) << header;
  }
  HttpResult r = server.request("POST", "/v1/messages", messages);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.json(), json::parse(R"({"type": "error", "error": {"type": "authentication_error",
    "message": "missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'"}})"));
  r = server.request("POST", "/v1/messages", messages, "-H 'x-api-key: sk-agent'");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.json()["error"]["message"], "incorrect API key provided");
  r = server.request("POST", "/v1/responses", responses, "-H 'x-api-key: wrong'");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.json()["error"]["code"], "invalid_api_key") << r.body;
  EXPECT_EQ(server.terminate(), 0);
}

// The raw streams: an event name on every event, each with its data line; and a route's 405 in
// its own shape.
TEST(ServerAgents, StreamsCarryEventNames) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const auto events = [](const std::string& body) {
    std::vector<std::string> names;
    size_t at = 0;
    while ((at = body.find("event: ", at)) != std::string::npos) {
      const size_t end = body.find('\n', at);
      names.push_back(body.substr(at + 7, end - at - 7));
      const size_t data = body.find("data: ", end);
      EXPECT_EQ(data, end + 1) << "every event line is followed by its data";
      at = end;
    }
    return names;
  };
  HttpResult r = server.request("POST", "/v1/responses",
                                R"({"input":"Once","max_output_tokens":3,"stream":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> names = events(r.body);
  ASSERT_GE(names.size(), 8u) << r.body;
  EXPECT_EQ(names.front(), "response.created");
  EXPECT_EQ(names.back(), "response.incomplete");
  EXPECT_EQ(sse_payloads(r.body).size(), names.size()) << "one data line per event";
  r = server.request("POST", "/v1/messages",
                     R"({"max_tokens":3,"stream":true,"messages":[{"role":"user","content":"Once"}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  names = events(r.body);
  ASSERT_GE(names.size(), 7u) << r.body;
  EXPECT_EQ(names[0], "message_start");
  EXPECT_EQ(names[1], "ping");
  EXPECT_EQ(names[2], "content_block_start");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");
  r = server.request("GET", "/v1/messages");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.json()["type"], "error") << r.body;
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerAgents, CountTokensIsTheUsageOfTheSameMessages) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const json body = {{"system", "You tell stories."},
                     {"messages", {{{"role", "user"}, {"content", "Once upon a time"}},
                                   {{"role", "assistant"}, {"content", "there was"}},
                                   {{"role", "user"}, {"content", "go on"}}}},
                     {"tools", {{{"name", "f"}, {"input_schema", {{"type", "object"}}}}}}};
  const HttpResult counted = server.post("/v1/messages/count_tokens", body);
  ASSERT_EQ(counted.status, 200) << counted.body;
  json create = body;
  create["max_tokens"] = 2;
  const HttpResult created = server.post("/v1/messages", create);
  ASSERT_EQ(created.status, 200) << created.body;
  EXPECT_EQ(counted.json(), json({{"input_tokens", created.json()["usage"]["input_tokens"]}}));
  EXPECT_GT(counted.json()["input_tokens"].get<int>(), 20);
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
