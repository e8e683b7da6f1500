// Structured output through the engine and the CPU executor, on models whose weights do nothing
// to keep the output valid: a random-weight model (arbor synth) over the Llama 2 vocabulary and
// the 512-token stories260K. For a suite of JSON Schemas, regexes, grammars and choices:
//   * every output is complete (finish reason stop), parses and validates (an independent
//     validator: tests/support/json_schema_validator.h, PCRE2 for regexes);
//   * greedy and seeded outputs are token for token the same with speculation (n-gram chains,
//     draft-model chains and trees) as without;
//   * unseeded sampling with a draft model (the model rule, masked p) stays valid.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "executor_under_test.h"
#include "draft_models.h"
#include "engine/engine_core.h"
#include "engine/stop_rules.h"
#include "engine_test_util.h"
#include "executor/local_executor.h"
#include "support/json_schema_validator.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "tokenizer/tokenizer.h"

namespace arbor::engine {
namespace {

using grammar::GrammarKind;
using grammar::GrammarSpec;
using json = nlohmann::json;

// JSON Schemas of varied shapes. Strings, arrays and recursion are bounded where a random
// model could otherwise write forever (a grammar constrains form, not length).
const std::vector<std::string> kSchemas = {
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":120}},"required":["name","age"]})",
    R"({"type":"boolean"})",
    R"({"type":"null"})",
    R"({"enum":["red","green","blue"]})",
    R"({"const":{"a":1,"b":[true,null]}})",
    R"({"type":"array","items":{"type":"integer","minimum":1,"maximum":9},"minItems":1,"maxItems":4})",
    R"({"type":"object","properties":{"tags":{"type":"array","items":{"type":"string","maxLength":5},"maxItems":3}},"required":["tags"]})",
    R"({"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"integer","minimum":1,"maximum":1000},"nick":{"type":"string","minLength":1,"maxLength":8}},"required":["id"]}},"required":["user"]})",
    R"({"anyOf":[{"type":"integer","minimum":0,"maximum":50},{"type":"string","maxLength":4}]})",
    R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer","minimum":0,"maximum":9},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})",
    R"({"type":"string","pattern":"^[A-Z]{2}-[0-9]{3}$"})",
    R"({"type":"string","format":"date"})",
    R"({"type":"string","format":"uuid"})",
    R"({"type":"number","minimum":0,"maximum":100})",
    R"({"type":"integer","minimum":-20,"maximum":-3})",
    R"({"type":"object","properties":{"a":{"type":"integer","minimum":0,"maximum":9},"b":{"type":"boolean"},"c":{"type":"null"}},"required":["b"]})",
    R"({"type":"array","prefixItems":[{"type":"string","maxLength":3},{"type":"integer","minimum":0,"maximum":5}],"items":false,"minItems":2})",
    R"({"type":["integer","null"],"minimum":0,"maximum":3})",
    R"({"enum":[1,"two",null,true,{"x":[1]}]})",
    R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"n":{"type":"integer","minimum":0,"maximum":3}},"required":["kind","n"]},{"type":"object","properties":{"kind":{"const":"b"}},"required":["kind"]}]})",
    R"({"allOf":[{"type":"string","minLength":2,"maxLength":4}]})",
    R"({"type":"string","minLength":3,"maxLength":3})",
    R"({"type":"array","items":{"type":"object","properties":{"k":{"enum":["x","y"]},"v":{"type":"number","minimum":0,"maximum":1}},"required":["k","v"]},"maxItems":3})",
    R"({"type":"string","format":"time"})",
    R"({"type":"string","format":"date-time"})",
    R"({"type":"string","format":"ipv4"})",
    R"({"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"object","properties":{"c":{"type":"array","items":{"type":"boolean"},"maxItems":2}},"required":["c"]}},"required":["b"]}},"required":["a"]})",
    R"({"definitions":{"p":{"type":"integer","minimum":10,"maximum":99}},"type":"object","properties":{"x":{"$ref":"#/definitions/p"},"y":{"$ref":"#/definitions/p"}},"required":["x","y"]})",
    R"({"enum":["café","naïve","日本"]})",
    R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})",
    R"({"type":"array","items":{"type":"array","items":{"type":"integer","minimum":0,"maximum":1},"maxItems":2},"maxItems":2})",
    R"({"type":"object","properties":{}})",
    R"({"title":"T","description":"annotations only","type":"object","properties":{"ok":{"type":"boolean","description":"x"}},"required":["ok"]})",
};

// Regexes (the whole output must match) and their ECMAScript form for std::regex.
const std::vector<std::string> kRegexes = {
    "[a-z]{3,6}", "(yes|no|maybe)", "\\d{3}-\\d{4}", "[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8})?",
    "0x[0-9a-f]{4}", "(ab|cd)*e",
};

// GBNF grammars with a std::regex that accepts the same language.
struct GbnfCase {
  std::string gbnf;
  std::string regex;
};
const std::vector<GbnfCase> kGrammars = {
    {"root ::= term ((\"+\" | \"-\") term){0,3}\nterm ::= [0-9]{1,3}", "[0-9]{1,3}([+-][0-9]{1,3}){0,3}"},
    {"root ::= \"<\" tag \">\" [a-z ]{0,10} \"</\" tag \">\"\ntag ::= \"b\" | \"i\"",
     "<[bi]>[a-z ]{0,10}</[bi]>"},
};

const std::vector<std::string> kChoices = {"alpha", "beta", "gamma delta"};

struct Case {
  std::string name;
  GrammarSpec spec;
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (size_t i = 0; i < kSchemas.size(); ++i) {
    cases.push_back({str_cat("schema ", i), {GrammarKind::kJsonSchema, kSchemas[i]}});
  }
  cases.push_back({"json_object", {GrammarKind::kJsonObject, ""}});
  for (size_t i = 0; i < kRegexes.size(); ++i) {
    cases.push_back({str_cat("regex ", i), {GrammarKind::kRegex, kRegexes[i]}});
  }
  for (size_t i = 0; i < kGrammars.size(); ++i) {
    cases.push_back({str_cat("grammar ", i), {GrammarKind::kGbnf, kGrammars[i].gbnf}});
  }
  cases.push_back({"choice", {GrammarKind::kChoice, json(kChoices).dump()}});
  return cases;
}

// "" when `text` is what `spec` asks for, else what is wrong.
std::string check_output(const GrammarSpec& spec, const std::string& text) {
  switch (spec.kind) {
    case GrammarKind::kJsonSchema:
    case GrammarKind::kJsonObject: {
      const json value = json::parse(text, nullptr, false);
      if (value.is_discarded()) return "not JSON";
      if (spec.kind == GrammarKind::kJsonObject) return value.is_object() ? "" : "not an object";
      const std::optional<std::string> error = test::validate_json(value, json::parse(spec.source));
      return error.value_or("");
    }
    case GrammarKind::kRegex:
      return std::regex_match(text, std::regex(spec.source)) ? "" : "no regex match";
    case GrammarKind::kGbnf:
      for (const GbnfCase& g : kGrammars) {
        if (g.gbnf == spec.source) {
          return std::regex_match(text, std::regex(g.regex)) ? "" : "not in the grammar's language";
        }
      }
      return "unknown grammar";
    case GrammarKind::kChoice:
      for (const std::string& c : kChoices) {
        if (c == text) return "";
      }
      return "not one of the choices";
  }
  return "?";
}

struct SpecRun {
  executor::SpecProposer proposer = executor::SpecProposer::kNone;
  int32_t k = 0;
  int32_t tree_budget = 0;
};

struct Output {
  std::vector<int32_t> tokens;
  std::string text;
  std::optional<sched::FinishReason> finish;
};

enum class Mode { kGreedy, kSeeded, kUnseeded };

// Runs every case once (all submitted together: batched) and returns the outputs.
std::vector<Output> run_cases(const std::string& model, const SpecRun& setup,
                              const std::vector<Case>& cases, Mode mode) {
  executor::ExecutorOptions cpu;
  cpu.num_kv_blocks = 4096 / 16 + 2;
  cpu.num_threads = 2;
  cpu.proposer = setup.proposer;
  if (setup.proposer == executor::SpecProposer::kDraft) cpu.draft_model = testing::draft_gguf(3);
  cpu.tree_budget = setup.tree_budget;
  auto exec = ::arbor::engine::testing::load_executor(model, cpu);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return {};
  auto tok = tokenizer::Tokenizer::from_file(model);
  EXPECT_TRUE(tok.ok());
  EngineCoreConfig cfg;
  cfg.options.max_spec_tokens = std::max(setup.k, 1);
  cfg.options.max_num_batched_tokens = 256;
  cfg.tokenizer = tok->get();  // outlives the engine: declared first
  EngineCore engine(std::move(exec).value(), cfg);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < cases.size(); ++i) {
    GenerateRequest g;
    g.prompt_token_ids = (*tok)->encode("Once upon a time, the answer was");
    g.sampling.temperature = mode == Mode::kGreedy ? 0.0f : 1.0f;
    if (mode == Mode::kSeeded) g.sampling.seed = 1000 + i;
    // A GBNF case without source runs free (no grammar).
    if (cases[i].spec.kind != GrammarKind::kGbnf || !cases[i].spec.source.empty()) {
      g.sampling.grammar = cases[i].spec;
    }
    g.max_tokens = 300;
    g.speculation = setup.k > 0 ? sched::SpecRequest{.mode = sched::SpecMode::kFixed, .k = setup.k}
                                : sched::SpecRequest{.mode = sched::SpecMode::kOff};
    auto s = engine.submit(std::move(g));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (s.ok()) streams.push_back(*s);
  }
  std::vector<Output> out;
  for (auto& s : streams) {
    testing::Collected c = testing::drain(*s, 1);
    EXPECT_TRUE(c.final_event.error.ok()) << c.final_event.error.to_string();
    out.push_back({c.token_ids[0], c.text[0], c.finish[0]});
  }
  return out;
}

void expect_valid(const std::vector<Case>& cases, const std::vector<Output>& outputs,
                  const std::string& what) {
  ASSERT_EQ(outputs.size(), cases.size()) << what;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(outputs[i].finish, sched::FinishReason::kStop)
        << what << ", " << cases[i].name << ": did not finish: '" << outputs[i].text << "'";
    EXPECT_EQ(check_output(cases[i].spec, outputs[i].text), "")
        << what << ", " << cases[i].name << ": '" << outputs[i].text << "' (tokens "
        << ::testing::PrintToString(outputs[i].tokens) << ")";
  }
}

void expect_same_tokens(const std::vector<Output>& a, const std::vector<Output>& b,
                        const std::vector<Case>& cases, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << what << ", " << cases[i].name;
  }
}

// A random-weight model over the Llama 2 vocabulary (32000 tokens), made once per run.
const std::string& random_llama2_model() {
  static test::TempDir dir("structured_output");
  static const std::string path = [] {
    const std::string p = dir.path() + "/random.gguf";
    EXPECT_TRUE(test::expect_shared_file("tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf"));
    const test::CommandResult r = test::run_arbor(
        "synth --shape custom --dim 64 --ffn 128 --layers 2 --heads 4 --kv-heads 2 --context 1024 "
        "--type f32 --seed 5 --vocab " +
        test::shared_path("tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf") + " -o " + p);
    EXPECT_EQ(r.exit_code, 0) << r.output();
    return p;
  }();
  return path;
}

// The cases whose language is infinite in depth or length, where a random model may go on past
// max_tokens (a grammar constrains form, not length).
bool unbounded(const Case& c) {
  return c.name == "schema 9" || c.name == "json_object" || c.name == "regex 5";
}

TEST(StructuredOutput, RandomModelEveryOutputValidGreedyAndSeededSameWithNgramSpeculation) {
  std::vector<Case> cases;
  for (const Case& c : all_cases()) {
    if (!unbounded(c)) cases.push_back(c);
  }
  ASSERT_GE(kSchemas.size(), 30u);
  for (Mode mode : {Mode::kGreedy, Mode::kSeeded}) {
    const std::string what = mode == Mode::kGreedy ? "greedy" : "seeded";
    const std::vector<Output> plain = run_cases(random_llama2_model(), {}, cases, mode);
    expect_valid(cases, plain, what);
    const std::vector<Output> ngram = run_cases(
        random_llama2_model(), {.proposer = executor::SpecProposer::kNgram, .k = 4}, cases, mode);
    expect_valid(cases, ngram, what + " with n-gram speculation");
    expect_same_tokens(plain, ngram, cases, what + ": n-gram speculation vs none");
  }
}

TEST(StructuredOutput, Stories260KSameWithDraftModelChainsAndTrees) {
  const std::string model = testing::shared(test::kStories260K);
  const std::vector<Case> cases = all_cases();
  for (Mode mode : {Mode::kGreedy, Mode::kSeeded}) {
    const std::string what = mode == Mode::kGreedy ? "greedy" : "seeded";
    const std::vector<Output> plain = run_cases(model, {}, cases, mode);
    expect_valid(cases, plain, what);
    const std::vector<Output> draft =
        run_cases(model, {.proposer = executor::SpecProposer::kDraft, .k = 4}, cases, mode);
    expect_valid(cases, draft, what + " with draft chains");
    expect_same_tokens(plain, draft, cases, what + ": draft chains vs none");
    const std::vector<Output> tree = run_cases(
        model, {.proposer = executor::SpecProposer::kDraft, .k = 4, .tree_budget = 12}, cases, mode);
    expect_valid(cases, tree, what + " with draft trees");
    expect_same_tokens(plain, tree, cases, what + ": draft trees vs none");
    const std::vector<Output> suffix =
        run_cases(model, {.proposer = executor::SpecProposer::kSuffix, .k = 5}, cases, mode);
    expect_same_tokens(plain, suffix, cases, what + ": suffix speculation vs none");
  }
}

TEST(StructuredOutput, UnseededSamplingWithDraftModelStaysValid) {
  const std::string model = testing::shared(test::kStories260K);
  // Bounded cases only: an unseeded run is not reproducible.
  std::vector<Case> cases;
  for (const Case& c : all_cases()) {
    if (!unbounded(c)) cases.push_back(c);
  }
  const std::vector<Output> out =
      run_cases(model, {.proposer = executor::SpecProposer::kDraft, .k = 4}, cases, Mode::kUnseeded);
  expect_valid(cases, out, "unseeded with draft chains");
}

// ---- A thinking block before the grammar (GrammarSpec::thinking) ----

// The markers are strings stories260K writes on its own after the prompt, so its greedy output
// has a block that the grammar must leave alone: the block must be token for token the output of
// an unconstrained request, the text after it valid, and speculation must change nothing.
// stories260K's greedy output after the prompt is " very excited. It was a big, red ball. ...":
// the block opens inside a word (a marker cut across tokens) and closes at the first full stop.
constexpr std::string_view kThinkingStart = "very ex";
constexpr std::string_view kThinkingEnd = "ed.";

struct ThinkingCase {
  std::string name;
  grammar::ThinkingSpec spec;
};

// The first bounded cases, each with `thinking`.
std::vector<Case> with_thinking(const grammar::ThinkingSpec& thinking, size_t count) {
  std::vector<Case> cases;
  for (const Case& c : all_cases()) {
    if (unbounded(c) || cases.size() == count) continue;
    cases.push_back(c);
    cases.back().spec.thinking = thinking;
  }
  return cases;
}

grammar::ThinkingScanner::Out split_output(const grammar::ThinkingSpec& t, const std::string& text) {
  grammar::ThinkingScanner scanner(t.markers, t.start);
  grammar::ThinkingScanner::Out out;
  scanner.feed(text, out);
  scanner.finish(out);
  return out;
}

TEST(StructuredOutput, AfterThinkingFreeBlockValidContentSameWithSpeculation) {
  const std::string model = testing::shared(test::kStories260K);
  const std::vector<ThinkingCase> variants = {
      // The prompt opened the block; the model closes it with the end of a sentence.
      {"open", {.markers = {.start = "", .end = std::string(kThinkingEnd), .content_open = ""},
                .start = grammar::ThinkingStart::kOpen, .control_texts = {}}},
      // The model opens it (a marker cut across tokens) and closes it.
      {"maybe", {.markers = {.start = std::string(kThinkingStart), .end = std::string(kThinkingEnd),
                             .content_open = ""},
                 .start = grammar::ThinkingStart::kMaybe, .control_texts = {}}},
  };
  // The unconstrained greedy output: the block must be its beginning.
  const std::vector<Output> free = run_cases(model, {}, {{"free", {GrammarKind::kGbnf, ""}}},
                                             Mode::kGreedy);
  ASSERT_EQ(free.size(), 1u);
  const size_t end = free[0].text.find(kThinkingEnd);
  ASSERT_NE(end, std::string::npos) << free[0].text;
  const std::string block = free[0].text.substr(0, end + kThinkingEnd.size());
  ASSERT_EQ(block.find(kThinkingStart), block.find_first_not_of(' ')) << free[0].text;
  for (const ThinkingCase& v : variants) {
    const std::vector<Case> cases = with_thinking(v.spec, 12);
    const std::vector<Output> plain = run_cases(model, {}, cases, Mode::kGreedy);
    ASSERT_EQ(plain.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      const grammar::ThinkingScanner::Out out = split_output(v.spec, plain[i].text);
      EXPECT_EQ(plain[i].finish, sched::FinishReason::kStop) << v.name << " " << cases[i].name;
      EXPECT_EQ(check_output(cases[i].spec, out.content), "")
          << v.name << ", " << cases[i].name << ": content '" << out.content << "' of '"
          << plain[i].text << "'";
      EXPECT_TRUE(plain[i].text.starts_with(block))
          << v.name << ", " << cases[i].name << ": the block was constrained: '" << plain[i].text
          << "'";
    }
    for (const SpecRun& spec :
         {SpecRun{.proposer = executor::SpecProposer::kNgram, .k = 4},
          SpecRun{.proposer = executor::SpecProposer::kDraft, .k = 4},
          SpecRun{.proposer = executor::SpecProposer::kDraft, .k = 4, .tree_budget = 12},
          SpecRun{.proposer = executor::SpecProposer::kSuffix, .k = 5}}) {
      expect_same_tokens(plain, run_cases(model, spec, cases, Mode::kGreedy), cases,
                         str_cat(v.name, ", proposer ", static_cast<int>(spec.proposer), " tree ",
                                 spec.tree_budget));
    }
    const std::vector<Output> seeded = run_cases(model, {}, cases, Mode::kSeeded);
    expect_same_tokens(seeded,
                       run_cases(model, {.proposer = executor::SpecProposer::kDraft, .k = 4},
                                 cases, Mode::kSeeded),
                       cases, v.name + ", seeded, draft chains");
  }
}

// min_tokens holds back EOS until the count is reached, with and without speculation (the same
// tokens), and the engine refuses min_tokens above max_tokens.
TEST(MinTokens, HoldsBackEosWithAndWithoutSpeculation) {
  const std::string model = testing::shared(test::kStories260K);
  auto tok = tokenizer::Tokenizer::from_file(model);
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> eos = default_stop_token_ids(**tok);
  auto generate = [&](const SpecRun& setup, int32_t min_tokens) {
    executor::ExecutorOptions cpu;
    cpu.num_kv_blocks = 4096 / 16 + 2;
    cpu.num_threads = 2;
    cpu.proposer = setup.proposer;
    if (setup.proposer == executor::SpecProposer::kDraft) cpu.draft_model = testing::draft_gguf(3);
    auto exec = ::arbor::engine::testing::load_executor(model, cpu);
    EXPECT_TRUE(exec.ok()) << exec.status().to_string();
    EngineCoreConfig cfg;
    cfg.options.max_spec_tokens = std::max(setup.k, 1);
    cfg.tokenizer = tok->get();
    EngineCore engine(std::move(exec).value(), cfg);
    GenerateRequest g;
    g.prompt_token_ids = (*tok)->encode("The cat");  // its greedy story ends after ~210 tokens
    g.sampling.temperature = 0.0f;
    g.sampling.min_tokens = min_tokens;
    g.max_tokens = 250;
    g.speculation = setup.k > 0 ? sched::SpecRequest{.mode = sched::SpecMode::kFixed, .k = setup.k}
                                : sched::SpecRequest{.mode = sched::SpecMode::kOff};
    GenerateRequest too_many = g;
    too_many.sampling.min_tokens = 251;
    EXPECT_FALSE(engine.submit(std::move(too_many)).ok());
    auto s = engine.submit(std::move(g));
    EXPECT_TRUE(s.ok());
    return testing::drain(**s, 1).token_ids[0];
  };
  const std::vector<int32_t> plain = generate({}, 0);
  ASSERT_FALSE(plain.empty());
  ASSERT_TRUE(std::count(eos.begin(), eos.end(), plain.back()) > 0 && plain.size() < 230)
      << "the prompt must end early without min_tokens for this test to mean anything: "
      << plain.size() << " tokens";
  const std::vector<int32_t> held = generate({}, 230);
  ASSERT_GE(held.size(), 230u);
  for (size_t i = 0; i < 230; ++i) {
    EXPECT_EQ(std::count(eos.begin(), eos.end(), held[i]), 0) << "EOS at output " << i;
  }
  // Before the point where EOS was first the argmax, the outputs agree.
  EXPECT_TRUE(std::equal(plain.begin(), plain.end() - 1, held.begin()));
  EXPECT_EQ(generate({.proposer = executor::SpecProposer::kNgram, .k = 4}, 230), held);
  EXPECT_EQ(generate({.proposer = executor::SpecProposer::kDraft, .k = 3}, 230), held);
  EXPECT_EQ(generate({.proposer = executor::SpecProposer::kDraft, .k = 3, .tree_budget = 8}, 230),
            held);
}

}  // namespace
}  // namespace arbor::engine
