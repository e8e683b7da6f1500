// Hand-made corrupt files: each is rejected with a Status naming the file, the exact byte
// offset of the problem and the problem.
#include <gtest/gtest.h>

#include <string>

#include "gguf/gguf.h"
#include "test_files.h"

namespace arbor::gguf {
namespace {

using test_files::Bytes;

constexpr uint32_t kF32 = 0;
constexpr uint32_t kQ8_0 = 8;
constexpr uint32_t kTypeBool = 7;
constexpr uint32_t kTypeString = 8;
constexpr uint32_t kTypeArray = 9;

// Parses `b` and expects exactly "bad.gguf: at offset <offset>: <message>".
void expect_error(const Bytes& b, uint64_t offset, const std::string& message) {
  auto f = GgufFile::parse({b.data().data(), b.size()}, "bad.gguf");
  ASSERT_FALSE(f.ok()) << "parsed although it should fail with: " << message;
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(f.status().message(), "bad.gguf: at offset " + std::to_string(offset) + ": " + message);
}

// One tensor info of f32 [n] at `offset`, with `data_bytes` zero bytes of data after padding.
Bytes one_tensor_file(std::vector<int64_t> dims, uint32_t type, uint64_t offset,
                      size_t data_bytes) {
  Bytes b;
  b.header(3, 1, 0).tensor("t", std::move(dims), type, offset).pad_to(32).zeros(data_bytes);
  return b;
}

TEST(GgufBadFiles, Header) {
  expect_error(Bytes().raw("GGUF").u32(3).raw("ab"), 0,
               "file has 10 bytes, a GGUF header needs 24");
  expect_error(Bytes(), 0, "file has 0 bytes, a GGUF header needs 24");
  expect_error(Bytes().raw("GGML").u32(3).u64(0).u64(0), 0,
               "bad magic: expected 47 47 55 46 (\"GGUF\"), got 47 47 4d 4c");
  expect_error(Bytes().header(1, 0, 0), 4, "GGUF version 1 is not supported (only 2 and 3)");
  expect_error(Bytes().header(4, 0, 0), 4, "GGUF version 4 is not supported (only 2 and 3)");
  expect_error(Bytes().header(0x03000000, 0, 0), 4,
               "GGUF version 50331648 looks byte-swapped (a big-endian file?)");
}

// Counts are checked against the bytes left before anything is allocated: 2^60 keys would
// otherwise try to reserve exabytes.
TEST(GgufBadFiles, HugeCounts) {
  expect_error(Bytes().header(3, 0, uint64_t{1} << 60), 16,
               "n_kv = 1152921504606846976 needs at least 13 bytes per key but only 0 bytes "
               "follow the header");
  expect_error(Bytes().header(3, ~uint64_t{0}, 0).zeros(100), 8,
               "n_tensors = 18446744073709551615 needs at least 32 bytes per tensor info but "
               "only 100 bytes follow the header");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(kTypeArray).u32(0).u64(uint64_t{1} << 62),
               37, "array of 4611686018427387904 u8 needs at least 1 bytes each but only 0 bytes "
               "are left in the file");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(kTypeArray).u32(kTypeString).u64(3).u64(0),
               37, "array of 3 string needs at least 8 bytes each but only 8 bytes are left in "
               "the file");
}

// An array longer than kMaxArrayLength (2^24) is refused even when the bytes are there.
TEST(GgufBadFiles, ArrayLengthLimit) {
  Bytes b;
  b.header(3, 0, 1).str("k").u32(kTypeArray).u32(0).u64(kMaxArrayLength + 1);
  b.zeros(kMaxArrayLength + 1);
  expect_error(b, 37, "array of 16777217 items is longer than the limit of 16777216");
}

TEST(GgufBadFiles, Strings) {
  expect_error(Bytes().header(3, 0, 1).u64(1000).raw("abcdefghijklm"), 24,
               "key has length 1000 but only 13 bytes are left in the file");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(kTypeString).u64(~uint64_t{0}), 37,
               "string value has length 18446744073709551615 but only 0 bytes are left in the "
               "file");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(kTypeString).raw("abc"), 37,
               "file ends while reading string value (8 bytes needed, 3 left)");
}

TEST(GgufBadFiles, Values) {
  expect_error(Bytes().header(3, 0, 1).str("k").u32(13).u32(0), 33,
               "key 'k' has unknown value type 13");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(kTypeArray).u32(99).u64(0), 37,
               "unknown array element type 99");
  expect_error(Bytes().header(3, 0, 1).str("b").u32(kTypeBool).put<uint8_t>(2), 37,
               "bool value 2 is not 0 or 1");
  Bytes deep;
  deep.header(3, 0, 1).str("k").u32(kTypeArray);
  for (int i = 0; i < 17; ++i) deep.u32(kTypeArray).u64(1);
  expect_error(deep, 37 + 16 * 12, "arrays nested deeper than 16 levels");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(6).raw("ab"), 37,
               "file ends while reading f32 (4 bytes needed, 2 left)");
}

TEST(GgufBadFiles, DuplicateKeys) {
  expect_error(Bytes().header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2), 41, "duplicate key 'k'");
}

TEST(GgufBadFiles, Alignment) {
  expect_error(Bytes().header(3, 0, 1).kv_u32("general.alignment", 48), 24,
               "general.alignment = 48 is not a power of two");
  expect_error(Bytes().header(3, 0, 1).kv_u32("general.alignment", 0), 24,
               "general.alignment = 0 is not a power of two");
  expect_error(Bytes().header(3, 0, 1).str("general.alignment").u32(kTypeString).str("32"), 24,
               "general.alignment has type string, expected u32");
}

TEST(GgufBadFiles, TensorShapes) {
  expect_error(one_tensor_file({1, 1, 1, 1, 1}, kF32, 0, 32), 24,
               "tensor 't' has n_dims = 5 (must be 1 to 4)");
  expect_error(one_tensor_file({}, kF32, 0, 32), 24, "tensor 't' has n_dims = 0 (must be 1 to 4)");
  expect_error(one_tensor_file({4, 0}, kF32, 0, 32), 24,
               "tensor 't' has dim 1 = 0 (must be positive)");
  expect_error(one_tensor_file({-3}, kF32, 0, 32), 24,
               "tensor 't' has dim 0 = -3 (must be positive)");
  const int64_t big = int64_t{1} << 31;
  expect_error(one_tensor_file({big, big, big}, kF32, 0, 32), 24,
               "tensor 't' is too large (size overflows)");
  expect_error(one_tensor_file({4}, 99, 0, 32), 24, "tensor 't' has unknown ggml type 99");
  expect_error(one_tensor_file({4}, 4, 0, 32), 24, "tensor 't' has unknown ggml type 4");
  expect_error(one_tensor_file({30}, kQ8_0, 0, 64), 24,
               "tensor 't' has row length 30, not a multiple of the q8_0 block size 32");
  Bytes long_name;
  long_name.header(3, 1, 0).tensor(std::string(64, 'n'), {4}, kF32, 0).pad_to(32).zeros(32);
  expect_error(long_name, 24, "tensor name of 64 bytes is longer than 63");
}

TEST(GgufBadFiles, TensorData) {
  expect_error(one_tensor_file({4}, kF32, 4, 64), 24,
               "tensor 't' has offset 4, not a multiple of the alignment 32");
  expect_error(one_tensor_file({16}, kF32, 0, 32), 24,
               "tensor 't' data [0, 64) runs past the end of the data section (32 bytes)");
  expect_error(one_tensor_file({4}, kF32, ~uint64_t{0} << 5, 32), 24,
               "tensor 't' data [18446744073709551584, 18446744073709551600) runs past the end of "
               "the data section (32 bytes)");
  Bytes no_data;
  no_data.header(3, 1, 0).tensor("t", {4}, kF32, 0);  // 57 bytes, data would start at 64
  expect_error(no_data, 57, "data section should start at 64 but the file has 57 bytes");
}

TEST(GgufBadFiles, DuplicateAndOverlappingTensors) {
  Bytes dup;
  dup.header(3, 2, 0).tensor("t", {4}, kF32, 0).tensor("t", {4}, kF32, 32).pad_to(32).zeros(64);
  expect_error(dup, 57, "duplicate tensor name 't'");
  Bytes overlap;
  overlap.header(3, 2, 0).tensor("a", {16}, kF32, 0).tensor("b", {16}, kF32, 32);
  overlap.pad_to(32).zeros(128);
  expect_error(overlap, 57, "tensor 'b' at offset 32 overlaps tensor 'a' [0, 64)");
}

// The same layouts with the problem removed parse, so the tests above fail for the reason
// they name.
TEST(GgufBadFiles, ControlsParse) {
  for (const Bytes& b : {one_tensor_file({4}, kF32, 0, 32), one_tensor_file({16}, kF32, 0, 64),
                         one_tensor_file({32}, kQ8_0, 0, 64),
                         one_tensor_file({1, 1, 1, 1}, kF32, 0, 32)}) {
    auto f = GgufFile::parse({b.data().data(), b.size()}, "good.gguf");
    EXPECT_TRUE(f.ok()) << f.status().to_string();
  }
  Bytes two;
  two.header(3, 2, 0).tensor("a", {16}, kF32, 0).tensor("b", {16}, kF32, 64).pad_to(32).zeros(128);
  EXPECT_TRUE(GgufFile::parse({two.data().data(), two.size()}, "good.gguf").ok());
  Bytes kv;
  kv.header(2, 0, 2).kv_u32("general.alignment", 64).str("b").u32(kTypeBool).put<uint8_t>(1);
  auto f = GgufFile::parse({kv.data().data(), kv.size()}, "good.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(*f->get_bool("b"), true);
}

TEST(GgufBadFiles, OpenNamesMissingFile) {
  auto f = GgufFile::open("/nonexistent/x.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kIoError);
  EXPECT_NE(f.status().message().find("/nonexistent/x.gguf"), std::string::npos);
}

}  // namespace
}  // namespace arbor::gguf
