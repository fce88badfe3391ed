// Indexed dataset: prepare from real Brown documents, read back, and reject damaged files with
// one-line errors that name the file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "data_test_support.h"
#include "jumbo/config/config.h"
#include "jumbo/data/indexed_dataset.h"
#include "jumbo/data/prepare.h"
#include "jumbo/data/tokenizer.h"

namespace fs = std::filesystem;

namespace jumbo {
namespace {

using test::TempDir;
using test::user_error_of;

void expect_mentions(const std::string& msg, std::initializer_list<std::string> parts) {
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in: " << msg;
}

TEST(IndexedDataset, PreparedBrownReadsBackAsEncodeThenEos) {
  TempDir tmp;
  const Tokenizer tok(test::small_tokenizer());
  PrepareOptions opts;
  opts.inputs = {test::brown_valid()};
  opts.tokenizer = test::small_tokenizer();
  opts.output_prefix = tmp.file("valid");
  const DatasetHeader written = prepare_dataset(opts).header;

  const auto docs = read_documents(test::brown_valid(), "text");
  const IndexedDataset data(tmp.file("valid"));
  EXPECT_EQ(data.header().dtype, TokenDType::u16);
  EXPECT_EQ(data.header().vocab_size, 500u);
  EXPECT_EQ(data.header().tokenizer_fingerprint, tok.fingerprint());
  EXPECT_EQ(data.num_tokens(), written.num_tokens);
  ASSERT_EQ(data.num_docs(), docs.size());
  EXPECT_EQ(data.format(), DatasetFormat::jumbo_parts);
  EXPECT_EQ(fs::file_size(tmp.file("valid.part-000000.bin")), data.num_tokens() * 2);
  for (size_t d = 0; d < docs.size(); ++d) {
    auto expected = tok.encode(docs[d]);
    expected.push_back(tok.eos_id());
    const uint64_t begin = data.doc_offset(d), end = data.doc_offset(d + 1);
    ASSERT_EQ(end - begin, expected.size()) << "document " << d;
    std::vector<int32_t> got(expected.size());
    data.read(begin, got.size(), got.data());
    ASSERT_EQ(got, expected) << "document " << d;
    got.pop_back();
    EXPECT_EQ(tok.decode(got), docs[d]);
  }
  EXPECT_NO_THROW(data.check_tokenizer(tok.vocab_size(), tok.fingerprint(), tok.path()));
  for (const auto& entry : fs::directory_iterator(tmp.path())) {
    EXPECT_NE(entry.path().extension(), ".tmp") << "left behind: " << entry.path();
  }
}

TEST(IndexedDataset, LargeVocabulariesStoreUint32) {
  TempDir tmp;
  const std::vector<std::vector<int32_t>> docs = {{0, 65535, 65536, 69999}, {}, {12345, 1}};
  IndexedDatasetWriter writer(tmp.file("big"), 70000, 0xfeedu);
  for (const auto& d : docs) writer.add_document(d);
  const DatasetHeader h = writer.finish();
  EXPECT_EQ(h.dtype, TokenDType::u32);
  EXPECT_EQ(h.num_tokens, 6u);

  const IndexedDataset data(tmp.file("big"));
  EXPECT_EQ(data.header().dtype, TokenDType::u32);
  EXPECT_EQ(data.header().vocab_size, 70000u);
  EXPECT_EQ(data.header().tokenizer_fingerprint, 0xfeedu);
  EXPECT_EQ(fs::file_size(tmp.file("big.bin")), 6u * 4);
  EXPECT_EQ(data.num_docs(), 3u);
  EXPECT_EQ(data.doc_offset(1), 4u);
  EXPECT_EQ(data.doc_offset(2), 4u);
  EXPECT_EQ(data.doc_offset(3), 6u);
  std::vector<int32_t> all(6);
  data.read(0, 6, all.data());
  EXPECT_EQ(all, (std::vector<int32_t>{0, 65535, 65536, 69999, 12345, 1}));
  int32_t tail[2];
  data.read(3, 2, tail);
  EXPECT_EQ(tail[0], 69999);
  EXPECT_EQ(tail[1], 12345);
  EXPECT_THROW(data.read(5, 2, all.data()), std::out_of_range);
}

TEST(IndexedDataset, WriterRejectsTokensOutsideTheVocabularyAndCleansUp) {
  TempDir tmp;
  {
    IndexedDatasetWriter writer(tmp.file("w"), 100, 1);
    writer.add_document({1, 2, 3});
    const std::string msg = user_error_of([&] { writer.add_document({5, 100}); });
    expect_mentions(msg, {tmp.file("w"), "token 100", "document 1", "[0, 100)"});
  }  // abandoned without finish()
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

// A 3-document dataset (12 tokens, vocab 1000), then one damage at a time.
class DamagedDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    IndexedDatasetWriter writer(prefix, 1000, 0x1234abcdu);
    writer.add_document({10, 11, 12, 2});
    writer.add_document({20, 21, 2});
    writer.add_document({30, 31, 32, 33, 2});
    writer.finish();
    ASSERT_NO_THROW(IndexedDataset ok(prefix));
    idx = test::read_bytes(prefix + ".idx");
    bin = test::read_bytes(prefix + ".bin");
    ASSERT_EQ(idx.size(), 64u + 4 * 8);
    ASSERT_EQ(bin.size(), 12u * 2);
  }
  void put_u64(size_t offset, uint64_t v) { std::memcpy(&idx[offset], &v, 8); }
  std::string open_error() {
    test::write_bytes(prefix + ".idx", idx);
    test::write_bytes(prefix + ".bin", bin);
    return user_error_of([&] { IndexedDataset d(prefix); });
  }

  TempDir tmp;
  std::string prefix = tmp.file("x");
  std::string idx, bin;
};

TEST_F(DamagedDataset, MissingBin) {
  fs::remove(prefix + ".bin");
  expect_mentions(user_error_of([&] { IndexedDataset d(prefix); }), {prefix + ".bin", "cannot open"});
}

TEST_F(DamagedDataset, MissingIdx) {
  fs::remove(prefix + ".idx");
  expect_mentions(user_error_of([&] { IndexedDataset d(prefix); }), {prefix + ".idx", "cannot open"});
}

TEST_F(DamagedDataset, TruncatedBin) {
  bin.resize(10);
  expect_mentions(open_error(), {prefix + ".bin: size 10 bytes, expected 24 (12 tokens x 2 bytes from " +
                                 prefix + ".idx)"});
}

TEST_F(DamagedDataset, BadMagic) {
  idx.replace(0, 8, "GPT2IDX\x01", 8);
  expect_mentions(open_error(), {prefix + ".idx", "magic \"GPT2IDX\\x01\"", "JUMBOIDX"});
}

TEST_F(DamagedDataset, NotAnIndexAtAll) {
  idx = "hello";
  expect_mentions(open_error(), {prefix + ".idx: size 5 bytes", "64-byte header"});
}

TEST_F(DamagedDataset, UnknownVersionAndDtype) {
  idx[8] = 7;
  expect_mentions(open_error(), {prefix + ".idx", "format version 7", "expected 1"});
  idx[8] = 1;
  idx[12] = 9;
  expect_mentions(open_error(), {prefix + ".idx", "dtype 9", "uint16"});
}

TEST_F(DamagedDataset, TruncatedIdx) {
  idx.resize(idx.size() - 8);
  expect_mentions(open_error(), {prefix + ".idx: size 88 bytes, expected 96", "3 documents"});
}

TEST_F(DamagedDataset, DecreasingOffsets) {
  put_u64(64 + 2 * 8, 3);  // offset 2 (7) -> 3, below offset 1 = 4
  expect_mentions(open_error(), {prefix + ".idx", "offset 2 (byte 80) is 3", "offset 1 = 4"});
}

TEST_F(DamagedDataset, OffsetsNotEndingAtNumTokens) {
  put_u64(64 + 3 * 8, 11);
  expect_mentions(open_error(), {prefix + ".idx", "is 11", "num_tokens = 12"});
}

TEST_F(DamagedDataset, NumTokensDisagreesWithBin) {
  put_u64(40, 13);  // num_tokens; the last offset now disagrees too
  put_u64(64 + 3 * 8, 13);
  expect_mentions(open_error(), {prefix + ".bin: size 24 bytes, expected 26"});
}

TEST_F(DamagedDataset, TokenOutsideVocabulary) {
  const uint16_t bad = 1000;
  std::memcpy(&bin[5 * 2], &bad, 2);
  expect_mentions(open_error(), {prefix + ".bin", "token 1000 at position 5", "[0, 1000)"});
}

TEST_F(DamagedDataset, TokenizerMismatchNamesBothSides) {
  const IndexedDataset data(prefix);
  EXPECT_NO_THROW(data.check_tokenizer(1000, 0x1234abcdu, "t.model"));
  expect_mentions(user_error_of([&] { data.check_tokenizer(8000, 0x99u, "tok/t.model"); }),
                  {prefix + ".idx: made with a tokenizer of vocab 1000 (fingerprint 0x000000001234abcd)",
                   "data.tokenizer = tok/t.model has vocab 8000 (fingerprint 0x0000000000000099)"});
  // Same vocabulary size, different model: still refused.
  expect_mentions(user_error_of([&] { data.check_tokenizer(1000, 0x1234abceu, "u.model"); }),
                  {"u.model", "fingerprint 0x000000001234abce"});
}

// A dataset of parts, written by hand: three pairs listed by PREFIX.parts, read as one stream.
class PartsDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<DatasetPart> parts;
    int32_t next = 0;
    for (int p = 0; p < 3; ++p) {
      const std::string part = part_prefix(prefix, static_cast<uint64_t>(p));
      IndexedDatasetWriter w(part, 1000, 0xabcu);
      for (int d = 0; d < 2 + p; ++d) {  // 2, 3, 4 documents of 5 tokens
        std::vector<int32_t> doc;
        for (int t = 0; t < 5; ++t) doc.push_back(next++);
        w.add_document(doc);
      }
      const DatasetHeader h = w.finish();
      parts.push_back({fs::path(part).filename().string(), h.num_docs, h.num_tokens});
    }
    write_parts_index(prefix, parts, 1000, 0xabcu);
  }
  std::string parts_text() { return test::read_bytes(prefix + ".parts"); }
  void replace(const std::string& from, const std::string& to) {
    std::string text = parts_text();
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in " << text;
    test::write_bytes(prefix + ".parts", text.replace(at, from.size(), to));
  }
  std::string open_error() { return user_error_of([&] { IndexedDataset d(prefix); }); }

  TempDir tmp;
  std::string prefix = tmp.file("web");
};

TEST_F(PartsDataset, ReadsAsOneStreamAcrossParts) {
  const IndexedDataset data(prefix);
  EXPECT_EQ(data.format(), DatasetFormat::jumbo_parts);
  EXPECT_EQ(data.num_segments(), 3u);
  EXPECT_EQ(data.num_docs(), 9u);
  EXPECT_EQ(data.num_tokens(), 45u);
  EXPECT_EQ(data.header().vocab_size, 1000u);
  EXPECT_EQ(data.header().tokenizer_fingerprint, 0xabcu);
  std::vector<int32_t> all(45);
  data.read(0, 45, all.data());
  for (int32_t t = 0; t < 45; ++t) EXPECT_EQ(all[t], t);
  std::vector<int32_t> across(12);
  data.read(8, 12, across.data());  // from part 0 through part 1 into part 2
  for (int32_t t = 0; t < 12; ++t) EXPECT_EQ(across[t], 8 + t);
  for (uint64_t d = 0; d <= 9; ++d) EXPECT_EQ(data.doc_offset(d), 5 * d);
  EXPECT_NO_THROW(data.check_tokenizer(1000, 0xabcu, "t.model"));
  expect_mentions(user_error_of([&] { data.check_tokenizer(1000, 0xabdu, "t.model"); }),
                  {prefix + ".parts: made with a tokenizer", "t.model"});
}

TEST_F(PartsDataset, AnIndexThatDisagreesWithItsPartsIsOneLine) {
  replace("\"num_tokens\": 15", "\"num_tokens\": 16");
  expect_mentions(open_error(), {prefix + ".parts", "parts[1]", "holds 3 documents, 15 tokens",
                                 "lists 3 documents, 16 tokens"});
}

TEST_F(PartsDataset, DamagedOrForeignIndexIsOneLine) {
  replace("\"jumbo-parts\"", "\"other\"");
  expect_mentions(open_error(), {prefix + ".parts", "format \"other\"", "expected \"jumbo-parts\""});
  test::write_bytes(prefix + ".parts", "{\"format\": ");
  expect_mentions(open_error(), {prefix + ".parts: not valid JSON"});
}

TEST_F(PartsDataset, APartOfAnotherTokenizerNamesIt) {
  IndexedDatasetWriter w(part_prefix(prefix, 1), 1000, 0xdefu);
  w.add_document({1, 2, 3, 4, 5});
  w.add_document({1, 2, 3, 4, 5});
  w.add_document({1, 2, 3, 4, 5});
  w.finish();
  expect_mentions(open_error(), {part_prefix(prefix, 1) + ".idx: made with a tokenizer",
                                 "fingerprint 0x0000000000000def", prefix + ".parts records"});
}

TEST_F(PartsDataset, MissingIndexOrAStalePairAreOneLine) {
  test::write_bytes(prefix + ".idx", "stale");
  expect_mentions(open_error(), {prefix + ".parts and " + prefix + ".idx exist"});
  fs::remove(prefix + ".idx");
  fs::remove(prefix + ".parts");
  test::write_bytes(prefix + ".parts.job", "{}");  // a preparation started, none finished
  expect_mentions(open_error(), {"the preparation did not finish; rerun it"});
  fs::remove(part_prefix(prefix, 2) + ".bin");
  write_parts_index(prefix, {{"web.part-000000", 2, 10}, {"web.part-000002", 4, 20}}, 1000, 0xabcu);
  expect_mentions(open_error(), {part_prefix(prefix, 2) + ".bin: cannot open"});
}

}  // namespace
}  // namespace jumbo
