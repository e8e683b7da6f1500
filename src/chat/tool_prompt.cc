#include "chat/tool_prompt.h"

#include "chat/chat_template.h"

namespace arbor::chat {

namespace {

using ojson = nlohmann::ordered_json;

Result<std::string> text_of(const ojson& message, size_t index) {
  if (!message.contains("content")) return std::string();
  Result<std::string> text = flatten_message_content(nlohmann::json(message["content"]));
  if (!text.ok()) return text.status().with_context(str_cat("messages[", index, "]"));
  return text;
}

// A call's arguments as the template should see them: the parsed JSON value, or the text itself
// when it is not JSON.
ojson arguments_value(const ojson& arguments) {
  if (!arguments.is_string()) return arguments;
  ojson parsed = ojson::parse(arguments.get<std::string>(), nullptr, false);
  return parsed.is_discarded() ? arguments : parsed;
}

// `{"name": ..., "arguments": ...}` of one OpenAI tool call, in Hermes' key order.
ojson call_object(const ojson& call) {
  const ojson& f = call.contains("function") ? call["function"] : call;
  ojson o = ojson::object();
  o["name"] = f.value("name", ojson(""));
  o["arguments"] = f.contains("arguments") ? arguments_value(f["arguments"]) : ojson::object();
  return o;
}

bool has_tool_calls(const ojson& m) {
  return m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty();
}

// Arguments parsed and a null content made "" (templates that render tools).
ojson normalise(const ojson& m) {
  ojson out = m;
  if (out.contains("content") && out["content"].is_null()) out["content"] = "";
  if (!has_tool_calls(m)) return out;
  for (ojson& call : out["tool_calls"]) {
    if (call.is_object() && call.contains("function") && call["function"].is_object() &&
        call["function"].contains("arguments")) {
      call["function"]["arguments"] = arguments_value(call["function"]["arguments"]);
    }
  }
  return out;
}

std::string hermes_call_text(const ojson& call) {
  return str_cat("<tool_call>\n", call_object(call).dump(), "\n</tool_call>");
}

}  // namespace

std::string describe_tools(const ojson& tools) {
  std::string out =
      "You can call functions to answer the user. The functions you may call are listed "
      "between <tools> and </tools>, one JSON description per line:\n<tools>";
  for (const ojson& t : tools) out += "\n" + t.dump();
  out +=
      "\n</tools>\n\nTo call a function, write a JSON object with its name and arguments between "
      "<tool_call> and </tool_call>:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<arguments-json-object>}\n</tool_call>\nThe results come back between <tool_response> and "
      "</tool_response>.";
  return out;
}

Result<ojson> template_messages(const ojson& messages, const ojson& tools,
                                bool template_renders_tools) {
  ojson out = ojson::array();
  if (template_renders_tools) {
    for (const ojson& m : messages) out.push_back(normalise(m));
    return out;
  }
  const bool describe = tools.is_array() && !tools.empty();
  size_t i = 0;
  if (describe) {
    std::string system = describe_tools(tools);
    if (!messages.empty() && messages[0].value("role", "") == "system") {
      ARBOR_ASSIGN_OR_RETURN(std::string text, text_of(messages[0], 0));
      if (!text.empty()) system = str_cat(text, "\n\n", system);
      i = 1;
    }
    out.push_back({{"role", "system"}, {"content", system}});
  }
  for (; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    const std::string role = m.value("role", "");
    if (role == "tool") {
      // A run of results, then the user message after it, become one user message.
      std::string text;
      for (; i < messages.size() && messages[i].value("role", "") == "tool"; ++i) {
        ARBOR_ASSIGN_OR_RETURN(std::string result, text_of(messages[i], i));
        text += str_cat(text.empty() ? "" : "\n", "<tool_response>\n", result, "\n</tool_response>");
      }
      if (i < messages.size() && messages[i].value("role", "") == "user") {
        ARBOR_ASSIGN_OR_RETURN(std::string user, text_of(messages[i], i));
        text += str_cat("\n\n", user);
      } else {
        --i;  // the loop's ++i moves on to the message after the results
      }
      out.push_back({{"role", "user"}, {"content", text}});
      continue;
    }
    if (role == "assistant" && has_tool_calls(m)) {
      ARBOR_ASSIGN_OR_RETURN(std::string text, text_of(m, i));
      for (const ojson& call : m["tool_calls"]) {
        text += str_cat(text.empty() ? "" : "\n", hermes_call_text(call));
      }
      out.push_back({{"role", "assistant"}, {"content", text}});
      continue;
    }
    out.push_back(normalise(m));
  }
  return out;
}

}  // namespace arbor::chat
