#include "chat/harmony.h"

#include <algorithm>

#include "chat/call_deltas.h"

namespace arbor::chat {

namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kTerminators[] = {"<|end|>", "<|call|>", "<|return|>", kStart};
constexpr size_t kNone = std::string_view::npos;

bool word_char(char c) { return c != ' ' && c != '\n' && c != '\t' && c != '\r' && c != '<'; }

// The word at `at` (up to whitespace or a marker).
std::string_view word_at(std::string_view s, size_t at) {
  size_t end = at;
  while (end < s.size() && word_char(s[end])) ++end;
  return s.substr(at, end - at);
}

struct Header {
  std::string_view channel;    // "" when the header names none
  std::string_view recipient;  // "" when none
};

// A message's header: [<|start|>ROLE] then, in either order, <|channel|>NAME and to=RECIPIENT,
// and a content type (<|constrain|>json, json), which is not needed to read the message.
Header parse_header(std::string_view h) {
  if (h.starts_with(kStart)) {
    h.remove_prefix(kStart.size());
    h.remove_prefix(word_at(h, 0).size());  // the role
  }
  Header out;
  const size_t c = h.find(kChannel);
  if (c != kNone) out.channel = word_at(h, c + kChannel.size());
  const size_t t = h.find("to=");
  if (t != kNone) out.recipient = word_at(h, t + 3);
  return out;
}

// Where the body starting at `from` ends: the first terminator, or npos.
std::pair<size_t, std::string_view> find_terminator(std::string_view text, size_t from) {
  std::pair<size_t, std::string_view> best{kNone, {}};
  for (std::string_view t : kTerminators) {
    const size_t at = text.find(t, from);
    if (at < best.first) best = {at, t};
  }
  return best;
}

// The length of the longest suffix of `body` that is a proper prefix of a terminator: bytes
// that may still become one.
size_t marker_prefix_tail(std::string_view body) {
  for (size_t k = std::min<size_t>(body.size(), 9); k > 0; --k) {
    const std::string_view tail = body.substr(body.size() - k);
    for (std::string_view t : kTerminators) {
      if (t.size() > k && t.starts_with(tail)) return k;
    }
  }
  return 0;
}

struct Reader {
  std::span<const std::string> tool_names;
  bool reasoning = true;
  HarmonyOutput out;

  void route(const Header& h, std::string_view body, bool complete) {
    constexpr std::string_view kFunctions = "functions.";
    if (h.recipient.starts_with(kFunctions)) {
      const std::string_view name = h.recipient.substr(kFunctions.size());
      if (std::find(tool_names.begin(), tool_names.end(), name) != tool_names.end()) {
        ParsedToolCall call;
        call.name = std::string(name);
        call.arguments = complete && body.empty() ? std::string("{}") : std::string(body);
        call.complete = complete;
        out.calls.push_back(std::move(call));
        return;
      }
    } else if (h.recipient.empty() && h.channel == "analysis" && reasoning) {
      out.reasoning += body;
      return;
    }
    out.content += body;  // final, a preamble, a call of another function, a built-in tool
  }
};

}  // namespace

HarmonyOutput parse_harmony(std::string_view text, bool final,
                            std::span<const std::string> tool_names, bool reasoning) {
  Reader r{.tool_names = tool_names, .reasoning = reasoning, .out = {}};
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t m = text.find(kMessage, pos);
    if (m == kNone) {
      // A header still arriving; at the end, text that never used the format is content.
      const std::string_view rest = text.substr(pos);
      if (final && pos == 0 && rest.find("<|") == kNone) r.out.content += rest;
      break;
    }
    const Header h = parse_header(text.substr(pos, m - pos));
    const size_t body = m + kMessage.size();
    const auto [end, marker] = find_terminator(text, body);
    if (end == kNone) {
      std::string_view b = text.substr(body);
      if (!final) b.remove_suffix(marker_prefix_tail(b));
      r.route(h, b, final);
      break;
    }
    r.route(h, text.substr(body, end - body), true);
    pos = marker == kStart ? end : end + marker.size();
  }
  return std::move(r.out);
}

HarmonyStreamer::Step HarmonyStreamer::update(std::string_view text, bool final) {
  const HarmonyOutput p = parse_harmony(text, final, tool_names_, reasoning_);
  Step step;
  if (p.reasoning.size() > sent_reasoning_) {
    step.reasoning = p.reasoning.substr(sent_reasoning_);
    sent_reasoning_ = p.reasoning.size();
  }
  if (p.content.size() > sent_content_) {
    step.content = p.content.substr(sent_content_);
    sent_content_ = p.content.size();
  }
  append_call_deltas(p.calls, sent_args_, step.calls);
  return step;
}

}  // namespace arbor::chat
