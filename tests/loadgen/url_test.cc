// --url parsing and the loopback-only rule.
#include "loadgen/url.h"

#include <gtest/gtest.h>

namespace arbor::loadgen {
namespace {

TEST(ServerUrl, AcceptsLoopback) {
  auto a = parse_server_url("http://127.0.0.1:8080");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->address, "127.0.0.1");
  EXPECT_EQ(a->port, 8080);
  EXPECT_EQ(a->base_path, "");
  auto b = parse_server_url("http://localhost:9000/");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->address, "127.0.0.1");
  EXPECT_EQ(b->host, "localhost");
  EXPECT_EQ(b->base_path, "");
  auto c = parse_server_url("http://[::1]:8000/api/");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->address, "::1");
  EXPECT_EQ(c->port, 8000);
  EXPECT_EQ(c->base_path, "/api");
  auto d = parse_server_url("HTTP://127.254.3.9");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->port, 80);
  EXPECT_TRUE(parse_server_url("http://LocalHost:1").ok());
  EXPECT_TRUE(parse_server_url("http://::1").ok());
}

TEST(ServerUrl, RefusesOtherHostsNamingTheProblem) {
  for (const char* url : {"http://10.0.0.1:8080", "http://192.168.1.2", "http://example.com:80",
                          "http://0.0.0.0:8080", "http://128.0.0.1", "http://127.0.0.1.nip.io",
                          "http://127.1", "http://[::2]:80", "http://[::ffff:8.8.8.8]:80",
                          "http://127.0.0.256", "http://localhost.example.com"}) {
    auto r = parse_server_url(url);
    ASSERT_FALSE(r.ok()) << url;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("not a loopback address"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("127.0.0.0/8"), std::string::npos);
  }
}

TEST(ServerUrl, RejectsMalformed) {
  for (const char* url :
       {"https://127.0.0.1", "127.0.0.1:8080", "http://", "http://:80", "http://127.0.0.1:0",
        "http://127.0.0.1:65536", "http://127.0.0.1:x", "http://[::1"}) {
    EXPECT_FALSE(parse_server_url(url).ok()) << url;
  }
}

TEST(LoopbackHost, Rules) {
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.255.255.255"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_TRUE(is_loopback_host("[::1]"));
  EXPECT_FALSE(is_loopback_host("126.0.0.1"));
  EXPECT_FALSE(is_loopback_host("127.0.0"));
  EXPECT_FALSE(is_loopback_host("127.0.0.1."));
  EXPECT_FALSE(is_loopback_host("1127.0.0.1"));
  EXPECT_FALSE(is_loopback_host(""));
}

}  // namespace
}  // namespace arbor::loadgen
