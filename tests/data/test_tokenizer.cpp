// Tokenizer training and encoding on the shipped Brown text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "data_test_support.h"
#include "jumbo/config/config.h"
#include "jumbo/data/prepare.h"
#include "jumbo/data/tokenizer.h"

namespace jumbo {
namespace {

using test::TempDir;
using test::user_error_of;

// Counts vocabulary entries whose text holds a space after its first character: pieces that
// span a word boundary ("▁of▁the" decodes to "of the").
int multi_word_pieces(const Tokenizer& tok) {
  int count = 0;
  for (int32_t id = 3; id < tok.vocab_size(); ++id) {  // after <unk> (decodes to " ⁇ "), <s>, </s>
    const std::string text = tok.decode({id});
    if (text.size() > 1 && text.find(' ', 1) != std::string::npos) ++count;
  }
  return count;
}

uint64_t fnv1a64_of(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

TEST(Tokenizer, RoundTripsEveryValidationDocumentExactly) {
  const Tokenizer tok(test::small_tokenizer());
  EXPECT_EQ(tok.vocab_size(), 500);
  EXPECT_EQ(tok.eos_id(), 2);
  const auto docs = read_documents(test::brown_valid(), "text");
  ASSERT_EQ(docs.size(), 25u);
  size_t total_ids = 0, total_bytes = 0;
  for (const auto& doc : docs) {  // 20 of these were not seen in training
    const auto ids = tok.encode(doc);
    for (int32_t id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, 500);
      ASSERT_NE(id, 0) << "byte fallback should leave no <unk>";
      ASSERT_NE(id, tok.eos_id()) << "EOS comes only from prepare";
    }
    EXPECT_EQ(tok.decode(ids), doc);
    total_ids += ids.size();
    total_bytes += doc.size();
  }
  // Even 500 pieces (259 of them bytes and controls) compress English: measured 1.85 bytes/id.
  EXPECT_LT(total_ids * 10, total_bytes * 7);
}

TEST(Tokenizer, RoundTripsTextOutsideTheTrainingAlphabet) {
  const Tokenizer tok(test::small_tokenizer());
  const std::string text = "Zoë's café\tcosts 3½ €\n\n  and   spaces — kept.";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(Tokenizer, LearnsMultiWordPiecesOnlyWithoutWhitespaceSplitting) {
  const Tokenizer spanning(test::small_tokenizer());
  EXPECT_GE(multi_word_pieces(spanning), 5);
  const auto of_the = spanning.encode("of the");
  EXPECT_EQ(of_the.size(), 1u) << "\"▁of▁the\" is among the commonest spans in Brown";

  TempDir tmp;
  test::write_brown_subset(tmp.file("subset.jsonl"), 5);
  TokenizerTrainOptions opts;
  opts.inputs = {tmp.file("subset.jsonl")};
  opts.model_prefix = tmp.file("words");
  opts.vocab_size = 500;
  opts.threads = 2;
  opts.split_by_whitespace = true;
  train_tokenizer(opts);
  const Tokenizer words(tmp.file("words.model"));
  EXPECT_EQ(multi_word_pieces(words), 0);
  EXPECT_GE(words.encode("of the").size(), 2u);
}

TEST(Tokenizer, TrainingIsDeterministic) {
  TempDir tmp;
  test::write_brown_subset(tmp.file("subset.jsonl"), 2);
  TokenizerTrainOptions opts;
  opts.inputs = {tmp.file("subset.jsonl")};
  opts.vocab_size = 400;
  opts.threads = 2;
  opts.model_prefix = tmp.file("a");
  train_tokenizer(opts);
  opts.model_prefix = tmp.file("b");
  train_tokenizer(opts);
  // The .model records its own prefix, so compare the pieces and their scores.
  const std::string a = test::read_bytes(tmp.file("a.vocab"));
  EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 400);
  EXPECT_TRUE(a == test::read_bytes(tmp.file("b.vocab"))) << "vocabularies differ";
  const Tokenizer ta(tmp.file("a.model")), tb(tmp.file("b.model"));
  const auto doc = read_documents(test::brown_valid(), "text").back();
  EXPECT_EQ(ta.encode(doc), tb.encode(doc));
}

TEST(Tokenizer, FingerprintIsFnv1aOfTheModelFile) {
  const std::string path = test::small_tokenizer();
  const Tokenizer tok(path);
  EXPECT_EQ(tok.fingerprint(), fnv1a64_of(test::read_bytes(path)));
  EXPECT_EQ(tok.path(), path);
}

TEST(Tokenizer, MissingOrInvalidModelIsAUserErrorNamingTheFile) {
  TempDir tmp;
  const std::string missing = tmp.file("nope.model");
  std::string msg = user_error_of([&] { Tokenizer t(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;

  const std::string text = test::brown_valid();  // a real file that is not a model
  msg = user_error_of([&] { Tokenizer t(text); });
  EXPECT_NE(msg.find(text), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a SentencePiece model"), std::string::npos) << msg;
}

TEST(Tokenizer, TrainingErrorsNameTheInput) {
  TempDir tmp;
  TokenizerTrainOptions opts;
  opts.model_prefix = tmp.file("t");
  opts.inputs = {tmp.file("absent.jsonl")};
  std::string msg = user_error_of([&] { train_tokenizer(opts); });
  EXPECT_NE(msg.find(tmp.file("absent.jsonl")), std::string::npos) << msg;

  // Far more pieces than two documents can supply.
  test::write_brown_subset(tmp.file("two.jsonl"), 2);
  opts.inputs = {tmp.file("two.jsonl")};
  opts.vocab_size = 200000;
  opts.threads = 2;
  msg = user_error_of([&] { train_tokenizer(opts); });
  EXPECT_NE(msg.find(tmp.file("two.jsonl")), std::string::npos) << msg;
  EXPECT_NE(msg.find("200000"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

TEST(ReadDocuments, ReadsJsonlAndPlainTextAndNamesBadLines) {
  const auto docs = read_documents(test::brown_valid(), "text");
  ASSERT_EQ(docs.size(), 25u);
  {
    std::ifstream in(test::brown_valid());
    std::string first;
    std::getline(in, first);
    EXPECT_EQ(docs[0], nlohmann::json::parse(first)["text"].get<std::string>());
  }

  TempDir tmp;
  const std::string plain = tmp.file("story.txt");
  test::write_bytes(plain, "One line.\nTwo lines.\n");
  const auto one = read_documents(plain, "text");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], "One line.\nTwo lines.\n");

  const std::string bad = tmp.file("bad.jsonl");
  test::write_bytes(bad, "{\"text\": \"fine\"}\n\n{\"text\": \"broken\n");
  std::string msg = user_error_of([&] { read_documents(bad, "text"); });
  EXPECT_NE(msg.find(bad + ":3:"), std::string::npos) << msg;

  test::write_bytes(bad, "{\"text\": \"fine\"}\n{\"body\": \"elsewhere\"}\n");
  msg = user_error_of([&] { read_documents(bad, "text"); });
  EXPECT_NE(msg.find(bad + ":2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"text\""), std::string::npos) << msg;
  msg = user_error_of([&] { read_documents(bad, "body"); });
  EXPECT_NE(msg.find(bad + ":1:"), std::string::npos) << msg;

  msg = user_error_of([&] { read_documents(tmp.file("absent.jsonl"), "text"); });
  EXPECT_NE(msg.find(tmp.file("absent.jsonl")), std::string::npos) << msg;
}

}  // namespace
}  // namespace jumbo
