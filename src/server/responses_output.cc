#include "server/responses_output.h"

#include <chrono>

#include "server/response_store.h"

namespace arbor::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// How the response ended, in the Responses API's words.
struct Outcome {
  std::string status;       // "completed", "incomplete", "cancelled"
  json incomplete_details;  // null or {"reason": ...}
  std::string event;        // the closing event's type
};

Outcome outcome_of(const std::optional<sched::StopReason>& stop) {
  if (!stop) return {"completed", nullptr, "response.completed"};
  switch (stop->finish_reason()) {
    case sched::FinishReason::kStop: return {"completed", nullptr, "response.completed"};
    case sched::FinishReason::kLength:
      return {"incomplete", {{"reason", "max_output_tokens"}}, "response.incomplete"};
    case sched::FinishReason::kAbort: return {"cancelled", nullptr, "response.cancelled"};
  }
  return {"completed", nullptr, "response.completed"};
}

json usage_json(const engine::Usage& u, int64_t reasoning_tokens) {
  json j{{"input_tokens", u.prompt_tokens},
         {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
         {"output_tokens", u.completion_tokens},
         {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
         {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (u.draft_tokens > 0) j["speculation"] = speculation_usage_json(u);
  return j;
}

class ResponsesBuilder : public ResponseBuilder, private OutputPartListener {
 public:
  explicit ResponsesBuilder(ResponsesOutputOptions o)
      : o_(std::move(o)), reader_(o_.output), id_(random_id("resp_")),
        created_(std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()) {}

  bool streaming() const override { return o_.stream; }
  ApiFlavor flavor() const override { return ApiFlavor::kOpenAi; }
  void set_request_id(std::string_view request_id) override {
    id_ = str_cat("resp_", request_id);
  }
  std::string response_id() const override { return id_; }

  std::string on_event(const engine::StreamEvent& ev) override {
    if (ev.index != 0) return "";
    begin();
    if (ev.stop_reason) stop_ = ev.stop_reason;
    feed(ev.text, ev.stop_reason.has_value());
    if (!answered_) thinking_tokens_ += static_cast<int64_t>(ev.token_ids.size());
    return take();
  }

  std::string on_final(const engine::StreamEvent& ev) override {
    begin();
    if (!fed_final_) feed("", true);
    const Outcome outcome = outcome_of(stop_);
    closing_status_ = outcome.status == "completed" ? "completed" : "incomplete";
    parts_.close(*this);
    usage_ = usage_json(ev.usage, reasoned_ ? thinking_tokens_ : 0);
    if (outcome.status != "cancelled") keep_conversation();
    json r = response_json(outcome.status);
    r["incomplete_details"] = outcome.incomplete_details;
    if (!o_.stream) return dump_json(r);
    emit(outcome.event, {{"response", std::move(r)}});
    return take();
  }

  std::string on_stream_error(const ApiError& error) override {
    begin();
    const json code = error.code.empty() ? json(error.type) : json(error.code);
    emit("error", {{"code", code},
                   {"message", error.message},
                   {"param", error.param.empty() ? json(nullptr) : json(error.param)}});
    json r = response_json("failed");
    r["error"] = {{"code", code}, {"message", error.message}};
    emit("response.failed", {{"response", std::move(r)}});
    return take();
  }

 private:
  // The stream's first events (once).
  void begin() {
    if (begun_ || !o_.stream) return;
    begun_ = true;
    emit("response.created", {{"response", response_json("in_progress")}});
    emit("response.in_progress", {{"response", response_json("in_progress")}});
  }

  void feed(std::string_view text, bool final) {
    if (fed_final_) return;
    fed_final_ = final;
    parts_.apply(reader_.feed(text, final), *this);
  }

  void emit(const std::string& type, json data) {
    if (!o_.stream) return;
    data["type"] = type;
    data["sequence_number"] = sequence_++;
    out_ += str_cat("event: ", type, "\ndata: ", dump_json(data), "\n\n");
  }

  std::string take() { return std::exchange(out_, std::string()); }

  json response_json(const std::string& status) const {
    json r{{"id", id_},
           {"object", "response"},
           {"created_at", created_},
           {"status", status},
           {"background", false},
           {"error", nullptr},
           {"incomplete_details", nullptr},
           {"max_tool_calls", nullptr},
           {"model", o_.model},
           {"output", items_},
           {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
           {"service_tier", "default"},
           {"truncation", "disabled"},
           {"usage", status == "in_progress" ? json(nullptr) : usage_}};
    r.update(o_.echo);
    return r;
  }

  json& open_item() { return items_.back(); }
  size_t open_index() const { return items_.size() - 1; }

  void part_open(OutputPart part, const chat::ToolCallDelta* call) override {
    json item;
    json first_part;
    switch (part) {
      case OutputPart::kReasoning:
        reasoned_ = true;
        item = {{"id", random_id("rs_")}, {"type", "reasoning"}, {"status", "in_progress"},
                {"summary", json::array()}, {"content", json::array()}};
        first_part = {{"type", "reasoning_text"}, {"text", ""}};
        break;
      case OutputPart::kText:
        answered_ = true;
        item = {{"id", random_id("msg_")}, {"type", "message"}, {"status", "in_progress"},
                {"role", "assistant"}, {"content", json::array()}};
        first_part = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()},
                      {"logprobs", json::array()}};
        break;
      case OutputPart::kToolCall:
        answered_ = true;
        item = {{"id", random_id("fc_")}, {"type", "function_call"}, {"status", "in_progress"},
                {"call_id", random_id("call_")}, {"name", call->name}, {"arguments", ""}};
        break;
    }
    items_.push_back(item);
    emit("response.output_item.added", {{"output_index", open_index()}, {"item", item}});
    if (first_part.is_null()) return;
    emit("response.content_part.added", {{"item_id", item["id"]},
                                         {"output_index", open_index()},
                                         {"content_index", 0},
                                         {"part", first_part}});
    open_item()["content"].push_back(std::move(first_part));
  }

  void part_delta(OutputPart part, std::string_view text) override {
    json& item = open_item();
    json event{{"item_id", item["id"]}, {"output_index", open_index()}, {"delta", text}};
    switch (part) {
      case OutputPart::kReasoning:
        item["content"][0]["text"].get_ref<std::string&>() += text;
        event["content_index"] = 0;
        emit("response.reasoning_text.delta", std::move(event));
        break;
      case OutputPart::kText:
        item["content"][0]["text"].get_ref<std::string&>() += text;
        event["content_index"] = 0;
        event["logprobs"] = json::array();
        emit("response.output_text.delta", std::move(event));
        break;
      case OutputPart::kToolCall:
        item["arguments"].get_ref<std::string&>() += text;
        emit("response.function_call_arguments.delta", std::move(event));
        break;
    }
  }

  void part_close(OutputPart part) override {
    json& item = open_item();
    const size_t index = open_index();
    item["status"] = closing_status_;
    if (part == OutputPart::kToolCall) {
      emit("response.function_call_arguments.done", {{"item_id", item["id"]},
                                                     {"output_index", index},
                                                     {"name", item["name"]},
                                                     {"arguments", item["arguments"]}});
    } else {
      const json& content = item["content"][0];
      json done{{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0},
                {"text", content["text"]}};
      if (part == OutputPart::kText) done["logprobs"] = json::array();
      emit(part == OutputPart::kText ? "response.output_text.done"
                                     : "response.reasoning_text.done",
           std::move(done));
      emit("response.content_part.done", {{"item_id", item["id"]},
                                          {"output_index", index},
                                          {"content_index", 0},
                                          {"part", content}});
    }
    emit("response.output_item.done", {{"output_index", index}, {"item", item}});
  }

  // The conversation this response ends, for a later previous_response_id: one assistant
  // message with the reasoning, the text and the calls.
  void keep_conversation() {
    if (o_.store == nullptr) return;
    std::string reasoning, content;
    ojson calls = ojson::array();
    for (const json& item : items_) {
      if (item["type"] == "reasoning") reasoning += item["content"][0]["text"].get<std::string>();
      if (item["type"] == "message") content += item["content"][0]["text"].get<std::string>();
      if (item["type"] == "function_call") {
        calls.push_back({{"id", item["call_id"]},
                         {"type", "function"},
                         {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
      }
    }
    ojson message{{"role", "assistant"}, {"content", content}};
    if (!reasoning.empty()) message["reasoning_content"] = reasoning;
    if (!calls.empty()) message["tool_calls"] = std::move(calls);
    ojson conversation = std::move(o_.conversation);
    conversation.push_back(std::move(message));
    o_.store->put(id_, std::move(conversation), ResponseStore::clock_s());
  }

  ResponsesOutputOptions o_;
  ChatOutputStreamer reader_;
  OutputParts parts_;
  std::string id_;
  int64_t created_;
  json items_ = json::array();
  json usage_;
  std::optional<sched::StopReason> stop_;
  std::string closing_status_ = "completed";
  std::string out_;
  int64_t sequence_ = 0;
  int64_t thinking_tokens_ = 0;  // tokens of the events before the answer began
  bool reasoned_ = false;        // a reasoning item was written
  bool answered_ = false;        // a message or call began
  bool begun_ = false;
  bool fed_final_ = false;
};

}  // namespace

std::unique_ptr<ResponseBuilder> make_responses_builder(ResponsesOutputOptions options) {
  return std::make_unique<ResponsesBuilder>(std::move(options));
}

}  // namespace arbor::server
