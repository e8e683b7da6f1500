#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <random>

#include "base/check.h"
#include "base/fp16.h"
#include "base/huge_buffer.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "base/progress.h"
#include "base/status.h"

namespace arbor {
namespace {

Result<int> half_of(int x) {
  if (x % 2 != 0) return invalid_argument("odd value ", x);
  return x / 2;
}

Result<int> quarter_of(int x) {
  ARBOR_ASSIGN_OR_RETURN(int h, half_of(x));
  ARBOR_ASSIGN_OR_RETURN(int q, half_of(h));
  return q;
}

Status check_even(int x) {
  ARBOR_RETURN_IF_ERROR(half_of(x));
  return ok_status();
}

TEST(StatusTest, CarriesCodeAndMessage) {
  Status s = out_of_range("prompt has ", 9000, " tokens, max_model_len is ", 8192);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.to_string(), "out_of_range: prompt has 9000 tokens, max_model_len is 8192");
  EXPECT_EQ(s.with_context("request 7").message(),
            "request 7: prompt has 9000 tokens, max_model_len is 8192");
  EXPECT_TRUE(ok_status().ok());
}

TEST(StatusTest, MacrosPropagate) {
  EXPECT_EQ(*quarter_of(12), 3);
  Result<int> r = quarter_of(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "odd value 3");
  EXPECT_TRUE(check_even(4).ok());
  EXPECT_EQ(check_even(5).code(), StatusCode::kInvalidArgument);
}

// A message longer than std::string's inline buffer, so it lives on the heap.
const char kLongMessage[] = "a message long enough to be allocated on the heap, not inline";

Result<int> fails_with_long_message() { return invalid_argument(kLongMessage); }
Status fails_by_value() { return invalid_argument(kLongMessage); }

// `expr` is a reference into a temporary (Result::status() of a Result returned by value, as in
// ARBOR_RETURN_IF_ERROR(make_batch(...).status())): the temporary dies at the end of the
// statement that evaluates `expr`, so the macro must copy the status out within it. (Binding
// `auto&&` to the reference left it dangling; ASan reported a heap-use-after-free here.)
Status status_of_temporary_result() {
  ARBOR_RETURN_IF_ERROR(fails_with_long_message().status());
  return ok_status();
}
Status status_by_value() {
  ARBOR_RETURN_IF_ERROR(fails_by_value());
  return ok_status();
}
Result<int> status_into_result() {
  ARBOR_RETURN_IF_ERROR(fails_with_long_message());
  return 1;
}

TEST(StatusTest, ReturnIfErrorCopiesTheStatusOutOfTemporaries) {
  const Status a = status_of_temporary_result();
  EXPECT_EQ(a.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.message(), kLongMessage);
  const Status b = status_by_value();
  EXPECT_EQ(b.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.message(), kLongMessage);
  const Result<int> c = status_into_result();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), kLongMessage);
}

TEST(CheckDeathTest, AbortsWithLocationAndValues) {
  int a = 3, b = 4;
  EXPECT_DEATH(ARBOR_CHECK_EQ(a, b) << "context", "base_test.cc.*a == b.*3 vs 4.*context");
  EXPECT_DEATH(ARBOR_CHECK(a > b) << "why", "a > b why");
}

TEST(ResultDeathTest, ValueOfErrorAborts) {
  Result<int> r = not_found("no such tensor 'x'");
  EXPECT_DEATH((void)r.value(), "no such tensor 'x'");
}

TEST(LogTest, ParsesLevels) {
  EXPECT_EQ(*parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(*parse_log_level("warning"), LogLevel::kWarn);
  EXPECT_FALSE(parse_log_level("loud").ok());
  set_log_level(LogLevel::kWarn);
  EXPECT_FALSE(log_enabled(LogLevel::kInfo));
  EXPECT_TRUE(log_enabled(LogLevel::kError));
  set_log_level(LogLevel::kInfo);
}

// Every finite half converts to float and back to the same bits.
// Not on a terminal (gtest's captured stderr is a file): a line per interval with the count and
// the share done, none once done, then finish()'s summary.
TEST(ProgressBarTest, WithoutATerminalItLogsProgressLinesAndASummary) {
  ::testing::internal::CaptureStderr();
  {
    ProgressBar bar("copying", 4, "files", std::chrono::milliseconds(0));
    bar.add(1);
    bar.add(1);
    bar.add(2);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("copying: 1/4 files (25 %) after 0 s"), std::string::npos) << err;
  EXPECT_NE(err.find("copying: 2/4 files (50 %)"), std::string::npos) << err;
  EXPECT_EQ(err.find("4/4 files (100 %)"), std::string::npos) << err;
  EXPECT_NE(err.find("copying: 4/4 files in "), std::string::npos) << err;
  ::testing::internal::CaptureStderr();
  {
    ProgressBar quiet("copying", 4, "files");  // the default interval: 30 s
    quiet.add(1);
  }
  const std::string summary_only = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(summary_only.find("(25 %)"), std::string::npos) << summary_only;
  EXPECT_NE(summary_only.find("copying: 1/4 files in "), std::string::npos) << summary_only;
}

TEST(Fp16Test, AllHalvesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), h) << "half 0x" << std::hex << h;
  }
}

// Conversion of arbitrary floats agrees with the hardware (F16C) rounding.
__attribute__((target("f16c"))) uint16_t hw_fp32_to_fp16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

TEST(Fp16Test, MatchesF16CRounding) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t b = bits(rng);
    const float f = std::bit_cast<float>(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), hw_fp32_to_fp16(f)) << "float bits 0x" << std::hex << b;
  }
  for (float f : {65504.0f, 65519.0f, 65520.0f, 6.0e-8f, 2.9e-8f, 3.0e-8f, -0.0f}) {
    EXPECT_EQ(fp32_to_fp16(f), hw_fp32_to_fp16(f)) << f;
  }
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
  EXPECT_EQ(fp32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway too: ties to even (up).
  EXPECT_EQ(fp32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::nanf("")))));
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(fp32_to_bf16(f), h);
    }
  }
}

TEST(MappedFileTest, MapsAndReportsErrors) {
  const std::string path = ::testing::TempDir() + "/arbor_mapped_file_test.bin";
  ASSERT_TRUE(write_file_atomic(path, "hello gguf").ok());
  auto f = MappedFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->data()), f->size()), "hello gguf");
  MappedFile moved = std::move(f).value();
  EXPECT_EQ(moved.size(), 10u);
  auto missing = MappedFile::open("/nonexistent/x.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/x.gguf"), std::string::npos);
  EXPECT_EQ(*read_file(path), "hello gguf");
}

// The packed weights' buffer: 2 MiB-aligned, zero-filled, writable to its last byte, the size
// asked for (not the rounded mapping), moves without a second unmap; 0 bytes is an error; and
// where transparent huge pages may be advised ("always" or "madvise" in the kernel's setting)
// the advice was taken.
TEST(HugePageBufferTest, AlignedZeroedWritableAndMovable) {
  EXPECT_FALSE(HugePageBuffer::allocate(0).ok());
  for (const size_t bytes : {size_t{1}, size_t{4096}, HugePageBuffer::kHugePage,
                             HugePageBuffer::kHugePage + 1, size_t{5} << 20}) {
    SCOPED_TRACE(bytes);
    auto b = HugePageBuffer::allocate(bytes);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % HugePageBuffer::kHugePage, 0u);
    EXPECT_EQ(b->size(), bytes);
    for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(b->data()[i], 0) << i;
    EXPECT_EQ(b->data()[bytes - 1], 0);
    std::memset(b->data(), 0xA5, bytes);
    HugePageBuffer moved = std::move(*b);
    EXPECT_EQ(b->data(), nullptr);
    EXPECT_EQ(moved.data()[bytes - 1], 0xA5);
    HugePageBuffer assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.size(), bytes);
    EXPECT_EQ(assigned.data()[0], 0xA5);
  }
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string setting((std::istreambuf_iterator<char>(thp)), std::istreambuf_iterator<char>());
  if (setting.find("[never]") == std::string::npos && !setting.empty()) {
    auto b = HugePageBuffer::allocate(size_t{4} << 20);
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(b->advised()) << "THP setting: " << setting;
  }
}

}  // namespace
}  // namespace arbor
