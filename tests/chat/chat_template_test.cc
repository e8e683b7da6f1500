// Chat templates: golden renderings of every built-in family, the real templates shipped in
// shared/tokenizers, and unit tests of the Jinja interpreter (syntax, semantics, errors, limits).
#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include "chat/jinja.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

namespace arbor::chat {
namespace {

using nlohmann::json;

const ChatMessage kSystem{"system", "You are a terse assistant.", std::nullopt};
const ChatMessage kUser1{"user", "Hello!", std::nullopt};
const ChatMessage kAssistant1{"assistant", "Hi there, how can I help?", std::nullopt};
const ChatMessage kUser2{"user", "What is 2+2?", std::nullopt};

const std::vector<ChatMessage> kWithSystem = {kSystem, kUser1, kAssistant1, kUser2};
const std::vector<ChatMessage> kNoSystem = {kUser1, kAssistant1, kUser2};

std::string render_builtin(std::string_view name, const std::vector<ChatMessage>& messages,
                           bool gen, const std::string& bos, const std::string& eos) {
  Result<ChatTemplate> t = builtin_chat_template(name);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return "";
  ChatRenderOptions opts;
  opts.add_generation_prompt = gen;
  opts.bos_token = bos;
  opts.eos_token = eos;
  Result<std::string> r = t->render(messages, opts);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : "";
}

// ---- Golden renderings of the built-in families ----

TEST(ChatTemplateGolden, Llama2) {
  EXPECT_EQ(render_builtin("llama2", kWithSystem, true, "<s>", "</s>"),
            "<s>[INST] <<SYS>>\nYou are a terse assistant.\n<</SYS>>\n\nHello! [/INST] Hi there, "
            "how can I help? "
            "</s><s>[INST] What is 2+2? [/INST]");
  // Llama 2 has no generation prompt: the output ends with [/INST] either way.
  EXPECT_EQ(
      render_builtin("llama2", kNoSystem, false, "<s>", "</s>"),
      "<s>[INST] Hello! [/INST] Hi there, how can I help? </s><s>[INST] What is 2+2? [/INST]");
}

TEST(ChatTemplateGolden, Llama3) {
  const std::string head =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a terse "
      "assistant.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHi there, how can I help?<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>";
  EXPECT_EQ(render_builtin("llama3", kWithSystem, true, "<|begin_of_text|>", "<|eot_id|>"),
            head + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_builtin("llama3", kWithSystem, false, "<|begin_of_text|>", "<|eot_id|>"), head);
  EXPECT_EQ(render_builtin("llama3", kNoSystem, true, "<|begin_of_text|>", "<|eot_id|>"),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHi there, how can I help?<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateGolden, Llama3TrimsContent) {
  // `message['content'] | trim`: the filter binds to the content only, not to the concatenation.
  const std::vector<ChatMessage> padded = {{"user", "  spaced out \n", std::nullopt}};
  EXPECT_EQ(render_builtin("llama3", padded, false, "<B>", ""),
            "<B><|start_header_id|>user<|end_header_id|>\n\nspaced out<|eot_id|>");
}

TEST(ChatTemplateGolden, Qwen2) {
  EXPECT_EQ(render_builtin("qwen2", kWithSystem, true, "", "<|im_end|>"),
            "<|im_start|>system\nYou are a terse "
            "assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
            "<|im_start|>assistant\nHi there, how can I help?<|im_end|>\n<|im_start|>user\nWhat is "
            "2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  // Without a system message Qwen2 inserts its default one.
  EXPECT_EQ(render_builtin("qwen2", kNoSystem, false, "", "<|im_end|>"),
            "<|im_start|>system\nYou are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
            "<|im_start|>assistant\nHi there, how can I help?<|im_end|>\n<|im_start|>user\nWhat is "
            "2+2?<|im_end|>\n");
}

TEST(ChatTemplateGolden, Chatml) {
  EXPECT_EQ(render_builtin("chatml", kNoSystem, true, "", ""),
            "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi there, how can I "
            "help?<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_builtin("chatml", kWithSystem, false, "", ""),
            "<|im_start|>system\nYou are a terse "
            "assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
            "<|im_start|>assistant\nHi there, how can I help?<|im_end|>\n<|im_start|>user\nWhat is "
            "2+2?<|im_end|>\n");
}

TEST(ChatTemplateGolden, Mistral) {
  EXPECT_EQ(render_builtin("mistral", kWithSystem, true, "<s>", "</s>"),
            "<s> [INST] You are a terse assistant.\n\nHello! [/INST] Hi there, how can I help?</s> "
            "[INST] What is "
            "2+2? [/INST]");
  EXPECT_EQ(render_builtin("mistral", kNoSystem, false, "<s>", "</s>"),
            "<s> [INST] Hello! [/INST] Hi there, how can I help?</s> [INST] What is 2+2? [/INST]");
}

TEST(ChatTemplateGolden, Zephyr) {
  EXPECT_EQ(render_builtin("zephyr", kWithSystem, true, "<s>", "</s>"),
            "<|system|>\nYou are a terse assistant.</s>\n<|user|>\nHello!</s>\n<|assistant|>\nHi "
            "there, how can I "
            "help?</s>\n<|user|>\nWhat is 2+2?</s>\n<|assistant|>\n");
  EXPECT_EQ(render_builtin("zephyr", kNoSystem, false, "<s>", "</s>"),
            "<|user|>\nHello!</s>\n<|assistant|>\nHi there, how can I help?</s>\n<|user|>\nWhat is "
            "2+2?</s>\n");
}

TEST(ChatTemplateGolden, Phi3) {
  EXPECT_EQ(render_builtin("phi3", kWithSystem, true, "<s>", "<|endoftext|>"),
            "<|system|>\nYou are a terse "
            "assistant.<|end|>\n<|user|>\nHello!<|end|>\n<|assistant|>\nHi there, how "
            "can I help?<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n");
  // Without the generation prompt Phi-3 closes with the eos token.
  EXPECT_EQ(
      render_builtin("phi3", kNoSystem, false, "<s>", "<|endoftext|>"),
      "<|user|>\nHello!<|end|>\n<|assistant|>\nHi there, how can I help?<|end|>\n<|user|>\nWhat is "
      "2+2?<|end|>\n<|endoftext|>");
}

TEST(ChatTemplateGolden, AlternationErrorsComeFromTheTemplate) {
  const std::vector<ChatMessage> two_users = {kUser1, kUser2};
  for (const char* name : {"llama2", "mistral"}) {
    Result<ChatTemplate> t = builtin_chat_template(name);
    ASSERT_TRUE(t.ok());
    Result<std::string> r = t->render(two_users, ChatRenderOptions{});
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(
                  "onversation roles must alternate user/assistant/user/assistant/..."),
              std::string::npos)
        << r.status().message();
  }
  Result<std::string> r = builtin_chat_template("llama2")->render(two_users, ChatRenderOptions{});
  EXPECT_EQ(r.status().message(),
            "Conversation roles must alternate user/assistant/user/assistant/...");
  const std::vector<ChatMessage> tool = {kUser1, {"tool", "42", std::nullopt}};
  r = builtin_chat_template("mistral")->render(tool, ChatRenderOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "Only user and assistant roles are supported, with the exception of an initial "
            "optional system message!");
}

TEST(ChatTemplateBuiltins, NamesSourcesAndDetection) {
  const std::vector<std::string_view> names = builtin_chat_template_names();
  EXPECT_EQ(names, (std::vector<std::string_view>{"llama2", "llama3", "qwen2", "chatml", "mistral",
                                                  "zephyr", "phi3"}));
  for (std::string_view name : names) {
    std::optional<std::string_view> src = builtin_chat_template_source(name);
    ASSERT_TRUE(src.has_value()) << name;
    EXPECT_EQ(detect_template_family(*src), name);
    EXPECT_EQ(builtin_chat_template(name)->source(), *src);
  }
  EXPECT_EQ(detect_template_family("{{ messages }}"), "unknown");
  Result<ChatTemplate> bad = builtin_chat_template("vicuna");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("llama2, llama3, qwen2, chatml, mistral, zephyr, phi3"),
            std::string::npos)
      << bad.status().message();
}

// ---- The real templates in shared/tokenizers ----

// shared/<rel> parsed; discarded (and the test failed, naming the path) when it is missing.
json read_shared_json(const std::string& rel) {
  EXPECT_TRUE(test::require_shared_file(rel));
  return json::parse(test::read_file(test::shared_path(rel)), nullptr,
                     /*allow_exceptions=*/false);
}

TEST(ChatTemplateShared, Llama3TokenizerConfig) {
  const json config = read_shared_json("tokenizers/hf/llama3/tokenizer_config.json");
  ASSERT_TRUE(config.is_object());
  Result<TokenizerChatConfig> cfg = read_tokenizer_chat_config(config);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  ASSERT_TRUE(cfg->chat_template.has_value());
  EXPECT_EQ(cfg->bos_token, "<|begin_of_text|>");
  EXPECT_EQ(detect_template_family(*cfg->chat_template), "llama3");
  Result<ChatTemplate> t = ChatTemplate::parse(*cfg->chat_template);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ChatRenderOptions opts;
  opts.bos_token = cfg->bos_token;
  opts.eos_token = cfg->eos_token;
  // This (base-model) template always appends the assistant header.
  Result<std::string> r = t->render({kUser1}, opts);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateShared, Qwen3TokenizerConfig) {
  const json config = read_shared_json("tokenizers/hf/qwen3/tokenizer_config.json");
  ASSERT_TRUE(config.is_object());
  Result<TokenizerChatConfig> cfg = read_tokenizer_chat_config(config);
  ASSERT_TRUE(cfg.ok() && cfg->chat_template.has_value());
  Result<ChatTemplate> t = ChatTemplate::parse(*cfg->chat_template);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ChatRenderOptions opts;
  opts.eos_token = cfg->eos_token;
  Result<std::string> r = t->render(kWithSystem, opts);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r,
            "<|im_start|>system\nYou are a terse "
            "assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
            "<|im_start|>assistant\nHi there, how can I help?<|im_end|>\n<|im_start|>user\nWhat is "
            "2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  // Extra variables reach the template: enable_thinking=false pre-fills an empty think block.
  opts.extra = {{"enable_thinking", false}};
  r = t->render({kUser1}, opts);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r,
            "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Reasoning in an earlier assistant turn is split off by str methods (split, lstrip, rstrip).
  const json messages = json::parse(R"([
      {"role": "user", "content": "Q1"},
      {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA1"},
      {"role": "user", "content": [{"type": "text", "text": "Q"}, {"type": "text", "text": "2"}]}])");
  opts.extra = json::object();
  // Content parts as given: this template calls content.startswith, which a list lacks, so it
  // fails as it does in jinja2; flattened, the parts are one string.
  r = t->render_json(messages, opts);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("startswith is undefined"), std::string::npos)
      << r.status().message();
  opts.content_parts = ContentParts::kFlattenText;
  r = t->render_json(messages, opts);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r,
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>"
            "user\nQ2<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateShared, Qwen3ToolsKeepTheClientsKeyOrder) {
  const json config = read_shared_json("tokenizers/hf/qwen3/tokenizer_config.json");
  Result<ChatTemplate> t = ChatTemplate::parse(config.value("chat_template", ""));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ChatRenderOptions opts;
  opts.extra["tools"] =
      nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
      {"role": "tool", "content": "20C"}])");
  Result<std::string> r = t->render_json(messages, opts);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(
      *r,
      "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "
      "query.\n\nYou "
      "are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": "
      "\"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", "
      "\"parameters\": "
      "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
      "\"string\"}}}}}\n</tools>\n\nFor each "
      "function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> "
      "XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
      "</"
      "tool_call><|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"
      "\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"c\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n20C\n</"
      "tool_response><|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateShared, HostileJsonDepthIsRejected) {
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += '[';
  for (int i = 0; i < 100000; ++i) deep += ']';
  ChatRenderOptions opts;
  opts.extra["x"] = nlohmann::ordered_json::parse(deep);
  Result<std::string> r = builtin_chat_template("chatml")->render({kUser1}, opts);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("deeper than"), std::string::npos) << r.status().message();
  json messages = json::array({{{"role", "user"}, {"content", "x"}, {"meta", json::parse(deep)}}});
  r = builtin_chat_template("chatml")->render_json(messages, ChatRenderOptions{});
  ASSERT_FALSE(r.ok());
}

// ---- OpenAI message helpers ----

TEST(ChatMessages, FlattenContent) {
  EXPECT_EQ(*flatten_message_content(json("plain")), "plain");
  EXPECT_EQ(*flatten_message_content(json(nullptr)), "");
  EXPECT_EQ(*flatten_message_content(
                json::parse(R"([{"type":"text","text":"a"},{"type":"text","text":"b"}])")),
            "ab");
  Result<std::string> image =
      flatten_message_content(json::parse(R"([{"type":"image_url","image_url":{}}])"));
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("image_url"), std::string::npos);
  EXPECT_FALSE(flatten_message_content(json(3)).ok());
  EXPECT_FALSE(flatten_message_content(json::parse(R"([{"type":"text"}])")).ok());
}

TEST(ChatMessages, ParseMessages) {
  Result<std::vector<ChatMessage>> m = parse_chat_messages(json::parse(
      R"([{"role":"user","content":[{"type":"text","text":"hi"}],"name":"bob"},
          {"role":"assistant","content":null,"reasoning_content":"think",
           "tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
          {"role":"tool","content":"42","tool_call_id":"c1","extra":1}])"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0].content, json::parse(R"([{"type":"text","text":"hi"}])"));
  EXPECT_EQ((*m)[0].name, std::optional<std::string>("bob"));
  EXPECT_TRUE((*m)[1].content.is_null());
  EXPECT_EQ((*m)[1].reasoning_content, std::optional<std::string>("think"));
  EXPECT_EQ((*m)[1].tool_calls[0]["function"]["name"], "f");
  EXPECT_EQ((*m)[2].tool_call_id, std::optional<std::string>("c1"));
  // The JSON the template sees: OpenAI's field order, only the fields that are set.
  EXPECT_EQ(chat_message_json((*m)[1]).dump(),
            R"({"role":"assistant","content":null,"tool_calls":[{"function":{"arguments":"{}",)"
            R"("name":"f"},"id":"c1","type":"function"}],"reasoning_content":"think"})");
  EXPECT_EQ(chat_message_json((*m)[2]).dump(),
            R"({"role":"tool","content":"42","tool_call_id":"c1"})");
  EXPECT_FALSE(parse_chat_messages(json::parse(R"([{"role":"tool","tool_call_id":3}])")).ok());
  EXPECT_FALSE(parse_chat_messages(json::parse(R"([{"role":"user","content":3}])")).ok());
  Result<std::vector<ChatMessage>> bad =
      parse_chat_messages(json::parse(R"([{"role":"user"},{"content":"x"}])"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("messages[1].role"), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(parse_chat_messages(json::object()).ok());
}

TEST(ChatMessages, TokenizerConfigForms) {
  const json config =
      json::parse(R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
      "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  Result<TokenizerChatConfig> cfg = read_tokenizer_chat_config(config);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->bos_token, "<s>");
  EXPECT_EQ(cfg->eos_token, "</s>");
  EXPECT_EQ(cfg->chat_template, std::optional<std::string>("D"));
  EXPECT_FALSE(read_tokenizer_chat_config(
                   json::parse(R"({"chat_template": [{"name": "x", "template": "y"}]})"))
                   .ok());
  EXPECT_FALSE(read_tokenizer_chat_config(json::parse(R"({"bos_token": "<s>"})"))
                   ->chat_template.has_value());
}

TEST(ChatMessages, ExtraMustBeAnObject) {
  ChatRenderOptions opts;
  opts.extra = json::array();
  EXPECT_FALSE(builtin_chat_template("chatml")->render({kUser1}, opts).ok());
}

// ---- The Jinja interpreter ----

Result<std::string> jinja_render(std::string_view src, const json& vars = json::object(),
                                 const jinja::RenderLimits& limits = {}) {
  ARBOR_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::parse(std::string(src)));
  return t.render(jinja::Value::from_json(vars), limits);
}

std::string render_ok(std::string_view src, const json& vars = json::object()) {
  Result<std::string> r = jinja_render(src, vars);
  EXPECT_TRUE(r.ok()) << src << " -> " << r.status().to_string();
  return r.ok() ? *r : "<error>";
}

const json kVars =
    json::parse(R"({"xs": [1, 2, 3], "s": "  Hello World  ", "d": {"a": [1, 2], "b": 1},
    "messages": [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi there"}]})");

TEST(Jinja, TextAndComments) {
  EXPECT_EQ(render_ok(""), "");
  EXPECT_EQ(render_ok("plain {# gone #}text"), "plain text");
  EXPECT_EQ(render_ok("one trailing newline is dropped\n"), "one trailing newline is dropped");
  EXPECT_EQ(render_ok("{{ 'a' }}{{ \"b\" }}{{ 'c' 'd' }}"), "abcd");
}

TEST(Jinja, WhitespaceControl) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks drops indentation before one.
  EXPECT_EQ(
      render_ok(
          "  {% if true %}\n    yes\n  {% endif %}\n  {{ 'x' }}\n  {%- if true -%}   trimmed   "
          "{%- endif %}\n{# comment #}\nafter"),
      "    yes\n  xtrimmedafter");
  EXPECT_EQ(render_ok("{%+ if true %}keep{% endif %}  {{- 'a' -}}  b"), "keepab");
  // `{{ }}` is not a block: the newline after it stays, indentation before it stays.
  EXPECT_EQ(render_ok("a\n  {{ 1 }}\nb"), "a\n  1\nb");
  EXPECT_EQ(render_ok("{% if true +%}\nkept newline{% endif %}"), "\nkept newline");
  EXPECT_EQ(render_ok("x {% if true %}y{% endif %}"), "x y");
  EXPECT_EQ(render_ok("{%- set x = 5 -%}\n    {{ x }}"), "5");
}

TEST(Jinja, LoopVariables) {
  EXPECT_EQ(
      render_ok(
          "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.first }}/{{ loop.last }}/"
          "{{ loop.length }}/{{ loop.revindex }};{% endfor %}",
          kVars),
      "1/0/True/False/3/3;2/1/False/False/3/2;3/2/False/True/3/1;");
  EXPECT_EQ(
      render_ok("{% for x in xs %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }} {% endfor %}",
                kVars),
      "<1>2 1<2>3 2<3> ");
}

TEST(Jinja, ForFilterElseAndControl) {
  EXPECT_EQ(
      render_ok("{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|"
                "{% for x in [] %}a{% else %}empty{% endfor %}",
                kVars),
      "2232|empty");
  EXPECT_EQ(
      render_ok(
          "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}"
          "{% endif %}{{ x }}{% endfor %}",
          kVars),
      "1");
  EXPECT_EQ(render_ok("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", kVars),
            "a=[1, 2];b=1;");
  EXPECT_EQ(render_ok("{% for c in 'hé' %}[{{ c }}]{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
                      kVars),
            "[h][é]ab");
  EXPECT_EQ(render_ok("{% for x in nothing %}x{% endfor %}"), "");
}

TEST(Jinja, ScopingAndNamespace) {
  // A set inside a loop does not leak out of it (nor into the next iteration); if has no scope.
  EXPECT_EQ(
      render_ok("{% set a = 'outer' %}{% for x in xs %}{{ a }}{% set a = x %}{% endfor %}{{ a }}"
                "{% if true %}{% set a = 'if' %}{% endif %}{{ a }}",
                kVars),
      "outerouterouterouterif");
  EXPECT_EQ(render_ok("{% set ns = namespace(total=0, found=false) %}{% for x in xs %}{% set "
                      "ns.total = ns.total + x "
                      "%}{% endfor %}{{ ns.total }} {{ ns.found }}",
                      kVars),
            "6 False");
  EXPECT_EQ(
      render_ok(
          "{% set ns = namespace() %}{% set ns.i = 0 %}{% for x in xs %}{% set ns.i = ns.i + 1 %}"
          "{% endfor %}{{ ns.i }}",
          kVars),
      "3");
  EXPECT_EQ(render_ok("{% set k, v = ['p', 'q'] %}{{ k }}{{ v }}{% set t = 1, 2 %}{{ t }}"),
            "pq(1, 2)");
  EXPECT_EQ(render_ok("{% set blk %}inner {{ 1 + 1 }}{% endset %}[{{ blk }}]"), "[inner 2]");
  Result<std::string> r = jinja_render("{% set d = {'a': 1} %}{% set d.a = 2 %}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("namespace"), std::string::npos) << r.status().message();
}

TEST(Jinja, Macros) {
  EXPECT_EQ(
      render_ok("{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}"
                "{{ greet('Bob') }} {{ greet('Al', greeting='Hi') }} {{ greet('X', 'Yo') }}"),
      "Hello, Bob! Hi, Al! Yo, X!");
  EXPECT_FALSE(jinja_render("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").ok());
}

TEST(Jinja, LiteralsAndPrinting) {
  EXPECT_EQ(render_ok("{{ [1, 'a', none, true, 1.5] }} {{ {'k': 'v', 'n': None} }} {{ none }} {{ "
                      "True }} {{ 1.0 }} "
                      "{{ 3.14159 }} {{ 1e20 }} {{ \"it's\" }} {{ [\"it's\"] }}"),
            "[1, 'a', None, True, 1.5] {'k': 'v', 'n': None} None True 1.0 3.14159 1e+20 it's "
            "[\"it's\"]");
  EXPECT_EQ(render_ok(R"({{ "\u00e9\t\\x\n" }})"), "é\t\\x\n");
  EXPECT_EQ(render_ok("{{ undefined_thing }}|{{ xs.0 }}", kVars), "|1");
}

TEST(Jinja, Operators) {
  EXPECT_EQ(
      render_ok(
          "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** "
          "10 }} "
          "{{ 'a' ~ 1 ~ none }} {{ 1 == 1.0 }} {{ 'b' in 'abc' }} {{ 4 not in xs }} {{ not true }} "
          "{{ 1 < 2 and 2 <= 2 or false }} {{ 'y' if xs else 'n' }} {{ 'y' if [] else 'n' }} "
          "{{ 'q' if false }}",
          kVars),
      "7 3 -4 1 2 3.5 1024 a1None True True True False True y n ");
  EXPECT_EQ(
      render_ok(
          "{{ [1] + [2] }}{{ 'ab' * 2 }}{{ 'a' in d }}{{ 0 or 'x' }}{{ 1 and 2 }}{{ (1 + 2) * 3 }}",
          kVars),
      "[1, 2]ababTruex29");
  // Filters bind tighter than +: Llama 3's `'...' + content | trim + '...'`.
  EXPECT_EQ(render_ok("{{ '[' + s | trim + ']' }}", kVars), "[Hello World]");
  EXPECT_FALSE(jinja_render("{{ 'a' + 1 }}").ok());
  EXPECT_FALSE(jinja_render("{{ 1 // 0 }}").ok());
  EXPECT_FALSE(jinja_render("{{ 9223372036854775807 + 1 }}").ok());
}

TEST(Jinja, SubscriptsAndSlices) {
  EXPECT_EQ(
      render_ok(
          "{{ xs[1:] }}{{ xs[::-1] }}{{ xs[:-1] }}{{ xs[-1] }}{{ 'hello'[1:3] }}{{ 'hello'[::-1] }}"
          "{{ xs[10] }}{{ xs[-2:] }}{{ xs[::2] }}",
          kVars),
      "[2, 3][3, 2, 1][1, 2]3elolleh[2, 3][1, 3]");
  EXPECT_EQ(
      render_ok("{{ messages[0].role }}{{ messages[0]['content'] }}{{ messages[5] is defined }}"
                "{{ messages[0].nope is defined }}{{ messages[-1].content }}",
                kVars),
      "userHello!FalseFalseHi there");
  EXPECT_EQ(render_ok("{{ 'é' | length }}{{ 'héllo'[1] }}{{ 'héllo'[1:3] }}"), "1éél");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(
      render_ok(
          "{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ s | length }}|{{ xs | first }}|{{ xs "
          "| last }}|"
          "{{ xs | join(', ') }}|{{ undefined_var | default('dflt') }}|{{ '' | d('e', true) }}|"
          "{{ 42 | string }}|{{ '12' | int + 1 }}|{{ 'x' | int }}|{{ '2.5' | float }}|"
          "{{ 'hello world' | capitalize }}|{{ 'hello world' | title }}|{{ 'a-b-c' | replace('-', "
          "'+') }}|"
          "{{ xs | reverse | list }}|{{ 'abc' | reverse }}|{{ -3 | abs }}|{{ d | count }}",
          kVars),
      "Hello World|  HELLO WORLD  |  hello world  |15|1|3|1, 2, 3|dflt|e|42|13|0|2.5|Hello "
      "world|Hello World|"
      "a+b+c|[3, 2, 1]|cba|3|2");
  EXPECT_EQ(render_ok("{{ messages | map(attribute='role') | join(',') }}|"
                      "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|"
                      "{{ messages | rejectattr('role', 'equalto', 'user') | "
                      "map(attribute='content') | first }}|"
                      "{{ xs | select('odd') | list }}|{{ xs | reject('odd') | list }}|{{ xs | "
                      "map('string') | join('-') }}|"
                      "{{ d | items | map('first') | join }}",
                      kVars),
            "user,assistant|1|Hi there|[1, 3]|[2]|1-2-3|ab");
  Result<std::string> r = jinja_render("line one\n   {{ 'x' | no_such_filter }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("No filter named 'no_such_filter' found"), std::string::npos);
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().message();
}

TEST(Jinja, ToJson) {
  EXPECT_EQ(
      render_ok(
          "{{ xs | tojson }} {{ \"a\\\"b\\n<\" | tojson }} {{ 'ü' | tojson }} {{ [] | "
          "tojson(indent=2) }} "
          "{{ {'a': {}} | tojson(indent=2) }} {{ {'x': [1, {'y': none}], 'w': 1.5} | tojson }}",
          kVars),
      "[1, 2, 3] \"a\\\"b\\n<\" \"ü\" [] {\n  \"a\": {}\n} {\"x\": [1, {\"y\": null}], \"w\": "
      "1.5}");
  EXPECT_EQ(render_ok("{{ d | tojson(indent=2) }}", kVars),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": 1\n}");
  EXPECT_FALSE(jinja_render("{{ nothing | tojson }}").ok());
}

TEST(Jinja, Tests) {
  EXPECT_EQ(render_ok("{{ x is defined }}{{ xs is defined }}{{ none is none }}{{ 'a' is string "
                      "}}{{ 1 is number }}"
                      "{{ d is mapping }}{{ xs is iterable }}{{ xs is sequence }}{{ true is true "
                      "}}{{ false is false }}"
                      "{{ 1 is not string }}{{ undefined_thing is undefined }}{{ 1 is true }}{{ "
                      "'a' is mapping }}",
                      kVars),
            "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseFalse");
  EXPECT_EQ(
      render_ok(
          "{{ 5 is divisibleby 5 }}{{ 3 is odd }}{{ 4 is even }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}"
          "{{ 'x' is in ['x'] }}{{ not x is defined }}"),
      "TrueTrueTrueTrueTrueTrueTrue");
  EXPECT_FALSE(jinja_render("{{ 1 is frobnicated }}").ok());
}

TEST(Jinja, Methods) {
  EXPECT_EQ(
      render_ok(
          "{{ '  x  '.strip() }}|{{ 'xxhixx'.lstrip('x') }}|{{ 'xxhixx'.rstrip('x') }}|"
          "{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}|{{ 'a b  c'.split() "
          "}}|"
          "{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'ab'.upper() }}{{ 'AB'.lower() "
          "}}|"
          "{{ 'hello big world'.title() }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ d.keys() | list }}|"
          "{{ d.values() | list }}|{{ d.get('b') }}{{ d.get('zz') }}{{ d.get('zz', 7) }}|"
          "{{ '-'.join(['a', 'b']) }}",
          kVars),
      "x|hixx|xxhi|TrueTrue|['a', 'b', 'c']|['a', 'b', '', 'c']|['a', 'b,c']|ABab|Hello Big "
      "World|bba|"
      "['a', 'b']|[[1, 2], 1]|1None7|a-b");
  EXPECT_FALSE(jinja_render("{{ 'x'.nosuchmethod() }}").ok());
  // items() pairs and parenthesised tuples print as Python tuples.
  EXPECT_EQ(render_ok("{{ d.items() | list }} {{ d | items | first }} {{ (1,) }} {{ () }}", kVars),
            "[('a', [1, 2]), ('b', 1)] ('a', [1, 2]) (1,) ()");
}

TEST(Jinja, Globals) {
  EXPECT_EQ(render_ok("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {% for i in range(2) %}{{ "
                      "i }}{% endfor %}"
                      " {{ namespace(a=1).a }}{{ dict(a=2).a }}"),
            "[0, 1, 2] [1, 3, 5] 01 12");
  EXPECT_EQ(render_ok("{{ strftime_now('%Y') | length }}"), "4");
  Result<std::string> r =
      jinja_render("{% if true %}{{ raise_exception('boom here') }}{% endif %}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "boom here");
}

TEST(Jinja, UndefinedSemantics) {
  EXPECT_EQ(render_ok("[{{ nope }}]{% if nope %}x{% endif %}{{ nope | length }}{{ nope ~ 'a' }}"),
            "[]0a");
  Result<std::string> r = jinja_render("\n{{ nope.attr }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'nope' is undefined"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().message();
  EXPECT_FALSE(jinja_render("{{ nope + 1 }}").ok());
  EXPECT_FALSE(jinja_render("{{ nope() }}").ok());
}

void expect_syntax_error(std::string_view src, std::string_view where, std::string_view what) {
  Result<jinja::Template> t = jinja::Template::parse(std::string(src));
  ASSERT_FALSE(t.ok()) << src;
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(where), std::string::npos)
      << src << " -> " << t.status().message();
  EXPECT_NE(t.status().message().find(what), std::string::npos)
      << src << " -> " << t.status().message();
}

TEST(Jinja, SyntaxErrorsCarryPositions) {
  expect_syntax_error("{% if x %}never closed", "line 1", "endif");
  expect_syntax_error("ab\ncd {{ 1 + }}", "line 2, column 11", "unexpected '}}'");
  expect_syntax_error("{{ 'unterminated }}", "line 1, column 4", "unterminated string");
  expect_syntax_error("{% for %}{% endfor %}", "line 1, column 8", "expected a name");
  expect_syntax_error("{% endfor %}", "line 1", "unknown or unsupported tag 'endfor'");
  expect_syntax_error("{% if true %}{% endfor %}", "line 1", "unknown or unsupported tag 'endfor'");
  expect_syntax_error("{{ x", "line 1, column 1", "missing '}}'");
  expect_syntax_error("{# never closed", "line 1, column 1", "unclosed comment");
  expect_syntax_error("{% include 'x' %}", "line 1", "include");
  expect_syntax_error("{{ a ! b }}", "line 1, column 6", "unexpected character '!'");
  expect_syntax_error("{{ f(a=1, 2) }}", "line 1", "positional argument follows keyword argument");
}

TEST(Jinja, DeepNestingIsCappedNotACrash) {
  const std::string parens =
      "{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}";
  expect_syntax_error(parens, "line 1", "nesting is deeper than");
  std::string chain = "{{ 1";
  for (int i = 0; i < 10000; ++i) chain += " + 1";
  expect_syntax_error(chain + " }}", "line 1", "nesting is deeper than");
  std::string attrs = "{{ x";
  for (int i = 0; i < 10000; ++i) attrs += ".a";
  expect_syntax_error(attrs + " }}", "line 1", "nesting is deeper than");
  std::string nots = "{{ ";
  for (int i = 0; i < 10000; ++i) nots += "not ";
  expect_syntax_error(nots + "x }}", "line 1", "nesting is deeper than");
  std::string ifs;
  for (int i = 0; i < 10000; ++i) ifs += "{% if true %}";
  expect_syntax_error(ifs, "line 1", "nesting is deeper than");
  std::string lists = "{{ " + std::string(10000, '[') + std::string(10000, ']') + " }}";
  expect_syntax_error(lists, "line 1", "nesting is deeper than");
  // Moderate nesting is fine.
  EXPECT_EQ(render_ok("{{ " + std::string(30, '(') + "7" + std::string(30, ')') + " }}"), "7");
}

TEST(Jinja, RunawayRendersAreBounded) {
  jinja::RenderLimits limits;
  limits.max_steps = 100000;
  Result<std::string> r = jinja_render(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
      json::object(), limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("steps"), std::string::npos) << r.status().message();

  limits = jinja::RenderLimits{};
  limits.max_output_bytes = 1000;
  r = jinja_render("{% for i in range(2000) %}x{% endfor %}", json::object(), limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  // Doubling a string 100 times would need 2^100 bytes.
  r = jinja_render(
      "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% "
      "endfor %}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  r = jinja_render("{{ 'x' * 9000000000000000000 }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  r = jinja_render("{{ range(1000000000) | length }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  r = jinja_render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("macro calls nested deeper"), std::string::npos)
      << r.status().message();
}

TEST(Jinja, TemplateIsReusableAndCopyable) {
  Result<jinja::Template> t =
      jinja::Template::parse("{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(v) }}");
  ASSERT_TRUE(t.ok());
  const jinja::Template copy = *t;
  for (int i = 0; i < 3; ++i) {
    Result<std::string> r = copy.render(jinja::Value::from_json(json{{"v", i}}));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, str_cat("<", i, ">"));
  }
}

}  // namespace
}  // namespace arbor::chat
