#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "base/log.h"

namespace arbor::tokenizer::internal {

namespace {

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kLlama3Pattern =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Pattern =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// The same two as written in Hugging Face tokenizer.json files.
constexpr const char* kLlama3HfPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2HfPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// DeepSeek LLM's letter class, with code points spelled out so no editor normalises them.
constexpr const char* kDeepseekLetters =
    "\\s?[\\x{41}-\\x{5A}\\x{61}-\\x{7A}\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}"
    "\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}"
    "\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"
    "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"
    "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"
    "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
    "\\x{1E900}-\\x{1E943}]+";
// llama.cpp runs a pattern without \p{..} through std::wregex after replacing every non-ASCII
// white-space character of the text by U+000B, so ranges of non-ASCII code points never match
// those characters: they are cut out of the ranges here. DeepSeek's CJK class is written
// [\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+, whose second range covers U+1680,
// U+2000-U+200A, U+2028, U+2029, U+202F, U+205F and U+3000 (llama.cpp's white space there).
constexpr const char* kCjk =
    "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{167F}\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}\\x{202A}-\\x{202E}"
    "\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}\\x{3001}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";
// llama.cpp's adaptations of the "[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
// words of Mistral's tekken and OpenAI's o200k patterns: an upper-case run is letters other
// than a-z, a lower-case run letters other than A-Z, so a non-ASCII letter counts as both, and
// combining marks are not part of words. Kept verbatim: llama.cpp tokenises GGUF files this way.
constexpr const char* kTekkenPattern =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|"
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
#define ARBOR_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
constexpr const char* kGpt4oPattern =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" ARBOR_CONTRACTIONS "?|"
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" ARBOR_CONTRACTIONS "?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Qwen3.5: marks join letters, and are not "other" symbols.
constexpr const char* kQwen35Pattern =
    ARBOR_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// DeepSeek V3: digit triples, then Han and kana runs, then words that may start with one ASCII
// punctuation mark.
constexpr const char* kDeepseekV3Words =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kHanKana = "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+";
constexpr const char* kPoroPattern =
    " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+";

// One row per llama.cpp pre-tokenizer type (llama_vocab::impl::load and llm_tokenizer_bpe in
// llama-vocab.cpp): the tokenizer.ggml.pre names that select it, its patterns, and the flags
// it sets. Names whose llama.cpp behaviour arbor does not reproduce are left out, so loading
// them fails instead of tokenising differently.
const std::vector<PreTokenizerSpec>& specs() {
  static const std::vector<PreTokenizerSpec> kSpecs = {
      {.names = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                 "lfm2"},
       .patterns = {kLlama3Pattern}, .ignore_merges = true, .add_bos = true},
      {.names = {"dbrx", "smaug-bpe"}, .patterns = {kLlama3Pattern}},
      {.names = {"glm4", "chatglm-bpe"}, .patterns = {kLlama3Pattern}, .no_default_bos = true},
      {.names = {"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "kormo", "f2llmv2", "hunyuan",
                 "solar-open", "grok-2"},
       .patterns = {kQwen2Pattern}},
      {.names = {"laguna"}, .patterns = {"[^\\n]+|[\\n]+", kQwen2Pattern}},
      {.names = {"ufakzeka"},  // Qwen2's without contractions (Turkish apostrophe suffixes)
       .patterns = {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                    "\\s+(?!\\S)|\\s+"}},
      {.names = {"bailingmoe", "bailingmoe2", "llada-moe"},
       .patterns = {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
      {.names = {"seed-coder"},
       .patterns = {ARBOR_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| "
                    "?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {.names = {"exaone-moe"},  // words may hold single spaces between letters
       .patterns = {ARBOR_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|"
                    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
      {.names = {"minicpm5"},
       .patterns = {"\\p{N}{1,3}",
                    ARBOR_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       .ignore_merges = true},
      {.names = {"jais-2"},  // Llama 3's with white-space runs cut into powers of two
       .patterns = {ARBOR_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|"
                    "\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|"
                    "\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"}},
      {.names = {"qwen35"}, .patterns = {kQwen35Pattern}},
      {.names = {"tekken"}, .patterns = {kTekkenPattern}, .ignore_merges = true, .add_bos = true},
      {.names = {"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, .patterns = {kGpt4oPattern}},
      {.names = {"gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4", "trillion", "gigachat",
                 "a.x-4.0", "mellum", "granite-docling"},
       .patterns = {kGpt2Pattern}},
      {.names = {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
                 "mellum2"},
       .patterns = {"\\p{N}", kGpt2Pattern}},
      {.names = {"falcon"}, .patterns = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2Pattern, "[0-9][0-9][0-9]"}},
      {.names = {"deepseek-coder"},
       .patterns = {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", kCjk, "\\p{N}"}},
      {.names = {"deepseek-llm"},
       .patterns = {"[\\r\\n]", kDeepseekLetters,
                    "\\s?[\\x{21}-\\x{2F}\\x{3A}-\\x{7E}\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}"
                    "\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+",  // U+3000: see kCjk
                    "\\s+$", kCjk, "\\p{N}+"}},
      {.names = {"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"},
       .patterns = {"\\p{N}{1,3}", kHanKana, kDeepseekV3Words}},
      {.names = {"poro-chat", "bloom", "gpt3-finnish"}, .patterns = {kPoroPattern}},
      {.names = {"viking"}, .patterns = {kPoroPattern, "\\p{N}"}},
      {.names = {"default", ""},
       .patterns = {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2Pattern, "\\p{N}+", "[0-9][0-9][0-9]"}},
  };
  return kSpecs;
}
#undef ARBOR_CONTRACTIONS

}  // namespace

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

namespace {

// Unicode's White_Space characters, which llama.cpp's \s matches (unicode_set_whitespace) and
// Hugging Face's regex engines too. PCRE2's \s also matches U+180E MONGOLIAN VOWEL SEPARATOR
// (through \h; it stopped being white space in Unicode 6.3), so \s and \S are spelled out.
constexpr std::string_view kWhiteSpace =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

}  // namespace

std::string spell_out_white_space(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char d = pattern[++i];
      if (d == 's') {
        out.append(in_class ? "" : "[").append(kWhiteSpace).append(in_class ? "" : "]");
      } else if (d == 'S' && !in_class) {
        out.append("[^").append(kWhiteSpace).append("]");
      } else {
        out.push_back(c);
        out.push_back(d);  // \S inside a class stays PCRE2's (no pattern of ours has one)
      }
      continue;
    }
    out.push_back(c);
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

Result<RegexSplitter> RegexSplitter::create(const std::vector<std::string>& patterns) {
  RegexSplitter s;
  for (const std::string& given : patterns) {
    const std::string p = spell_out_white_space(given);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto c = std::make_shared<Compiled>();
    c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
    if (c->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return invalid_argument("pre-tokenizer regex '", p, "' does not compile at offset ", err_off,
                              ": ", reinterpret_cast<const char*>(msg));
    }
    c->jit = pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE) == 0;
    s.patterns_.push_back(std::move(c));
  }
  return s;
}

namespace {

// Per-call match state: match data and a JIT stack big enough for long whitespace runs.
class MatchScratch {
 public:
  explicit MatchScratch(const pcre2_code* code) {
    data_ = pcre2_match_data_create_from_pattern(code, nullptr);
  }
  ~MatchScratch() {
    pcre2_match_data_free(data_);
    pcre2_match_context_free(context_);
    pcre2_jit_stack_free(stack_);
  }
  pcre2_match_data* data() { return data_; }
  pcre2_match_context* context() {
    if (context_ == nullptr) {
      context_ = pcre2_match_context_create(nullptr);
      stack_ = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(context_, nullptr, stack_);
    }
    return context_;
  }

 private:
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
};

int run_match(const pcre2_code* code, bool jit, std::string_view piece, size_t offset,
              MatchScratch& scratch) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  if (jit) {
    int rc = pcre2_jit_match(code, subject, piece.size(), offset, 0, scratch.data(), nullptr);
    if (rc != PCRE2_ERROR_JIT_STACKLIMIT) return rc;
    return pcre2_jit_match(code, subject, piece.size(), offset, 0, scratch.data(),
                           scratch.context());
  }
  return pcre2_match(code, subject, piece.size(), offset, PCRE2_NO_UTF_CHECK, scratch.data(),
                     nullptr);
}

// Splits one piece [begin, end) of `text` with one pattern, appending to `out`.
void split_piece(const pcre2_code* code, bool jit, std::string_view text, Span span,
                 MatchScratch& scratch, std::vector<Span>& out) {
  const std::string_view piece = text.substr(span.first, span.second - span.first);
  size_t prev = 0, offset = 0;
  while (offset < piece.size()) {
    const int rc = run_match(code, jit, piece, offset, scratch);
    if (rc < 0) {
      if (rc != PCRE2_ERROR_NOMATCH) {
        ARBOR_LOG(kWarn) << "pre-tokenizer regex failed with PCRE2 error " << rc
                         << "; keeping the rest of a " << piece.size() << "-byte piece whole";
      }
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data());
    const size_t mb = ov[0], me = ov[1];
    if (me == mb) {  // empty match: step over one character
      offset = mb + 1;
      while (offset < piece.size() && (static_cast<uint8_t>(piece[offset]) & 0xC0) == 0x80) ++offset;
      continue;
    }
    if (mb > prev) out.emplace_back(span.first + prev, span.first + mb);
    out.emplace_back(span.first + mb, span.first + me);
    prev = offset = me;
  }
  if (prev < piece.size()) out.emplace_back(span.first + prev, span.second);
}

}  // namespace

std::vector<Span> RegexSplitter::split(std::string_view text) const {
  std::vector<Span> spans;
  if (text.empty()) return spans;
  spans.emplace_back(0, static_cast<uint32_t>(text.size()));
  std::vector<Span> next;
  for (const auto& c : patterns_) {
    MatchScratch scratch(c->code);
    next.clear();
    next.reserve(spans.size() * 2 + text.size() / 4);
    for (const Span& span : spans) split_piece(c->code, c->jit, text, span, scratch, next);
    spans.swap(next);
  }
  return spans;
}

Result<PreTokenizerSpec> bpe_pre_tokenizer(std::string_view pre_name) {
  for (const PreTokenizerSpec& spec : specs()) {
    if (std::find(spec.names.begin(), spec.names.end(), pre_name) != spec.names.end()) {
      return spec;
    }
  }
  std::string supported;
  for (std::string_view name : supported_pre_names()) {
    supported.append(supported.empty() ? "" : ", ").append(name);
  }
  return unimplemented("tokenizer.ggml.pre = '", pre_name,
                       "' is a pre-tokenizer arbor does not support (supported: ", supported, ")");
}

std::vector<std::string_view> supported_pre_names() {
  std::vector<std::string_view> names;
  for (const PreTokenizerSpec& spec : specs()) {
    for (std::string_view name : spec.names) {
      if (!name.empty()) names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string pre_name_for_patterns(const std::vector<std::string>& patterns) {
  if (patterns.size() == 1) {
    if (patterns[0] == kLlama3HfPattern) return "llama-bpe";
    if (patterns[0] == kQwen2HfPattern) return "qwen2";
  }
  for (const PreTokenizerSpec& spec : specs()) {
    if (spec.patterns == patterns) return std::string(spec.names.front());
  }
  return "";
}

}  // namespace arbor::tokenizer::internal
