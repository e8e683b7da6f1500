// arbor's GGUF tokenizer against llama.cpp's own (tests/reference/.llama/llama_ref, built by
// scripts/install_reference.sh), on a broad text set, for every `tokenizer.ggml.pre` arbor
// supports and for the SentencePiece settings of Gemma and Phi-3.5.
//
// Real vocabularies of most models are not available offline, and the pre-tokenizer is what
// differs between the names, so each name is tested on one real byte-level BPE vocabulary
// (Llama 3's tokenizer.json, restricted to the tokens the texts contain so that llama_ref loads
// it in milliseconds) written as a vocab-only GGUF whose tokenizer.ggml.pre is that name. The texts
// are joined with a control token and tokenised with parse_special, so each text is a fragment
// of its own (its start and end are the regexes' subject start and end) and one llama_ref run
// covers them all. add_bos_token is left out of the files, so each name's default applies.
//
// A test cannot pass without llama_ref: it fails, naming scripts/install_reference.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_set>

#include "gguf/gguf.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "test_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace arbor::tokenizer {
namespace {

using gguf::Value;
using testing::ids_to_string;
using testing::shared_path;

constexpr size_t kMaxTokenBytes = 64;  // longer than any Llama 3 token that text forms
constexpr char kSeparator[] = "<|end_of_text|>";
constexpr char kSpmVocab[] = "tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf";
constexpr char kPhi3Vocab[] = "tokenizers/llamacpp-vocab/ggml-vocab-phi-3.gguf";
constexpr char kInputs[] = "tokenizers/llamacpp-vocab/ggml-vocab-llama-bpe.gguf.inp";

std::string llama_ref_bin() {
  return std::string(ARBOR_SOURCE_DIR) + "/tests/reference/.llama/llama_ref";
}

::testing::AssertionResult have_llama_ref() {
  if (access(llama_ref_bin().c_str(), X_OK) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "llama.cpp reference " << llama_ref_bin()
         << " is missing: run scripts/install_reference.sh (make deps runs it)";
}

// Texts chosen to separate the pre-tokenizers: case changes inside words (tekken, o200k),
// combining marks (qwen35), digit runs ({1,3} vs single digits), CJK and kana (deepseek),
// contractions, punctuation and slashes, every kind of whitespace, emoji, mixed scripts.
const std::vector<std::string>& own_texts() {
  static const std::vector<std::string> kTexts = {
      "HTTPServer XMLHttpRequest iPhone McDonald's camelCaseWord snake_case_word kebab-case",
      "ÉCOLE École éCOLE ÀÉÎÕÜ àéîõü ǅungla ǈubljana ΑΒΓ αβγ ΣΊΣΥΦΟΣ Straße STRASSE",
      "e\xcc\x81t\xc3\xa9 cafe\xcc\x81 n\xcc\x83o Z\xcd\x91\xcc\x88lgo nai\xcc\x88ve",
      "नमस्ते दुनिया, क्षत्रिय; தமிழ் மொழி; ภาษาไทย; ខ្មែរ; ᎣᏏᏲ; ქართული",
      "日本語のテキスト、ひらがなカタカナ漢字。中文文本，简体字和繁體字。한국어 텍스트입니다.",
      "ﾊﾝｶｸｶﾀｶﾅ ＡＢＣ１２３ｘｙｚ！？ 「括弧」『二重』【墨付き】〜",
      "1 12 123 1234 12345 123456 1234567 12345678901234567890",
      "3.14159 -2.5e-10 1,234,567.89 0x1F 0b1011 1e9 $100 €20 ¥3000 50% v1.2.3",
      "١٢٣٤٥ ۱۲۳ ०१२३ ①②③ ½¾ x² H₂O Ⅻ ⅰⅱ 𝟙𝟚𝟛",
      "I'm you're he's she'd we'll they've don't DON'T I'M YOU'RE It'S 'tis o'clock",
      "‘curly’ “double” «guillemets» „low“ ‹single› 'single' \"double\" `backtick`",
      "a/b/c path/to/file.txt http://example.com/a?b=c&d=e#f C:\\Windows\\ ~/.bashrc //x// /x\n/y",
      "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
      "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\r\n}\r\n\r\n",
      "if(x&&y||!z){y->z=x<<2;}else{x>>=1;}// a+=b-=c*=d/=e%=f^=g|=h",
      "<html><body class=\"x\">Hi &amp; bye</body></html> <|im_start|> [INST] {{x}}",
      "   leading and trailing   ",
      "a  b   c    d\t\te\n\nf\r\rg\x0b\x0ch",
      "tab\tand\ttabs\t\t\tend\t",
      "\n\n\n\n",
      "    ",
      " ",
      "x                                        y",
      "nbsp\xc2\xa0here ideo\xe3\x80\x80space em\xe2\x80\x83space line\xe2\x80\xa8sep nel\xc2\x85x",
      "mongolian\xe1\xa0\x8evs zero\xe2\x80\x8bwidth joiner\xe2\x80\x8dx bom\xef\xbb\xbfx",
      // U+180E is not white space for llama.cpp (nor Unicode since 6.3), but is PCRE2's \s.
      " \xe1\xa0\x8e x \xe1\xa0\x8e's \xe1\xa0\x8e\n\xe1\xa0\x8e  \xe1\xa0\x8e",
      "ascii\x1c\x1d\x1e\x1fseparators \x01\x02\x7f controls",
      "emoji 🦙🚀😀 😶‍🌫️ 👩🏽‍💻 👨‍👩‍👧‍👦 🇫🇷🇯🇵 1️⃣ ✅❌ ☃︎ ♥️",
      "Привет, мир! Καλημέρα κόσμε. שלום עולם. مرحبا بالعالم. Xin chào thế giới.",
      "mixed日本English한국어Русский123abc ABC漢字def ひらがなABC",
      "ALLCAPS lowercase Titlecase mIxEd CaSe ABCdef abcDEF aBc AbC",
      "...!!!???,,,;;;::: --- ___ *** ### @@@ !@#$%^&*()_+-=[]{}|;':\",./<>?",
      "'s 'S 't 're 'RE 've 'm 'll 'LL 'd ' s '' ''' x'y",
      "new\nline\r\nwin\rmac\n\r\n\n text \n",
      "end with spaces   ",
      "end with newline and spaces\n   ",
      "bad utf8 \xff\xfe \xc3( \xe2\x82 ok",
      "Ünïcödé ÅngströM ŁÓDŹ ĲSSEL ŒUVRE ǄUNGLA ꞋꞌꞍ",
      "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX.",
      "我 爱 中文 。 日本 東京 大阪 と 中国 の 人 ABC漢字def 123日本 (中国) “中文”",
      "  \n  \n\n \t\n x  \r\n   \n\tend\t\t\n",
      // (A hex escape runs on while hex digits follow: "\xa0" "b" keeps the b.)
      "a\xc2\xa0\xc2\xa0" "b x \xe3\x80\x80y \xe2\x80\x83\xe2\x80\x83z\n\xc2\xa0\n",
      "a\xc2\xa0\xc2\xa0\x0b x\xe3\x80\x80 \xe3\x80\x80\xe3\x80\x81 \xe2\x80\xa8\xe2\x80\xa9 \xe1\x9a\x80",
      "\xcc\x81start 1\xcc\x81 !\xcc\x81 a\xcc\x81\xcc\x82\xcc\x83" "b \xcc\x81\xcc\x81",
      "it's 'tis ''s l'\xc3\xa9t\xc3\xa9 1's x's_ y'S IT'S 's's",
      "    def x():\n        return 'a'\n\n\n    # done   \n",
      "!!!\r\n...\n\n?? \n;;\t\n -- \n /// \n\\\\\n",
      "A1B2C3 a1b2c3 1a2b3c \xe2\x85\xa0\xe2\x85\xa1 v2.0-rc1 x86_64 UTF-8 3D 4K 1080p",
  };
  return kTexts;
}

// llama.cpp's own tokenizer test inputs (test-tokenizer-0) plus own_texts().
std::vector<std::string> load_texts() {
  std::vector<std::string> texts;
  EXPECT_TRUE(::arbor::test::require_shared_file(kInputs));
  const std::string inp = ::arbor::test::read_file(shared_path(kInputs));
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    if (next > pos) texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  EXPECT_GE(texts.size(), 40u) << kInputs;
  for (const std::string& t : own_texts()) texts.push_back(t);
  return texts;
}

// The key-value pairs of a vocab-only GGUF, in order; set() replaces or appends.
struct Keys {
  std::vector<gguf::KeyValue> kv;
  void set(const std::string& key, Value v) {
    for (auto& e : kv) {
      if (e.key == key) {
        e.value = std::move(v);
        return;
      }
    }
    kv.push_back({key, std::move(v)});
  }
  Status write(const std::string& path) const {
    gguf::GgufWriter w;
    for (const auto& e : kv) w.set(e.key, e.value);
    return w.write(path);
  }
};

// Every key of the shared GGUF at `rel` (architecture keys included, which llama.cpp needs
// even for a vocab-only load).
Keys keys_of(const std::string& rel) {
  Keys keys;
  EXPECT_TRUE(::arbor::test::require_shared_file(rel));
  auto file = gguf::GgufFile::open(shared_path(rel));
  EXPECT_TRUE(file.ok()) << file.status().to_string();
  if (file.ok()) keys.kv = file->metadata();
  return keys;
}

std::vector<std::string> strings_of(const Value& v) {
  std::vector<std::string> out;
  for (const Value& item : std::get<gguf::Array>(v.data).items) {
    out.push_back(std::get<std::string>(item.data));
  }
  return out;
}

// Llama 3's byte-level BPE restricted to the tokens that occur in `texts` (as byte
// substrings), plus <|begin_of_text|> (BOS) and <|end_of_text|> (EOS, the text separator).
// Every token BPE can form inside a piece of a text is such a substring, and the kept merges
// keep their order, so any pre-tokenizer tokenises the texts exactly as with the full
// vocabulary, while llama_ref loads the file in milliseconds. The architecture keys are
// llama-spm's; tokenizer.ggml.pre is set per test.
Keys small_bpe_keys(const std::vector<std::string>& texts) {
  Keys keys;
  auto tok = Tokenizer::from_file(shared_path("tokenizers/hf/llama3/tokenizer.json"));
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  if (!tok.ok()) return keys;
  std::vector<uint8_t> keep((*tok)->vocab_size(), 0);
  for (std::string text : texts) {
    std::string repaired;  // what llama.cpp makes of invalid UTF-8
    internal::append_utf8_like_llama_cpp(text, repaired);
    for (const std::string& t : {text, repaired}) {
      for (size_t i = 0; i < t.size(); ++i) {
        for (size_t n = 1; n <= kMaxTokenBytes && i + n <= t.size(); ++n) {
          const int32_t id = (*tok)->token_id(internal::byte_level_encode(t.substr(i, n)));
          if (id >= 0) keep[id] = 1;
        }
      }
    }
  }
  std::vector<std::string> tokens, merges;
  for (int32_t id = 0; id < static_cast<int32_t>(keep.size()); ++id) {
    if (keep[id] || id < 256) tokens.push_back((*tok)->token_text(id));  // 256: every byte
  }
  const std::unordered_set<std::string> kept(tokens.begin(), tokens.end());
  for (const auto& kv : (*tok)->to_gguf_metadata()) {
    if (kv.key != "tokenizer.ggml.merges") continue;
    for (const std::string& m : strings_of(kv.value)) {
      const size_t space = m.find(' ', 1);
      const std::string left = m.substr(0, space), right = m.substr(space + 1);
      if (kept.count(left) && kept.count(right) && kept.count(left + right)) merges.push_back(m);
    }
  }
  std::vector<int32_t> types(tokens.size(), 1);
  const auto bos = static_cast<uint32_t>(tokens.size());
  tokens.push_back("<|begin_of_text|>");
  tokens.push_back(kSeparator);
  types.push_back(3);
  types.push_back(3);
  for (const auto& kv : keys_of(kSpmVocab).kv) {
    if (!kv.key.starts_with("tokenizer.")) keys.set(kv.key, kv.value);
  }
  keys.set("general.name", Value::str("arbor-bpe-test"));
  keys.set("llama.vocab_size", Value::u32(static_cast<uint32_t>(tokens.size())));
  keys.set("tokenizer.ggml.model", Value::str("gpt2"));
  keys.set("tokenizer.ggml.pre", Value::str("default"));
  keys.set("tokenizer.ggml.tokens", Value::string_array(tokens));
  keys.set("tokenizer.ggml.token_type", Value::i32_array(types));
  keys.set("tokenizer.ggml.merges", Value::string_array(merges));
  keys.set("tokenizer.ggml.bos_token_id", Value::u32(bos));
  keys.set("tokenizer.ggml.eos_token_id", Value::u32(bos + 1));
  return keys;
}

// The ids llama_ref prints for `text_path` (with add_special and parse_special).
std::vector<int32_t> llama_ref_ids(const std::string& gguf_path, const std::string& text_path) {
  const auto r = ::arbor::test::run_shell(llama_ref_bin() + " tokenize '" + gguf_path + "' '" +
                                          text_path + "' --parse-special");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  std::vector<int32_t> ids;
  std::istringstream in(r.out);
  for (std::string field; std::getline(in, field, ',');) ids.push_back(std::stoi(field));
  return ids;
}

// Splits `ids` at every `separator` id: one run per text.
std::vector<std::vector<int32_t>> split_runs(const std::vector<int32_t>& ids, int32_t separator) {
  std::vector<std::vector<int32_t>> runs(1);
  for (int32_t id : ids) {
    if (id == separator) {
      runs.emplace_back();
    } else {
      runs.back().push_back(id);
    }
  }
  return runs;
}

std::string join(const std::vector<std::string>& texts, const std::string& separator) {
  std::string all;
  for (size_t i = 0; i < texts.size(); ++i) all += (i ? separator : "") + texts[i];
  return all;
}

// Tokenises the joined texts with llama_ref and with arbor (both from the file at gguf_path)
// and returns the number of texts whose ids differ; with `report`, each difference is a test
// failure naming `what`, the text and both id lists.
int count_differences(const std::string& what, const std::string& gguf_path,
                      const std::vector<std::string>& texts, const std::string& separator,
                      const std::vector<int32_t>& expected, bool report) {
  auto tok = Tokenizer::from_file(gguf_path);
  EXPECT_TRUE(tok.ok()) << what << ": " << tok.status().to_string();
  if (!tok.ok()) return static_cast<int>(texts.size());
  const std::string all = join(texts, separator);
  const std::vector<int32_t> got = (*tok)->encode(all, {.parse_special = true});
  const int32_t sep_id = (*tok)->token_id(separator);
  const auto want_runs = split_runs(expected, sep_id), got_runs = split_runs(got, sep_id);
  if (want_runs.size() != texts.size() || got_runs.size() != texts.size()) {
    if (report) {
      ADD_FAILURE() << what << ": " << texts.size() << " texts, llama_ref gave "
                    << want_runs.size() << " runs, arbor " << got_runs.size();
    }
    return static_cast<int>(texts.size());
  }
  int differences = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (want_runs[i] == got_runs[i]) continue;
    ++differences;
    if (report && differences <= 5) {
      ADD_FAILURE() << what << ": text " << i << " '" << texts[i] << "'\n  llama.cpp "
                    << ids_to_string(want_runs[i]) << "\n  arbor     " << ids_to_string(got_runs[i]);
    }
  }
  return differences;
}

// Writes `keys` to a GGUF, compares arbor with llama_ref on all texts, and returns llama_ref's
// ids (for further checks on the same file).
std::vector<int32_t> expect_same_as_llama_cpp(const std::string& what, const Keys& keys,
                                              const std::vector<std::string>& texts,
                                              const std::string& separator) {
  const std::string path = ::arbor::test::temp_path("llama_ref_vocab.gguf");
  const std::string text_path = ::arbor::test::temp_path("llama_ref_texts.txt");
  EXPECT_TRUE(keys.write(path).ok()) << what;
  {
    std::ofstream out(text_path, std::ios::binary);
    out << join(texts, separator);
  }
  const std::vector<int32_t> expected = llama_ref_ids(path, text_path);
  EXPECT_FALSE(expected.empty()) << what;
  const int diff = count_differences(what, path, texts, separator, expected, true);
  EXPECT_EQ(diff, 0) << what << ": " << diff << " of " << texts.size() << " texts differ";
  return expected;
}

// The texts of every test, and the BPE vocabulary built for them.
const std::vector<std::string>& all_texts() {
  static const std::vector<std::string> kTexts = load_texts();
  return kTexts;
}

Keys bpe_keys_for(std::string_view pre) {
  static const Keys kBase = small_bpe_keys(all_texts());
  Keys keys = kBase;
  keys.set("tokenizer.ggml.pre", Value::str(std::string(pre)));
  return keys;
}

// Plausible wrong regexes for some pre-tokenizer names, each of which must tokenise some of
// the texts differently from llama.cpp: the proof that the comparison can fail. They reach
// arbor through tokenizer.arbor.pre_regexes, which llama.cpp ignores; the name keeps every flag.
std::multimap<std::string, std::vector<std::string>> wrong_regexes() {
  auto patterns = [](std::string_view pre) { return internal::bpe_pre_tokenizer(pre)->patterns; };
  auto replaced = [&](std::string_view pre, const std::string& from, const std::string& to) {
    std::vector<std::string> p = patterns(pre);
    const size_t at = p.back().find(from);
    EXPECT_NE(at, std::string::npos) << from << " not in " << p.back();
    if (at != std::string::npos) p.back().replace(at, from.size(), to);
    return p;
  };
  // Mistral's tokenizer.json original, which llama.cpp adapted (see pretokenizer.cc).
  const std::string tekken_hf =
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
      "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  return {
      {"tekken", {tekken_hf}},
      {"tekken", patterns("llama-bpe")},
      {"gpt-4o", replaced("gpt-4o", "\\p{N}{1,3}", "\\p{N}")},
      {"gpt-4o", patterns("tekken")},
      {"qwen35", patterns("qwen2")},
      {"qwen2", patterns("llama-bpe")},
      {"llama-bpe", replaced("llama-bpe", "\\p{N}{1,3}", "\\p{N}{1,2}")},
      {"dbrx", replaced("dbrx", "\\s+(?!\\S)|", "")},
      {"refact", patterns("gpt-2")},
      {"smollm", {"\\p{N}+", patterns("smollm")[1]}},
      {"gpt-2", replaced("gpt-2", "'s|'t|'re|'ve|'m|'ll|'d|", "")},
      {"deepseek-v3", {"\\p{N}{1,3}", patterns("deepseek-v3")[2]}},
      {"deepseek-v3", {"\\p{N}+", patterns("deepseek-v3")[1], patterns("deepseek-v3")[2]}},
  };
}

// Every name arbor accepts, on the same vocabulary with that name, against llama.cpp; then the
// wrong regexes above, which must differ from llama.cpp's ids on some text.
TEST(LlamaRef, EverySupportedPreTokenizerMatchesLlamaCpp) {
  ASSERT_TRUE(have_llama_ref());
  const std::vector<std::string>& texts = all_texts();
  const auto names = internal::supported_pre_names();
  ASSERT_EQ(names.size(), 68u);  // a name lost from the table fails here
  const auto mutants = wrong_regexes();
  const std::string mutant_path = ::arbor::test::temp_path("mutant_vocab.gguf");
  for (std::string_view pre : names) {
    SCOPED_TRACE(std::string("tokenizer.ggml.pre = ") + std::string(pre));
    const auto expected = expect_same_as_llama_cpp(std::string(pre), bpe_keys_for(pre), texts,
                                                   kSeparator);
    const auto [begin, end] = mutants.equal_range(std::string(pre));
    for (auto it = begin; it != end; ++it) {
      Keys keys = bpe_keys_for(pre);
      keys.set("tokenizer.arbor.pre_regexes", Value::string_array(it->second));
      ASSERT_TRUE(keys.write(mutant_path).ok());
      const int diff = count_differences(it->first, mutant_path, texts, kSeparator, expected, false);
      EXPECT_GT(diff, 0) << pre << ": the wrong regexes " << join(it->second, " ; ")
                         << " tokenise every text like llama.cpp; the texts cannot tell them apart";
    }
  }
  for (const auto& [pre, wrong] : mutants) {
    EXPECT_TRUE(std::find(names.begin(), names.end(), pre) != names.end()) << pre;
  }
}

// Gemma (1, 2, 3) GGUFs are SentencePiece ("llama") vocabularies with add_space_prefix = false
// (llama.cpp's converter writes it), add_bos = true; Gemma 3 marks many added tokens
// user-defined, which are split out of the text before the model runs. Tested on the Llama 2
// vocabulary with those settings, since no Gemma vocabulary is available offline.
TEST(LlamaRef, SentencePieceSettingsOfGemmaMatchLlamaCpp) {
  ASSERT_TRUE(have_llama_ref());
  const std::vector<std::string>& texts = all_texts();
  const Keys base = keys_of(kSpmVocab);
  expect_same_as_llama_cpp("llama-spm", base, texts, "</s>");
  Keys gemma = base;
  gemma.set("general.name", Value::str("gemma-3-test"));
  gemma.set("tokenizer.ggml.add_space_prefix", Value::boolean(false));
  gemma.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
  gemma.set("tokenizer.ggml.add_eos_token", Value::boolean(false));
  expect_same_as_llama_cpp("llama-spm, add_space_prefix = false", gemma, texts, "</s>");
  // User-defined tokens: retype a few ordinary ones, as Gemma's added tokens are typed.
  auto file = gguf::GgufFile::open(shared_path(kSpmVocab));
  ASSERT_TRUE(file.ok());
  const auto tokens = file->get_string_array("tokenizer.ggml.tokens");
  auto types = file->get_i32_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(tokens.ok() && types.ok());
  for (const char* text : {"http", "://", "<", "ing", "\xe2\x96\x81the"}) {
    const auto it = std::find(tokens->begin(), tokens->end(), std::string(text));
    ASSERT_NE(it, tokens->end()) << text;
    (*types)[it - tokens->begin()] = 4;  // USER_DEFINED
  }
  gemma.set("tokenizer.ggml.token_type", Value::i32_array(*types));
  expect_same_as_llama_cpp("llama-spm, Gemma flags, user-defined tokens", gemma, texts, "</s>");
}

// Phi-3.5 GGUFs are the Phi-3 SentencePiece vocabulary; llama.cpp marks special tokens rstrip
// only when general.name contains "phi-3" or "phi3" (converters now write "Phi 3.5 Mini
// Instruct", which does not).
TEST(LlamaRef, PhiSentencePieceMatchesLlamaCpp) {
  ASSERT_TRUE(have_llama_ref());
  std::vector<std::string> texts = all_texts();
  texts.push_back("<|user|>\n  hi  <|end|>\n<|assistant|>  ok <|end|>  \n");
  Keys phi = keys_of(kPhi3Vocab);
  expect_same_as_llama_cpp("phi-3 (name Phi3)", phi, texts, "<|endoftext|>");
  phi.set("general.name", Value::str("Phi 3.5 Mini Instruct"));
  expect_same_as_llama_cpp("phi-3 (name Phi 3.5 Mini Instruct)", phi, texts, "<|endoftext|>");
}

}  // namespace
}  // namespace arbor::tokenizer
