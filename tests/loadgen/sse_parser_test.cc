// SseParser: events must not depend on how the bytes were split.
#include "loadgen/sse_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace arbor::loadgen {
namespace {

std::vector<std::string> parse(const std::vector<std::string>& pieces) {
  SseParser p;
  std::vector<std::string> out;
  int count = 0;
  for (const std::string& piece : pieces) {
    count += p.feed(piece, [&](std::string_view d) { out.emplace_back(d); });
  }
  EXPECT_EQ(count, static_cast<int>(out.size()));
  return out;
}

using Events = std::vector<std::string>;

// A stream like arbor's: chunks, a keep-alive comment, usage, [DONE].
const std::string kStream =
    "data: {\"choices\":[{\"text\":\" Once\"}]}\n\n"
    ": keep-alive\n\n"
    "data: {\"choices\":[{\"text\":\" upon\\n\"}]}\n\n"
    "data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\n\n"
    "data: [DONE]\n\n";
const Events kEvents = {"{\"choices\":[{\"text\":\" Once\"}]}",
                        "{\"choices\":[{\"text\":\" upon\\n\"}]}",
                        "{\"choices\":[],\"usage\":{\"completion_tokens\":2}}", "[DONE]"};

std::string with_crlf(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += '\r';
    out += c;
  }
  return out;
}

std::string with_cr(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (c == '\n') c = '\r';
  }
  return out;
}

TEST(SseParser, WholeStream) { EXPECT_EQ(parse({kStream}), kEvents); }

TEST(SseParser, EverySplitPointAndEveryLineEnding) {
  for (const std::string& s : {kStream, with_crlf(kStream), with_cr(kStream)}) {
    for (size_t i = 0; i <= s.size(); ++i) {
      ASSERT_EQ(parse({s.substr(0, i), s.substr(i)}), kEvents) << "split at " << i;
    }
    for (size_t i = 0; i + 1 < s.size(); i += 7) {
      for (size_t j = i + 1; j <= s.size(); j += 5) {
        ASSERT_EQ(parse({s.substr(0, i), s.substr(i, j - i), s.substr(j)}), kEvents)
            << "splits at " << i << " and " << j;
      }
    }
  }
}

TEST(SseParser, ByteAtATimeAndRandomPieces) {
  const std::string s = with_crlf(kStream);
  std::vector<std::string> bytes;
  for (char c : s) bytes.emplace_back(1, c);
  EXPECT_EQ(parse(bytes), kEvents);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < s.size();) {
      const size_t n = std::min<size_t>(s.size() - i, 1 + rng() % 40);
      pieces.push_back(s.substr(i, n));
      i += n;
    }
    ASSERT_EQ(parse(pieces), kEvents) << "trial " << trial;
  }
}

TEST(SseParser, CrLfSplitBetweenPiecesIsOneLineEnd) {
  // "\r" ends a piece and its "\n" starts the next: one line end, not an extra blank line
  // (which would dispatch "x" early and make "y" a second event).
  EXPECT_EQ(parse({"data: x\r", "\ndata: y\r\n\r\n"}), Events{"x\ny"});
  EXPECT_EQ(parse({"data: x\r", "\n", "\r", "\n"}), Events{"x"});
}

TEST(SseParser, FieldRules) {
  EXPECT_EQ(parse({"data:nospace\n\n"}), Events{"nospace"});
  EXPECT_EQ(parse({"data:  two\n\n"}), Events{" two"});  // only one space is dropped
  EXPECT_EQ(parse({"data\n\n"}), Events{""});
  EXPECT_EQ(parse({"event: ping\nid: 3\nretry: 10\n\n"}), Events{});  // no data: nothing
  EXPECT_EQ(parse({"event: x\ndata: a\ndata: b\n\n"}), Events{"a\nb"});
  EXPECT_EQ(parse({": comment\n: another\n\n"}), Events{});
  EXPECT_EQ(parse({"\n\n\ndata: a\n\n\n"}), Events{"a"});
}

TEST(SseParser, PendingBytesUntilTheEventEnds) {
  SseParser p;
  int n = 0;
  auto count = [&](std::string_view) { ++n; };
  p.feed("data: {\"a\"", count);
  EXPECT_GT(p.pending_bytes(), 0u);
  p.feed(":1}\n", count);
  EXPECT_EQ(n, 0);
  EXPECT_GT(p.pending_bytes(), 0u);  // the data waits for the blank line
  p.feed("\n", count);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(p.pending_bytes(), 0u);
  p.feed("data: [DONE]", count);  // no line end: not an event yet
  EXPECT_EQ(n, 1);
}

}  // namespace
}  // namespace arbor::loadgen
