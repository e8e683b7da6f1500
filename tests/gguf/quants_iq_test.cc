// The codebook types MXFP4, IQ4_NL and IQ4_XS in the gguf codecs, against two references arbor
// did not write:
//  * tests/gguf/codebook_reference.py, a numpy decoder written from the formats' specifications
//    (the OCP MX spec for MXFP4: E2M1 elements, E8M0 scales);
//  * llama.cpp's own codecs (tests/reference/.llama/llama_ref quantize / dequant: ggml's
//    ggml_quantize_chunk without an importance matrix, and the type's to_float), so a file
//    arbor writes decodes in llama.cpp to the values arbor decodes, and arbor's quantiser writes
//    llama-quantize's bytes.
// Blocks are random bytes plus the edge values: every E8M0 exponent 0..255 (denormal and
// overflowing scales), every nibble (MXFP4's negative zero included), fp16 scales that are
// zero, negative zero, denormal and the largest finite, IQ4_XS sub-block scales -32 and 31.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/strings.h"
#include "gguf/ggml_type.h"
#include "gguf/quants.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::gguf {
namespace {

std::string llama_ref() { return ARBOR_SOURCE_DIR "/tests/reference/.llama/llama_ref"; }

void write_bytes(const std::string& path, const void* data, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  ASSERT_TRUE(out.good()) << path;
}

template <class T>
std::vector<T> read_values(const std::string& path, size_t n) {
  std::vector<T> v(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  EXPECT_EQ(static_cast<size_t>(in.gcount()), n * sizeof(T)) << path;
  return v;
}

uint16_t finite_fp16(std::mt19937& rng) {
  for (;;) {
    const auto h = static_cast<uint16_t>(rng());
    if ((h & 0x7C00) != 0x7C00) return h;
  }
}

// `count` random blocks of `type` followed by the edge blocks.
std::vector<uint8_t> test_blocks(GgmlType type, int count, std::mt19937& rng) {
  const size_t bytes = ggml_traits(type).type_size;
  std::vector<uint8_t> out;
  auto block = [&](auto&& fill) {
    std::vector<uint8_t> b(bytes);
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
    fill(b.data());
    out.insert(out.end(), b.begin(), b.end());
  };
  const uint16_t edge_d[] = {0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0xFBFF, 0x3C00};
  switch (type) {
    case GgmlType::kMXFP4:
      for (int i = 0; i < count; ++i) block([](uint8_t*) {});
      for (int e = 0; e < 256; ++e) {  // every exponent with every nibble
        block([e](uint8_t* b) {
          b[0] = static_cast<uint8_t>(e);
          for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
        });
      }
      break;
    case GgmlType::kIQ4_NL:
      for (int i = 0; i < count; ++i) {
        block([&](uint8_t* b) { *reinterpret_cast<uint16_t*>(b) = finite_fp16(rng); });
      }
      for (uint16_t d : edge_d) block([d](uint8_t* b) { std::memcpy(b, &d, 2); });
      break;
    case GgmlType::kIQ4_XS:
      for (int i = 0; i < count; ++i) {
        block([&](uint8_t* b) { *reinterpret_cast<uint16_t*>(b) = finite_fp16(rng); });
      }
      for (uint16_t d : edge_d) {
        for (const uint8_t s : {0x00, 0xFF}) {  // every scale -32, or every scale 31
          block([d, s](uint8_t* b) {
            std::memcpy(b, &d, 2);
            std::memset(b + 2, s, 6);
          });
        }
      }
      break;
    default:
      ADD_FAILURE() << "not a codebook type";
  }
  return out;
}

constexpr GgmlType kTypes[] = {GgmlType::kMXFP4, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS};

TEST(CodebookCodecs, DecodeEqualsTheSpecDecoderAndLlamaCpp) {
  ASSERT_EQ(access(llama_ref().c_str(), X_OK), 0)
      << llama_ref() << " is missing: run scripts/install_reference.sh (make test does)";
  test::TempDir dir("codebook_decode");
  std::mt19937 rng(36);
  for (GgmlType type : kTypes) {
    SCOPED_TRACE(ggml_type_name(type));
    const std::vector<uint8_t> blocks = test_blocks(type, 400, rng);
    const int64_t n =
        static_cast<int64_t>(blocks.size() / ggml_traits(type).type_size) * ggml_traits(type).block_size;
    std::vector<float> ours(static_cast<size_t>(n));
    ASSERT_TRUE(dequantize_row(type, blocks.data(), ours.data(), n).ok());
    const std::string in = dir / "blocks.bin", spec = dir / "spec.f32", ggml = dir / "ggml.f32";
    write_bytes(in, blocks.data(), blocks.size());
    const std::string name(ggml_type_name(type));
    test::CommandResult r = test::run_shell(str_cat(
        "/usr/bin/python3 " ARBOR_SOURCE_DIR "/tests/gguf/codebook_reference.py ", name, " ", in,
        " ", spec));
    ASSERT_EQ(r.exit_code, 0) << r.output() << "(needs /usr/bin/python3 with numpy)";
    r = test::run_shell(str_cat(llama_ref(), " dequant ", static_cast<int>(type), " ", in, " ", n,
                                " ", ggml));
    ASSERT_EQ(r.exit_code, 0) << r.output();
    const auto want_spec = read_values<float>(spec, ours.size());
    const auto want_ggml = read_values<uint32_t>(ggml, ours.size());
    int zeros = 0, infinities = 0, denormals = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      // llama.cpp: the same bits. The spec: the same value (its -0 is ggml's +0).
      ASSERT_EQ(std::bit_cast<uint32_t>(ours[i]), want_ggml[i]) << "element " << i;
      ASSERT_EQ(ours[i], want_spec[i]) << "element " << i;
      zeros += ours[i] == 0.0f;
      infinities += std::isinf(ours[i]);
      denormals += std::fpclassify(ours[i]) == FP_SUBNORMAL;
    }
    // The edges were reached.
    EXPECT_GT(zeros, 0);
    if (type == GgmlType::kMXFP4) {
      EXPECT_GT(denormals, 0);
      EXPECT_GT(infinities, 0);
    }
  }
}

// MXFP4's negative zero (nibble 8) decodes to +0 as in ggml (the test above compares bits with
// llama.cpp), and the E8M0 extremes to 2^-128 and 2^127 (halved: ggml doubles the elements).
TEST(CodebookCodecs, Mxfp4EdgeValues) {
  EXPECT_EQ(std::bit_cast<uint32_t>(e8m0_to_fp32_half(0)), 0x00200000u);
  EXPECT_EQ(e8m0_to_fp32_half(0), std::ldexp(1.0f, -128));
  EXPECT_EQ(e8m0_to_fp32_half(1), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_fp32_half(127), 0.5f);
  EXPECT_EQ(e8m0_to_fp32_half(255), std::ldexp(1.0f, 127));
  BlockMxfp4 b;
  b.e = 127;  // scale 1: the elements themselves
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | j << 4);
  float y[32];
  dequantize_block_mxfp4(b, y);
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], e2m1[j]) << j;
    EXPECT_EQ(y[16 + j], e2m1[j]) << j;
  }
  EXPECT_EQ(std::bit_cast<uint32_t>(y[8]), 0u);  // +0, not -0
}

// arbor's quantisers write llama-quantize's bytes (ggml_quantize_chunk without an importance
// matrix) for matrices of several scales, all-zero blocks and tiny blocks included.
TEST(CodebookCodecs, QuantizeWritesLlamaCppBytes) {
  ASSERT_EQ(access(llama_ref().c_str(), X_OK), 0)
      << llama_ref() << " is missing: run scripts/install_reference.sh (make test does)";
  test::TempDir dir("codebook_quantize");
  std::mt19937 rng(37);
  const int64_t rows = 24, cols = 512;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(r % 12) * 3 - 20);
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = scale * normal(rng);
  }
  std::fill(x.begin() + 5 * cols, x.begin() + 5 * cols + 32, 0.0f);           // a zero block
  std::fill(x.begin() + 7 * cols + 64, x.begin() + 7 * cols + 96, 1e-20f);    // below 1e-15
  std::fill(x.begin() + 9 * cols, x.begin() + 10 * cols, 0.0f);               // a zero row
  const std::string in = dir / "x.f32";
  write_bytes(in, x.data(), x.size() * sizeof(float));
  for (GgmlType type : kTypes) {
    SCOPED_TRACE(ggml_type_name(type));
    const size_t row_bytes = ggml_row_size(type, cols);
    std::vector<uint8_t> ours(row_bytes * rows);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(quantize_row(type, x.data() + r * cols, ours.data() + r * row_bytes, cols).ok());
    }
    const std::string out = dir / "q.bin";
    const test::CommandResult res = test::run_shell(str_cat(
        llama_ref(), " quantize ", static_cast<int>(type), " ", in, " ", rows, " ", cols, " ", out));
    ASSERT_EQ(res.exit_code, 0) << res.output();
    const auto theirs = read_values<uint8_t>(out, ours.size());
    size_t differ = 0, first = ours.size();
    for (size_t i = 0; i < ours.size(); ++i) {
      if (ours[i] != theirs[i]) {
        ++differ;
        first = std::min(first, i);
      }
    }
    EXPECT_EQ(differ, 0u) << "first differing byte " << first << " (row " << first / row_bytes
                          << ")";
    // And the round trip is close (the quantisers are not trivially wrong the same way): row 8,
    // of scale 16 (rows of scale 2^-20 quantise to zero in fp16-scaled IQ4, in both engines).
    std::vector<float> back(static_cast<size_t>(cols));
    ASSERT_TRUE(dequantize_row(type, ours.data() + 8 * row_bytes, back.data(), cols).ok());
    double err = 0, norm = 0;
    for (int64_t c = 0; c < cols; ++c) {
      err += std::pow(back[c] - x[8 * cols + c], 2);
      norm += std::pow(x[8 * cols + c], 2);
    }
    EXPECT_LT(std::sqrt(err / norm), type == GgmlType::kMXFP4 ? 0.2 : 0.12);
  }
}

}  // namespace
}  // namespace arbor::gguf
