#include "server/sse_ids.h"

#include <charconv>

namespace arbor::server {

std::string format_sse_event_id(const SseEventId& id) {
  return str_cat(id.seed, ".", id.tokens, ".", id.index);
}

Result<SseEventId> parse_sse_event_id(std::string_view text) {
  SseEventId id;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  auto number = [&](auto* out, bool last) {
    auto [next, ec] = std::from_chars(p, end, *out);
    if (ec != std::errc() || next == p) return false;
    p = next;
    if (last) return p == end;
    if (p == end || *p != '.') return false;
    ++p;
    return true;
  };
  if (!number(&id.seed, false) || !number(&id.tokens, false) || !number(&id.index, true) ||
      id.tokens < 0 || id.index < 0) {
    return invalid_argument("Last-Event-ID '", text.substr(0, 64),
                            "' is not an event id of this server (<seed>.<tokens>.<index>)");
  }
  return id;
}

std::string label_sse_events(std::string_view bytes, SseIdCursor* cursor,
                             const std::optional<SseEventId>& after) {
  std::string out;
  out.reserve(bytes.size() + 32);
  size_t start = 0;
  while (start < bytes.size()) {
    size_t end = bytes.find("\n\n", start);
    end = end == std::string_view::npos ? bytes.size() : end + 2;
    const std::string_view event = bytes.substr(start, end - start);
    start = end;
    if (event.starts_with(":")) {
      out += event;
      continue;
    }
    if (cursor->tokens != cursor->labelled_tokens) {
      cursor->labelled_tokens = cursor->tokens;
      cursor->next_index = 0;
    }
    const SseEventId id{cursor->seed, cursor->tokens, cursor->next_index++};
    if (after && (id.tokens < after->tokens ||
                  (id.tokens == after->tokens && id.index <= after->index))) {
      continue;
    }
    out += "id: ";
    out += format_sse_event_id(id);
    out += '\n';
    out += event;
  }
  return out;
}

}  // namespace arbor::server
