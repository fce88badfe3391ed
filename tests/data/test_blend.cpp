// Blends: Megatron's largest-lag rule from the sample index alone, exact proportions over any
// window, each dataset's own epochs still permutations, and one dataset left as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "data_test_support.h"
#include "jumbo/data/blend.h"
#include "jumbo/data/indexed_dataset.h"

namespace jumbo {
namespace {

using test::TempDir;

constexpr int64_t kSeqLen = 4;
constexpr int32_t kBase = 1000000;  // dataset d's tokens are d x kBase + position

std::string tagged_dataset(const TempDir& tmp, int dataset, int64_t samples) {
  const int64_t tokens = samples * kSeqLen + 1;
  const std::string prefix = tmp.file("set" + std::to_string(dataset));
  IndexedDatasetWriter writer(prefix, static_cast<uint64_t>(4 * kBase), 0);
  std::vector<int32_t> doc;
  for (int64_t p = 0; p < tokens; ++p) doc.push_back(static_cast<int32_t>(dataset * kBase + p));
  writer.add_document(doc);
  writer.finish();
  return prefix;
}

TEST(Blend, DecimalWeightsAreExactIntegersAndOnePeriodHoldsEachExactly) {
  const std::vector<double> w = {0.6, 0.3, 0.1};
  const Blend b(w);
  EXPECT_EQ(b.period(), 10);
  EXPECT_EQ(b.integer_weights(), (std::vector<int64_t>{6, 3, 1}));
  // Weights need not sum to 1: 6 3 1 and 60 30 10 are the same blend.
  const std::vector<double> scaled = {60, 30, 10};
  const Blend same(scaled);
  for (int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(b.pick(i).dataset, same.pick(i).dataset);
    EXPECT_EQ(b.pick(i).index, same.pick(i).index);
  }
  // Two to one: 0 1 0, 0 1 0, ...; the dataset's own indices count up.
  const std::vector<double> two_one = {2, 1};
  const Blend t(two_one);
  std::vector<size_t> seq;
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < 6; ++i) seq.push_back(t.pick(i).dataset), idx.push_back(t.pick(i).index);
  EXPECT_EQ(seq, (std::vector<size_t>{0, 1, 0, 0, 1, 0}));
  EXPECT_EQ(idx, (std::vector<int64_t>{0, 0, 1, 2, 1, 3}));
}

TEST(Blend, CountsStayWithinOneSampleOfTheWeightsOverAnyPrefixAndWindow) {
  for (const std::vector<double>& w :
       {std::vector<double>{0.6, 0.3, 0.1}, std::vector<double>{1.0 / 3, 1.0 / 3, 1.0 / 3},
        std::vector<double>{0.5, 0.25, 0.125, 0.0625, 0.0625}, std::vector<double>{7, 0.001}}) {
    const Blend b(w);
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    const int64_t n = 100000;
    std::vector<int64_t> count(w.size(), 0);
    std::vector<std::vector<int64_t>> prefix(w.size(), std::vector<int64_t>(n + 1, 0));
    for (int64_t i = 0; i < n; ++i) {
      const Blend::Pick p = b.pick(i);
      ASSERT_LT(p.dataset, w.size());
      EXPECT_EQ(p.index, count[p.dataset]) << "dataset indices count up without gaps";
      ++count[p.dataset];
      for (size_t d = 0; d < w.size(); ++d) {
        prefix[d][i + 1] = count[d];
        // The largest-lag rule keeps every prefix within one sample of its share (a little
        // more where the weights were apportioned to a period of 2^20).
        ASSERT_LT(std::fabs(count[d] - w[d] / total * (i + 1)), 1.01) << "d " << d << " i " << i;
      }
    }
    for (size_t d = 0; d < w.size(); ++d) {
      const double share = static_cast<double>(count[d]) / n, want = w[d] / total;
      EXPECT_LT(std::fabs(share - want), 0.01 * want + 1.0 / n) << "dataset " << d;
    }
    std::mt19937_64 rng(7);
    for (int k = 0; k < 200; ++k) {  // any window of 1000 samples: within 2 of its share
      const int64_t start = static_cast<int64_t>(rng() % (n - 1000));
      for (size_t d = 0; d < w.size(); ++d) {
        const int64_t got = prefix[d][start + 1000] - prefix[d][start];
        EXPECT_LT(std::fabs(got - 1000 * w[d] / total), 2.01) << "window at " << start;
      }
    }
  }
}

TEST(Blend, APickDependsOnTheIndexAloneAndOneDatasetIsTheIdentity) {
  const std::vector<double> w = {0.45, 0.35, 0.2};
  const Blend b(w);
  std::vector<Blend::Pick> forward;
  for (int64_t i = 0; i < 5000; ++i) forward.push_back(b.pick(i));
  for (int64_t i : {4999, 17, 0, 2500, 1234}) {  // resume anywhere: no state
    const Blend fresh(w);
    EXPECT_EQ(fresh.pick(i).dataset, forward[i].dataset);
    EXPECT_EQ(fresh.pick(i).index, forward[i].index);
  }
  const std::vector<double> one = {0.7};
  const Blend solo(one);
  EXPECT_EQ(solo.period(), 1);
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{99}, int64_t{1} << 40}) {
    EXPECT_EQ(solo.pick(i).dataset, 0u);
    EXPECT_EQ(solo.pick(i).index, i);
  }
}

TEST(BlendedSampler, ProportionsHoldAndEveryDatasetVisitsEachSampleOncePerEpoch) {
  TempDir tmp;
  const std::vector<int64_t> sizes = {997, 300, 41};
  const std::vector<double> weights = {0.6, 0.3, 0.1};
  std::vector<std::unique_ptr<IndexedDataset>> data;
  std::vector<std::unique_ptr<SampleSource>> samplers;
  for (int d = 0; d < 3; ++d) {
    data.push_back(std::make_unique<IndexedDataset>(tagged_dataset(tmp, d, sizes[d])));
    samplers.push_back(std::make_unique<GptSampler>(*data.back(), kSeqLen, 1234 + d));
  }
  const BlendedSampler blend(std::move(samplers), weights);
  const int64_t n = 100000;
  std::vector<std::vector<int64_t>> drawn(3);  // per dataset, the sample positions in order
  std::vector<int32_t> s(kSeqLen + 1), targets(kSeqLen);
  for (int64_t i = 0; i < n; ++i) {
    blend.sample(i, {s.data(), targets.data(), nullptr});
    s[kSeqLen] = targets[kSeqLen - 1];
    const int d = s[0] / kBase;
    const int64_t pos = s[0] % kBase;
    ASSERT_EQ(pos % kSeqLen, 0);
    for (int64_t k = 1; k <= kSeqLen; ++k) ASSERT_EQ(s[k], s[0] + k) << "contiguous tokens";
    drawn[d].push_back(pos / kSeqLen);
  }
  for (int d = 0; d < 3; ++d) {
    const double share = static_cast<double>(drawn[d].size()) / n;
    EXPECT_NEAR(share, weights[d], 0.01 * weights[d]) << "dataset " << d;
    std::vector<int64_t> identity(static_cast<size_t>(sizes[d]));
    std::iota(identity.begin(), identity.end(), 0);
    const size_t epochs = drawn[d].size() / static_cast<size_t>(sizes[d]);
    ASSERT_GE(epochs, 2u);
    for (size_t e = 0; e < epochs; ++e) {
      std::vector<int64_t> epoch(drawn[d].begin() + static_cast<int64_t>(e) * sizes[d],
                                 drawn[d].begin() + static_cast<int64_t>(e + 1) * sizes[d]);
      EXPECT_NE(epoch, identity) << "dataset " << d << " epoch " << e << " is not shuffled";
      std::sort(epoch.begin(), epoch.end());
      EXPECT_EQ(epoch, identity) << "dataset " << d << " epoch " << e << " is not a permutation";
    }
  }
}

}  // namespace
}  // namespace jumbo
