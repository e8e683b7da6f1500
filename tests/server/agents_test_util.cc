#include "agents_test_util.h"

#include <sstream>

#include "server/chat_renderer.h"
#include "support/shared_data.h"
#include "tokenizer/tokenizer.h"

namespace arbor::server::testing {
namespace {

const tokenizer::Tokenizer* qwen3_tokenizer() {
  static const std::unique_ptr<tokenizer::Tokenizer> tok = []() -> std::unique_ptr<tokenizer::Tokenizer> {
    if (!test::expect_shared_file("tokenizers/hf/qwen3/tokenizer.json")) return nullptr;
    auto t = tokenizer::Tokenizer::from_file(test::shared_path("tokenizers/hf/qwen3"));
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return tok.get();
}

}  // namespace

QwenModel::QwenModel(ResponseStoreOptions store_options, const std::string& chat_template,
                     const std::string& reasoning_format)
    : store(store_options) {
  info.name = "qwen";
  info.path = "/models/qwen.gguf";
  info.tokenizer = qwen3_tokenizer();
  info.context_length = 4096;
  info.responses = &store;
  if (info.tokenizer == nullptr) return;
  info.vocab_size = info.tokenizer->vocab_size();
  auto r = make_chat_renderer(*info.tokenizer, chat_template, std::nullopt, reasoning_format);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (r.ok()) chat = std::move(r).value();
  info.chat = chat.get();
}

Prepared prepare(PrepareFn fn, const nlohmann::json& body, const ModelInfo& model) {
  return prepare_raw(fn, body.dump(), model);
}

Prepared prepare_raw(PrepareFn fn, const std::string& raw, const ModelInfo& model) {
  Prepared p;
  const nlohmann::json body = nlohmann::json::parse(raw);
  p.request.raw_body = raw;
  p.error = fn(body, model, &p.request);
  p.request.raw_body = {};
  return p;
}

engine::StreamEvent text_event(const std::string& text, int num_tokens,
                               std::optional<sched::StopKind> stop,
                               const std::string& stop_string) {
  engine::StreamEvent ev;
  ev.text = text;
  ev.token_ids.assign(static_cast<size_t>(num_tokens), 1);
  if (stop) ev.stop_reason = sched::StopReason{.kind = *stop, .token_id = -1, .stop_string = stop_string};
  return ev;
}

engine::StreamEvent final_event(int64_t prompt_tokens, int64_t completion_tokens) {
  engine::StreamEvent ev;
  ev.final = true;
  ev.usage.prompt_tokens = prompt_tokens;
  ev.usage.completion_tokens = completion_tokens;
  return ev;
}

std::string run_builder(ResponseBuilder& builder, const std::vector<engine::StreamEvent>& events,
                        const engine::StreamEvent& final) {
  builder.set_request_id("req1");
  std::string out;
  for (const engine::StreamEvent& ev : events) out += builder.on_event(ev);
  return out + builder.on_final(final);
}

std::vector<SseEvent> parse_sse(const std::string& bytes) {
  std::vector<SseEvent> out;
  SseEvent cur;
  bool any = false;
  std::istringstream in(bytes);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) {
      if (any) out.push_back(std::move(cur));
      cur = SseEvent{};
      any = false;
    } else if (line.rfind("event: ", 0) == 0) {
      cur.event = line.substr(7);
      any = true;
    } else if (line.rfind("data: ", 0) == 0) {
      cur.data = nlohmann::json::parse(line.substr(6), nullptr, false);
      EXPECT_FALSE(cur.data.is_discarded()) << line;
      any = true;
    } else {
      ADD_FAILURE() << "not an SSE line: " << line;
    }
  }
  EXPECT_FALSE(any) << "the stream does not end with a blank line";
  return out;
}

}  // namespace arbor::server::testing
