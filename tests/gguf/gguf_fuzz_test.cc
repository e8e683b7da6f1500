// Seeded mutation fuzzing of the GGUF reader: no mutated file may crash it, and every parse
// either succeeds or fails with "NAME: at offset N: problem" (N inside the file).
// A file that parses must also survive GgufWriter::from_file -> serialize -> parse with the
// same metadata and tensors (checked for every synthetic file and every 8th stories260K one).
//
//   ARBOR_FUZZ_ITERATIONS  number of mutated files (default 10000; `make fuzz` runs 200000)
//   ARBOR_FUZZ_SEED        seed (default: random; always printed)
//
// Base files: a small synthetic GGUF with every value type and the real stories260K.gguf.
// Mutations: bit flips, bytes and u32/u64 words overwritten with interesting values (0, 0xff..,
// huge counts), truncation, inserted and deleted bytes; half of them aimed at the structure's
// boundaries (header fields, key/value/tensor-info starts, the data section).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"
#include "test_files.h"

#include <sanitizer/asan_interface.h>  // ASAN_(UN)POISON_MEMORY_REGION; no-ops without ASan
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace arbor::gguf {
namespace {

// What is being parsed right now, printed if a sanitizer kills the process.
uint64_t g_seed = 0;
uint64_t g_iteration = 0;
volatile uint64_t g_sink = 0;  // keeps the reads of parsed data from being optimised away
#if defined(__SANITIZE_ADDRESS__)
void print_progress_on_death() {
  std::fprintf(stderr, "gguf_fuzz_test died at seed %llu iteration %llu\n",
               static_cast<unsigned long long>(g_seed),
               static_cast<unsigned long long>(g_iteration));
}
#endif

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

uint64_t encoded_size(const Value& v) {
  switch (v.type) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kBool: return 1;
    case ValueType::kUint16: case ValueType::kInt16: return 2;
    case ValueType::kUint32: case ValueType::kInt32: case ValueType::kFloat32: return 4;
    case ValueType::kUint64: case ValueType::kInt64: case ValueType::kFloat64: return 8;
    case ValueType::kString: return 8 + std::get<std::string>(v.data).size();
    case ValueType::kArray: {
      uint64_t n = 12;
      for (const Value& item : std::get<Array>(v.data).items) n += encoded_size(item);
      return n;
    }
  }
  return 0;
}

struct Base {
  std::string name;
  std::vector<uint8_t> bytes;
  std::vector<uint64_t> boundaries;  // offsets where a field starts
};

// Field starts of a well-formed file: header fields, each key, value type and value, each
// tensor info and its fields, the data section and each tensor's data.
std::vector<uint64_t> boundaries_of(const GgufFile& f) {
  std::vector<uint64_t> b = {0, 4, 8, 16};
  uint64_t pos = 24;
  for (const KeyValue& kv : f.metadata()) {
    b.push_back(pos);
    pos += 8 + kv.key.size();
    b.push_back(pos);
    pos += 4;
    b.push_back(pos);
    if (kv.value.type == ValueType::kArray) b.push_back(pos + 4);  // the count
    pos += encoded_size(kv.value);
  }
  for (const TensorInfo& t : f.tensors()) {
    b.push_back(pos);
    pos += 8 + t.name.size();
    b.push_back(pos);  // n_dims
    b.push_back(pos + 4);  // dims
    pos += 4 + 8 * t.dims.size();
    b.push_back(pos);  // type
    b.push_back(pos + 4);  // offset
    pos += 12;
  }
  b.push_back(pos);
  b.push_back(f.data_offset());
  for (const TensorInfo& t : f.tensors()) {
    b.push_back(f.data_offset() + t.offset);
    b.push_back(f.data_offset() + t.offset + t.size_bytes);
  }
  return b;
}

Base make_base(std::string name, std::vector<uint8_t> bytes) {
  auto f = GgufFile::parse(bytes, name);
  ARBOR_CHECK(f.ok()) << f.status().to_string();
  Base base{std::move(name), {}, boundaries_of(*f)};
  base.bytes = std::move(bytes);
  return base;
}

std::vector<Base> load_bases() {
  std::vector<Base> bases;
  const std::string syn = test_files::synthetic_writer(3, 32).serialize();
  bases.push_back(make_base("synthetic.gguf", std::vector<uint8_t>(syn.begin(), syn.end())));
  const std::string stories = test::read_file(test::shared_path(test::kStories260K));
  bases.push_back(make_base("stories260K.gguf", std::vector<uint8_t>(stories.begin(), stories.end())));
  return bases;
}

// A file being mutated: one allocation per base, reused every iteration. The bytes past
// size() are poisoned under ASan, so a read past the end of the file is reported even though
// the memory is ours.
class Buffer {
 public:
  explicit Buffer(size_t capacity) : data_(new uint8_t[capacity]), capacity_(capacity) {}
  ~Buffer() { unpoison(); }

  void reset(const std::vector<uint8_t>& bytes) {
    unpoison();
    ARBOR_CHECK_LE(bytes.size(), capacity_);
    std::memcpy(data_.get(), bytes.data(), bytes.size());
    size_ = bytes.size();
  }
  uint8_t* data() { return data_.get(); }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_.get(), size_}; }
  void truncate(size_t n) { size_ = std::min(size_, n); }
  // Inserts up to the capacity.
  void insert(size_t pos, const std::vector<uint8_t>& ins) {
    const size_t n = std::min(ins.size(), capacity_ - size_);
    std::memmove(data_.get() + pos + n, data_.get() + pos, size_ - pos);
    std::memcpy(data_.get() + pos, ins.data(), n);
    size_ += n;
  }
  void erase(size_t pos, size_t n) {
    std::memmove(data_.get() + pos, data_.get() + pos + n, size_ - pos - n);
    size_ -= n;
  }
  void poison_tail() { ASAN_POISON_MEMORY_REGION(data_.get() + size_, capacity_ - size_); }
  void unpoison() { ASAN_UNPOISON_MEMORY_REGION(data_.get(), capacity_); }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_;
  size_t size_ = 0;
};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  // Applies 1-3 mutations; returns a description of them.
  std::string mutate(const Base& base, Buffer* bytes) {
    std::string what;
    const int n = 1 + static_cast<int>(below(3));
    for (int i = 0; i < n && bytes->size() > 0; ++i) what += mutate_once(base, bytes) + "; ";
    return what;
  }

 private:
  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  // Half the time a structural boundary (nudged by a few bytes), else anywhere, biased to
  // the metadata (where the parser's decisions are) rather than the tensor data.
  uint64_t position(const Base& base, size_t size) {
    uint64_t p;
    if (below(2) == 0) {
      const uint64_t boundary = base.boundaries[below(base.boundaries.size())];
      p = boundary + below(9);
      p = p >= 4 ? p - 4 : 0;
    } else if (below(4) != 0) {
      p = below(std::min<uint64_t>(size, base.boundaries.back() + 64));
    } else {
      p = below(size);
    }
    return std::min<uint64_t>(p, size == 0 ? 0 : size - 1);
  }

  std::string mutate_once(const Base& base, Buffer* b) {
    static const uint64_t kWords[] = {0,
                                      1,
                                      2,
                                      3,
                                      13,
                                      0x7f,
                                      0xff,
                                      0xffff,
                                      0x7fffffff,
                                      0x80000000,
                                      0xffffffff,
                                      uint64_t{1} << 32,
                                      uint64_t{1} << 60,
                                      uint64_t{1} << 62,
                                      0x7fffffffffffffff,
                                      0x8000000000000000,
                                      0xffffffffffffffff};
    static const uint8_t kBytes[] = {0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff, 0x09, 0x0c};
    const uint64_t pos = position(base, b->size());
    switch (below(7)) {
      case 0: {
        const int bit = static_cast<int>(below(8));
        b->data()[pos] ^= static_cast<uint8_t>(1u << bit);
        return str_cat("flip bit ", bit, " at ", pos);
      }
      case 1: {
        const uint8_t v = kBytes[below(sizeof(kBytes))];
        b->data()[pos] = v;
        return str_cat("byte ", int{v}, " at ", pos);
      }
      case 2:
      case 3: {
        const uint64_t v = kWords[below(std::size(kWords))];
        const size_t width = below(2) == 0 ? 4 : 8;
        const size_t n = std::min(width, b->size() - pos);
        std::memcpy(b->data() + pos, &v, n);  // little-endian: the low bytes first
        return str_cat("u", width * 8, " ", v, " at ", pos);
      }
      case 4: {
        b->truncate(pos);
        return str_cat("truncate to ", pos);
      }
      case 5: {
        const size_t n = 1 + below(16);
        std::vector<uint8_t> ins(n);
        for (uint8_t& x : ins) x = static_cast<uint8_t>(below(2) == 0 ? 0 : rng_());
        b->insert(pos, ins);
        return str_cat("insert ", n, " bytes at ", pos);
      }
      default: {
        const size_t n = std::min<size_t>(1 + below(16), b->size() - pos);
        b->erase(pos, n);
        return str_cat("delete ", n, " bytes at ", pos);
      }
    }
  }

  std::mt19937_64 rng_;
};

// Returns an empty string if the outcome of parsing `bytes` is acceptable, else the problem.
// *parsed tells whether the file parsed.
// With `rewrite`, a file that parses must also survive from_file -> serialize -> parse.
std::string check_parse(const std::string& name, std::span<const uint8_t> bytes, bool rewrite,
                        bool* parsed) {
  auto f = GgufFile::parse(bytes, name);
  *parsed = f.ok();
  if (!f.ok()) {
    // Expected shape: "<name>: at offset <digits>: <problem>".
    const std::string& msg = f.status().message();
    if (f.status().code() != StatusCode::kDataLoss) return "wrong code: " + msg;
    const std::string prefix = name + ": at offset ";
    if (msg.compare(0, prefix.size(), prefix) != 0) return "bad message: " + msg;
    size_t end = prefix.size();
    while (end < msg.size() && msg[end] >= '0' && msg[end] <= '9') ++end;
    if (end == prefix.size() || msg.compare(end, 2, ": ") != 0 || msg.size() <= end + 2) {
      return "bad message: " + msg;
    }
    if (std::stoull(msg.substr(prefix.size(), end - prefix.size())) > bytes.size()) {
      return "offset past the end: " + msg;
    }
    return "";
  }
  // Touch everything the parse handed out (ASan checks it lies inside `bytes`).
  uint64_t sum = 0;
  for (const TensorInfo& t : f->tensors()) {
    if (t.size_bytes > 0) sum += t.data[0] + t.data[t.size_bytes - 1];
  }
  for (const KeyValue& kv : f->metadata()) sum += value_to_string(kv.value, 3).size();
  g_sink = g_sink + sum;
  if (!rewrite) return "";
  const std::string again = GgufWriter::from_file(*f).serialize();
  auto g = GgufFile::parse({reinterpret_cast<const uint8_t*>(again.data()), again.size()}, name);
  if (!g.ok()) return "rewritten file does not parse: " + g.status().message();
  if (g->metadata().size() != f->metadata().size() || g->tensors().size() != f->tensors().size()) {
    return "rewritten file differs";
  }
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    const TensorInfo& a = f->tensors()[i];
    const TensorInfo& b = g->tensors()[i];
    if (a.name != b.name || a.dims != b.dims || a.type != b.type ||
        !std::equal(a.bytes().begin(), a.bytes().end(), b.bytes().begin())) {
      return "rewritten tensor differs: " + a.name;
    }
  }
  return "";
}

void save_failure(std::span<const uint8_t> bytes, uint64_t seed, uint64_t iteration) {
  const auto path = std::filesystem::temp_directory_path() /
                    str_cat("gguf_fuzz_failure_", seed, "_", iteration, ".gguf");
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  std::fprintf(stderr, "saved the failing file to %s\n", path.c_str());
}

TEST(GgufFuzz, MutatedFilesNeverCrash) {
  const uint64_t iterations = env_u64("ARBOR_FUZZ_ITERATIONS", 10000);
  const uint64_t seed = env_u64("ARBOR_FUZZ_SEED", std::random_device{}());
  g_seed = seed;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_set_death_callback(&print_progress_on_death);
#endif
  std::printf("gguf_fuzz_test: seed %llu, %llu iterations (ARBOR_FUZZ_SEED=%llu reproduces)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(iterations),
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);  // visible even if a sanitizer aborts the process
  ASSERT_TRUE(test::require_shared_file(test::kStories260K));
  const std::vector<Base> bases = load_bases();
  Mutator mutator(seed);
  uint64_t ok = 0;
  int failures = 0;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<Buffer>> buffers;
  for (const Base& base : bases) buffers.push_back(std::make_unique<Buffer>(base.bytes.size() + 64));
  for (uint64_t it = 0; it < iterations && failures < 10; ++it) {
    g_iteration = it;
    const Base& base = bases[it % bases.size()];
    Buffer& buf = *buffers[it % bases.size()];
    buf.reset(base.bytes);
    const std::string what = mutator.mutate(base, &buf);
    buf.poison_tail();
    // Rewriting copies the whole file; for the 1 MB model one iteration in 8 is plenty.
    const bool rewrite = base.bytes.size() < (1u << 16) || it % 16 < 2;
    bool parsed = false;
    const std::string problem = check_parse(base.name, buf.bytes(), rewrite, &parsed);
    buf.unpoison();
    if (problem.empty()) {
      ok += parsed ? 1 : 0;
      continue;
    }
    ++failures;
    ADD_FAILURE() << "seed " << seed << " iteration " << it << " base " << base.name << " ("
                  << what << "): " << problem;
    save_failure(buf.bytes(), seed, it);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("gguf_fuzz_test: %llu files in %.1f s, %llu parsed, the rest rejected cleanly\n",
              static_cast<unsigned long long>(iterations), secs,
              static_cast<unsigned long long>(ok));
  // Both outcomes must be exercised, or the mutations are too weak (or too strong).
  EXPECT_GT(ok, iterations / 50);
  EXPECT_LT(ok, iterations - iterations / 50);
}

}  // namespace
}  // namespace arbor::gguf
