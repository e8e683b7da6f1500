#include "server/messages_output.h"

namespace arbor::server {
namespace {

using json = nlohmann::json;

class MessagesBuilder : public ResponseBuilder, private OutputPartListener {
 public:
  explicit MessagesBuilder(MessagesOutputOptions o)
      : o_(std::move(o)), reader_(o_.output), id_(random_id("msg_")) {}

  bool streaming() const override { return o_.stream; }
  ApiFlavor flavor() const override { return ApiFlavor::kAnthropic; }
  void set_request_id(std::string_view request_id) override { id_ = str_cat("msg_", request_id); }
  std::string response_id() const override { return id_; }

  std::string on_event(const engine::StreamEvent& ev) override {
    if (ev.index != 0) return "";
    begin();
    if (ev.stop_reason) stop_ = ev.stop_reason;
    feed(ev.text, ev.stop_reason.has_value());
    return take();
  }

  std::string on_final(const engine::StreamEvent& ev) override {
    begin();
    if (!fed_final_) feed("", true);
    parts_.close(*this);
    const json usage = usage_json(ev.usage);
    if (!o_.stream) {
      json m = message_json();
      m["stop_reason"] = stop_reason();
      m["stop_sequence"] = stop_sequence();
      m["usage"] = usage;
      return dump_json(m);
    }
    emit("message_delta",
         {{"delta", {{"stop_reason", stop_reason()}, {"stop_sequence", stop_sequence()}}},
          {"usage", usage}});
    emit("message_stop", json::object());
    return take();
  }

  std::string on_stream_error(const ApiError& error) override {
    begin();
    out_ += str_cat("event: error\ndata: ", error_body(error, ApiFlavor::kAnthropic), "\n\n");
    return take();
  }

 private:
  void begin() {
    if (begun_ || !o_.stream) return;
    begun_ = true;
    json m = message_json();
    m["usage"] = {{"input_tokens", o_.input_tokens},
                  {"output_tokens", 0},
                  {"cache_creation_input_tokens", 0},
                  {"cache_read_input_tokens", 0}};
    emit("message_start", {{"message", std::move(m)}});
    emit("ping", json::object());
  }

  void feed(std::string_view text, bool final) {
    if (fed_final_) return;
    fed_final_ = final;
    parts_.apply(reader_.feed(text, final), *this);
  }

  void emit(const std::string& type, json data) {
    if (!o_.stream) return;
    data["type"] = type;
    out_ += str_cat("event: ", type, "\ndata: ", dump_json(data), "\n\n");
  }

  std::string take() { return std::exchange(out_, std::string()); }

  json message_json() const {
    return {{"id", id_},           {"type", "message"},         {"role", "assistant"},
            {"model", o_.model},   {"content", blocks_},        {"stop_reason", nullptr},
            {"stop_sequence", nullptr}};
  }

  json usage_json(const engine::Usage& u) const {
    json j{{"input_tokens", u.prompt_tokens},
           {"output_tokens", u.completion_tokens},
           {"cache_creation_input_tokens", 0},
           {"cache_read_input_tokens", u.cached_tokens}};
    if (u.draft_tokens > 0) j["speculation"] = speculation_usage_json(u);
    return j;
  }

  json stop_reason() const {
    if (!stop_) return "end_turn";
    switch (stop_->kind) {
      case sched::StopKind::kEos:
      case sched::StopKind::kStopToken: return called_ ? "tool_use" : "end_turn";
      case sched::StopKind::kStopString: return "stop_sequence";
      case sched::StopKind::kMaxTokens:
      case sched::StopKind::kMaxModelLen: return "max_tokens";
      case sched::StopKind::kAbort: return "abort";
    }
    return "end_turn";
  }

  json stop_sequence() const {
    if (stop_ && stop_->kind == sched::StopKind::kStopString) return stop_->stop_string;
    return nullptr;
  }

  size_t index() const { return blocks_.size() - 1; }

  void part_open(OutputPart part, const chat::ToolCallDelta* call) override {
    skipping_ = part == OutputPart::kReasoning && !o_.show_thinking;
    if (skipping_) return;
    json block;
    switch (part) {
      case OutputPart::kReasoning:
        block = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
        break;
      case OutputPart::kText: block = {{"type", "text"}, {"text", ""}}; break;
      case OutputPart::kToolCall:
        called_ = true;
        block = {{"type", "tool_use"}, {"id", random_id("toolu_")}, {"name", call->name},
                 {"input", json::object()}};
        arguments_.clear();
        break;
    }
    blocks_.push_back(block);
    emit("content_block_start", {{"index", index()}, {"content_block", std::move(block)}});
  }

  void part_delta(OutputPart part, std::string_view text) override {
    if (skipping_) return;
    json& block = blocks_.back();
    json delta;
    switch (part) {
      case OutputPart::kReasoning:
        block["thinking"].get_ref<std::string&>() += text;
        delta = {{"type", "thinking_delta"}, {"thinking", text}};
        break;
      case OutputPart::kText:
        block["text"].get_ref<std::string&>() += text;
        delta = {{"type", "text_delta"}, {"text", text}};
        break;
      case OutputPart::kToolCall:
        arguments_ += text;
        delta = {{"type", "input_json_delta"}, {"partial_json", text}};
        break;
    }
    emit("content_block_delta", {{"index", index()}, {"delta", std::move(delta)}});
  }

  void part_close(OutputPart part) override {
    if (skipping_) {
      skipping_ = false;
      return;
    }
    if (part == OutputPart::kToolCall) {
      // Arguments that are not a JSON object (a model free to write anything, cut short by
      // max_tokens) leave the input empty; the stream carried their text.
      json input = json::parse(arguments_, nullptr, false);
      if (input.is_object()) blocks_.back()["input"] = std::move(input);
    }
    emit("content_block_stop", {{"index", index()}});
  }

  MessagesOutputOptions o_;
  ChatOutputStreamer reader_;
  OutputParts parts_;
  std::string id_;
  json blocks_ = json::array();
  std::string arguments_;  // the open tool_use block's arguments
  std::optional<sched::StopReason> stop_;
  std::string out_;
  bool called_ = false;    // a tool_use block was written
  bool skipping_ = false;  // the open part is thinking the request turned off
  bool begun_ = false;
  bool fed_final_ = false;
};

}  // namespace

std::unique_ptr<ResponseBuilder> make_messages_builder(MessagesOutputOptions options) {
  return std::make_unique<MessagesBuilder>(std::move(options));
}

}  // namespace arbor::server
