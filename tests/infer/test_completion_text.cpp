// The completion's text is the exact continuation of the prompt's text: decode(prompt +
// completion) minus decode(prompt), on real tokenizers (unigram with multi-word pieces, BPE,
// both with byte fallback), and its tokens' texts join to it.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "../data/data_test_support.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/completion_text.h"

namespace jumbo {
namespace {

const std::string& bpe_tokenizer() {
  static const std::string path = [] {
    static test::TempDir dir;  // lives as long as the test process
    const std::string subset = dir.file("subset.jsonl");
    test::write_brown_subset(subset, 5);
    TokenizerTrainOptions opts;
    opts.inputs = {subset};
    opts.model_prefix = dir.file("bpe");
    opts.model_type = "bpe";
    opts.vocab_size = 400;
    opts.threads = 2;
    train_tokenizer(opts);
    return dir.file("bpe.model");
  }();
  return path;
}

std::vector<std::string> tokenizer_paths() { return {test::small_tokenizer(), bpe_tokenizer()}; }

const std::vector<std::string> kPrompts = {
    "The jury said", "In the", "He was a", "x", "", "naïve café:", "It is not  ",
    "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary"};

// What a model might continue with: ordinary text's tokens, then seeded random ids (byte
// pieces among them, so characters split across tokens and invalid bytes occur).
std::vector<int32_t> continuation(const Tokenizer& tok, uint64_t seed) {
  std::vector<int32_t> ids = tok.encode("and the s. é over");  // "▁and": a word start
  std::mt19937_64 gen(seed);
  for (int i = 0; i < 12; ++i) {
    ids.push_back(static_cast<int32_t>(gen() % static_cast<uint64_t>(tok.vocab_size())));
  }
  return ids;
}

std::string expected_suffix(const Tokenizer& tok, const std::vector<int32_t>& prompt,
                            const std::vector<int32_t>& completion) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), completion.begin(), completion.end());
  const std::string whole = tok.decode(all), head = tok.decode(prompt);
  EXPECT_EQ(whole.compare(0, head.size(), head), 0) << "the prompt's text is not a prefix";
  return whole.substr(head.size());
}

TEST(CompletionText, IsTheContinuationOfThePromptsText) {
  for (const std::string& path : tokenizer_paths()) {
    const Tokenizer tok(path);
    for (size_t p = 0; p < kPrompts.size(); ++p) {
      const std::vector<int32_t> prompt = encode_prompt(tok, kPrompts[p]);
      const std::vector<int32_t> completion = continuation(tok, p);
      CompletionText text(tok, {}, prompt);
      for (size_t k = 0; k < completion.size(); ++k) {
        text.add(completion[k]);
        const std::vector<int32_t> so_far(completion.begin(), completion.begin() + static_cast<std::ptrdiff_t>(k) + 1);
        ASSERT_EQ(text.text(), expected_suffix(tok, prompt, so_far))
            << path << " prompt \"" << kPrompts[p] << "\" after " << k + 1 << " tokens";
      }
      // The first token of ordinary text keeps its space: " and", not "and".
      if (!kPrompts[p].empty()) {
        EXPECT_EQ(text.text().substr(0, 4), " and") << kPrompts[p];
      }
      // Each token owns the bytes it settled: the texts join to the text.
      std::string joined;
      for (size_t i = 0; i < completion.size(); ++i) {
        joined += text.text().substr(text.token_begin(i), text.token_end(i, true) - text.token_begin(i));
      }
      EXPECT_EQ(joined, text.text()) << path << " prompt \"" << kPrompts[p] << "\"";
      const std::vector<std::string> pieces = token_texts(tok, completion);
      std::string joined_pieces;
      for (const std::string& s : pieces) joined_pieces += s;
      EXPECT_EQ(joined_pieces, tok.decode(completion));
    }
  }
}

TEST(CompletionText, AStopStringAtTheFirstTokenEndsWithNoText) {
  for (const std::string& path : tokenizer_paths()) {
    const Tokenizer tok(path);
    const std::vector<int32_t> prompt = encode_prompt(tok, "The jury said");
    const std::vector<int32_t> completion = tok.encode("and the jury");
    CompletionText probe(tok, {}, prompt);
    probe.add(completion[0]);
    const std::string first = probe.text();
    ASSERT_EQ(first[0], ' ') << path;
    CompletionText text(tok, {first}, prompt);
    EXPECT_TRUE(text.add(completion[0])) << path << ": the stop string " << first;
    EXPECT_EQ(text.text(), "");
    EXPECT_EQ(text.take_delta(true), "");
  }
}

TEST(CompletionText, AStreamHoldsBackWhatCouldBecomeAStopString) {
  const Tokenizer tok(test::small_tokenizer());
  const std::vector<int32_t> prompt = encode_prompt(tok, "He was a");
  const std::vector<int32_t> completion = tok.encode("and the jury said");
  CompletionText text(tok, {" the jury"}, prompt);
  std::string streamed;
  for (int32_t t : completion) {
    if (text.add(t)) break;
    streamed += text.take_delta(false);
    EXPECT_EQ(streamed.find(" the"), std::string::npos) << "sent a stop string's start: " << streamed;
  }
  streamed += text.take_delta(true);
  EXPECT_TRUE(text.stopped());
  EXPECT_EQ(streamed, " and");
  EXPECT_EQ(text.text(), " and");
}

}  // namespace
}  // namespace jumbo
