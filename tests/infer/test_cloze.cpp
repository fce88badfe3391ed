// Where a task pair is cut into context and scored continuation (jumbo eval --scoring), on a
// real unigram tokenizer with multi-word pieces: the whole rule is lm-evaluation-harness's
// (unchanged), the boundary rule scores exactly the continuation's characters after the
// context's own tokens, and count_seams counts what the whole rule's cut does at the seam.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../data/data_test_support.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/cloze.h"
#include "jumbo/infer/completion_text.h"

namespace jumbo {
namespace {

const std::vector<std::string> kContexts = {
    "The jury said", "He was one of", "In the", "x", "naïve café:", "It is not  ",
    "Genre:", "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent",
    "line one\n"};
const std::vector<std::string> kContinuations = {
    " press", " of the", "ing", " the", "é", "  two spaces", " science fiction", ".", "\n",
    " $3.22", " ½"};

std::vector<int32_t> join(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A learned piece spanning a word boundary ("▁of▁the"), split at its second "▁": the seam of
// a pair the whole rule encodes across.
std::pair<std::string, std::string> multi_word_seam(const Tokenizer& tok) {
  const std::string space = "\xe2\x96\x81";
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string p = tok.piece(id);
    if (!tok.is_learned(id) || p.rfind(space, 0) != 0) continue;
    const size_t second = p.find(space, space.size());
    if (second == std::string::npos || second + space.size() >= p.size()) continue;
    std::string a = p.substr(space.size(), second - space.size());
    std::string b = p.substr(second);
    for (std::string* s : {&a, &b}) {
      for (size_t at; (at = s->find(space)) != std::string::npos;) s->replace(at, space.size(), " ");
    }
    if (a.empty() || a.find(' ') != std::string::npos) continue;
    return {"It was " + a, b};
  }
  ADD_FAILURE() << "no multi-word piece";
  return {};
}

TEST(ClozeScoring, Names) {
  EXPECT_EQ(parse_cloze_scoring("whole"), ClozeScoring::whole);
  EXPECT_EQ(parse_cloze_scoring("boundary"), ClozeScoring::boundary);
  EXPECT_FALSE(parse_cloze_scoring("Whole"));
  EXPECT_FALSE(parse_cloze_scoring(""));
  EXPECT_STREQ(to_string(ClozeScoring::whole), "whole");
  EXPECT_STREQ(to_string(ClozeScoring::boundary), "boundary");
}

TEST(ClozeScoring, BoundaryScoresExactlyTheContinuationAfterTheContextsOwnTokens) {
  const Tokenizer tok(test::small_tokenizer());
  for (const std::string& ctx : kContexts) {
    for (const std::string& cont : kContinuations) {
      const PairTokens p = split_pair(tok, ctx, cont, ClozeScoring::boundary);
      EXPECT_EQ(p.context, encode_prompt(tok, ctx));
      ASSERT_FALSE(p.continuation.empty());
      EXPECT_EQ(tok.decode(join(p.context, p.continuation)), tok.decode(p.context) + cont)
          << ctx << " | " << cont;
      // The tokens do not depend on the context: the continuation's own.
      EXPECT_EQ(p.continuation, encode_after_boundary(tok, cont));
    }
  }
  // After an empty context the continuation starts the document, encoded as documents are.
  const PairTokens first = split_pair(tok, "", " press", ClozeScoring::boundary);
  EXPECT_EQ(join(first.context, first.continuation), encode_prompt(tok, " press"));
  EXPECT_EQ(tok.decode(join(first.context, first.continuation)), " press");
}

TEST(ClozeScoring, AfterABoundaryIsWhatAWholeEncodingHasAfterANewline) {
  // A newline is a byte piece (outside the vocabulary): no piece spans it, so the whole
  // encoding after it is the boundary encoding, with no word-start mark of its own.
  const Tokenizer tok(test::small_tokenizer());
  for (const std::string& cont : kContinuations) {
    if (cont == "\n") continue;
    const std::vector<int32_t> nl = tok.encode("a\n"), all = tok.encode("a\n" + cont);
    ASSERT_GE(all.size(), nl.size());
    ASSERT_TRUE(std::equal(nl.begin(), nl.end(), all.begin()));
    EXPECT_EQ(std::vector<int32_t>(all.begin() + static_cast<std::ptrdiff_t>(nl.size()), all.end()),
              encode_after_boundary(tok, cont))
        << cont;
    const PairTokens w = split_pair(tok, "line one\n", cont, ClozeScoring::whole);
    const PairTokens b = split_pair(tok, "line one\n", cont, ClozeScoring::boundary);
    EXPECT_EQ(w.context, b.context) << cont;
    EXPECT_EQ(w.continuation, b.continuation) << cont;
  }
  EXPECT_TRUE(encode_after_boundary(tok, "").empty());
  EXPECT_EQ(tok.decode(join(tok.encode("x"), encode_after_boundary(tok, "ing"))), "xing");
}

TEST(ClozeScoring, WholeIsTheHarnessSplit) {
  const Tokenizer tok(test::small_tokenizer());
  for (const std::string& ctx : kContexts) {
    for (const std::string& cont : kContinuations) {
      const std::vector<int32_t> whole = encode_prompt(tok, ctx + cont);
      const size_t split = std::min(encode_prompt(tok, ctx).size(), whole.size() - 1);
      const PairTokens p = split_pair(tok, ctx, cont, ClozeScoring::whole);
      EXPECT_EQ(p.context, std::vector<int32_t>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(split)));
      EXPECT_EQ(join(p.context, p.continuation), whole);
    }
  }
}

TEST(ClozeScoring, SeamsCountsAPieceAcrossTheSeam) {
  const Tokenizer tok(test::small_tokenizer());
  const auto [ctx, cont] = multi_word_seam(tok);
  ASSERT_FALSE(ctx.empty());
  // The whole encoding ends in the multi-word piece: the context's last word is in it, so the
  // cut after the context's own token count is not at the seam.
  const PairTokens w = split_pair(tok, ctx, cont, ClozeScoring::whole);
  EXPECT_NE(w.context, encode_prompt(tok, ctx)) << ctx << " | " << cont;
  EXPECT_NE(tok.decode(join(w.context, w.continuation)).substr(tok.decode(w.context).size()), cont);
  const PairTokens b = split_pair(tok, ctx, cont, ClozeScoring::boundary);
  EXPECT_EQ(tok.decode(join(b.context, b.continuation)), ctx + cont);

  // A clean seam (a newline before the continuation) counts nothing.
  const std::vector<ClozeItem> items = {{ctx, {cont, "\n" + cont}, 0},
                                        {"line one\n", {" press", "ing"}, 1}};
  const SeamCounts n = count_seams(tok, items);
  EXPECT_EQ(n.pairs, 4);
  EXPECT_EQ(n.merged + n.changed, 1);
  EXPECT_LE(n.cut_inside, n.changed);
  EXPECT_EQ(describe_seams({1600, 14, 22, 20}),
            "1600 pairs, 14 merge the continuation into the context's last piece, 22 more "
            "change the context's tokens (20 of them cut inside the context); whole rule");
}

TEST(ClozeScoring, CountsOnTheShippedTask) {
  // Every pair is either clean, merged or changed; the boundary rule's tokens are exact.
  const Tokenizer tok(test::small_tokenizer());
  std::vector<ClozeItem> items = read_cloze_task(test::source_path("inputs/tasks/brown-lastword.jsonl"));
  items.resize(100);
  const SeamCounts n = count_seams(tok, items);
  EXPECT_EQ(n.pairs, 400);
  int64_t merged = 0, changed = 0, cut_inside = 0;
  for (const ClozeItem& item : items) {
    const std::vector<int32_t> own = encode_prompt(tok, item.context);
    for (const std::string& c : item.continuations) {
      const PairTokens w = split_pair(tok, item.context, c, ClozeScoring::whole);
      const std::string scored =
          tok.decode(join(w.context, w.continuation)).substr(tok.decode(w.context).size());
      if (scored.size() < c.size()) {
        ++merged;  // the context's last piece took the continuation's first characters
        EXPECT_EQ(c.compare(c.size() - scored.size(), scored.size(), scored), 0);
      } else if (w.context != own) {
        ++changed;
        cut_inside += scored != c;
      }
      const PairTokens b = split_pair(tok, item.context, c, ClozeScoring::boundary);
      EXPECT_EQ(b.context, own);
      EXPECT_EQ(tok.decode(join(b.context, b.continuation)), item.context + c);
    }
  }
  EXPECT_EQ(n.merged, merged);
  EXPECT_EQ(n.changed, changed);
  EXPECT_EQ(n.cut_inside, cut_inside);
  EXPECT_GT(n.merged + n.changed, 0) << "no seam crossed: the test shows nothing";
}

}  // namespace
}  // namespace jumbo
