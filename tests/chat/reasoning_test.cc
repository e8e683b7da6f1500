// Reasoning output: the syntax read from every thinking template in shared/templates, where real
// templates leave the thinking block at the end of the prompt (rendered), and the split into
// reasoning and content: exact cases, streamed in any pieces equal to the whole (markers cut
// across deltas, byte by byte), a missing end marker, a block the prompt opened, and tool-call
// markup inside the thinking that the tool-call parser must not see.
#include "chat/reasoning.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "chat/chat_template.h"
#include "chat/tool_calls.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

namespace arbor::chat {
namespace {

using grammar::ThinkingStart;

ReasoningSyntax syntax(std::string_view name) {
  std::optional<ReasoningSyntax> s = reasoning_syntax(name);
  EXPECT_TRUE(s.has_value()) << name;
  return s.value_or(ReasoningSyntax{});
}

std::string read_template(const std::string& file) {
  const std::string rel = "templates/" + file;
  EXPECT_TRUE(test::expect_shared_file(rel));
  return test::read_file(test::shared_path(rel));
}

TEST(ReasoningDetect, SharedTemplates) {
  // "" = no syntax.
  const std::map<std::string, std::string> expected = {
      {"Qwen-Qwen3-0.6B.jinja", "think"},
      {"Qwen3.5-4B.jinja", "think"},
      {"Qwen-QwQ-32B.jinja", "think"},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "think"},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "think"},
      {"deepseek-ai-DeepSeek-V3.1.jinja", "think"},
      {"llama-cpp-deepseek-r1.jinja", "think"},
      {"HuggingFaceTB-SmolLM3-3B.jinja", "think"},
      {"GLM-4.6.jinja", "think"},
      {"Kimi-K2-Thinking.jinja", "think"},
      {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "think"},
      {"MiniMax-M2.jinja", "think"},
      {"ibm-granite-granite-3.3-2B-Instruct.jinja", "granite"},
      {"mistralai-Ministral-3-14B-Reasoning-2512.jinja", "mistral"},
      {"ByteDance-Seed-OSS.jinja", "seed"},
      {"google-gemma-4-31B-it.jinja", "gemma4"},
      {"Apriel-1.6-15b-Thinker-fixed.jinja", "apriel"},
      {"unsloth-Apriel-1.5.jinja", "apriel"},
      {"openai-gpt-oss-120b.jinja", "harmony"},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ""},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ""},
      {"Mistral-Small-3.2-24B-Instruct-2506.jinja", ""},
  };
  for (const auto& [file, name] : expected) {
    const ReasoningDetection d = detect_reasoning(read_template(file));
    EXPECT_EQ(d.syntax ? d.syntax->name : "", name) << file << ": " << d.reason;
    EXPECT_FALSE(d.reason.empty()) << file;
  }
  const ReasoningDetection apriel15 = detect_reasoning(read_template("unsloth-Apriel-1.5.jinja"));
  ASSERT_TRUE(apriel15.syntax);
  EXPECT_EQ(apriel15.syntax->markers.start, "") << "Apriel 1.5 reasons from its first token";
  EXPECT_EQ(apriel15.syntax->content_close, "[END FINAL RESPONSE]");
  const ReasoningDetection apriel16 =
      detect_reasoning(read_template("Apriel-1.6-15b-Thinker-fixed.jinja"));
  ASSERT_TRUE(apriel16.syntax);
  EXPECT_EQ(apriel16.syntax->markers.start, "Here are my reasoning steps:");
  EXPECT_EQ(apriel16.syntax->content_close, "");
  EXPECT_NE(detect_reasoning(read_template("openai-gpt-oss-120b.jinja")).reason.find("gpt-oss"),
            std::string::npos);
  // The switch each template reads.
  EXPECT_EQ(detect_reasoning(read_template("Qwen-Qwen3-0.6B.jinja")).switch_variable,
            "enable_thinking");
  EXPECT_EQ(detect_reasoning(read_template("ibm-granite-granite-3.3-2B-Instruct.jinja")).switch_variable,
            "thinking");
  // This copy maps enable_thinking to its `thinking` itself.
  EXPECT_EQ(detect_reasoning(read_template("deepseek-ai-DeepSeek-V3.1.jinja")).switch_variable,
            "enable_thinking");
  EXPECT_EQ(detect_reasoning(read_template("Kimi-K2-Thinking.jinja")).switch_variable, "");
}

TEST(ReasoningDetect, NamesRoundTrip) {
  for (std::string_view name : reasoning_syntax_names()) {
    const std::optional<ReasoningSyntax> s = reasoning_syntax(name);
    ASSERT_TRUE(s.has_value()) << name;
    EXPECT_EQ(s->name, name);
    EXPECT_FALSE(s->markers.end.empty()) << name;
  }
  EXPECT_FALSE(reasoning_syntax("deepseek").has_value());
}

// Renders a shared template for one user turn.
std::string render(const std::string& file, nlohmann::ordered_json extra = nlohmann::ordered_json::object()) {
  Result<ChatTemplate> t = ChatTemplate::parse(read_template(file));
  EXPECT_TRUE(t.ok()) << file << ": " << t.status().to_string();
  if (!t.ok()) return "";
  ChatRenderOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  o.extra = std::move(extra);
  Result<std::string> r = t->render({ChatMessage{.role = "user", .content = "Hi", .name = {}}}, o);
  EXPECT_TRUE(r.ok()) << file << ": " << r.status().to_string();
  return r.ok() ? *r : "";
}

TEST(ReasoningPrompt, WhereRealTemplatesLeaveTheBlock) {
  const ReasoningSyntax think = syntax("think");
  // Qwen 3: the model opens <think> itself; enable_thinking=false closes an empty block.
  EXPECT_EQ(prompt_thinking(think, render("Qwen-Qwen3-0.6B.jinja")), PromptThinking::kMaybe);
  EXPECT_EQ(prompt_thinking(think, render("Qwen-Qwen3-0.6B.jinja", {{"enable_thinking", false}})),
            PromptThinking::kClosed);
  // DeepSeek-R1's distills end the prompt with "<think>\n"; Qwen 3.5 too.
  EXPECT_EQ(prompt_thinking(think, render("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")),
            PromptThinking::kOpen);
  EXPECT_EQ(prompt_thinking(think, render("Qwen3.5-4B.jinja")), PromptThinking::kOpen);
  EXPECT_EQ(prompt_thinking(think, render("Qwen3.5-4B.jinja", {{"enable_thinking", false}})),
            PromptThinking::kClosed);
  // SmolLM3: /think (default) leaves it to the model; enable_thinking=false pre-fills the block.
  EXPECT_EQ(prompt_thinking(think, render("HuggingFaceTB-SmolLM3-3B.jinja")), PromptThinking::kMaybe);
  EXPECT_EQ(prompt_thinking(think, render("HuggingFaceTB-SmolLM3-3B.jinja", {{"enable_thinking", false}})),
            PromptThinking::kClosed);
  const ReasoningSyntax mistral = syntax("mistral");
  EXPECT_EQ(prompt_thinking(mistral, render("mistralai-Ministral-3-14B-Reasoning-2512.jinja")),
            PromptThinking::kMaybe);
  // Syntax-level rules: no opening marker means the output starts inside.
  ReasoningSyntax apriel = syntax("apriel");
  EXPECT_EQ(prompt_thinking(apriel, "<|assistant|>\nHere are my reasoning steps:\n"),
            PromptThinking::kOpen);
  apriel.markers.start.clear();
  EXPECT_EQ(prompt_thinking(apriel, "<|assistant|>\n"), PromptThinking::kOpen);
  EXPECT_EQ(prompt_thinking(think, "x<think></think>  \n"), PromptThinking::kClosed);
}

SplitText split(std::string_view name, ThinkingStart start, std::string_view text) {
  const ReasoningSyntax s = syntax(name);
  return split_reasoning(s, start, text);
}

void expect_split(const SplitText& got, std::string_view reasoning, std::string_view content) {
  EXPECT_EQ(got.reasoning, reasoning);
  EXPECT_EQ(got.content, content);
}

TEST(ReasoningSplit, ExactCases) {
  const ThinkingStart kMaybe = ThinkingStart::kMaybe, kOpen = ThinkingStart::kOpen;
  expect_split(split("think", kMaybe, "<think>\nOkay, 2+2.\n\n</think>\n\nIt is 4."), "Okay, 2+2.",
               "It is 4.");
  expect_split(split("think", kMaybe, "It is 4."), "", "It is 4.");
  expect_split(split("think", kMaybe, "  It is 4.  "), "", "  It is 4.  ");
  // The prompt opened the block (DeepSeek-R1).
  expect_split(split("think", kOpen, "Hmm.\n</think>\n\nFour."), "Hmm.", "Four.");
  // max_tokens inside the block: all reasoning.
  expect_split(split("think", kOpen, "Hmm, let me see </thi"), "Hmm, let me see </thi", "");
  expect_split(split("think", kMaybe, "<think>Hmm\n\n"), "Hmm", "");
  expect_split(split("mistral", kMaybe, "[THINK]a b[/THINK]c"), "a b", "c");
  expect_split(split("seed", kMaybe, "<seed:think>x</seed:think>y"), "x", "y");
  expect_split(split("gemma4", kMaybe, "<|channel>thought\nx\n<channel|>y"), "x", "y");
  expect_split(split("granite", kMaybe, "<think>x</think>\n<response>y</response>\n"), "x", "y");
  expect_split(split("granite", kMaybe, "<think>x</think>y</response> z"), "x", "y</response> z");
  expect_split(split("apriel", kOpen, "\nStep 1.\n[BEGIN FINAL RESPONSE]\nDone.\n[END FINAL RESPONSE]\n"),
               "Step 1.", "Done.\n");
  // Without a block the content's wrapper is not touched.
  expect_split(split("granite", kMaybe, "y</response>"), "", "y</response>");
}

// Every cut into 3 pieces, and byte by byte, gives the whole's split.
void expect_stream_equals_whole(std::string_view name, ThinkingStart start, const std::string& text) {
  const ReasoningSyntax s = syntax(name);
  const SplitText whole = split_reasoning(s, start, text);
  const auto run = [&](const std::vector<std::string_view>& pieces) {
    ReasoningSplitter sp(s, start);
    SplitText sum;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const SplitText d = sp.feed(pieces[i], i + 1 == pieces.size());
      sum.reasoning += d.reasoning;
      sum.content += d.content;
    }
    return sum;
  };
  const std::string_view t = text;
  for (size_t i = 0; i <= t.size(); ++i) {
    for (size_t j = i; j <= t.size(); ++j) {
      const SplitText got = run({t.substr(0, i), t.substr(i, j - i), t.substr(j)});
      ASSERT_EQ(got.reasoning, whole.reasoning) << name << " '" << text << "' cut " << i << "," << j;
      ASSERT_EQ(got.content, whole.content) << name << " '" << text << "' cut " << i << "," << j;
    }
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < t.size(); ++i) bytes.push_back(t.substr(i, 1));
  bytes.push_back("");  // the final event carries no text
  const SplitText got = run(bytes);
  EXPECT_EQ(got.reasoning, whole.reasoning) << name << " byte by byte";
  EXPECT_EQ(got.content, whole.content) << name << " byte by byte";
}

TEST(ReasoningSplit, StreamedEqualsWhole) {
  expect_stream_equals_whole("think", ThinkingStart::kMaybe,
                             "\n<think>\n a </thi b \n</think>\n\n c  </think> ");
  expect_stream_equals_whole("think", ThinkingStart::kMaybe, "<thin k>");
  expect_stream_equals_whole("think", ThinkingStart::kOpen, " x \n\n y \n");
  expect_stream_equals_whole("granite", ThinkingStart::kMaybe,
                             "<think>a</think> <respo <response> b </respons</response>\n");
  expect_stream_equals_whole("granite", ThinkingStart::kMaybe, "<think>a</think><response>b</response>c");
  expect_stream_equals_whole("apriel", ThinkingStart::kOpen,
                             "s [BEGIN FINAL RESPONSE] r [END FINAL [END FINAL RESPONSE] ");
}

TEST(ReasoningSplit, SeededRandomOutputsStreamLikeTheWhole) {
  const std::vector<std::string> atoms = {"<think>", "</think>", "<", "/", "think", ">", " ", "\n",
                                          "a", "<response>", "</response>", "</resp"};
  std::mt19937_64 rng(7);
  for (int n = 0; n < 300; ++n) {
    std::string text;
    const size_t len = rng() % 10;
    for (size_t i = 0; i < len; ++i) text += atoms[rng() % atoms.size()];
    const std::string name = n % 2 == 0 ? "think" : "granite";
    const ThinkingStart start = n % 3 == 0 ? ThinkingStart::kOpen : ThinkingStart::kMaybe;
    const ReasoningSyntax s = syntax(name);
    const SplitText whole = split_reasoning(s, start, text);
    ReasoningSplitter sp(s, start);
    SplitText sum;
    size_t at = 0;
    while (at < text.size()) {
      const size_t k = std::min(text.size() - at, 1 + rng() % 4);
      const SplitText d = sp.feed(std::string_view(text).substr(at, k), false);
      sum.reasoning += d.reasoning;
      sum.content += d.content;
      at += k;
    }
    const SplitText d = sp.feed("", true);
    ASSERT_EQ(sum.reasoning + d.reasoning, whole.reasoning) << "'" << text << "'";
    ASSERT_EQ(sum.content + d.content, whole.content) << "'" << text << "'";
  }
}

TEST(ReasoningSplit, ToolCallsInsideTheThinkingAreNotCalls) {
  const std::vector<std::string> names = {"get_weather"};
  const std::string text =
      "<think>\nI could answer <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Rome\"}}\n</tool_call> but the user asked for Paris.\n</think>\n\n<tool_call>\n{\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const SplitText s = split("think", ThinkingStart::kMaybe, text);
  EXPECT_NE(s.reasoning.find("Rome"), std::string::npos);
  const ParsedToolOutput calls = parse_tool_calls(ToolCallFormat::kHermes, s.content, true, names);
  ASSERT_EQ(calls.calls.size(), 1u);
  EXPECT_EQ(calls.calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(calls.content, "");
  // The block not yet closed: no call at all, however the thinking is cut.
  const SplitText open = split("think", ThinkingStart::kMaybe, text.substr(0, text.find("</think>")));
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::kHermes, open.content, true, names).calls.empty());
  EXPECT_EQ(open.content, "");
}

}  // namespace
}  // namespace arbor::chat
