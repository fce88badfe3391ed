// GPT sampler: a bijection per epoch, keyed by (seed, epoch), samples are contiguous tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "data_test_support.h"
#include "jumbo/config/config.h"
#include "jumbo/data/indexed_dataset.h"
#include "jumbo/data/prepare.h"
#include "jumbo/data/sampler.h"

namespace jumbo {
namespace {

using test::TempDir;

constexpr int64_t kSeqLen = 4;

// A dataset whose token at position p is p (so a sample shows where it came from), sized to
// hold exactly `samples` samples of kSeqLen + 1 tokens, split into a few documents.
std::string positional_dataset(const TempDir& tmp, int64_t samples) {
  const int64_t tokens = samples * kSeqLen + 1;
  const std::string prefix = tmp.file("pos" + std::to_string(samples));
  IndexedDatasetWriter writer(prefix, static_cast<uint64_t>(tokens), 0);
  std::vector<int32_t> doc;
  for (int64_t p = 0; p < tokens; ++p) {
    doc.push_back(static_cast<int32_t>(p));
    if (doc.size() == 37 || p + 1 == tokens) {
      writer.add_document(doc);
      doc.clear();
    }
  }
  writer.finish();
  return prefix;
}

std::vector<int64_t> epoch_order(const GptSampler& s, int64_t epoch) {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < s.samples_per_epoch(); ++i) {
    order.push_back(s.permuted(epoch * s.samples_per_epoch() + i));
  }
  return order;
}

TEST(GptSampler, EachEpochIsAPermutationOfAllSamples) {
  TempDir tmp;
  for (int64_t n : {1, 2, 7, 1000, 4099}) {
    const IndexedDataset data(positional_dataset(tmp, n));
    const GptSampler sampler(data, kSeqLen, 1234);
    ASSERT_EQ(sampler.samples_per_epoch(), n);
    std::vector<int64_t> identity(static_cast<size_t>(n));
    std::iota(identity.begin(), identity.end(), 0);
    for (int64_t epoch : {0, 1, 5}) {
      auto order = epoch_order(sampler, epoch);
      if (n >= 7) {
        EXPECT_NE(order, identity) << "n " << n << " epoch " << epoch << " not shuffled";
      }
      std::sort(order.begin(), order.end());
      EXPECT_EQ(order, identity) << "n " << n << " epoch " << epoch << " is not a bijection";
    }
  }
}

TEST(GptSampler, OrderDependsOnSeedAndEpochAndNothingElse) {
  TempDir tmp;
  const IndexedDataset data(positional_dataset(tmp, 1000));
  const GptSampler a(data, kSeqLen, 1234), again(data, kSeqLen, 1234), other(data, kSeqLen, 1235);
  EXPECT_EQ(epoch_order(a, 0), epoch_order(again, 0));
  EXPECT_EQ(epoch_order(a, 3), epoch_order(again, 3));
  EXPECT_NE(epoch_order(a, 0), epoch_order(a, 1));
  EXPECT_NE(epoch_order(a, 1), epoch_order(a, 2));
  EXPECT_NE(epoch_order(a, 0), epoch_order(other, 0));
  // Permuted positions spread over the epoch: the first 100 are not bunched at one end.
  const auto order = epoch_order(a, 0);
  const auto [lo, hi] = std::minmax_element(order.begin(), order.begin() + 100);
  EXPECT_LT(*lo, 100);
  EXPECT_GT(*hi, 900);
}

TEST(GptSampler, SamplesAreContiguousTokensSharingOneWithTheNext) {
  TempDir tmp;
  const IndexedDataset data(positional_dataset(tmp, 4099));
  const GptSampler sampler(data, kSeqLen, 7);
  int32_t out[kSeqLen + 1];
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{4098}, int64_t{4099}, int64_t{12345}}) {
    sampler.window(i, out);
    const int64_t start = sampler.permuted(i) * kSeqLen;
    for (int64_t k = 0; k <= kSeqLen; ++k) EXPECT_EQ(out[k], start + k) << "sample " << i;
  }
  // The last sample ends exactly on the last token.
  const GptSampler in_order(data, kSeqLen, 7, SampleOrder::stored);
  in_order.window(4098, out);
  EXPECT_EQ(out[kSeqLen], static_cast<int32_t>(data.num_tokens() - 1));
}

TEST(GptSampler, WithoutShuffleEveryEpochIsInOrder) {
  TempDir tmp;
  const IndexedDataset data(positional_dataset(tmp, 7));
  const GptSampler sampler(data, kSeqLen, 1234, SampleOrder::stored);
  for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(sampler.permuted(i), i % 7);
}

TEST(GptSampler, SamplesOfRealBrownTokensMatchTheStream) {
  TempDir tmp;
  PrepareOptions opts;
  opts.inputs = {test::brown_valid()};
  opts.tokenizer = test::small_tokenizer();
  opts.output_prefix = tmp.file("valid");
  prepare_dataset(opts);
  const IndexedDataset data(tmp.file("valid"));
  const int64_t seq_len = 64;
  const GptSampler sampler(data, seq_len, 42);
  EXPECT_EQ(sampler.samples_per_epoch(), static_cast<int64_t>((data.num_tokens() - 1) / seq_len));
  std::vector<int32_t> got(seq_len + 1), expected(seq_len + 1);
  for (int64_t i = 0; i < 50; ++i) {
    sampler.window(i, got.data());
    data.read(static_cast<uint64_t>(sampler.permuted(i) * seq_len), seq_len + 1, expected.data());
    ASSERT_EQ(got, expected) << "sample " << i;
  }
}

TEST(GptSampler, TooFewTokensIsAUserErrorNamingTheDataset) {
  TempDir tmp;
  const std::string prefix = tmp.file("tiny");
  {
    IndexedDatasetWriter writer(prefix, 100, 0);
    writer.add_document({1, 2, 3, 4});
    writer.finish();
  }
  const IndexedDataset data(prefix);
  EXPECT_EQ(GptSampler(data, 3, 0).samples_per_epoch(), 1);
  std::string msg = test::user_error_of([&] { GptSampler s(data, 4, 0); });
  EXPECT_NE(msg.find(prefix + ".bin: 4 tokens, too few for one sample of 5 (context 4 + 1)"),
            std::string::npos) << msg;
  msg = test::user_error_of([&] { GptSampler s(data, 0, 0); });
  EXPECT_NE(msg.find(prefix), std::string::npos) << msg;
}

}  // namespace
}  // namespace jumbo
