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
constexpr const char* kCjk = "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";

struct Preset {
  std::vector<std::string_view> names;
  std::vector<std::string> patterns;
};

const std::vector<Preset>& presets() {
  static const std::vector<Preset> kPresets = {
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe", "chatglm-bpe",
        "glm4"},
       {kLlama3Pattern}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {kQwen2Pattern}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de",
        "roberta-bpe", "jina-v1-en", "jina-v2-code", "exaone4", "trillion", "gigachat"},
       {kGpt2Pattern}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {"\\p{N}", kGpt2Pattern}},
      {{"falcon"},
       {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2Pattern, "[0-9][0-9][0-9]"}},
      {{"deepseek-coder"},
       {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", kCjk, "\\p{N}"}},
      {{"deepseek-llm"},
       {"[\\r\\n]", kDeepseekLetters,
        "\\s?[\\x{21}-\\x{2F}\\x{3A}-\\x{7E}\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}"
        "\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
        "\\s+$", kCjk, "\\p{N}+"}},
      {{"poro-chat", "bloom", "gpt3-finnish"},
       {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"}},
      {{"default", ""},
       {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2Pattern, "\\p{N}+", "[0-9][0-9][0-9]"}},
  };
  return kPresets;
}

}  // namespace

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

Result<RegexSplitter> RegexSplitter::create(const std::vector<std::string>& patterns) {
  RegexSplitter s;
  for (const std::string& p : patterns) {
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

Result<std::vector<std::string>> bpe_pre_patterns(std::string_view pre_name) {
  for (const Preset& p : presets()) {
    if (std::find(p.names.begin(), p.names.end(), pre_name) != p.names.end()) return p.patterns;
  }
  return unimplemented("unknown pre-tokenizer '", pre_name, "'");
}

std::string pre_name_for_patterns(const std::vector<std::string>& patterns) {
  if (patterns.size() == 1) {
    if (patterns[0] == kLlama3HfPattern) return "llama-bpe";
    if (patterns[0] == kQwen2HfPattern) return "qwen2";
  }
  for (const Preset& p : presets()) {
    if (p.patterns == patterns) return std::string(p.names.front());
  }
  return "";
}

bool pre_ignores_merges(std::string_view pre_name) {
  for (std::string_view n : {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"}) {
    if (pre_name == n) return true;
  }
  return false;
}

bool pre_adds_bos(std::string_view pre_name) { return pre_ignores_merges(pre_name); }

}  // namespace arbor::tokenizer::internal
