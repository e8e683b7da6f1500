// Incremental parser of a server-sent-events stream (the WHATWG "text/event-stream" format).
//
// Bytes arrive in arbitrary pieces (TCP segments, HTTP chunks): feed() takes each piece as it
// comes and reports every event that piece completes. An event is the "data" fields of a block
// of lines ended by a blank line, joined with '\n'. Lines may end in "\n", "\r\n" or "\r" (a
// "\r\n" split across two pieces is one line end); a line starting with ':' is a comment
// (keep-alives); "data:x" and "data: x" are the same (one leading space is dropped); other
// fields (event, id, retry) are ignored; a block without a data field dispatches nothing.
// Not thread-safe; one parser per response.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace arbor::loadgen {

class SseParser {
 public:
  using EventFn = std::function<void(std::string_view data)>;

  // Calls `on_event` for each event completed by `bytes`, in order; the view is valid only
  // during the call. Returns the number of events. O(bytes).
  int feed(std::string_view bytes, const EventFn& on_event);

  // Bytes held for an unfinished line or event (0 at a clean event boundary).
  size_t pending_bytes() const { return line_.size() + data_.size(); }

 private:
  bool end_line(const EventFn& on_event);  // true if it dispatched an event

  std::string line_;  // the unfinished line
  std::string data_;  // data of the event being built
  bool has_data_ = false;
  bool after_cr_ = false;  // the last byte seen was '\r': a following '\n' belongs to it
};

}  // namespace arbor::loadgen
