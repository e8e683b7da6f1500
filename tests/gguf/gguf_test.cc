#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "gguf/gguf.h"
#include "test_files.h"

namespace arbor::gguf {
namespace {

using test_files::shared_gguf_files;
using ::arbor::test::require_shared_file;
using ::arbor::test::shared_path;
using test_files::synthetic_writer;

std::span<const uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(GgufSharedFiles, WriterReproducesEveryFileByteForByte) {
  ASSERT_TRUE(require_shared_file("models"));
  const auto files = shared_gguf_files();
  EXPECT_GE(files.size(), 10u);
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    const std::string out = GgufWriter::from_file(*file).serialize();
    const auto in = file->file_bytes();
    ASSERT_EQ(out.size(), in.size());
    EXPECT_TRUE(std::equal(in.begin(), in.end(), as_bytes(out).begin()));
  }
}

TEST(GgufSharedFiles, Stories260KKnownValues) {
  ASSERT_TRUE(require_shared_file("models/stories260K/stories260K.gguf"));
  const std::string path = shared_path("models/stories260K/stories260K.gguf");
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset(), 14176u);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(*f->get_string("general.architecture"), "llama");
  EXPECT_EQ(*f->get_u32("llama.block_count"), 5u);
  EXPECT_EQ(*f->get_u64("llama.block_count"), 5u);
  EXPECT_EQ(*f->get_i64("llama.block_count"), 5);
  EXPECT_EQ(*f->get_u32("llama.embedding_length"), 64u);
  EXPECT_EQ(*f->get_u32("llama.context_length"), 2048u);
  EXPECT_EQ(*f->get_u32("llama.feed_forward_length"), 172u);
  EXPECT_EQ(*f->get_u32("llama.attention.head_count"), 8u);
  EXPECT_EQ(*f->get_u32("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(*f->get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(*f->get_u32("tokenizer.ggml.seperator_token_id"), 4294967295u);
  const auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  const auto types = f->get_i32_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  EXPECT_EQ(types->size(), 512u);
  EXPECT_EQ((*types)[0], 2);
  EXPECT_EQ((*types)[3], 6);
  EXPECT_EQ(f->get_f32_array("tokenizer.ggml.scores")->size(), 512u);

  ASSERT_EQ(f->tensors().size(), 48u);
  const TensorInfo* down = f->find_tensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->dims, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(down->type, GgmlType::kF32);
  EXPECT_EQ(down->offset, 355840u);
  EXPECT_EQ(down->size_bytes, 44032u);
  EXPECT_EQ(down->num_elements(), 172 * 64);
  EXPECT_EQ(down->data, f->file_bytes().data() + f->data_offset() + down->offset);
  EXPECT_EQ(f->tensors()[0].name, "token_embd.weight");
  EXPECT_EQ(f->tensors()[0].dims, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(f->find_tensor("no.such.tensor"), nullptr);
}

TEST(GgufSharedFiles, TinyStoriesQ8_0KnownValues) {
  ASSERT_TRUE(require_shared_file("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"));
  const std::string path = shared_path("models/tinystories-656K/TinyStories-656K-Q8_0.gguf");
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->tensors().size(), 20u);
  EXPECT_EQ(*f->get_u32("general.file_type"), 7u);
  EXPECT_EQ(*f->get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(*f->get_u32("llama.vocab_size"), 2048u);
  const TensorInfo* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kQ8_0);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{128, 2048}));
  EXPECT_EQ(emb->size_bytes, 128u / 32 * 34 * 2048);
}

TEST(GgufGetters, ErrorsNameTheKeyAndTheProblem) {
  const std::string bytes = synthetic_writer(3, 32).serialize();
  auto f = GgufFile::parse(as_bytes(bytes), "syn.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const auto missing = f->get_u32("no.such.key");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "syn.gguf: key 'no.such.key' not found");
  const auto wrong = f->get_string("t.u32");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.status().message(),
            "syn.gguf: key 't.u32' has type u32 (value 4000000000), expected string");
  EXPECT_FALSE(f->get_u32("t.i8").ok());   // -100 does not fit
  EXPECT_FALSE(f->get_u32("t.u64").ok());  // 2^60 does not fit
  EXPECT_FALSE(f->get_u64("t.i64").ok());  // negative
  EXPECT_EQ(*f->get_i64("t.i64"), -(int64_t{1} << 60));
  EXPECT_EQ(*f->get_u64("t.u64"), uint64_t{1} << 60);
  EXPECT_EQ(*f->get_i64("t.i8"), -100);
  EXPECT_EQ(*f->get_u32("t.u16"), 60000u);
  EXPECT_EQ(*f->get_f32("t.f64"), -2.25f);
  EXPECT_FALSE(f->get_f32("t.i32").ok());
  EXPECT_EQ(*f->get_bool("t.bool"), true);
  EXPECT_EQ(*f->get_string("t.empty_string"), "");
  EXPECT_EQ(*f->get_string_array("t.strings"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(*f->get_f32_array("t.f32s"), (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(*f->get_i32_array("t.i32s"), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_TRUE(f->get_i32_array("t.empty_array")->empty());
  EXPECT_FALSE(f->get_i32_array("t.nested").ok());
  EXPECT_FALSE(f->get_string_array("t.i32s").ok());
  EXPECT_FALSE(f->get_i32_array("t.u8").ok());
}

TEST(GgufValues, ToStringAbbreviatesAndEscapes) {
  EXPECT_EQ(value_to_string(Value::i32_array({1, 2, 3, 4, 5}), 2), "[1, 2, ... (5 items)]");
  EXPECT_EQ(value_to_string(Value::str("a\"b\n\x01")), "\"a\\\"b\\n\\x01\"");
  EXPECT_EQ(value_to_string(Value::boolean(false)), "false");
  EXPECT_EQ(value_to_string(Value::i64(-5)), "-5");
  EXPECT_EQ(value_to_string(Value::f32(0.5f)), "0.5");
  EXPECT_EQ(value_to_string(Value::array(ValueType::kArray, {Value::i32_array({7})})), "[[7]]");
}

// Writer -> bytes -> reader -> writer: every value and tensor survives, for each version and
// alignment.
TEST(GgufWriterReader, SyntheticRoundTrip) {
  for (uint32_t version : {2u, 3u}) {
    for (uint64_t alignment : {1u, 32u, 64u, 256u}) {
      SCOPED_TRACE(::testing::Message() << "version " << version << " alignment " << alignment);
      const GgufWriter w = synthetic_writer(version, alignment);
      const std::string bytes = w.serialize();
      EXPECT_EQ(bytes.size() % alignment, 0u);
      auto f = GgufFile::parse(as_bytes(bytes), "syn.gguf");
      ASSERT_TRUE(f.ok()) << f.status().to_string();
      EXPECT_EQ(f->version(), version);
      EXPECT_EQ(f->alignment(), alignment);
      EXPECT_EQ(f->data_offset() % alignment, 0u);
      ASSERT_EQ(f->metadata().size(), w.metadata().size());
      for (size_t i = 0; i < w.metadata().size(); ++i) {
        EXPECT_EQ(f->metadata()[i].key, w.metadata()[i].key);
        EXPECT_TRUE(f->metadata()[i].value == w.metadata()[i].value) << w.metadata()[i].key;
      }
      EXPECT_EQ(f->find("general.alignment") != nullptr, alignment != 32);
      ASSERT_EQ(f->tensors().size(), 5u);
      const TensorInfo* q4k = f->find_tensor("d.q4_K");
      ASSERT_NE(q4k, nullptr);
      EXPECT_EQ(q4k->type, GgmlType::kQ4_K);
      EXPECT_EQ(q4k->dims, (std::vector<int64_t>{256, 1, 1, 2}));
      const auto expected = test_files::pattern_bytes(144 * 2, 4);
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), q4k->bytes().begin()));
      for (const TensorInfo& t : f->tensors()) EXPECT_EQ(t.offset % alignment, 0u) << t.name;
      EXPECT_EQ(GgufWriter::from_file(*f).serialize(), bytes);
    }
  }
}

TEST(GgufWriterReader, WriteToFileMatchesSerialize) {
  const GgufWriter w = synthetic_writer(3, 64);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("gguf_test_" + std::to_string(getpid()) + ".gguf"))
          .string();
  ASSERT_TRUE(w.write(path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const std::string bytes = w.serialize();
  ASSERT_EQ(f->file_bytes().size(), bytes.size());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(),
                         reinterpret_cast<const char*>(f->file_bytes().data())));
  std::filesystem::remove(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(w.write("/nonexistent-dir/x.gguf").code(), StatusCode::kIoError);
}

// add_tensor_generated: the bytes come from the generator when the file is written (once per
// write), and the file equals the one with the same bytes added up front.
TEST(GgufWriter, GeneratedTensorsEqualOwnedOnes) {
  const std::vector<uint8_t> a = test_files::pattern_bytes(34 * 3, 1);  // q8_0 [96]
  const std::vector<uint8_t> b = test_files::pattern_bytes(4 * 5, 2);   // f32 [5]
  GgufWriter owned, generated;
  int calls = 0;
  for (GgufWriter* w : {&owned, &generated}) w->set("k", Value::u32(7));
  owned.add_tensor_owned("a", GgmlType::kQ8_0, {96}, a);
  owned.add_tensor_owned("b", GgmlType::kF32, {5}, b);
  generated.add_tensor_generated("a", GgmlType::kQ8_0, {96}, [&] { ++calls; return a; });
  generated.add_tensor_generated("b", GgmlType::kF32, {5}, [&] { ++calls; return b; });
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(generated.serialize(), owned.serialize());
  EXPECT_EQ(calls, 2);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("gguf_gen_" + std::to_string(getpid()) + ".gguf")).string();
  ASSERT_TRUE(generated.write(path).ok());
  EXPECT_EQ(calls, 4);
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const std::string bytes = owned.serialize();
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(),
                         reinterpret_cast<const char*>(f->file_bytes().data())));
  std::filesystem::remove(path);
  GgufWriter wrong;
  wrong.add_tensor_generated("c", GgmlType::kF32, {5}, [] { return std::vector<uint8_t>(12); });
  EXPECT_DEATH(wrong.serialize(), "generated tensor 'c'");
  // A generator's error ends write() with it, naming the tensor, and leaves no file behind.
  GgufWriter failing;
  failing.add_tensor_owned("a", GgmlType::kQ8_0, {96}, a);
  failing.add_tensor_generated("d", GgmlType::kF32, {5}, []() -> Result<std::vector<uint8_t>> {
    return invalid_argument("no bytes today");
  });
  const Status st = failing.write(path);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tensor 'd'"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("no bytes today"), std::string::npos) << st.to_string();
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(GgufWriter, SetReplacesInPlaceAndRemoveDeletes) {
  GgufWriter w;
  w.set("a", Value::u32(1));
  w.set("b", Value::str("x"));
  w.set("a", Value::str("now a string"));
  ASSERT_EQ(w.metadata().size(), 2u);
  EXPECT_EQ(w.metadata()[0].key, "a");
  EXPECT_EQ(w.metadata()[0].value.type, ValueType::kString);
  w.remove("a");
  ASSERT_EQ(w.metadata().size(), 1u);
  EXPECT_EQ(w.metadata()[0].key, "b");
  w.set("general.alignment", Value::u32(128));
  EXPECT_EQ(w.alignment(), 128u);
  w.set_alignment(32);  // the key exists, so it is updated rather than left stale
  EXPECT_EQ(std::get<uint32_t>(w.find("general.alignment")->data), 32u);
}

// A file without tensors: ggml pads after the tensor infos, older gguf-py did not; the reader
// takes both and from_file keeps whichever the file had.
TEST(GgufWriter, NoTensorsPaddingIsOptional) {
  GgufWriter w;
  w.set("k", Value::str("abc"));
  const std::string padded = w.serialize();
  EXPECT_EQ(padded.size() % 32, 0u);
  w.set_pad_end(false);
  const std::string unpadded = w.serialize();
  EXPECT_EQ(unpadded.size(), 24u + 8 + 1 + 4 + 8 + 3);
  for (const std::string& bytes : {padded, unpadded}) {
    auto f = GgufFile::parse(as_bytes(bytes), "empty.gguf");
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ(GgufWriter::from_file(*f).serialize(), bytes);
  }
}

TEST(GgufWriterDeathTest, CallerMistakesAreChecks) {
  GgufWriter w;
  EXPECT_DEATH(w.set_alignment(48), "not a power of two");
  EXPECT_DEATH(w.set_version(4), "GGUF version 4");
  EXPECT_DEATH(w.add_tensor_owned("t", GgmlType::kF32, {4}, std::vector<uint8_t>(15)), "15 vs 16");
  EXPECT_DEATH(w.add_tensor_owned("t", GgmlType::kQ8_0, {30}, std::vector<uint8_t>(34)),
               "invalid dims");
  w.add_tensor_owned("t", GgmlType::kF32, {1}, std::vector<uint8_t>(4));
  EXPECT_DEATH(w.add_tensor_owned("t", GgmlType::kF32, {1}, std::vector<uint8_t>(4)),
               "duplicate tensor name 't'");
}

TEST(GgmlTypes, TableAndParsing) {
  EXPECT_EQ(ggml_traits(GgmlType::kQ4_K).type_size, 144u);
  EXPECT_EQ(ggml_traits(GgmlType::kQ6_K).block_size, 256u);
  EXPECT_EQ(ggml_type_name(GgmlType::kQ4_K), "q4_K");
  EXPECT_EQ(*parse_ggml_type("Q4_K"), GgmlType::kQ4_K);
  EXPECT_EQ(*parse_ggml_type("bf16"), GgmlType::kBF16);
  const auto bad = parse_ggml_type("q9_9");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("accepted: f32, f16, q4_0"), std::string::npos);
  EXPECT_FALSE(ggml_type_traits(4).has_value());  // removed Q4_2
  EXPECT_EQ(ggml_row_size(GgmlType::kQ8_0, 64), 68u);
  EXPECT_EQ(*ggml_nbytes(GgmlType::kQ4_0, {64, 3}), 2u * 18 * 3);
  EXPECT_FALSE(ggml_nbytes(GgmlType::kQ4_0, {48, 3}).has_value());
  EXPECT_FALSE(ggml_nbytes(GgmlType::kF32, {int64_t{1} << 40, int64_t{1} << 30}).has_value());
  EXPECT_FALSE(ggml_nbytes(GgmlType::kF32, {4, 0}).has_value());
}

}  // namespace
}  // namespace arbor::gguf
