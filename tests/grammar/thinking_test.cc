// The thinking block before a grammar: ThinkingScanner's byte classification (exact cases, and
// every way of cutting an output into pieces classifying it the same), and OutputGrammar's masks
// against a from-scratch reference (the tokens so far decoded to text, split again by a fresh
// scanner, the content run through a fresh matcher) on seeded random walks with rollbacks.
#include "grammar/output_grammar.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/thinking.h"

namespace arbor::grammar {
namespace {

using Phase = ThinkingScanner::Phase;

const ThinkingMarkers kThink{.start = "<think>", .end = "</think>", .content_open = ""};
const ThinkingMarkers kGranite{.start = "<think>", .end = "</think>", .content_open = "<response>"};

struct Split {
  std::string reasoning, content;
  bool operator==(const Split&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Split& s) {
  return os << "{reasoning '" << s.reasoning << "', content '" << s.content << "'}";
}

Split scan(const ThinkingMarkers& m, ThinkingStart start, const std::vector<std::string>& pieces) {
  ThinkingScanner s(m, start);
  ThinkingScanner::Out out;
  for (const std::string& p : pieces) s.feed(p, out);
  s.finish(out);
  return {out.reasoning, out.content};
}

TEST(ThinkingScanner, ExactSplits) {
  const auto whole = [](const ThinkingMarkers& m, ThinkingStart st, const std::string& text) {
    return scan(m, st, {text});
  };
  const ThinkingStart kMaybe = ThinkingStart::kMaybe, kOpen = ThinkingStart::kOpen;
  EXPECT_EQ(whole(kThink, kMaybe, "<think>\nhm.\n</think>\n\n{\"a\": 1}"),
            (Split{"\nhm.\n", "{\"a\": 1}"}));
  EXPECT_EQ(whole(kThink, kMaybe, " \n<think>x</think>y"), (Split{"x", "y"}));
  // No block at the start: all content, a later <think> included.
  EXPECT_EQ(whole(kThink, kMaybe, "  hi <think>x</think>"), (Split{"", "  hi <think>x</think>"}));
  EXPECT_EQ(whole(kThink, kMaybe, "<thin"), (Split{"", "<thin"}));
  EXPECT_EQ(whole(kThink, kMaybe, "<thinx"), (Split{"", "<thinx"}));
  // The prompt opened the block.
  EXPECT_EQ(whole(kThink, kOpen, "a<b</think> c"), (Split{"a<b", "c"}));
  // No end marker (max_tokens): all reasoning, a partial marker too.
  EXPECT_EQ(whole(kThink, kOpen, "abc</thi"), (Split{"abc</thi", ""}));
  EXPECT_EQ(whole(kThink, kOpen, "<</</think>x"), (Split{"<</", "x"}));
  // Only the first block is read.
  EXPECT_EQ(whole(kThink, kOpen, "a</think>b<think>c</think>"), (Split{"a", "b<think>c</think>"}));
  EXPECT_EQ(whole(kGranite, kMaybe, "<think>a</think>\n <response>\nb</response>"),
            (Split{"a", "b</response>"}));
  EXPECT_EQ(whole(kGranite, kMaybe, "<think>a</think><resp!"), (Split{"a", "<resp!"}));
  EXPECT_EQ(whole(kGranite, kMaybe, "<think>a</think><resp"), (Split{"a", "<resp"}));
  EXPECT_EQ(whole(kGranite, kMaybe, "<think>a</think>"), (Split{"a", ""}));
}

TEST(ThinkingScanner, PiecesClassifyLikeTheWhole) {
  const std::vector<std::pair<ThinkingStart, std::string>> outputs = {
      {ThinkingStart::kMaybe, " <think>\nI think </thin</think> so.</think>\n\nok"},
      {ThinkingStart::kMaybe, "<th<think>x"},
      {ThinkingStart::kMaybe, "\n\n"},
      {ThinkingStart::kOpen, "<<//think></think></think>"},
      {ThinkingStart::kOpen, "</think"},
  };
  for (const ThinkingMarkers& m : {kThink, kGranite}) {
    for (const auto& [start, text] : outputs) {
      const Split whole = scan(m, start, {text});
      for (size_t i = 0; i <= text.size(); ++i) {
        for (size_t j = i; j <= text.size(); ++j) {
          EXPECT_EQ(scan(m, start, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}),
                    whole)
              << "'" << text << "' cut at " << i << " and " << j;
        }
      }
    }
  }
}

TEST(ThinkingScanner, PhasesAndKeys) {
  ThinkingScanner s(kThink, ThinkingStart::kMaybe);
  ThinkingScanner::Out out;
  EXPECT_EQ(s.phase(), Phase::kPrefix);
  s.feed(" <thi", out);
  EXPECT_EQ(s.held(), " <thi");
  EXPECT_EQ(s.phase(), Phase::kPrefix);
  s.feed("nk>", out);
  EXPECT_EQ(s.phase(), Phase::kThinking);
  EXPECT_TRUE(s.opened());
  ThinkingScanner t(kThink, ThinkingStart::kOpen);
  EXPECT_EQ(s.key(), t.key()) << "both at the start of the block";
  s.feed("</", out);
  EXPECT_NE(s.key(), t.key());
  s.feed("think>", out);
  EXPECT_EQ(s.phase(), Phase::kAfterEnd);
  s.feed("\n x", out);
  EXPECT_EQ(s.phase(), Phase::kContent);
  EXPECT_EQ(out.content, "x");
  EXPECT_EQ(out.reasoning, "");
}

// ---- OutputGrammar ----

// Token 0: a control token (no bytes); 1, 2: end ids; 3: a control token whose text the spec
// gives ("<think>", as Mistral's [THINK] is); then text tokens.
const std::vector<std::string> kTexts = {
    "<", "/", "think", ">", "<think>", "</think>", "</", "think>", "</think>{", "</think>x",
    "</think>\n", "\n", " ", "{", "}", "\"a\"", ":", "1", "2", "x", "let", " me", ".", "<response>",
    "<resp", "onse>", "{\"a\"", "\n<think>\n", " {", "<th", "ink>", "resp"};

std::shared_ptr<const TokenVocabulary> vocab() {
  std::vector<std::string> bytes = {"", "", "", ""};
  bytes.insert(bytes.end(), kTexts.begin(), kTexts.end());
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<int32_t>{1, 2});
}

int32_t id(const std::string& text) {
  for (size_t i = 0; i < kTexts.size(); ++i) {
    if (kTexts[i] == text) return static_cast<int32_t>(i + 4);
  }
  ADD_FAILURE() << "no token " << text;
  return -1;
}

constexpr std::string_view kGbnf =
    "root ::= \"{\" ws \"\\\"a\\\"\" ws \":\" ws [0-9] [0-9]? ws \"}\"\nws ::= [ \\n]{0,2}";

std::shared_ptr<CompiledGrammar> compiled() {
  auto a = compile_gbnf(kGbnf);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return std::make_shared<CompiledGrammar>(std::make_shared<const Automaton>(std::move(*a)),
                                           vocab());
}

ThinkingSpec spec(const ThinkingMarkers& m, ThinkingStart start) {
  ThinkingSpec s{.markers = m, .start = start, .control_texts = {}};
  s.control_texts.push_back({.id = 3, .text = "<think>"});
  return s;
}

TEST(OutputGrammar, ThinkingIsFreeAndTheGrammarStartsAfterIt) {
  auto g = compiled();
  OutputGrammar out(g, spec(kThink, ThinkingStart::kMaybe));
  // Before the block: the grammar's first tokens or the way to <think>; not "x", nor a control
  // token, nor the end of the output.
  EXPECT_TRUE(out.allows(id("{")));
  EXPECT_TRUE(out.allows(id("<")));
  EXPECT_TRUE(out.allows(id("<think>")));
  EXPECT_TRUE(out.allows(3)) << "the control token whose text is <think>";
  EXPECT_TRUE(out.allows(id("\n<think>\n")));
  EXPECT_FALSE(out.allows(id("x")));
  EXPECT_FALSE(out.allows(0));
  EXPECT_FALSE(out.allows(1));
  ASSERT_TRUE(out.accept(3));
  EXPECT_EQ(out.phase(), Phase::kThinking);
  // Inside: anything, but closing the block into content the grammar refuses.
  for (const char* t : {"x", "let", " me", "}", "<think>", "."}) EXPECT_TRUE(out.allows(id(t))) << t;
  EXPECT_TRUE(out.allows(0));
  EXPECT_TRUE(out.allows(1));
  EXPECT_TRUE(out.allows(id("</think>{")));
  EXPECT_FALSE(out.allows(id("</think>x")));
  for (const char* t : {"let", " me", "x", "</", "think>"}) ASSERT_TRUE(out.accept(id(t))) << t;
  EXPECT_EQ(out.phase(), Phase::kAfterEnd);
  EXPECT_FALSE(out.allows(id("x")));
  EXPECT_FALSE(out.allows(1)) << "no content yet: the grammar cannot end";
  EXPECT_TRUE(out.allows(id("\n")));
  EXPECT_TRUE(out.allows(id(" {")));
  for (const char* t : {"\n", " {", "\"a\"", ":", "1"}) ASSERT_TRUE(out.accept(id(t))) << t;
  EXPECT_EQ(out.phase(), Phase::kContent);
  EXPECT_FALSE(out.allows(id("<think>")));
  EXPECT_FALSE(out.allows(1));
  ASSERT_TRUE(out.accept(id("}")));
  EXPECT_TRUE(out.allows(1));
  // Back to the start: the same masks as a fresh gate.
  out.rollback(out.num_accepted());
  OutputGrammar fresh(g, spec(kThink, ThinkingStart::kMaybe));
  for (int32_t t = 0; t < g->vocab().size(); ++t) {
    EXPECT_EQ(out.mask().test(t), fresh.mask().test(t)) << t;
  }
}

TEST(OutputGrammar, NoBlockMeansTheGrammarFromTheFirstByte) {
  auto g = compiled();
  OutputGrammar out(g, spec(kThink, ThinkingStart::kMaybe));
  ASSERT_TRUE(out.accept(id("{\"a\"")));
  EXPECT_EQ(out.phase(), Phase::kContent);
  EXPECT_FALSE(out.allows(id("<think>")));
  // Whitespace before a would-be block, then content: the whitespace is content too.
  OutputGrammar ws(g, spec(kThink, ThinkingStart::kMaybe));
  ASSERT_TRUE(ws.accept(id(" ")));
  EXPECT_EQ(ws.phase(), Phase::kPrefix);
  EXPECT_FALSE(ws.allows(id("{"))) << "\" {\" does not start the grammar's language";
  EXPECT_TRUE(ws.allows(id("<th")));
}

// The text side skips any whitespace around the markers; the gate bounds it, so a model cannot
// stall there instead of writing what the grammar allows.
TEST(OutputGrammar, WhitespaceAroundMarkersIsBounded) {
  auto g = compiled();
  for (const ThinkingStart start : {ThinkingStart::kMaybe, ThinkingStart::kOpen}) {
    OutputGrammar out(g, spec(kGranite, start));
    if (start == ThinkingStart::kOpen) {
      ASSERT_TRUE(out.accept(id("</think>")));
      ASSERT_TRUE(out.accept(id("<response>")));
    }
    for (size_t i = 0; i < kMaxSpaceAroundMarkers; ++i) {
      ASSERT_TRUE(out.accept(id(i % 2 ? " " : "\n"))) << i;
    }
    EXPECT_FALSE(out.allows(id(" ")));
    EXPECT_FALSE(out.allows(id("\n")));
    EXPECT_TRUE(out.allows(id(start == ThinkingStart::kOpen ? "{" : "<think>")));
  }
}

TEST(OutputGrammar, EndInsideTheBlockEndsTheOutput) {
  auto g = compiled();
  OutputGrammar out(g, spec(kThink, ThinkingStart::kOpen));
  ASSERT_TRUE(out.accept(id("let")));
  ASSERT_TRUE(out.accept(2));
  EXPECT_FALSE(out.allows(id("let")));
  EXPECT_TRUE(out.allows(1));
  out.rollback(1);
  EXPECT_TRUE(out.allows(id("let")));
}

// The reference: the tokens' text split again from scratch; the content must be a prefix of the
// grammar's language (or all of it, for an end id).
class Reference {
 public:
  Reference(std::shared_ptr<CompiledGrammar> g, const ThinkingSpec& s) : g_(std::move(g)), s_(s) {}

  bool allows(const std::vector<int32_t>& tokens, int32_t next) const {
    std::vector<int32_t> all = tokens;
    all.push_back(next);
    ThinkingScanner sc(s_.markers, s_.start);
    ThinkingScanner::Out out;
    std::string all_text;
    bool ended = false;
    for (size_t i = 0; i < all.size(); ++i) {
      const int32_t t = all[i];
      const bool end = t == 1 || t == 2;
      if (ended) {
        if (!end) return false;
        continue;
      }
      const Phase before = sc.phase();
      if (end) {
        ended = true;
        if (before == Phase::kThinking) continue;
        sc.finish(out);
        GrammarState fresh(g_);
        if (!out.content.empty() && !fresh.accept_bytes(out.content)) return false;
        if (!fresh.can_end()) return false;
        continue;
      }
      // A control token is never content (the grammar gives it no bytes).
      if (t == 3 && before == Phase::kContent) return false;
      const std::string text = t == 3 ? "<think>" : std::string(g_->vocab().bytes(t));
      if (text.empty() && before != Phase::kThinking) return false;
      sc.feed(text, out);
      all_text += text;
      // Whitespace before START and after END is bounded: count it again from the text.
      if (sc.phase() == Phase::kPrefix || sc.phase() == Phase::kAfterEnd) {
        const std::string since =
            sc.phase() == Phase::kPrefix
                ? all_text
                : all_text.substr(all_text.rfind(s_.markers.end) + s_.markers.end.size());
        if (std::count_if(since.begin(), since.end(), [](char c) { return c == ' ' || c == '\n'; }) >
            static_cast<std::ptrdiff_t>(kMaxSpaceAroundMarkers)) {
          return false;
        }
      }
    }
    if (ended) return true;
    GrammarState fresh(g_);
    return out.content.empty() || fresh.accepts_bytes(out.content);
  }

 private:
  std::shared_ptr<CompiledGrammar> g_;
  ThinkingSpec s_;
};

void random_walks(const ThinkingMarkers& m, ThinkingStart start, uint64_t seed) {
  auto g = compiled();
  const ThinkingSpec s = spec(m, start);
  const Reference ref(g, s);
  OutputGrammar out(g, s);
  std::vector<int32_t> tokens;
  std::mt19937_64 rng(seed);
  std::vector<int32_t> bias;  // prefer the markers so that walks cross every phase
  for (const char* t : {"<think>", "</think>", "</", "think>", "</think>\n", "\n<think>\n",
                        "<response>", "<resp", "onse>", " ", "\n", " ", "\n"}) {
    bias.push_back(id(t));
  }
  for (int step = 0; step < 400; ++step) {
    const TokenBitmask mask = out.mask();
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < g->vocab().size(); ++t) {
      ASSERT_EQ(mask.test(t), ref.allows(tokens, t))
          << "seed " << seed << " step " << step << " token " << t << " after "
          << ::testing::PrintToString(tokens);
      if (mask.test(t)) allowed.push_back(t);
    }
    ASSERT_FALSE(allowed.empty()) << "seed " << seed << " step " << step << ": dead end after "
                                  << ::testing::PrintToString(tokens);
    const bool ended = !tokens.empty() && (tokens.back() == 1 || tokens.back() == 2);
    if (ended || tokens.size() > 20 || (!tokens.empty() && rng() % 6 == 0)) {
      const size_t n = std::min<size_t>(tokens.size(), 1 + rng() % 4);
      out.rollback(n);
      tokens.resize(tokens.size() - n);
      continue;
    }
    int32_t pick = allowed[rng() % allowed.size()];
    if (rng() % 2 == 0) {
      const int32_t b = bias[rng() % bias.size()];
      if (mask.test(b)) pick = b;
    }
    ASSERT_TRUE(out.accept(pick));
    tokens.push_back(pick);
    ASSERT_EQ(out.num_accepted(), tokens.size());
  }
}

TEST(OutputGrammar, MasksEqualTheReferenceOnRandomWalks) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    random_walks(kThink, ThinkingStart::kMaybe, seed);
    random_walks(kThink, ThinkingStart::kOpen, seed);
    random_walks(kGranite, ThinkingStart::kMaybe, seed);
  }
}

TEST(OutputGrammar, WithoutThinkingItIsTheGrammar) {
  auto g = compiled();
  OutputGrammar out(g, std::nullopt);
  GrammarState plain(g);
  for (const char* t : {"{", "\"a\"", ":", "1"}) {
    for (int32_t x = 0; x < g->vocab().size(); ++x) {
      ASSERT_EQ(out.mask().test(x), plain.mask().test(x)) << x;
    }
    ASSERT_TRUE(out.accept(id(t)));
    ASSERT_TRUE(plain.accept(id(t)));
  }
  EXPECT_EQ(out.num_accepted(), 4u);
  EXPECT_EQ(out.phase(), Phase::kContent);
}

}  // namespace
}  // namespace arbor::grammar
