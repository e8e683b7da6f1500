// Tool calling's text side: parsing calls out of model output (exact cases per format), the
// prefix-monotone promise that streaming depends on (every prefix of 20,000 seeded random
// outputs), the streamer's deltas adding up to the final parse, template detection, and the
// messages templates see (Qwen 3's real template against transformers' rendering).
#include "chat/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "chat/chat_template.h"
#include "chat/tool_prompt.h"
#include "support/shared_data.h"

namespace arbor::chat {
namespace {

using ojson = nlohmann::ordered_json;

const std::vector<std::string> kNames = {"f", "get_weather"};

ParsedToolOutput parse(ToolCallFormat format, std::string_view text, bool final = true) {
  return parse_tool_calls(format, text, final, kNames);
}

void expect_calls(const ParsedToolOutput& p, std::string_view content,
                  const std::vector<std::pair<std::string, std::string>>& calls) {
  EXPECT_EQ(p.content, content);
  ASSERT_EQ(p.calls.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(p.calls[i].name, calls[i].first) << i;
    EXPECT_EQ(p.calls[i].arguments, calls[i].second) << i;
  }
}

TEST(ToolCallParse, Hermes) {
  const auto H = ToolCallFormat::kHermes;
  expect_calls(parse(H, "Just text."), "Just text.", {});
  expect_calls(parse(H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, \"}\"]}}\n</tool_call>"),
               "", {{"f", "{\"a\": [1, \"}\"]}"}});
  expect_calls(parse(H, "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n"
                        "<tool_call>\n{\"arguments\": {\"city\": \"Paris\"}, \"name\": "
                        "\"get_weather\"}\n</tool_call>"),
               "Sure.\n", {{"f", "{}"}, {"get_weather", "{\"city\": \"Paris\"}"}});
  // No arguments: "{}"; "parameters" reads as arguments; other keys are skipped.
  expect_calls(parse(H, "<tool_call>{\"name\": \"f\", \"id\": 3}</tool_call>"), "", {{"f", "{}"}});
  expect_calls(parse(H, "<tool_call>{\"name\": \"f\", \"parameters\": {\"x\": 1}}</tool_call>"), "",
               {{"f", "{\"x\": 1}"}});
  // Unknown function, bad JSON before the name: text.
  expect_calls(parse(H, "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>"),
               "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>", {});
  expect_calls(parse(H, "a <tool_call>oops</tool_call> b"), "a <tool_call>oops</tool_call> b", {});
  // A bad call, then a good one: the bad one stays text.
  expect_calls(parse(H, "<tool_call>x</tool_call><tool_call>{\"name\": \"f\"}</tool_call>"),
               "<tool_call>x</tool_call>", {{"f", "{}"}});
  // Cut short (max_tokens): the arguments so far, and the call is not complete.
  const ParsedToolOutput cut = parse(H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"x");
  expect_calls(cut, "", {{"f", "{\"a\": \"x"}});
  EXPECT_FALSE(cut.calls[0].complete);
  // No closing tag: what follows is content; whitespace between calls is dropped.
  expect_calls(parse(H, "<tool_call>{\"name\": \"f\"} then text"), " then text", {{"f", "{}"}});
  expect_calls(parse(H, "<tool_call>{\"name\":\"f\"}</tool_call>\n \n"), "", {{"f", "{}"}});
  // Bad JSON after the name: the call stands, the rest is text.
  expect_calls(parse(H, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1} x"), "x",
               {{"f", "{\"a\": 1}"}});
}

TEST(ToolCallParse, HermesPartialHoldsBackWhatMayBecomeACall) {
  const auto H = ToolCallFormat::kHermes;
  expect_calls(parse(H, "Hi <tool_c", false), "Hi ", {});
  expect_calls(parse(H, "Hi <tool_c", true), "Hi <tool_c", {});
  expect_calls(parse(H, "<tool_call>\n{\"name\": \"get_wea", false), "", {});
  expect_calls(parse(H, "<tool_call>\n{\"name\": \"f\", \"argu", false), "", {{"f", ""}});
  expect_calls(parse(H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 12", false), "",
               {{"f", "{\"a\": 12"}});
  expect_calls(parse(H, "<tool_call>{\"name\": \"f\"}\n</tool", false), "", {{"f", "{}"}});
}

TEST(ToolCallParse, Llama3Json) {
  const auto L = ToolCallFormat::kLlama3Json;
  expect_calls(parse(L, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}"), "", {{"f", "{\"a\": 1}"}});
  expect_calls(parse(L, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}"), "", {{"f", "{}"}});
  expect_calls(parse(L, " {\"name\": \"f\", \"parameters\": {}}; {\"name\": \"get_weather\", "
                        "\"parameters\": {\"city\": \"Oslo\"}}"),
               "", {{"f", "{}"}, {"get_weather", "{\"city\": \"Oslo\"}"}});
  expect_calls(parse(L, "The answer is {1}."), "The answer is {1}.", {});
  expect_calls(parse(L, "{\"result\": 3}"), "{\"result\": 3}", {});
  expect_calls(parse(L, "{\"name\": \"nope\", \"parameters\": {}}"),
               "{\"name\": \"nope\", \"parameters\": {}}", {});
  expect_calls(parse(L, "{\"name\": \"f\"} and more"), " and more", {{"f", "{}"}});
  // Partial: a message that starts with "{" is held until it is known to be a call or not.
  expect_calls(parse(L, "  {\"na", false), "", {});
  expect_calls(parse(L, "  {\"na", true), "  {\"na", {});
  expect_calls(parse(L, "{\"name\": \"f\", \"parameters\": {\"a\"", false), "", {{"f", "{\"a\""}});
}

// Qwen3-Coder / Qwen3.5 XML calls: values typed as JSON when they read as a JSON value, strings
// otherwise (one newline each side dropped, the rest kept), parameters in order.
TEST(ToolCallParse, Qwen3CoderXml) {
  const ToolCallFormat Q = ToolCallFormat::kQwen3Coder;
  expect_calls(parse(Q, "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                        "Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                        "</tool_call>"),
               "Let me check.\n", {{"get_weather", "{\"city\": \"Paris\", \"days\": 3}"}});
  // Two calls, JSON values, a string with quotes and lines, no parameters.
  expect_calls(parse(Q, "<tool_call>\n<function=f>\n<parameter=o>\n{\"a\": [1, true]}\n"
                        "</parameter>\n<parameter=s>\nsay \"hi\"\nand go\n</parameter>\n"
                        "<parameter=n>\n-2.5e3\n</parameter>\n<parameter=b>\nfalse\n</parameter>\n"
                        "<parameter=t>\n12 apples\n</parameter>\n</function>\n</tool_call>\n"
                        "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"),
               "", {{"f", "{\"o\": {\"a\": [1, true]}, \"s\": \"say \\\"hi\\\"\\nand go\", "
                          "\"n\": -2.5e3, \"b\": false, \"t\": \"12 apples\"}"},
                    {"get_weather", "{}"}});
  // An unknown function is text; a partial call holds back, then streams a parameter at a time.
  expect_calls(parse(Q, "<tool_call>\n<function=g>\n</function>\n</tool_call>"),
               "<tool_call>\n<function=g>\n</function>\n</tool_call>", {});
  expect_calls(parse(Q, "ok <tool_call>\n<function=get_wea", false), "ok ", {});
  expect_calls(parse(Q, "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<param", false),
               "", {{"f", "{\"a\": 1"}});
  const ParsedToolOutput p = parse(Q, "<tool_call>\n<function=f>\n<parameter=a>\n12", false);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{");
  EXPECT_FALSE(p.calls[0].complete);
  EXPECT_EQ(parse_tool_call_format("qwen3_coder"), Q);
}

// `p` describes a prefix of `full` (tool_calls.h's promise).
::testing::AssertionResult is_prefix_parse(const ParsedToolOutput& p, const ParsedToolOutput& full) {
  if (!full.content.starts_with(p.content)) {
    return ::testing::AssertionFailure() << "content '" << p.content << "' vs '" << full.content << "'";
  }
  if (p.calls.size() > full.calls.size()) return ::testing::AssertionFailure() << "more calls";
  for (size_t i = 0; i < p.calls.size(); ++i) {
    if (p.calls[i].name != full.calls[i].name) return ::testing::AssertionFailure() << "name " << i;
    if (!full.calls[i].arguments.starts_with(p.calls[i].arguments)) {
      return ::testing::AssertionFailure() << "arguments " << i << ": '" << p.calls[i].arguments
                                           << "' vs '" << full.calls[i].arguments << "'";
    }
  }
  return ::testing::AssertionSuccess();
}

// Random outputs built from the pieces that matter to both formats.
std::string random_output(std::mt19937& rng) {
  static const std::vector<std::string> kPieces = {
      "<tool_call>", "</tool_call>", "\n", " ", "{", "}", "[", "]", "\"name\"", "\"arguments\"",
      "\"parameters\"", ":", ",", "\"f\"", "\"get_weather\"", "\"g\"", "\"x\"", "1", "-2.5",
      "hello", "<tool_c", ";", "<|python_tag|>", "\"a\\\"}\"", "true",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": ", "{\"name\": \"get_weather\", \"parameters\": ",
      // Qwen3-Coder XML pieces.
      "<function=f>", "<function=get_weather>\n", "<function=", "<parameter=a>", "<parameter=",
      "</parameter>", "</function>", "<tool_call>\n<function=f>\n<parameter=x>\n", "\n</parameter>\n",
      "</parame"};
  std::uniform_int_distribution<size_t> piece(0, kPieces.size() - 1);
  std::uniform_int_distribution<int> length(0, 24);
  std::string out;
  for (int n = length(rng); n > 0; --n) out += kPieces[piece(rng)];
  return out;
}

TEST(ToolCallParse, EveryPrefixOfRandomOutputsIsAPrefixOfTheFinalParse) {
  const uint32_t seed = 20261125;
  std::mt19937 rng(seed);
  int with_calls = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::string text = random_output(rng);
    for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
                                  ToolCallFormat::kQwen3Coder}) {
      const ParsedToolOutput full = parse(format, text, true);
      with_calls += !full.calls.empty();
      for (size_t n = 0; n <= text.size(); ++n) {
        ASSERT_TRUE(is_prefix_parse(parse(format, text.substr(0, n), false), full))
            << "seed " << seed << " output " << i << " format " << tool_call_format_name(format)
            << " prefix " << n << ": '" << text << "'";
      }
      // The streamer, fed byte by byte, sends exactly the final parse.
      ToolCallStreamer streamer(format, kNames);
      std::string content;
      std::vector<std::pair<std::string, std::string>> calls;
      for (size_t n = 0; n <= text.size(); ++n) {
        const ToolCallStreamer::Step step = streamer.update(text.substr(0, n), n == text.size());
        content += step.content;
        for (const ToolCallDelta& d : step.calls) {
          if (d.first) {
            ASSERT_EQ(d.index, static_cast<int32_t>(calls.size()));
            calls.emplace_back(d.name, "");
          }
          calls.at(static_cast<size_t>(d.index)).second += d.arguments;
        }
      }
      EXPECT_EQ(content, full.content) << "output " << i << ": '" << text << "'";
      ASSERT_EQ(calls.size(), full.calls.size()) << "output " << i << ": '" << text << "'";
      for (size_t c = 0; c < calls.size(); ++c) {
        EXPECT_EQ(calls[c].first, full.calls[c].name);
        EXPECT_EQ(calls[c].second, full.calls[c].arguments);
      }
    }
  }
  EXPECT_GT(with_calls, 1000);  // the corpus exercises calls, not only text
}

TEST(ToolSupport, DetectedFromTheTemplate) {
  for (std::string_view name : builtin_chat_template_names()) {
    const TemplateToolSupport s = detect_tool_support(*builtin_chat_template_source(name));
    EXPECT_FALSE(s.renders_tools) << name;  // the builtins are the reference models' originals
    EXPECT_EQ(s.format, ToolCallFormat::kHermes) << name;
  }
  TemplateToolSupport s = detect_tool_support("{% if tools %}<tool_call>{% endif %}");
  EXPECT_TRUE(s.renders_tools);
  EXPECT_EQ(s.format, ToolCallFormat::kHermes);
  s = detect_tool_support("{% for t in tools %}<|start_header_id|>ipython{% endfor %}");
  EXPECT_TRUE(s.renders_tools);
  EXPECT_EQ(s.format, ToolCallFormat::kLlama3Json);
  s = detect_tool_support("{% if tools %}<tool_call>\n<function=x>\n<parameter=y>{% endif %}");
  EXPECT_TRUE(s.renders_tools);
  EXPECT_EQ(s.format, ToolCallFormat::kQwen3Coder);
  // Qwen3.5's own template.
  std::ifstream in(test::shared_path("templates/Qwen3.5-4B.jinja"));
  ASSERT_TRUE(in.good()) << "templates/Qwen3.5-4B.jinja";
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(detect_tool_support(source).format, ToolCallFormat::kQwen3Coder);
  s = detect_tool_support("{{ toolset }}");  // a word that merely contains "tools"
  EXPECT_FALSE(s.renders_tools);
  EXPECT_EQ(parse_tool_call_format("llama3_json"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(parse_tool_call_format("auto"), std::nullopt);
}

ojson conversation() {
  return ojson::parse(R"([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris, and 2+3?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}},
      {"id": "call_2", "type": "function",
       "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "5"}])");
}

ojson tools() {
  return ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
     "parameters": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]},
                    "city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Adds",
     "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                    "b": {"type": "integer"}}}}}])");
}

// Qwen 3's own template, given OpenAI messages: the text transformers renders for the same
// conversation (jinja2 3.1.6 with transformers' tojson, arguments passed as objects).
TEST(ToolPrompt, Qwen3TemplateRendersToolsAsTransformersDoes) {
  ASSERT_TRUE(test::require_shared_file("tokenizers/hf/qwen3/tokenizer_config.json"));
  std::ifstream in(test::shared_path("tokenizers/hf/qwen3/tokenizer_config.json"));
  const Result<TokenizerChatConfig> config = read_tokenizer_chat_config(nlohmann::json::parse(in));
  ASSERT_TRUE(config.ok() && config->chat_template);
  const Result<ChatTemplate> t = ChatTemplate::parse(*config->chat_template);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const TemplateToolSupport support = detect_tool_support(t->source());
  EXPECT_TRUE(support.renders_tools);
  EXPECT_EQ(support.format, ToolCallFormat::kHermes);
  Result<ojson> messages = template_messages(conversation(), tools(), true);
  ASSERT_TRUE(messages.ok()) << messages.status().to_string();
  ChatRenderOptions opts;
  opts.eos_token = "<|im_end|>";
  opts.extra["tools"] = tools();
  const Result<std::string> text = t->render_json(*messages, opts);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions "
            "to assist with the user query.\n\nYou are provided with function signatures within "
            "<tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
            "\"get_weather\", \"description\": \"Current weather\", \"parameters\": {\"type\": "
            "\"object\", \"properties\": {\"unit\": {\"enum\": [\"c\", \"f\"]}, \"city\": {\"type\": "
            "\"string\"}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": "
            "{\"name\": \"add\", \"description\": \"Adds\", \"parameters\": {\"type\": \"object\", "
            "\"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"integer\"}}}}}\n"
            "</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
            "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\nWeather in Paris, and 2+3?<|im_end|>\n<|im_start|>assistant\n"
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
            "\"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": "
            "{\"a\": 2, \"b\": 3}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
            "18 C\n</tool_response>\n<tool_response>\n5\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

// A template without tools: the tools become a system message, calls and results text.
TEST(ToolPrompt, TemplatesWithoutToolsSeeThemAsText) {
  ojson messages = conversation();
  messages.push_back({{"role", "user"}, {"content", "Thanks!"}});
  Result<ojson> out = template_messages(messages, tools(), false);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), 4u);
  EXPECT_EQ((*out)[0]["role"], "system");
  EXPECT_EQ((*out)[0]["content"], "You are helpful.\n\n" + describe_tools(tools()));
  EXPECT_NE(describe_tools(tools()).find(tools()[0].dump()), std::string::npos);
  EXPECT_EQ((*out)[1], messages[1]);
  EXPECT_EQ((*out)[2], (ojson{{"role", "assistant"},
                              {"content",
                               "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":"
                               "\"Paris\",\"unit\":\"c\"}}\n</tool_call>\n<tool_call>\n{\"name\":"
                               "\"add\",\"arguments\":{\"a\":2,\"b\":3}}\n</tool_call>"}}));
  EXPECT_EQ((*out)[3], (ojson{{"role", "user"},
                              {"content",
                               "<tool_response>\n18 C\n</tool_response>\n<tool_response>\n5\n"
                               "</tool_response>\n\nThanks!"}}));
  // What the model is asked to write parses back.
  const ParsedToolOutput p = parse_tool_calls(ToolCallFormat::kHermes,
                                              (*out)[2]["content"].get<std::string>(), true,
                                              std::vector<std::string>{"get_weather", "add"});
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].arguments, "{\"a\":2,\"b\":3}");
  // The llama2 template (alternating roles) renders the rewritten conversation.
  const Result<std::string> text = builtin_chat_template("llama2")->render_json(*out, {});
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  // Without tools nothing is described, and a conversation without tool messages is unchanged.
  const ojson plain = ojson::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(*template_messages(plain, nullptr, false), plain);
}

}  // namespace
}  // namespace arbor::chat
