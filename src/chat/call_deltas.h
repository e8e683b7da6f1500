// What a streamer sends of a growing parse of tool calls: for call i (calls only grow, and a
// call's arguments only grow), its name the first time it appears and its argument bytes
// beyond sent_args[i]. Shared by ToolCallStreamer and HarmonyStreamer.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "chat/tool_calls.h"

namespace arbor::chat {

// Appends to `out` a delta for every call that is new or has new argument bytes; grows and
// advances `sent_args` (bytes of each call's arguments already sent).
inline void append_call_deltas(const std::vector<ParsedToolCall>& calls,
                               std::vector<size_t>& sent_args, std::vector<ToolCallDelta>& out) {
  for (size_t i = 0; i < calls.size(); ++i) {
    const ParsedToolCall& c = calls[i];
    ToolCallDelta d;
    d.index = static_cast<int32_t>(i);
    if (i >= sent_args.size()) {
      d.first = true;
      d.name = c.name;
      sent_args.push_back(0);
    }
    if (c.arguments.size() > sent_args[i]) {
      d.arguments = c.arguments.substr(sent_args[i]);
      sent_args[i] = c.arguments.size();
    }
    if (d.first || !d.arguments.empty()) out.push_back(std::move(d));
  }
}

}  // namespace arbor::chat
