#include "loadgen/sse_parser.h"

namespace arbor::loadgen {

int SseParser::feed(std::string_view bytes, const EventFn& on_event) {
  int events = 0;
  size_t i = 0;
  if (after_cr_ && !bytes.empty()) {
    after_cr_ = false;
    if (bytes[0] == '\n') i = 1;
  }
  while (i < bytes.size()) {
    size_t j = i;
    while (j < bytes.size() && bytes[j] != '\n' && bytes[j] != '\r') ++j;
    line_.append(bytes.data() + i, j - i);
    if (j == bytes.size()) break;
    if (end_line(on_event)) ++events;
    if (bytes[j] == '\r') {
      if (j + 1 == bytes.size()) {
        after_cr_ = true;
        break;
      }
      if (bytes[j + 1] == '\n') ++j;
    }
    i = j + 1;
  }
  return events;
}

bool SseParser::end_line(const EventFn& on_event) {
  std::string_view line(line_);
  bool dispatched = false;
  if (line.empty()) {
    if (has_data_) {
      on_event(std::string_view(data_));
      dispatched = true;
    }
    data_.clear();
    has_data_ = false;
  } else if (line[0] != ':') {
    const size_t colon = line.find(':');
    if (line.substr(0, colon) == "data") {
      std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
      if (has_data_) data_.push_back('\n');
      data_.append(value);
      has_data_ = true;
    }
  }
  line_.clear();
  return dispatched;
}

}  // namespace arbor::loadgen
