// llama_ref: evaluates a GGUF with llama.cpp (the prebuilt libllama of the pinned npm package
// @node-llama-cpp/linux-x64, llama.cpp de3ff81), the independent reference arbor's architecture
// and tokenizer tests compare against. Built by scripts/install_reference.sh, never by CMake:
// arbor itself never links llama.cpp.
//
//   llama_ref logits   MODEL.gguf TOKENS OUT.bin [--kv f32|f16] [--threads N]
//       TOKENS: comma-separated ids, evaluated as one sequence from position 0 in one batch;
//       OUT.bin: float32 [num_tokens, n_vocab], the logits at every position.
//   llama_ref embed    MODEL.gguf TOKENS[;TOKENS...] OUT.bin [--pooling P] [--threads N]
//       each TOKENS list one sequence (alone in its batch, in order), pooled by llama.cpp's
//       embeddings API (llama_get_embeddings_seq) with the file's pooling_type, or P (mean, cls,
//       last, rank); OUT.bin: float32, the sequences' pooled vectors back to back, not
//       normalised ([n_embd] each, or [n_cls_out] for rank: the softmaxed classes).
//   llama_ref tokenize MODEL.gguf TEXT_FILE [--no-special] [--parse-special]
//       prints the ids of the file's text, comma-separated (add_special unless --no-special).
//   llama_ref bench    MODEL.gguf [--pp N] [--tg N] [--threads N] [--reps N]
//       llama-bench's two measurements, for side-by-side figures: prefill of N tokens in one
//       batch, and decode of N tokens one at a time after it (F16 KV cache, flash attention
//       off); prints one line per repetition: "pp N: T tok/s, tg N: T tok/s".
//   llama_ref spec     TARGET.gguf PROMPTS.txt [--draft-model DRAFT.gguf --draft K --p-min P]
//                      [-n N] [--threads N] [--ids OUT.txt]
//       greedy decoding of N tokens after each line of PROMPTS.txt (tokenized with BOS), one
//       prompt at a time; with a draft model, llama.cpp's speculative-simple loop: the draft
//       model proposes up to K tokens greedily while its top probability is >= P (default 8 and
//       0.75, llama.cpp's), the target verifies them in one batch and keeps the longest agreeing
//       prefix plus its own next token. Prints one line: tokens, seconds, tok/s (prefill
//       included), drafts proposed and accepted; --ids writes each prompt's generated ids.
//   llama_ref spec     TARGET.gguf PROMPTS.txt --mtp [--draft K --p-min P] [-n N] [--threads N]
//                      [--ids OUT.txt]
//       the same greedy loop with the model's own MTP (NextN) head as the drafter, following
//       llama.cpp's draft-mtp driver (common/speculative.cpp, the single-head mode of
//       qwen35/qwen35moe): after every target decode (the prompt, each verification batch) the
//       MTP context decodes the same rows with the target's h_nextn shifted by one (the first
//       row pairs with the h carried over from the previous batch, zeros at the start), keeping
//       only committed positions; then it drafts from (last committed token, target h of the
//       position before it), chaining its own h_nextn, up to K tokens while its top probability
//       is >= P. The target is created with n_rs_seq = K + 1 (recurrent-state snapshots) so that
//       a hybrid model can roll back rejected drafts; a failed rollback is an error.
//   llama_ref mtp      MODEL.gguf TOKENS OUT.bin [--draft N] [--hidden H.bin] [--threads N]
//       the MTP head on its own (model loaded with load_mtp, F32 KV caches, flash attention
//       off): the target decodes TOKENS (T of them) in one batch, giving its h_nextn rows
//       h_0..h_{T-1} (post-final-norm hidden); the MTP context then decodes one batch of T rows,
//       row p = (TOKENS[p], position p, h_{p-1}), row 0 with h = zeros (as llama.cpp's driver
//       starts); then N chained draft steps, step i = (argmax of the previous row's MTP logits,
//       position T + i, the previous row's MTP h_nextn). OUT.bin: float32 [T + N, n_vocab], the
//       MTP logits of every row; H.bin: float32 [T, n_embd] target h rows, then [T + N, n_embd]
//       MTP h_nextn rows.
//   llama_ref quantize TYPE IN.f32 ROWS COLS OUT.bin
//       ggml_quantize_chunk (what llama-quantize writes without an importance matrix) of the
//       float32 matrix [ROWS, COLS] in IN.f32 into ggml type TYPE (its number, e.g. 39 mxfp4).
//   llama_ref dequant  TYPE IN.bin N OUT.f32
//       ggml's own dequantizer (the type's to_float) of the N elements of type TYPE in IN.bin.
//
// Exit status 0 on success; 2 with a message on any failure.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

// llama.cpp's staging MTP API (src/llama-ext.h, not in the installed llama.h): exported from
// libllama with C++ linkage, so declared here with the identical signatures (same mangled names).
// masked == false: a row for every token of the batch (index = batch row); true: rows only for
// the outputs (batch.logits != 0). The rows are the post-final-norm hidden states (h_nextn).
void llama_set_embeddings_nextn(struct llama_context* ctx, bool value, bool masked);
float* llama_get_embeddings_nextn_ith(struct llama_context* ctx, int32_t i);

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llama_ref: %s\n", msg.c_str());
  std::exit(2);
}

std::vector<llama_token> parse_ids(const std::string& s) {
  std::vector<llama_token> ids;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) ids.push_back(static_cast<llama_token>(std::stol(item)));
  }
  return ids;
}

const char* flag_value(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 0; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

bool has_flag(int argc, char** argv, const char* name) {
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return true;
  }
  return false;
}

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

llama_model* load(const char* path, bool vocab_only, bool load_mtp = false) {
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.vocab_only = vocab_only;
  mp.load_mtp = load_mtp;
  llama_model* model = llama_model_load_from_file(path, mp);
  if (model == nullptr) die(std::string("cannot load ") + path);
  return model;
}

int run_logits(int argc, char** argv) {
  if (argc < 5) die("usage: llama_ref logits MODEL TOKENS OUT.bin [--kv f32|f16] [--threads N]");
  const std::vector<llama_token> ids = parse_ids(argv[3]);
  if (ids.empty()) die("no tokens");
  llama_model* model = load(argv[2], false);
  const int n = static_cast<int>(ids.size());
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n < 256 ? 256 : n);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = std::atoi(flag_value(argc, argv, "--threads", "2"));
  const std::string kv = flag_value(argc, argv, "--kv", "f32");
  cp.type_k = cp.type_v = kv == "f16" ? GGML_TYPE_F16 : GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.swa_full = true;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) die("cannot create a context");
  llama_batch batch = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = n;
  if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::ofstream out(argv[4], std::ios::binary);
  for (int i = 0; i < n; ++i) {
    const float* row = llama_get_logits_ith(ctx, i);
    if (row == nullptr) die("no logits for row " + std::to_string(i));
    out.write(reinterpret_cast<const char*>(row), sizeof(float) * n_vocab);
  }
  if (!out) die(std::string("cannot write ") + argv[4]);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}

enum llama_pooling_type pooling_flag(int argc, char** argv) {
  const std::string p = flag_value(argc, argv, "--pooling", "");
  if (p.empty()) return LLAMA_POOLING_TYPE_UNSPECIFIED;
  if (p == "mean") return LLAMA_POOLING_TYPE_MEAN;
  if (p == "cls") return LLAMA_POOLING_TYPE_CLS;
  if (p == "last") return LLAMA_POOLING_TYPE_LAST;
  if (p == "rank") return LLAMA_POOLING_TYPE_RANK;
  die("--pooling " + p + ": mean, cls, last or rank");
}

int run_embed(int argc, char** argv) {
  if (argc < 5) die("usage: llama_ref embed MODEL TOKENS[;TOKENS...] OUT.bin [--pooling P]");
  std::vector<std::vector<llama_token>> seqs;
  std::stringstream lists(argv[3]);
  std::string list;
  int total = 0;
  while (std::getline(lists, list, ';')) {
    seqs.push_back(parse_ids(list));
    if (seqs.back().empty()) die("an empty token list");
    total += static_cast<int>(seqs.back().size());
  }
  if (seqs.empty()) die("no tokens");
  llama_model* model = load(argv[2], false);
  size_t longest = 0;
  for (const auto& seq : seqs) longest = std::max(longest, seq.size());
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(longest < 256 ? 256 : longest);
  cp.n_batch = cp.n_ubatch = cp.n_ctx;
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = std::atoi(flag_value(argc, argv, "--threads", "2"));
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.embeddings = true;
  cp.pooling_type = pooling_flag(argc, argv);
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) die("cannot create a context");
  const bool rank = llama_pooling_type(ctx) == LLAMA_POOLING_TYPE_RANK;
  const int width = rank ? static_cast<int>(llama_model_n_cls_out(model))
                         : llama_model_n_embd_out(model);
  llama_batch batch = llama_batch_init(static_cast<int32_t>(longest), 0, 1);
  std::ofstream out(argv[4], std::ios::binary);
  // One sequence per batch, the memory cleared between: llama.cpp pools a sequence only when
  // all of it is in one ubatch, which several sequences of different lengths would break.
  for (const std::vector<llama_token>& seq : seqs) {
    llama_memory_clear(llama_get_memory(ctx), true);
    const int n = static_cast<int>(seq.size());
    for (int i = 0; i < n; ++i) {
      batch.token[i] = seq[i];
      batch.pos[i] = i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
    const float* v = llama_get_embeddings_seq(ctx, 0);
    if (v == nullptr) die("no pooled embedding");
    out.write(reinterpret_cast<const char*>(v), sizeof(float) * width);
  }
  if (!out) die(std::string("cannot write ") + argv[4]);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}

double seconds_since(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Decodes `n` tokens from position `pos` in one batch, logits for the last only.
void decode_batch(llama_context* ctx, llama_batch& batch, int n, int pos, int n_vocab) {
  for (int i = 0; i < n; ++i) {
    batch.token[i] = (pos + i * 7919) % n_vocab;
    batch.pos[i] = pos + i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = i == n - 1;
  }
  batch.n_tokens = n;
  if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
}

int run_bench(int argc, char** argv) {
  if (argc < 3) die("usage: llama_ref bench MODEL [--pp N] [--tg N] [--threads N] [--reps N]");
  const int pp = std::atoi(flag_value(argc, argv, "--pp", "512"));
  const int tg = std::atoi(flag_value(argc, argv, "--tg", "128"));
  const int reps = std::atoi(flag_value(argc, argv, "--reps", "3"));
  llama_model* model = load(argv[2], false);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(pp + tg + 16);
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(std::max(pp, 1));
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = std::atoi(flag_value(argc, argv, "--threads", "2"));
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) die("cannot create a context");
  llama_batch batch = llama_batch_init(std::max(pp, 1), 0, 1);
  decode_batch(ctx, batch, std::min(pp, 16), 0, n_vocab);  // warm-up
  for (int r = 0; r < reps; ++r) {
    llama_memory_clear(llama_get_memory(ctx), true);
    auto t0 = std::chrono::steady_clock::now();
    decode_batch(ctx, batch, pp, 0, n_vocab);
    const double t_pp = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < tg; ++i) decode_batch(ctx, batch, 1, pp + i, n_vocab);
    const double t_tg = seconds_since(t0);
    std::printf("pp %d: %.2f tok/s, tg %d: %.2f tok/s\n", pp, pp / t_pp, tg, tg / t_tg);
    std::fflush(stdout);
  }
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}

int run_tokenize(int argc, char** argv) {
  if (argc < 4) die("usage: llama_ref tokenize MODEL TEXT_FILE [--no-special] [--parse-special]");
  std::ifstream in(argv[3], std::ios::binary);
  if (!in) die(std::string("cannot read ") + argv[3]);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  llama_model* model = load(argv[2], true);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const bool add_special = !has_flag(argc, argv, "--no-special");
  const bool parse_special = has_flag(argc, argv, "--parse-special");
  std::vector<llama_token> ids(text.size() + 16);
  int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                             static_cast<int32_t>(ids.size()), add_special, parse_special);
  if (n < 0) {
    ids.resize(-n);
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                       static_cast<int32_t>(ids.size()), add_special, parse_special);
  }
  if (n < 0) die("llama_tokenize failed");
  for (int32_t i = 0; i < n; ++i) std::printf(i ? ",%d" : "%d", ids[i]);
  std::printf("\n");
  llama_model_free(model);
  return 0;
}

std::vector<char> read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die(std::string("cannot read ") + path);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const char* path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) die(std::string("cannot write ") + path);
}

int run_quantize(int argc, char** argv) {
  if (argc < 7) die("usage: llama_ref quantize TYPE IN.f32 ROWS COLS OUT.bin");
  const auto type = static_cast<ggml_type>(std::atoi(argv[2]));
  const std::vector<char> in = read_file(argv[3]);
  const int64_t rows = std::atoll(argv[4]), cols = std::atoll(argv[5]);
  if (static_cast<int64_t>(in.size()) != rows * cols * 4) die("IN.f32 is not ROWS x COLS floats");
  std::vector<char> out(ggml_row_size(type, cols) * rows);
  ggml_quantize_chunk(type, reinterpret_cast<const float*>(in.data()), out.data(), 0, rows, cols,
                      nullptr);
  write_file(argv[6], out.data(), out.size());
  return 0;
}

int run_dequant(int argc, char** argv) {
  if (argc < 6) die("usage: llama_ref dequant TYPE IN.bin N OUT.f32");
  const auto type = static_cast<ggml_type>(std::atoi(argv[2]));
  const std::vector<char> in = read_file(argv[3]);
  const int64_t n = std::atoll(argv[4]);
  if (in.size() != ggml_row_size(type, n)) die("IN.bin is not N elements of TYPE");
  const ggml_type_traits* traits = ggml_get_type_traits(type);
  if (traits->to_float == nullptr) die("ggml has no dequantizer for this type");
  std::vector<float> out(static_cast<size_t>(n));
  traits->to_float(in.data(), out.data(), n);
  write_file(argv[5], out.data(), out.size() * sizeof(float));
  return 0;
}

// ---- spec: greedy speculative decoding on llama.cpp (llama.cpp's speculative-simple loop) ----

// n_rs_seq: recurrent-state snapshots per sequence (rollback of that many tokens on a hybrid
// model); mtp_of: create the MTP (NextN) context of that target context instead of a plain one.
llama_context* make_context(llama_model* model, int n_ctx, int threads, uint32_t n_rs_seq = 0,
                            llama_context* mtp_of = nullptr) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n_ctx);
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(n_ctx);
  cp.n_seq_max = 1;
  cp.n_rs_seq = n_rs_seq;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = true;
  if (mtp_of != nullptr) {
    cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    cp.ctx_other = mtp_of;
  }
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) {
    die(mtp_of != nullptr ? "cannot create the MTP context" : "cannot create a context");
  }
  return ctx;
}

// Decodes ids[0..n) at positions pos.. as one batch; logits for every row when all_logits, else
// for the last. Returns nothing: llama_get_logits_ith reads them.
void decode_ids(llama_context* ctx, llama_batch& batch, const llama_token* ids, int n, int pos,
                bool all_logits) {
  for (int i = 0; i < n; ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = pos + i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = all_logits || i == n - 1;
  }
  batch.n_tokens = n;
  if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
}

llama_token argmax(const float* row, int n_vocab) {
  return static_cast<llama_token>(std::max_element(row, row + n_vocab) - row);
}

// The greedy token of `row` and its probability renormalised over the 10 most probable tokens,
// as llama.cpp's draft-mtp driver judges p_min (its sampler is top-k 10).
std::pair<llama_token, float> top10_with_prob(const float* row, int n_vocab) {
  std::vector<int> ids(static_cast<size_t>(n_vocab));
  for (int i = 0; i < n_vocab; ++i) ids[static_cast<size_t>(i)] = i;
  const int k = std::min(10, n_vocab);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  double sum = 0.0;
  for (int i = 0; i < k; ++i) sum += std::exp(static_cast<double>(row[ids[i]] - row[ids[0]]));
  return {static_cast<llama_token>(ids[0]), static_cast<float>(1.0 / sum)};
}

// The greedy token of `row` and its softmax probability.
std::pair<llama_token, float> top_with_prob(const float* row, int n_vocab) {
  const llama_token best = argmax(row, n_vocab);
  double sum = 0.0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(row[i] - row[best]));
  return {best, static_cast<float>(1.0 / sum)};
}

// A batch for the MTP context: llama_batch_init allocates either token or embd, the MTP graph
// takes both (the token x_p and the hidden row h_{p-1}), so token is allocated as well, as
// llama.cpp's driver does; llama_batch_free frees both.
struct MtpBatch {
  llama_batch b;
  int n_embd;
  MtpBatch(int capacity, int embd) : b(llama_batch_init(capacity, embd, 1)), n_embd(embd) {
    b.token = static_cast<llama_token*>(std::malloc(sizeof(llama_token) * capacity));
    if (b.token == nullptr) die("out of memory");
  }
  ~MtpBatch() { llama_batch_free(b); }
  MtpBatch(const MtpBatch&) = delete;
  MtpBatch& operator=(const MtpBatch&) = delete;
  // Row i: token at position pos with hidden row h (n_embd floats).
  void set(int i, llama_token token, int pos, const float* h, bool logits) {
    b.token[i] = token;
    b.pos[i] = pos;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = logits;
    std::memcpy(b.embd + static_cast<size_t>(i) * n_embd, h, sizeof(float) * n_embd);
  }
};

void mtp_enable(llama_context* tgt, llama_context* mtp) {
  llama_set_embeddings_nextn(tgt, true, /*masked=*/false);  // h_nextn of every target row
  llama_set_embeddings_nextn(mtp, true, /*masked=*/true);   // h_nextn of the MTP's output rows
}

// The target's h_nextn row i (batch row) of its last decode.
const float* target_h(llama_context* tgt, int i) {
  const float* h = llama_get_embeddings_nextn_ith(tgt, i);
  if (h == nullptr) die("no target h_nextn row " + std::to_string(i));
  return h;
}

void remove_from(llama_context* ctx, int p0, const char* what) {
  if (!llama_memory_seq_rm(llama_get_memory(ctx), 0, p0, -1)) {
    die(std::string("llama_memory_seq_rm cannot roll ") + what + " back to position " +
        std::to_string(p0) + " (a hybrid model needs n_rs_seq >= the rows rejected)");
  }
}

struct SpecTotals {
  int64_t generated = 0, drafted = 0, accepted = 0, verifications = 0;
  double seconds = 0.0;
};

// Greedy verification after a target batch whose row 0 is the last committed token and rows
// 1.. the drafts: accepts drafts while each equals the target's argmax before it (at most n
// tokens in all), appending them to seq and out; `sampled` gets the target's token after them.
// Returns how many were accepted.
int accept_greedy(llama_context* tgt, const std::vector<llama_token>& drafts, int n_vocab, int n,
                  int& made, std::vector<llama_token>& seq, std::vector<llama_token>& out,
                  SpecTotals& totals, llama_token& sampled) {
  int accepted = 0;
  sampled = argmax(llama_get_logits_ith(tgt, 0), n_vocab);
  while (accepted < static_cast<int>(drafts.size()) && sampled == drafts[accepted] && made < n) {
    seq.push_back(sampled);
    out.push_back(sampled);
    ++made;
    ++accepted;
    sampled = argmax(llama_get_logits_ith(tgt, accepted), n_vocab);
  }
  if (!drafts.empty()) {
    ++totals.verifications;
    totals.drafted += static_cast<int64_t>(drafts.size());
    totals.accepted += accepted;
  }
  return accepted;
}

// One prompt, `n` tokens greedily; k = 0: plain decoding. Appends the generated ids to `out`.
void generate(llama_context* tgt, llama_context* dft, llama_batch& batch, int n_vocab,
              const std::vector<llama_token>& prompt, int n, int k, float p_min,
              std::vector<llama_token>& out, SpecTotals& totals) {
  llama_memory_clear(llama_get_memory(tgt), true);
  if (dft != nullptr) llama_memory_clear(llama_get_memory(dft), true);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<llama_token> seq = prompt;  // committed tokens
  decode_ids(tgt, batch, seq.data(), static_cast<int>(seq.size()), 0, false);
  llama_token next = argmax(llama_get_logits_ith(tgt, -1), n_vocab);
  int draft_seen = 0;  // tokens of seq the draft context holds
  int made = 0;
  while (made < n) {
    seq.push_back(next);
    out.push_back(next);
    ++made;
    if (made >= n) break;
    std::vector<llama_token> drafts;
    if (k > 0) {
      // The draft model catches up on the committed tokens, then drafts greedily while it is
      // confident (llama.cpp's --draft-p-min).
      const int behind = static_cast<int>(seq.size()) - draft_seen;
      decode_ids(dft, batch, seq.data() + draft_seen, behind, draft_seen, false);
      draft_seen = static_cast<int>(seq.size());
      const int room = std::min(k, n - made);
      for (int j = 0; j < room; ++j) {
        const auto [tok, p] = top_with_prob(llama_get_logits_ith(dft, -1), n_vocab);
        if (p < p_min) break;
        drafts.push_back(tok);
        if (j + 1 < room) decode_ids(dft, batch, &tok, 1, draft_seen + j, false);
      }
      // Forget the drafts in the draft context (the accepted ones come back as committed).
      llama_memory_seq_rm(llama_get_memory(dft), 0, draft_seen, -1);
    }
    // The target verifies [next, drafts...] in one batch: greedy tokens at every row.
    std::vector<llama_token> rows = {next};
    rows.insert(rows.end(), drafts.begin(), drafts.end());
    const int pos = static_cast<int>(seq.size()) - 1;
    // `next` is committed but not yet in the target's cache: it is the batch's first row.
    decode_ids(tgt, batch, rows.data(), static_cast<int>(rows.size()), pos, true);
    llama_token sampled = 0;
    accept_greedy(tgt, drafts, n_vocab, n, made, seq, out, totals, sampled);
    // Rejected rows leave the target's cache; the committed tokens stay.
    llama_memory_seq_rm(llama_get_memory(tgt), 0, static_cast<int>(seq.size()), -1);
    next = sampled;
  }
  totals.seconds += seconds_since(t0);
  totals.generated += made;
}

// llama.cpp's draft-mtp driver (common_speculative_impl_draft_mtp, single trained head) in the
// greedy loop of generate(): one prompt, `n` tokens, up to k drafts per verification.
struct MtpState {
  std::vector<float> pending_h;  // target h of the last committed position (zeros at first)
  std::vector<float> verify_h;   // target h rows of the last target batch
};

// process(): after a target decode of ids[0..n) at positions pos.., the MTP context decodes the
// same rows, row i paired with the target h of row i - 1 (row 0 with the carried pending h);
// no outputs. Keeps the batch's target h rows; pending h = its last row (accept() fixes it up).
void mtp_process(llama_context* tgt, llama_context* mtp, MtpBatch& mb, MtpState& st,
                 const llama_token* ids, int n, int pos) {
  const size_t w = static_cast<size_t>(mb.n_embd);
  st.verify_h.resize(static_cast<size_t>(n) * w);
  for (int i = 0; i < n; ++i) {
    std::memcpy(st.verify_h.data() + i * w, target_h(tgt, i), sizeof(float) * w);
  }
  for (int i = 0; i < n; ++i) {
    mb.set(i, ids[i], pos + i, i == 0 ? st.pending_h.data() : st.verify_h.data() + (i - 1) * w,
           false);
  }
  mb.b.n_tokens = n;
  if (llama_decode(mtp, mb.b) != 0) die("llama_decode (MTP process) failed");
  std::copy(st.verify_h.end() - static_cast<std::ptrdiff_t>(w), st.verify_h.end(),
            st.pending_h.begin());
}

void generate_mtp(llama_context* tgt, llama_context* mtp, llama_batch& batch, MtpBatch& mb,
                  int n_vocab, const std::vector<llama_token>& prompt, int n, int k, float p_min,
                  std::vector<llama_token>& out, SpecTotals& totals) {
  llama_memory_clear(llama_get_memory(tgt), true);
  llama_memory_clear(llama_get_memory(mtp), true);
  MtpState st;
  st.pending_h.assign(static_cast<size_t>(mb.n_embd), 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<llama_token> seq = prompt;  // committed tokens
  decode_ids(tgt, batch, seq.data(), static_cast<int>(seq.size()), 0, false);
  mtp_process(tgt, mtp, mb, st, seq.data(), static_cast<int>(seq.size()), 0);
  llama_token next = argmax(llama_get_logits_ith(tgt, -1), n_vocab);
  int made = 0;
  while (made < n) {
    seq.push_back(next);
    out.push_back(next);
    ++made;
    if (made >= n) break;
    // `next` is committed, in neither cache yet: position pos0. The MTP holds 0..pos0-1.
    const int pos0 = static_cast<int>(seq.size()) - 1;
    std::vector<llama_token> drafts;
    if (k > 0) {
      // draft(): (next, pos0, pending h = target h at pos0 - 1), then each drafted token with
      // the MTP's own h_nextn of the row before, while the top probability is >= p_min.
      const int room = std::min(k, n - made);
      mb.set(0, next, pos0, st.pending_h.data(), true);
      mb.b.n_tokens = 1;
      for (int j = 0; j < room; ++j) {
        if (llama_decode(mtp, mb.b) != 0) die("llama_decode (MTP draft) failed");
        const auto [tok, p] = top10_with_prob(llama_get_logits_ith(mtp, 0), n_vocab);
        if (p < p_min) break;
        drafts.push_back(tok);
        if (j + 1 < room) {
          const float* h = llama_get_embeddings_nextn_ith(mtp, 0);
          if (h == nullptr) die("no MTP h_nextn row");
          mb.set(0, tok, pos0 + j + 1, h, true);
        }
      }
      // The draft rows leave the MTP cache: process() re-adds the verified rows.
      remove_from(mtp, pos0, "the MTP cache");
    }
    std::vector<llama_token> rows = {next};
    rows.insert(rows.end(), drafts.begin(), drafts.end());
    const int n_rows = static_cast<int>(rows.size());
    decode_ids(tgt, batch, rows.data(), n_rows, pos0, true);
    mtp_process(tgt, mtp, mb, st, rows.data(), n_rows, pos0);
    llama_token sampled = 0;
    const int accepted = accept_greedy(tgt, drafts, n_vocab, n, made, seq, out, totals, sampled);
    // accept(): the pending h is the target h of the last committed row.
    const size_t w = static_cast<size_t>(mb.n_embd);
    std::copy(st.verify_h.begin() + accepted * w, st.verify_h.begin() + (accepted + 1) * w,
              st.pending_h.begin());
    // Rejected rows leave both caches (the target's recurrent state through its snapshots).
    remove_from(tgt, static_cast<int>(seq.size()), "the target");
    remove_from(mtp, static_cast<int>(seq.size()), "the MTP cache");
    next = sampled;
  }
  totals.seconds += seconds_since(t0);
  totals.generated += made;
}

std::vector<std::string> read_lines(const char* path) {
  std::ifstream in(path);
  if (!in) die(std::string("cannot read ") + path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

// ---- mtp: the MTP (NextN) head on its own, fed as llama.cpp's draft-mtp driver feeds it ----

int run_mtp(int argc, char** argv) {
  if (argc < 5) {
    die("usage: llama_ref mtp MODEL TOKENS OUT.bin [--draft N] [--hidden H.bin] [--threads N]");
  }
  const std::vector<llama_token> ids = parse_ids(argv[3]);
  if (ids.empty()) die("no tokens");
  const int t = static_cast<int>(ids.size());
  const int n_draft = std::atoi(flag_value(argc, argv, "--draft", "0"));
  if (n_draft < 0) die("--draft must be >= 0");
  const int threads = std::atoi(flag_value(argc, argv, "--threads", "2"));
  llama_model* model = load(argv[2], false, true);
  if (llama_model_n_layer_nextn(model) <= 0) die("the model has no MTP layers");
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const int n_embd = llama_model_n_embd_out(model);
  const int rows = t + n_draft;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(rows < 256 ? 256 : rows);
  cp.n_batch = cp.n_ubatch = cp.n_ctx;
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.swa_full = true;
  cp.no_perf = true;
  llama_context* tgt = llama_init_from_model(model, cp);
  if (tgt == nullptr) die("cannot create a context");
  // The MTP context as llama.cpp creates it: its own KV cache for the NextN layer, no
  // recurrent-state snapshots, the target as ctx_other.
  llama_context_params mp = cp;
  mp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
  mp.ctx_other = tgt;
  mp.n_rs_seq = 0;
  llama_context* mtp = llama_init_from_model(model, mp);
  if (mtp == nullptr) die("cannot create the MTP context");
  mtp_enable(tgt, mtp);

  // The target: all T tokens in one batch, h_nextn rows h_0..h_{T-1}.
  llama_batch batch = llama_batch_init(t, 0, 1);
  decode_ids(tgt, batch, ids.data(), t, 0, true);
  std::vector<float> h_tgt(static_cast<size_t>(t) * n_embd);
  for (int i = 0; i < t; ++i) {
    std::memcpy(h_tgt.data() + static_cast<size_t>(i) * n_embd, target_h(tgt, i),
                sizeof(float) * n_embd);
  }
  // The MTP: row p = (x_p, position p, h_{p-1}), row 0 with zeros; logits at every row.
  MtpBatch mb(t, n_embd);
  const std::vector<float> zeros(static_cast<size_t>(n_embd), 0.0f);
  for (int p = 0; p < t; ++p) {
    mb.set(p, ids[p], p, p == 0 ? zeros.data() : h_tgt.data() + static_cast<size_t>(p - 1) * n_embd,
           true);
  }
  mb.b.n_tokens = t;
  if (llama_decode(mtp, mb.b) != 0) die("llama_decode (MTP) failed");
  std::vector<float> logits(static_cast<size_t>(rows) * n_vocab);
  std::vector<float> h_mtp(static_cast<size_t>(rows) * n_embd);
  auto keep_row = [&](int dst, int src) {
    const float* l = llama_get_logits_ith(mtp, src);
    const float* h = llama_get_embeddings_nextn_ith(mtp, src);
    if (l == nullptr || h == nullptr) die("no MTP output for row " + std::to_string(dst));
    std::memcpy(logits.data() + static_cast<size_t>(dst) * n_vocab, l, sizeof(float) * n_vocab);
    std::memcpy(h_mtp.data() + static_cast<size_t>(dst) * n_embd, h, sizeof(float) * n_embd);
  };
  for (int p = 0; p < t; ++p) keep_row(p, p);
  // Chained drafts: the previous row's greedy token and its own h_nextn, one row at a time.
  for (int i = 0; i < n_draft; ++i) {
    const int prev = t + i - 1;
    const llama_token tok = argmax(logits.data() + static_cast<size_t>(prev) * n_vocab, n_vocab);
    mb.set(0, tok, t + i, h_mtp.data() + static_cast<size_t>(prev) * n_embd, true);
    mb.b.n_tokens = 1;
    if (llama_decode(mtp, mb.b) != 0) die("llama_decode (MTP draft) failed");
    keep_row(t + i, 0);
  }
  write_file(argv[4], logits.data(), logits.size() * sizeof(float));
  if (const char* hidden = flag_value(argc, argv, "--hidden", nullptr)) {
    std::ofstream out(hidden, std::ios::binary);
    out.write(reinterpret_cast<const char*>(h_tgt.data()),
              static_cast<std::streamsize>(h_tgt.size() * sizeof(float)));
    out.write(reinterpret_cast<const char*>(h_mtp.data()),
              static_cast<std::streamsize>(h_mtp.size() * sizeof(float)));
    if (!out) die(std::string("cannot write ") + hidden);
  }
  std::fprintf(stderr, "mtp: n_embd %d, vocab %d, rows %d (%d tokens + %d drafts)\n", n_embd,
               n_vocab, rows, t, n_draft);
  llama_batch_free(batch);
  llama_free(mtp);
  llama_free(tgt);
  llama_model_free(model);
  return 0;
}

int run_spec(int argc, char** argv) {
  if (argc < 4) {
    die("usage: llama_ref spec TARGET PROMPTS.txt [--draft-model DRAFT | --mtp] [--draft K] "
        "[--p-min P] [-n N] [--threads T] [--ids OUT.txt]");
  }
  const int n = std::atoi(flag_value(argc, argv, "-n", "128"));
  const int threads = std::atoi(flag_value(argc, argv, "--threads", "2"));
  const char* draft_path = flag_value(argc, argv, "--draft-model", nullptr);
  const bool use_mtp = has_flag(argc, argv, "--mtp");
  if (use_mtp && draft_path != nullptr) die("--mtp and --draft-model exclude each other");
  const int k = draft_path == nullptr && !use_mtp
                    ? 0 : std::atoi(flag_value(argc, argv, "--draft", "8"));
  if (k < 0) die("--draft must be >= 0");
  const float p_min = static_cast<float>(std::atof(flag_value(argc, argv, "--p-min", "0.75")));
  const std::vector<std::string> prompts = read_lines(argv[3]);
  llama_model* target = load(argv[2], false, use_mtp);
  if (use_mtp && llama_model_n_layer_nextn(target) <= 0) die("--mtp: the model has no MTP layers");
  llama_model* draft = draft_path != nullptr ? load(draft_path, false) : nullptr;
  const llama_vocab* vocab = llama_model_get_vocab(target);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  if (draft != nullptr && llama_vocab_n_tokens(llama_model_get_vocab(draft)) != n_vocab) {
    die("the draft model's vocabulary differs from the target's");
  }
  const int n_ctx = 1024 + n + k + 8;
  // With --mtp the target keeps k + 1 recurrent-state snapshots (a verification batch has at
  // most k + 1 rows, at most k of them rejected), llama.cpp's n_rs_seq rollback.
  llama_context* tgt = make_context(target, n_ctx, threads, use_mtp ? k + 1 : 0);
  llama_context* dft = draft != nullptr ? make_context(draft, n_ctx, threads) : nullptr;
  llama_context* mtp = use_mtp ? make_context(target, n_ctx, threads, 0, tgt) : nullptr;
  if (mtp != nullptr) mtp_enable(tgt, mtp);
  std::unique_ptr<MtpBatch> mtp_batch;
  if (mtp != nullptr) mtp_batch = std::make_unique<MtpBatch>(n_ctx, llama_model_n_embd_out(target));
  llama_batch batch = llama_batch_init(n_ctx, 0, 1);
  SpecTotals totals;
  std::string ids_text;
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::vector<llama_token> ids(prompts[p].size() + 16);
    const int m = llama_tokenize(vocab, prompts[p].data(), static_cast<int32_t>(prompts[p].size()),
                                 ids.data(), static_cast<int32_t>(ids.size()), true, false);
    if (m <= 0 || m > 1024) die("cannot tokenize prompt " + std::to_string(p));
    ids.resize(static_cast<size_t>(m));
    std::vector<llama_token> out;
    if (mtp != nullptr) {
      generate_mtp(tgt, mtp, batch, *mtp_batch, n_vocab, ids, n, k, p_min, out, totals);
    } else {
      generate(tgt, dft, batch, n_vocab, ids, n, k, p_min, out, totals);
    }
    for (size_t i = 0; i < out.size(); ++i) ids_text += (i ? "," : "") + std::to_string(out[i]);
    ids_text += "\n";
  }
  if (const char* ids_path = flag_value(argc, argv, "--ids", nullptr)) {
    write_file(ids_path, ids_text.data(), ids_text.size());
  }
  std::printf("prompts %zu, generated %lld tokens in %.3f s: %.2f tok/s; drafts %lld, accepted "
              "%lld in %lld verifications (k %d, p_min %.2f)\n",
              prompts.size(), static_cast<long long>(totals.generated), totals.seconds,
              totals.generated / totals.seconds, static_cast<long long>(totals.drafted),
              static_cast<long long>(totals.accepted),
              static_cast<long long>(totals.verifications), k, p_min);
  llama_batch_free(batch);
  mtp_batch.reset();
  if (mtp != nullptr) llama_free(mtp);
  if (dft != nullptr) llama_free(dft);
  llama_free(tgt);
  if (draft != nullptr) llama_model_free(draft);
  llama_model_free(target);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) die("usage: llama_ref logits|embed|tokenize|bench|spec|mtp|quantize|dequant ...");
  llama_log_set(quiet_log, nullptr);
  // The package's CPU backends (one per ISA level) sit beside libllama; the best one loads.
  const char* libdir = std::getenv("LLAMA_REF_LIBDIR");
  if (libdir == nullptr) libdir = LLAMA_REF_LIBDIR;  // where install_reference.sh put them
  ggml_backend_load_all_from_path(libdir);
  llama_backend_init();
  const std::string mode = argv[1];
  if (mode == "logits") return run_logits(argc, argv);
  if (mode == "embed") return run_embed(argc, argv);
  if (mode == "tokenize") return run_tokenize(argc, argv);
  if (mode == "bench") return run_bench(argc, argv);
  if (mode == "spec") return run_spec(argc, argv);
  if (mode == "mtp") return run_mtp(argc, argv);
  if (mode == "quantize") return run_quantize(argc, argv);
  if (mode == "dequant") return run_dequant(argc, argv);
  die("unknown mode " + mode);
}
