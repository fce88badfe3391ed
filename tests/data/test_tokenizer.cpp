// Tokenizer sampling, training, inspection and encoding, mostly on the shipped Brown text.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

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

// Writes `count` distinct sentences, one a line, as a text file or as .jsonl documents of
// one paragraph each; returns the bytes of text. Sentences of `tag` have `pad` extra letters.
int64_t write_sentences(const std::string& path, const std::string& tag, int count, int pad,
                        bool as_jsonl) {
  std::ofstream out(path);
  int64_t bytes = 0;
  for (int i = 0; i < count; ++i) {
    const std::string s = tag + " sentence " + std::to_string(i) + " " + std::string(pad, 'x');
    bytes += static_cast<int64_t>(s.size());
    if (as_jsonl) {
      out << nlohmann::json{{"text", s}}.dump() << "\n";
    } else {
      out << s << "\n";
    }
  }
  return bytes;
}

TokenizerTrainOptions sample_options(std::vector<std::string> inputs, int64_t budget) {
  TokenizerTrainOptions o;
  o.inputs = std::move(inputs);
  o.model_prefix = "unused";
  o.sample_bytes = budget;
  return o;
}

TEST(TokenizerSample, FillsTheByteBudgetAndNoMore) {
  TempDir tmp;
  const int64_t total = write_sentences(tmp.file("a.txt"), "alpha", 20000, 10, false);
  const int64_t budget = 100000;
  const SentenceSample s = sample_training_sentences(sample_options({tmp.file("a.txt")}, budget));
  int64_t bytes = 0;
  for (const auto& line : s.sentences) bytes += static_cast<int64_t>(line.size());
  EXPECT_EQ(bytes, s.stats.sampled_bytes);
  EXPECT_LE(bytes, budget);
  // The longest key-order prefix that fits: the next sentence (<= 40 bytes) did not.
  EXPECT_GT(bytes, budget - 40);
  EXPECT_EQ(s.stats.sentences_seen, 20000);
  EXPECT_EQ(s.stats.sampled_sentences, static_cast<int64_t>(s.sentences.size()));
  EXPECT_GT(s.stats.bytes_read, total);  // text plus newlines

  // Keys order the sample: a smaller budget keeps a prefix of a larger one's sentences.
  const SentenceSample half =
      sample_training_sentences(sample_options({tmp.file("a.txt")}, budget / 2));
  ASSERT_LT(half.sentences.size(), s.sentences.size());
  EXPECT_TRUE(std::equal(half.sentences.begin(), half.sentences.end(), s.sentences.begin()));

  // A sentence-count cap applies as well as the bytes.
  auto capped = sample_options({tmp.file("a.txt")}, budget);
  capped.input_sentence_size = 500;
  EXPECT_EQ(sample_training_sentences(capped).sentences.size(), 500u);
}

TEST(TokenizerSample, IsUniformOverInputsOfDifferentSizes) {
  TempDir tmp;
  // 30000 short sentences and 10000 long ones: a uniform sample of sentences holds 75% from
  // the first file whatever their lengths; reading the first file first must not favour it.
  write_sentences(tmp.file("big.jsonl"), "big", 30000, 0, true);
  write_sentences(tmp.file("small.jsonl"), "small", 10000, 60, true);
  const SentenceSample s = sample_training_sentences(
      sample_options({tmp.file("big.jsonl"), tmp.file("small.jsonl")}, 400000));
  ASSERT_EQ(s.stats.sampled_per_input.size(), 2u);
  const double n = static_cast<double>(s.stats.sampled_sentences);
  ASSERT_GT(n, 5000);
  EXPECT_NEAR(static_cast<double>(s.stats.sampled_per_input[0]) / n, 0.75, 0.03);
  EXPECT_EQ(s.stats.sampled_per_input[0] + s.stats.sampled_per_input[1], s.stats.sampled_sentences);
  // Sentences from the end of a file are as likely as from its start: not a first-N read.
  int late = 0;
  for (const auto& line : s.sentences) {
    if (line.rfind("big sentence 2", 0) == 0 &&
        line.size() == std::string("big sentence 29999 ").size())
      ++late;
  }
  EXPECT_GT(late, 0.75 * n * 10000 / 30000 * 0.8) << "sentences 20000..29999 of the big file";
  // Not parsing lines that cannot enter changes nothing: the same lines as text files (one
  // paragraph a line, same keys) give the same sample.
  EXPECT_GT(s.stats.lines_not_parsed, 0);
  write_sentences(tmp.file("big.txt"), "big", 30000, 0, false);
  write_sentences(tmp.file("small.txt"), "small", 10000, 60, false);
  const SentenceSample t = sample_training_sentences(
      sample_options({tmp.file("big.txt"), tmp.file("small.txt")}, 400000));
  EXPECT_TRUE(t.sentences == s.sentences);
}

TEST(TokenizerSample, SkippingUnparsedLinesKeepsMultiParagraphDocumentsExact) {
  TempDir tmp;
  // Documents of 1..6 paragraphs; the second file writes each newline as "\u000a" and adds a
  // "\u0041", and lines with "\u" escapes are always parsed: same documents, same keys, so
  // the same sample unless skipping a line ever drops a paragraph that belonged in it.
  std::ofstream plain(tmp.file("n.jsonl")), escaped(tmp.file("u.jsonl"));
  for (int d = 0; d < 3000; ++d) {
    std::string doc;
    for (int p = 0; p <= d % 6; ++p)
      doc += (p ? "\n" : "") + fmt::format("doc {} paragraph {}", d, p);
    plain << nlohmann::json{{"text", doc}}.dump() << "\n";
    std::string u = nlohmann::json{{"text", doc}}.dump();
    for (size_t at = u.find("\\n"); at != std::string::npos; at = u.find("\\n", at))
      u.replace(at, 2, "\\u000a");
    escaped << u.substr(0, u.size() - 1) << ",\"note\":\"\\u0041\"}\n";  // one-paragraph ones too
  }
  plain.close();
  escaped.close();
  const SentenceSample n = sample_training_sentences(sample_options({tmp.file("n.jsonl")}, 20000));
  const SentenceSample u = sample_training_sentences(sample_options({tmp.file("u.jsonl")}, 20000));
  EXPECT_GT(n.stats.lines_not_parsed, 1000);
  EXPECT_EQ(u.stats.lines_not_parsed, 0);
  EXPECT_EQ(u.stats.sentences_seen, 3000 / 6 * 21);
  EXPECT_GT(n.sentences.size(), 500u);
  EXPECT_TRUE(n.sentences == u.sentences);
}

TEST(TokenizerSample, IsDeterministicFromTheSeedAloneAndSeedsDiffer) {
  TempDir tmp;
  write_sentences(tmp.file("a.jsonl"), "a", 8000, 5, true);
  write_sentences(tmp.file("b.txt"), "b", 8000, 5, false);
  auto o = sample_options({tmp.file("a.jsonl"), tmp.file("b.txt")}, 50000);
  o.threads = 1;
  const SentenceSample first = sample_training_sentences(o);
  o.threads = 2;  // the trainer's threads: the sample must not depend on them
  EXPECT_TRUE(sample_training_sentences(o).sentences == first.sentences);
  o.seed = 99;
  const SentenceSample other = sample_training_sentences(o);
  std::vector<std::string> a = first.sentences, b = other.sentences;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<std::string> common;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
  // Independent samples of ~8% each share ~8% of their sentences; the same sample, all.
  EXPECT_LT(common.size() * 4, a.size()) << common.size() << " of " << a.size() << " shared";
}

TEST(TokenizerSample, BadInputIsOneLineNamingFileAndLine) {
  TempDir tmp;
  const std::string bad = tmp.file("bad.jsonl");
  test::write_bytes(bad, "{\"text\": \"fine\"}\n{\"body\": \"elsewhere\"}\n");
  std::string msg = user_error_of([&] { sample_training_sentences(sample_options({bad}, 4096)); });
  EXPECT_NE(msg.find(bad + ":2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"text\""), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  test::write_bytes(bad, "{\"text\": \"fine\"}\n\n{\"text\": \"broken\n");
  msg = user_error_of([&] { sample_training_sentences(sample_options({bad}, 4096)); });
  EXPECT_NE(msg.find(bad + ":3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;

  const std::string absent = tmp.file("absent.txt");
  // Missing inputs are named before any input is read (patterns are expanded first).
  msg = user_error_of([&] { sample_training_sentences(sample_options({bad, absent}, 4096)); });
  EXPECT_NE(msg.find(absent + ": no such input file"), std::string::npos) << msg;
  msg = user_error_of([&] { sample_training_sentences(sample_options({tmp.file("none-*.jsonl")}, 4096)); });
  EXPECT_NE(msg.find("none-*.jsonl: the pattern matches no file"), std::string::npos) << msg;
  msg = user_error_of(
      [&] { sample_training_sentences(sample_options({tmp.path().string()}, 4096)); });
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
}

TEST(Tokenizer, OptionErrorsNameFlagAndValueBeforeAnyInputIsRead) {
  TokenizerTrainOptions o;
  o.inputs = {"/nonexistent/input.jsonl"};  // never opened: the options fail first
  o.model_prefix = "/nonexistent/tok";
  const auto expect = [&](const TokenizerTrainOptions& bad, const std::string& flag,
                          const std::string& value) {
    const std::string msg = user_error_of([&] { train_tokenizer(bad); });
    EXPECT_NE(msg.find(flag + " " + value + ": expected"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("input.jsonl"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  auto b = o;
  b.vocab_size = 100;
  expect(b, "--vocab-size", "100");
  b = o;
  b.max_piece_length = 65;
  expect(b, "--max-piece-length", "65");
  b = o;
  b.max_piece_length = 0;
  expect(b, "--max-piece-length", "0");
  b = o;
  b.sample_bytes = 10;
  expect(b, "--sample-bytes", "10");
  b = o;
  b.threads = 129;
  expect(b, "--threads", "129");
  b = o;
  b.model_type = "wordpiece";
  expect(b, "--model-type", "wordpiece");
  b = o;
  b.vocab_size = 256000;
  b.seed_pieces = 100000;
  expect(b, "--seed-pieces", "100000");
  b = o;
  b.input_sentence_size = -1;
  expect(b, "--input-sentence-size", "-1");
  // In range: the first complaint is the missing input.
  b = o;
  b.vocab_size = 256000;
  b.max_piece_length = 64;
  const std::string msg = user_error_of([&] { train_tokenizer(b); });
  EXPECT_NE(msg.find("/nonexistent/input.jsonl: no such input file"), std::string::npos) << msg;
}

TEST(Tokenizer, MaxPieceLengthBoundsLearnedPieces) {
  TempDir tmp;
  test::write_brown_subset(tmp.file("subset.jsonl"), 2);
  TokenizerTrainOptions opts;
  opts.inputs = {tmp.file("subset.jsonl")};
  opts.vocab_size = 400;
  opts.threads = 2;
  opts.max_piece_length = 3;
  opts.model_prefix = tmp.file("short");
  const TokenizerTrainReport report = train_tokenizer(opts);
  EXPECT_EQ(report.sample.sampled_sentences, report.sample.sentences_seen) << "all fit";
  const TokenizerInspection shrt = inspect_tokenizer(tmp.file("short.model"), "", 1);
  ASSERT_EQ(shrt.longest.size(), 1u);
  EXPECT_LE(shrt.longest[0].chars, 3);
  // The default (16) learns longer ones from the same text.
  const TokenizerInspection dflt = inspect_tokenizer(test::small_tokenizer(), "", 1);
  EXPECT_GT(dflt.longest[0].chars, 3);
}

TEST(Tokenizer, InspectionCountsPiecesAndMeasuresASample) {
  const Tokenizer tok(test::small_tokenizer());
  const TokenizerInspection r = inspect_tokenizer(test::small_tokenizer(), test::brown_valid(), 5);
  EXPECT_EQ(r.vocab_size, 500);
  EXPECT_EQ(r.byte_pieces, 256);
  EXPECT_EQ(r.learned, 500 - 256 - 3);  // <unk>, <s>, </s>
  EXPECT_EQ(r.multi_word, multi_word_pieces(tok)) << "a space after the first character";
  EXPECT_GE(r.multi_word, 5);
  ASSERT_EQ(r.longest.size(), 5u);
  for (size_t i = 1; i < r.longest.size(); ++i)
    EXPECT_GE(r.longest[i - 1].chars, r.longest[i].chars);
  EXPECT_EQ(r.longest[0].chars, utf8_chars(r.longest[0].piece));
  EXPECT_EQ(utf8_chars("\xE2\x96\x81of\xE2\x96\x81the"), 7);  // "▁of▁the"
  EXPECT_EQ(r.sample_documents, 25);
  EXPECT_EQ(
      r.sample_bytes, 0 + [] {
        int64_t n = 0;
        for (const auto& d : read_documents(test::brown_valid(), "text"))
          n += static_cast<int64_t>(d.size());
        return n;
      }());
  // Measured 1.85 bytes/token (see RoundTripsEveryValidationDocumentExactly); a word of
  // English is ~6 bytes with its space, so several tokens a word at 500 pieces.
  const double bytes_per_token =
      static_cast<double>(r.sample_bytes) / static_cast<double>(r.sample_tokens);
  EXPECT_GT(bytes_per_token, 1.5);
  EXPECT_LT(bytes_per_token, 2.5);
  EXPECT_GT(r.sample_tokens, 2 * r.sample_words);
  EXPECT_GT(r.sample_words, 40000);  // 25 documents of ~2,000 words

  TempDir tmp;
  const std::string msg =
      user_error_of([&] { inspect_tokenizer(test::small_tokenizer(), tmp.file("none.txt"), 5); });
  EXPECT_NE(msg.find(tmp.file("none.txt") + ": cannot open"), std::string::npos) << msg;
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
