#include "convert/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "safetensors_builder.h"

namespace arbor::convert {
namespace {

using testing::st_bytes;
using testing::st_entry;
using testing::st_header;
using testing::StEntry;

std::vector<StEntry> two_tensors() {
  return {st_entry("a", "F32", {2, 3}, {1, 2, 3, 4, 5, 6}),
          st_entry("b", "F16", {4}, {1, 2, 3, 4})};
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  auto f = SafetensorsFile::parse(bytes, "bad.safetensors");
  if (f.ok()) return "parsed fine";
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  return f.status().message();
}

TEST(SafetensorsTest, ParsesTensorsAndMetadata) {
  auto entries = two_tensors();
  auto header = st_header(entries);
  header["__metadata__"] = {{"format", "pt"}};
  const auto bytes = st_bytes(header.dump(), entries);
  auto f = SafetensorsFile::parse(bytes, "ok.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_EQ(f->tensors().size(), 2u);
  const StTensor* a = f->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->dtype, StDtype::kF32);
  EXPECT_EQ(a->bytes.size(), 24u);
  float v;
  std::memcpy(&v, a->bytes.data() + 20, 4);
  EXPECT_EQ(v, 6.0f);
  EXPECT_EQ(f->find("b")->bytes.size(), 8u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(*f->find("b")->file, "ok.safetensors");
}

TEST(SafetensorsTest, BadHeaderLength) {
  auto bytes = st_bytes(two_tensors());
  const uint64_t huge = bytes.size();  // header cannot be as long as the whole file
  std::memcpy(bytes.data(), &huge, 8);
  EXPECT_NE(parse_error(bytes).find("bad.safetensors: header length " + std::to_string(huge) +
                                    " exceeds the " + std::to_string(bytes.size() - 8)),
            std::string::npos)
      << parse_error(bytes);
  EXPECT_NE(parse_error({1, 2, 3}).find("fewer than the 8-byte header length"), std::string::npos);
}

TEST(SafetensorsTest, InvalidJson) {
  const auto bytes = st_bytes("{\"a\": [", {});
  EXPECT_NE(parse_error(bytes).find("is not valid JSON"), std::string::npos) << parse_error(bytes);
}

TEST(SafetensorsTest, OffsetsPastEnd) {
  auto entries = two_tensors();
  auto header = st_header(entries);
  header["b"]["data_offsets"] = {24, 40};
  header["b"]["shape"] = {8};
  const auto msg = parse_error(st_bytes(header.dump(), entries));
  EXPECT_NE(msg.find("tensor 'b': data_offsets end 40 is past the end of the 32-byte data buffer"),
            std::string::npos)
      << msg;
}

TEST(SafetensorsTest, DtypeSizeMismatch) {
  auto entries = two_tensors();
  auto header = st_header(entries);
  header["b"]["dtype"] = "F32";  // 4 × F32 needs 16 bytes, the range holds 8
  const auto msg = parse_error(st_bytes(header.dump(), entries));
  EXPECT_NE(
      msg.find("tensor 'b': shape [4] of F32 needs 16 bytes but data_offsets [24, 32] hold 8"),
      std::string::npos)
      << msg;
}

TEST(SafetensorsTest, UnknownDtypeAndBadShape) {
  auto entries = two_tensors();
  auto header = st_header(entries);
  header["a"]["dtype"] = "F33";
  auto msg = parse_error(st_bytes(header.dump(), entries));
  EXPECT_NE(msg.find("tensor 'a': unknown safetensors dtype \"F33\""), std::string::npos) << msg;
  header = st_header(entries);
  header["a"]["shape"] = {2, -3};
  msg = parse_error(st_bytes(header.dump(), entries));
  EXPECT_NE(msg.find("shape entry -3 is not a non-negative integer"), std::string::npos) << msg;
  header = st_header(entries);
  header["a"].erase("data_offsets");
  msg = parse_error(st_bytes(header.dump(), entries));
  EXPECT_NE(msg.find("\"data_offsets\" must be two non-negative integers"), std::string::npos)
      << msg;
}

TEST(SafetensorsTest, OverlappingRanges) {
  auto entries = two_tensors();
  auto header = st_header(entries);
  header["b"]["data_offsets"] = {20, 28};
  const auto msg = parse_error(st_bytes(header.dump(), entries));
  EXPECT_NE(msg.find("tensors 'a' [0, 24) and 'b' [20, ...) overlap"), std::string::npos) << msg;
}

TEST(SafetensorsTest, ShardedIndexConsistency) {
  const std::string dir = testing::temp_path("st_shards");
  std::filesystem::create_directories(dir);
  testing::write_bytes(dir + "/s1.safetensors", st_bytes({st_entry("x", "F32", {1}, {1})}));
  testing::write_bytes(dir + "/s2.safetensors", st_bytes({st_entry("y", "F32", {1}, {2})}));
  testing::write_text(
      dir + "/model.safetensors.index.json",
      R"({"metadata": {}, "weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}})");
  auto m = SafetensorsModel::open_dir(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->num_files(), 2u);
  ASSERT_NE(m->find("y"), nullptr);
  EXPECT_EQ(std::filesystem::path(*m->find("y")->file).filename(), "s2.safetensors");

  testing::write_text(dir + "/model.safetensors.index.json",
                      R"({"weight_map": {"x": "s1.safetensors", "y": "s1.safetensors"}})");
  m = SafetensorsModel::open_dir(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(
                "tensor 'y' is mapped to s1.safetensors but that file does not contain it"),
            std::string::npos)
      << m.status().message();

  testing::write_text(dir + "/model.safetensors.index.json",
                      R"({"weight_map": {"x": "../s1.safetensors"}})");
  m = SafetensorsModel::open_dir(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("outside the directory"), std::string::npos);
}

TEST(SafetensorsTest, MissingFiles) {
  const std::string dir = testing::temp_path("st_empty");
  std::filesystem::create_directories(dir);
  auto m = SafetensorsModel::open_dir(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos);
}

}  // namespace
}  // namespace arbor::convert
