// Megatron-LM indexed datasets (MMIDIDX .bin/.idx) read through jumbo::IndexedDataset. The
// files come from tests/data/write_megatron_dataset.py, written from the format's published
// description, so the reader is checked against an independent writer, not against itself.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../../src/data/token_segment.h"  // the segment's own contract: vocab 0, sampled check
#include "data_test_support.h"
#include "jumbo/config/config.h"
#include "jumbo/data/indexed_dataset.h"

namespace fs = std::filesystem;

namespace jumbo {
namespace {

using test::TempDir;
using test::user_error_of;

using Sequence = std::vector<int64_t>;
using Document = std::vector<Sequence>;
using Documents = std::vector<Document>;

std::string to_json(const Documents& docs) {
  std::string s = "[";
  for (size_t d = 0; d < docs.size(); ++d) {
    if (d) s += ',';
    s += '[';
    for (size_t q = 0; q < docs[d].size(); ++q) {
      if (q) s += ',';
      s += '[';
      for (size_t t = 0; t < docs[d][q].size(); ++t) {
        if (t) s += ',';
        s += std::to_string(docs[d][q][t]);
      }
      s += ']';
    }
    s += ']';
  }
  return s + "]";
}

// Writes `docs` as TMP/NAME.{bin,idx} with the python writer; `args` go to it as they are
// (--dtype, --corrupt, ...). Returns the prefix.
std::string write_megatron(const TempDir& tmp, const std::string& name, const Documents& docs,
                           const std::string& args) {
  const std::string json = tmp.file(name + ".json");
  std::ofstream(json) << to_json(docs);
  const std::string prefix = tmp.file(name);
  const std::string command = "python3 '" + test::source_path("tests/data/write_megatron_dataset.py") +
                              "' '" + prefix + "' '" + json + "' " + args;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return prefix;
}

void expect_mentions(const std::string& msg, std::initializer_list<std::string> parts) {
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in: " << msg;
}

std::vector<int32_t> flatten(const Documents& docs) {
  std::vector<int32_t> all;
  for (const auto& d : docs) {
    for (const auto& q : d) all.insert(all.end(), q.begin(), q.end());
  }
  return all;
}

// Reads every document back by its offsets and compares with what was written.
void expect_reads_back(const IndexedDataset& data, const Documents& docs) {
  const std::vector<int32_t> all = flatten(docs);
  ASSERT_EQ(data.num_tokens(), all.size());
  ASSERT_EQ(data.num_docs(), docs.size());
  std::vector<int32_t> got(all.size());
  data.read(0, got.size(), got.data());
  EXPECT_EQ(got, all);
  uint64_t offset = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    EXPECT_EQ(data.doc_offset(d), offset) << "document " << d;
    const std::vector<int32_t> doc = flatten({docs[d]});
    std::vector<int32_t> one(doc.size());
    data.read(offset, one.size(), one.data());
    EXPECT_EQ(one, doc) << "document " << d;
    offset += doc.size();
  }
  EXPECT_EQ(data.doc_offset(docs.size()), all.size());
}

// What preprocess_data.py makes with --split-sentences --append-eod for a vocab < 65500
// (uint16): documents of several sequences, EOS (here 2) ending each document's last one. Also
// an empty document and an empty trailing sequence, both legal in the format.
const Documents kSentences = {
    {{17, 400, 9}, {65499, 3}, {81, 2}},
    {{5, 2}},
    {},
    {{1000, 1001, 1002, 1003}, {2}, {}},
};

TEST(MegatronDataset, Uint16DocumentsOfSeveralSequencesReadBack) {
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "corpus_text_sentence", kSentences, "--dtype uint16");
  const IndexedDataset data(prefix);
  EXPECT_EQ(fs::file_size(prefix + ".bin"), 14u * 2);
  expect_reads_back(data, kSentences);
  EXPECT_EQ(data.doc_offset(1), 7u);
  EXPECT_EQ(data.doc_offset(2), 9u);
  EXPECT_EQ(data.doc_offset(3), 9u);  // the empty document
  EXPECT_EQ(data.doc_offset(4), 14u);
  std::vector<int32_t> middle(4);
  data.read(2, 4, middle.data());  // across a sequence boundary
  EXPECT_EQ(middle, (std::vector<int32_t>{9, 65499, 3, 81}));
  EXPECT_NO_THROW(data.check_tokenizer(65500, 0x1234, "tok.model"));  // no fingerprint to match
}

TEST(MegatronDataset, Int32ForLargeVocabulariesReadsBack) {
  // preprocess_data.py picks int32 for vocabularies of 65500 and more.
  const Documents docs = {{{0, 65535, 65536, 131071}}, {{200000, 2}}, {{7}, {8, 2}}};
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "big_text_document", docs, "--dtype int32");
  const IndexedDataset data(prefix);
  EXPECT_EQ(fs::file_size(prefix + ".bin"), 9u * 4);
  expect_reads_back(data, docs);
  EXPECT_NO_THROW(data.check_tokenizer(200001, 0, "tok.model"));
}

TEST(MegatronDataset, EveryIntegerDtypeReadsBack) {
  const Documents docs = {{{0, 1, 100}, {127}}, {{3, 2}}};
  TempDir tmp;
  for (const char* dtype : {"uint8", "int8", "int16", "int32", "int64", "uint16"}) {
    SCOPED_TRACE(dtype);
    const IndexedDataset data(write_megatron(tmp, dtype, docs, std::string("--dtype ") + dtype));
    expect_reads_back(data, docs);
    EXPECT_NO_THROW(data.check_tokenizer(128, 0, "tok.model"));
  }
}

TEST(MegatronDataset, TrailingTextSequenceModesAreAccepted) {
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "mm", kSentences,
                                            "--dtype uint16 --sequence-modes 0,0,0,0,0,0,0");
  const IndexedDataset data(prefix);
  expect_reads_back(data, kSentences);
}

TEST(MegatronDataset, ImageSequenceModeIsRefused) {
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "mm", kSentences,
                                            "--dtype int32 --sequence-modes 0,0,0,0,1,0,0");
  // 34-byte header + 7 x 4 + 7 x 8 + 5 x 8 = 158; mode 4 is at byte 162.
  expect_mentions(user_error_of([&] { IndexedDataset{prefix}; }),
                  {"mm.idx", "sequence_modes[4]", "byte 162", "is 1", "text"});
}

TEST(MegatronDataset, SegmentRecordsNoTokenizer) {
  TempDir tmp;
  const auto segment = open_megatron_segment(write_megatron(tmp, "s", kSentences, "--dtype uint16"));
  EXPECT_EQ(segment->vocab_size(), 0u);
  EXPECT_EQ(segment->tokenizer_fingerprint(), 0u);
  EXPECT_EQ(segment->bin_path(), tmp.file("s.bin"));
  EXPECT_EQ(segment->num_docs(), 4u);
  EXPECT_EQ(segment->num_tokens(), 14u);
}

TEST(MegatronDataset, LargeSegmentsCheckAnEvenlySpacedSample) {
  Document doc(1, Sequence(1000, 5));
  doc[0][500] = 700;  // sampled: positions 0, 100, ..., 900 are checked with max_checked 10
  doc[0][501] = 800;  // between samples
  TempDir tmp;
  const auto segment = open_megatron_segment(write_megatron(tmp, "s", {doc}, "--dtype int16"));
  expect_mentions(user_error_of([&] { segment->check_tokens_below(600, 10); }),
                  {"s.bin", "token 700", "position 500", "[0, 600)"});
  EXPECT_NO_THROW(segment->check_tokens_below(750, 10));  // 800 at 501 is not in the sample
  expect_mentions(user_error_of([&] { segment->check_tokens_below(750, 1000); }),
                  {"s.bin", "token 800", "position 501", "[0, 750)"});
}

// ---- user errors: one line naming the file and the field ----

TEST(MegatronDataset, BadMagicIsRefused) {
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "x", kSentences, "--dtype uint16 --corrupt magic");
  expect_mentions(user_error_of([&] { IndexedDataset{prefix}; }), {"x.idx", "magic"});
  expect_mentions(user_error_of([&] { open_megatron_segment(prefix); }),
                  {"x.idx", "magic", "NOTMEGAT", "MMIDIDX"});
}

TEST(MegatronDataset, Version2IsRefused) {
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "x", kSentences, "--dtype uint16 --version 2");
  expect_mentions(user_error_of([&] { IndexedDataset{prefix}; }),
                  {"x.idx", "version 2", "byte 9", "expected 1"});
}

TEST(MegatronDataset, FloatDtypesAreRefused) {
  TempDir tmp;
  const std::string p64 = write_megatron(tmp, "f64", kSentences, "--dtype float64");
  expect_mentions(user_error_of([&] { IndexedDataset{p64}; }),
                  {"f64.idx", "dtype code 6 (float64)", "byte 17", "integer dtype", "8 uint16"});
  const std::string p32 = write_megatron(tmp, "f32", kSentences, "--dtype float32");
  expect_mentions(user_error_of([&] { IndexedDataset{p32}; }),
                  {"f32.idx", "dtype code 7 (float32)", "byte 17"});
}

TEST(MegatronDataset, TruncatedIdxIsRefused) {
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "x", kSentences, "--dtype uint16 --corrupt truncate-idx");
  // 34 + 7 x 4 + 7 x 8 + 5 x 8 = 158 bytes, 5 cut off.
  expect_mentions(user_error_of([&] { IndexedDataset{prefix}; }),
                  {"x.idx", "size 153 bytes", "expected 158", "document_indices"});
}

TEST(MegatronDataset, TruncatedBinIsRefused) {
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "x", kSentences, "--dtype uint16 --corrupt truncate-bin");
  expect_mentions(user_error_of([&] { IndexedDataset{prefix}; }),
                  {"x.bin", "size 26 bytes", "expected 28", "14 tokens x 2 bytes", "x.idx"});
}

TEST(MegatronDataset, NonContiguousPointerIsRefused) {
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "x", kSentences, "--dtype int32 --corrupt pointer");
  // The last of 7 sequences: pointers start at 34 + 7 x 4 = 62, entry 6 at 110; it should start
  // after 14 tokens x 4 bytes and was moved one token on.
  expect_mentions(user_error_of([&] { IndexedDataset{prefix}; }),
                  {"x.idx", "sequence_pointers[6]", "byte 110", "is 60", "expected 56"});
}

TEST(MegatronDataset, DecreasingDocumentIndexIsRefused) {
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "x", kSentences, "--dtype uint16 --corrupt document-index");
  // document_indices [0, 3, 4, 4, 7] became [0, 4, 3, 4, 7]; they start at 62 + 7 x 8 = 118.
  expect_mentions(user_error_of([&] { IndexedDataset{prefix}; }),
                  {"x.idx", "document_indices[2]", "byte 134", "is 3", "must not decrease"});
}

TEST(MegatronDataset, NegativeSequenceLengthIsRefused) {
  TempDir tmp;
  const std::string prefix = write_megatron(tmp, "x", kSentences, "--dtype uint16 --corrupt negative-length");
  expect_mentions(user_error_of([&] { IndexedDataset{prefix}; }),
                  {"x.idx", "sequence_lengths[0]", "byte 34", "is -1", ">= 0"});
}

TEST(MegatronDataset, TokenOutsideTheVocabularyIsFoundByCheckTokenizer) {
  TempDir tmp;
  const IndexedDataset data(write_megatron(tmp, "x", kSentences, "--dtype uint16"));
  // 65499 is token 3 of the stream.
  expect_mentions(user_error_of([&] { data.check_tokenizer(65499, 0, "tok.model"); }),
                  {"x.bin", "token 65499", "position 3", "65499)"});
}

TEST(MegatronDataset, NegativeTokenIsFoundByCheckTokenizer) {
  const Documents docs = {{{4, 5}}, {{6, -3, 2}}};
  TempDir tmp;
  const IndexedDataset data(write_megatron(tmp, "neg", docs, "--dtype int16"));
  expect_mentions(user_error_of([&] { data.check_tokenizer(100, 0, "tok.model"); }),
                  {"neg.bin", "token -3", "position 3", "100)"});
}

}  // namespace
}  // namespace jumbo
