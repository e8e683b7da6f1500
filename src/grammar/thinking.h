// A model's thinking block, read byte by byte: which bytes of an output are its reasoning, which
// are its answer (content), and which are markup (docs/server.md, "Reasoning").
//
// An output of a thinking model looks like
//     [ws] START reasoning END [ws] [CONTENT_OPEN [ws]] content
// e.g. "<think>\nLet me see.\n</think>\n\nHello!" with START "<think>" and END "</think>". When
// the prompt already opened the block (DeepSeek-R1's template ends with "<think>\n"), or the model
// writes no START at all (Apriel), the output begins inside the reasoning (ThinkingStart::kOpen).
// Otherwise (kMaybe) the block is optional: an output that does not begin with START (after
// whitespace) is all content, and START later on is content too. Only one block is read: once
// END has been seen, everything after it is content.
//
// ThinkingScanner classifies bytes as they come. It holds back only what may still be markup (a
// partial START or END, whitespace before START); feeding an output in any number of pieces
// classifies every byte the same way, which is what makes streamed equal whole. The server's
// text splitter (chat/reasoning.h) and the per-request grammar gate (output_grammar.h) share it,
// so the grammar constrains exactly the bytes the client receives as content.
//
// Pure logic; a scanner belongs to one thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace arbor::grammar {

struct ThinkingMarkers {
  // Opens the block: "<think>", "[THINK]", "<seed:think>". "" when the block has no opening
  // marker and the output always begins inside it (ThinkingStart::kOpen is then required).
  std::string start;
  // Closes the block: "</think>". Never empty.
  std::string end;
  // Skipped, with the whitespace around it, between END and the content: Granite 3.3 wraps its
  // answer in "<response>". "" for none.
  std::string content_open;

  bool operator==(const ThinkingMarkers&) const = default;
};

enum class ThinkingStart : uint8_t {
  kMaybe,  // the output may open a block with `start` (after whitespace)
  kOpen,   // the output begins inside the block (the prompt opened it)
};

class ThinkingScanner {
 public:
  enum class Phase : uint8_t {
    kPrefix,    // kMaybe: only whitespace and a proper prefix of `start` so far
    kThinking,  // inside the block
    kAfterEnd,  // after `end`: skipping whitespace and `content_open`
    kContent,   // everything from here on is content
  };
  // `markers` must outlive the scanner (and its copies). `start` must be kOpen when
  // markers.start is empty (CHECKed), and markers.end must not be empty (CHECKed).
  ThinkingScanner(const ThinkingMarkers& markers, ThinkingStart start);

  struct Out {
    std::string reasoning;  // appended: bytes found to be reasoning
    std::string content;    // appended: bytes found to be content
  };
  // Reads more of the output; bytes whose role is now known are appended to `out`.
  void feed(std::string_view bytes, Out& out);
  // The output has ended: the held bytes are resolved (a partial START or leading whitespace
  // is content, a partial END is reasoning, a partial CONTENT_OPEN is content). The phase then
  // becomes kContent (from kPrefix / kAfterEnd) or stays kThinking.
  void finish(Out& out);

  Phase phase() const { return phase_; }
  // Whether a thinking block was opened (by the prompt or the output).
  bool opened() const { return phase_ == Phase::kThinking || phase_ == Phase::kAfterEnd || opened_; }
  // Bytes read but not yet classified.
  const std::string& held() const { return held_; }
  // Whitespace bytes read in the current kPrefix or kAfterEnd phase (before START, around
  // CONTENT_OPEN): what a grammar gate bounds, since the text side skips any amount.
  size_t space() const { return space_; }
  // Whether byte `c`, read now, would be content with nothing held back (and so would every
  // byte after it).
  bool passes_through(char c) const;
  // Equal for two scanners (of the same markers) exactly when every future input is classified
  // the same way by both.
  std::string key() const;

 private:
  void step(char c, Out& out);

  const ThinkingMarkers* m_;
  Phase phase_;
  bool opened_ = false;     // kContent after a block
  bool open_done_ = false;  // kAfterEnd: content_open was skipped
  size_t matched_ = 0;      // kPrefix: bytes of `start` matched (after the whitespace in held_)
  size_t space_ = 0;        // see space()
  std::string held_;
};

}  // namespace arbor::grammar
