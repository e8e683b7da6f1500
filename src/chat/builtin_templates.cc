// Built-in chat templates for `--chat-template NAME`: the chat_template fields of the reference
// models' tokenizer_config.json files, verbatim (JSON string escapes decoded; a `\n` inside a
// Jinja string literal is the two characters the model's file holds, which Jinja turns into a
// newline).
#include <array>
#include <utility>

#include "chat/chat_template.h"

namespace arbor::chat {
namespace {

// meta-llama/Llama-2-7b-chat-hf
constexpr std::string_view kLlama2 =
    R"jinja({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})jinja";

// meta-llama/Meta-Llama-3-8B-Instruct
constexpr std::string_view kLlama3 =
    R"jinja({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})jinja";

// Qwen/Qwen2-7B-Instruct: ChatML with a default system message when the conversation has none.
constexpr std::string_view kQwen2 =
    R"jinja({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})jinja";

// teknium/OpenHermes-2.5-Mistral-7B (plain ChatML)
constexpr std::string_view kChatml =
    R"jinja({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})jinja";

// mistralai/Mistral-7B-Instruct-v0.2 (the revision that accepts a leading system message)
constexpr std::string_view kMistral = R"jinja({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)jinja";

// HuggingFaceH4/zephyr-7b-beta (relies on trim_blocks: the newline after each `}}` is output)
constexpr std::string_view kZephyr = R"jinja({% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %})jinja";

// microsoft/Phi-3-mini-4k-instruct
constexpr std::string_view kPhi3 =
    R"jinja({% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %})jinja";

constexpr std::array<std::pair<std::string_view, std::string_view>, 7> kBuiltins = {{
    {"llama2", kLlama2},
    {"llama3", kLlama3},
    {"qwen2", kQwen2},
    {"chatml", kChatml},
    {"mistral", kMistral},
    {"zephyr", kZephyr},
    {"phi3", kPhi3},
}};

}  // namespace

std::vector<std::string_view> builtin_chat_template_names() {
  std::vector<std::string_view> names;
  for (const auto& [name, source] : kBuiltins) names.push_back(name);
  return names;
}

std::optional<std::string_view> builtin_chat_template_source(std::string_view name) {
  for (const auto& [n, source] : kBuiltins) {
    if (n == name) return source;
  }
  return std::nullopt;
}

}  // namespace arbor::chat
