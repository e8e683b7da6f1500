// gpt-oss's harmony format (chat/harmony.h): exact readings of the message shapes gpt-oss writes
// (analysis then final; analysis then a call, with the recipient in the header's role part or
// after the channel; parallel calls; preambles; calls of unknown functions; text that ignores
// the format), the prefix-monotone promise over every prefix of 5,000 seeded random outputs, the
// streamer fed byte by byte adding up to the whole parse, and the shared gpt-oss template
// (detected as harmony, reasoning_effort rendered).
#include "chat/harmony.h"

#include <gtest/gtest.h>

#include <random>

#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

namespace arbor::chat {
namespace {

const std::vector<std::string> kNames = {"get_weather", "add"};

HarmonyOutput parse(std::string_view text, bool final = true, bool reasoning = true) {
  return parse_harmony(text, final, kNames, reasoning);
}

void expect_output(const HarmonyOutput& p, std::string_view reasoning, std::string_view content,
                   const std::vector<std::pair<std::string, std::string>>& calls) {
  EXPECT_EQ(p.reasoning, reasoning);
  EXPECT_EQ(p.content, content);
  ASSERT_EQ(p.calls.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(p.calls[i].name, calls[i].first) << i;
    EXPECT_EQ(p.calls[i].arguments, calls[i].second) << i;
  }
}

TEST(HarmonyParse, ChannelsBecomeReasoningContentAndCalls) {
  // What gpt-oss writes after "<|start|>assistant" (its <|return|> / <|call|> usually stop
  // generation before they reach the text; both forms read alike).
  expect_output(parse("<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant"
                      "<|channel|>final<|message|>Hello!"),
                "User says hi.", "Hello!", {});
  expect_output(parse("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final"
                      "<|message|>b<|return|>"),
                "a", "b", {});
  // The recipient after the channel, with <|constrain|>; and in the role part.
  expect_output(parse("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant"
                      "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                      "<|message|>{\"city\":\"Paris\"}<|call|>"),
                "Need weather.", "", {{"get_weather", "{\"city\":\"Paris\"}"}});
  expect_output(parse("<|start|>assistant to=functions.add<|channel|>commentary json<|message|>"
                      "{\"a\":1,\"b\":2}"),
                "", "", {{"add", "{\"a\":1,\"b\":2}"}});
  // Parallel calls, a preamble on commentary (user-visible), an empty call.
  expect_output(parse("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to="
                      "functions.add<|channel|>commentary json<|message|>{\"a\":1}<|call|>"
                      "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
                      "<|message|><|call|>"),
                "", "Checking.", {{"add", "{\"a\":1}"}, {"get_weather", "{}"}});
  // A function the request does not have, a built-in tool: content.
  expect_output(parse("<|channel|>commentary to=functions.rm <|constrain|>json<|message|>{}"),
                "", "{}", {});
  expect_output(parse("<|channel|>analysis to=browser.search<|message|>{\"q\":1}"), "",
                "{\"q\":1}", {});
  // --reasoning-format none: analysis is content too.
  expect_output(parse("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final"
                      "<|message|>b",
                      true, false),
                "", "ab", {});
  // Output that ignores the format is content once it has ended, nothing while it may still be
  // a header.
  expect_output(parse("Plain answer."), "", "Plain answer.", {});
  expect_output(parse("Plain answer.", false), "", "", {});
  // Several analysis messages concatenate.
  expect_output(parse("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>analysis"
                      "<|message|>y<|end|>"),
                "xy", "", {});
}

TEST(HarmonyParse, PartialOutputHoldsBackWhatMayBecomeAMarker) {
  expect_output(parse("<|channel|>analysis<|message|>Think<|e", false), "Think", "", {});
  expect_output(parse("<|channel|>analysis<|message|>Think<|e", true), "Think<|e", "", {});
  expect_output(parse("<|channel|>analysis<|message|>a <", false), "a ", "", {});
  expect_output(parse("<|channel|>analysis<|mess", false), "", "", {});
  // A call appears with its header; its arguments grow.
  const HarmonyOutput p =
      parse("<|channel|>commentary to=functions.add json<|message|>{\"a\"", false);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{\"a\"");
  EXPECT_FALSE(p.calls[0].complete);
  EXPECT_TRUE(parse("<|channel|>commentary to=functions.add json<|message|>{}<|call|>", false)
                  .calls[0]
                  .complete);
}

// Random outputs from harmony's pieces (markers, headers, bodies with stray '<' and '|').
std::string random_output(std::mt19937& rng) {
  static const std::vector<std::string> kPieces = {
      "<|channel|>analysis<|message|>", "<|end|><|start|>assistant", "<|channel|>final<|message|>",
      "<|channel|>commentary to=functions.add <|constrain|>json<|message|>",
      "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>",
      "<|channel|>", "analysis", "final", "commentary", "<|message|>", "<|end|>", "<|start|>",
      "assistant", " to=functions.add", " to=functions.nope", "<|constrain|>json", " json",
      "<|call|>", "<|return|>", "{\"a\":", "1}", "Hi", " ", "<", "|", "<|", "e", "x<|en"};
  std::uniform_int_distribution<size_t> piece(0, kPieces.size() - 1);
  std::uniform_int_distribution<int> length(0, 20);
  std::string out;
  for (int n = length(rng); n > 0; --n) out += kPieces[piece(rng)];
  return out;
}

bool is_prefix(const std::string& a, const std::string& b) { return b.compare(0, a.size(), a) == 0; }

TEST(HarmonyParse, EveryPrefixIsAPrefixOfTheFinalParseAndTheStreamAddsUp) {
  const uint32_t seed = 20261129;
  std::mt19937 rng(seed);
  int with_calls = 0, with_reasoning = 0;
  for (int i = 0; i < 5000; ++i) {
    const std::string text = random_output(rng);
    const HarmonyOutput full = parse(text, true);
    with_calls += !full.calls.empty();
    with_reasoning += !full.reasoning.empty();
    for (size_t n = 0; n <= text.size(); ++n) {
      const HarmonyOutput p = parse(text.substr(0, n), false);
      const std::string where = "seed " + std::to_string(seed) + " output " +
                                std::to_string(i) + " prefix " + std::to_string(n) + ": '" +
                                text + "'";
      ASSERT_TRUE(is_prefix(p.reasoning, full.reasoning)) << where;
      ASSERT_TRUE(is_prefix(p.content, full.content)) << where;
      ASSERT_LE(p.calls.size(), full.calls.size()) << where;
      for (size_t c = 0; c < p.calls.size(); ++c) {
        ASSERT_EQ(p.calls[c].name, full.calls[c].name) << where;
        ASSERT_TRUE(is_prefix(p.calls[c].arguments, full.calls[c].arguments)) << where;
      }
    }
    HarmonyStreamer streamer(kNames, true);
    std::string reasoning, content;
    std::vector<std::pair<std::string, std::string>> calls;
    for (size_t n = 0; n <= text.size(); ++n) {
      const HarmonyStreamer::Step step = streamer.update(text.substr(0, n), n == text.size());
      reasoning += step.reasoning;
      content += step.content;
      for (const ToolCallDelta& d : step.calls) {
        if (d.first) {
          ASSERT_EQ(d.index, static_cast<int32_t>(calls.size()));
          calls.emplace_back(d.name, "");
        }
        calls.at(static_cast<size_t>(d.index)).second += d.arguments;
      }
    }
    EXPECT_EQ(reasoning, full.reasoning) << "output " << i << ": '" << text << "'";
    EXPECT_EQ(content, full.content) << "output " << i << ": '" << text << "'";
    ASSERT_EQ(calls.size(), full.calls.size()) << "output " << i << ": '" << text << "'";
    for (size_t c = 0; c < calls.size(); ++c) {
      EXPECT_EQ(calls[c].first, full.calls[c].name);
      EXPECT_EQ(calls[c].second, full.calls[c].arguments);
    }
  }
  EXPECT_GT(with_calls, 100);  // the corpus exercises calls and reasoning, not only text
  EXPECT_GT(with_reasoning, 100);
}

// The shared gpt-oss template: its tools and channels are detected as harmony, it renders the
// request's reasoning_effort, and parse_tool_calls reads its calls through the harmony parser.
TEST(HarmonyTemplate, SharedGptOssTemplate) {
  const std::string rel = "templates/openai-gpt-oss-120b.jinja";
  ASSERT_TRUE(test::expect_shared_file(rel));
  const std::string source = test::read_file(test::shared_path(rel));
  const TemplateToolSupport tools = detect_tool_support(source);
  EXPECT_TRUE(tools.renders_tools);
  EXPECT_EQ(tools.format, ToolCallFormat::kHarmony) << tools.reason;
  const ReasoningDetection reasoning = detect_reasoning(source);
  ASSERT_TRUE(reasoning.syntax);
  EXPECT_EQ(reasoning.syntax->name, "harmony");
  Result<ChatTemplate> t = ChatTemplate::parse(source);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  for (const char* effort : {"low", "high"}) {
    ChatRenderOptions o;
    o.extra = nlohmann::ordered_json{{"reasoning_effort", effort}};
    Result<std::string> r = t->render({ChatMessage{.role = "user", .content = "Hi", .name = {}, .reasoning_content = {}}}, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_NE(r->find(std::string("Reasoning: ") + effort + "\n"), std::string::npos) << *r;
    EXPECT_TRUE(r->ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant")) << *r;
  }
  const ParsedToolOutput p = parse_tool_calls(
      ToolCallFormat::kHarmony,
      "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.add <|constrain|>json<|message|>{\"a\":1}",
      true, kNames);
  EXPECT_EQ(p.content, "hm");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "add");
  EXPECT_EQ(parse_tool_call_format("harmony"), ToolCallFormat::kHarmony);
}

}  // namespace
}  // namespace arbor::chat
