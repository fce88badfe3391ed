// Prompt-completion examples: the version-2 index (each example's loss start), their samples
// (EOS first, targets masked before the loss start, positions restarting), packing against
// one example per sample, and the loss-token counts every rank sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "data_test_support.h"
#include "jumbo/config/config.h"
#include "jumbo/data/example_sampler.h"
#include "jumbo/data/indexed_dataset.h"

namespace jumbo {
namespace {

using test::TempDir;

constexpr int32_t kEos = 2;

// Example d: prompt of 2 + d % 3 tokens (ids 100 + d), completion of 1 + d % 2 (ids 200 + d),
// then EOS.
struct Examples {
  std::string prefix;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<uint64_t> loss_starts;
};

Examples write_examples(const TempDir& tmp, int n) {
  Examples e{tmp.file("examples"), {}, {}};
  IndexedDatasetWriter writer(e.prefix, 1000, 0, DocumentKind::prompt_completion);
  for (int d = 0; d < n; ++d) {
    std::vector<int32_t> doc(static_cast<size_t>(2 + d % 3), 100 + d);
    doc.insert(doc.end(), static_cast<size_t>(1 + d % 2), 200 + d);
    doc.push_back(kEos);
    e.loss_starts.push_back(static_cast<uint64_t>(2 + d % 3));
    writer.add_example(doc, e.loss_starts.back());
    e.tokens.push_back(doc);
  }
  writer.finish();
  return e;
}

struct Sample {
  std::vector<int32_t> tokens, targets, positions;
  explicit Sample(int64_t seq) : tokens(seq), targets(seq), positions(seq) {}
  SampleView view() { return {tokens.data(), targets.data(), positions.data()}; }
};

TEST(ExampleDataset, RecordsEachExamplesLossStart) {
  TempDir tmp;
  const Examples e = write_examples(tmp, 7);
  const IndexedDataset data(e.prefix);
  EXPECT_EQ(data.kind(), DocumentKind::prompt_completion);
  for (uint64_t d = 0; d < 7; ++d) EXPECT_EQ(data.doc_loss_start(d), e.loss_starts[d]);
  // Text datasets keep version 1 and no loss starts.
  IndexedDatasetWriter text(tmp.file("text"), 1000, 0);
  text.add_document({5, 6, kEos});
  text.finish();
  const IndexedDataset t(tmp.file("text"));
  EXPECT_EQ(t.kind(), DocumentKind::text);
  EXPECT_EQ(t.doc_loss_start(0), 0u);
}

TEST(ExampleDataset, RefusesALossStartPastItsExample) {
  TempDir tmp;
  const Examples e = write_examples(tmp, 3);
  {  // example 1's loss start (after the header and 4 offsets) set to its length, 6
    std::fstream f(e.prefix + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 + 8 * 4 + 8 * 1);
    const uint64_t bad = 6;
    f.write(reinterpret_cast<const char*>(&bad), sizeof bad);
  }
  try {
    const IndexedDataset data(e.prefix);
    FAIL() << "opened";
  } catch (const UserError& err) {
    EXPECT_NE(std::string(err.what()).find("loss start of example 1 (byte 104) is 6, expected below its 6 tokens"),
              std::string::npos) << err.what();
  }
}

TEST(ExampleSampler, PaddedSampleIsOneExampleBehindEosWithItsPromptMasked) {
  TempDir tmp;
  const Examples e = write_examples(tmp, 5);
  const IndexedDataset data(e.prefix);
  const int64_t seq = 8;
  const ExampleSampler s(data, seq, 1, SampleOrder::stored, ExamplePacking::padded);
  EXPECT_EQ(s.samples_per_epoch(), 5);
  Sample got(seq);
  for (int64_t i = 0; i < 5; ++i) {
    s.sample(i, got.view());
    const std::vector<int32_t>& doc = e.tokens[static_cast<size_t>(i)];
    const auto len = static_cast<int64_t>(doc.size());
    EXPECT_EQ(got.tokens[0], kEos);
    int64_t counted = 0;
    for (int64_t j = 0; j < seq; ++j) {
      if (j < len) {
        if (j > 0) {
          EXPECT_EQ(got.tokens[j], doc[j - 1]);
        }
        EXPECT_EQ(got.positions[j], j);
        const bool in_loss = j >= static_cast<int64_t>(e.loss_starts[i]);
        EXPECT_EQ(got.targets[j], in_loss ? doc[j] : kIgnoredTarget) << "sample " << i << " at " << j;
        counted += in_loss;
      } else {  // padding: EOS, ignored, a sequence of its own from position 0
        EXPECT_EQ(got.tokens[j], kEos);
        EXPECT_EQ(got.targets[j], kIgnoredTarget);
        EXPECT_EQ(got.positions[j], j - len);
      }
    }
    EXPECT_EQ(s.loss_tokens(i), counted);
    EXPECT_EQ(counted, 2 + i % 2) << "the completion and EOS";
  }
}

TEST(ExampleSampler, PackingFillsSamplesWithWholeExamplesInTheSameOrder) {
  TempDir tmp;
  const Examples e = write_examples(tmp, 40);
  const IndexedDataset data(e.prefix);
  const int64_t seq = 16;
  const ExampleSampler packed(data, seq, 7, SampleOrder::shuffled, ExamplePacking::packed);
  const ExampleSampler padded(data, seq, 7, SampleOrder::shuffled, ExamplePacking::padded);
  ASSERT_LT(packed.samples_per_epoch(), 40 / 2) << "at least two examples per sample";
  // The padded epoch's examples, in order, are the packed epoch's sequences, in order.
  std::vector<std::vector<int32_t>> from_packed, from_padded;
  int64_t packed_loss = 0, padded_loss = 0;
  Sample got(seq);
  for (int64_t i = 0; i < packed.samples_per_epoch(); ++i) {
    packed.sample(i, got.view());
    packed_loss += packed.loss_tokens(i);
    for (int64_t j = 0; j < seq; ++j) {
      if (got.positions[j] == 0) from_packed.emplace_back();
      from_packed.back().push_back(got.targets[j]);
    }
    // The last sequence of a sample is padding unless the sample is full.
    if (std::all_of(from_packed.back().begin(), from_packed.back().end(),
                    [](int32_t t) { return t == kIgnoredTarget; })) {
      from_packed.pop_back();
    }
  }
  for (int64_t i = 0; i < padded.samples_per_epoch(); ++i) {
    padded.sample(i, got.view());
    padded_loss += padded.loss_tokens(i);
    const auto end = std::find_if(got.positions.begin() + 1, got.positions.end(),
                                  [](int32_t p) { return p == 0; });
    from_padded.emplace_back(got.targets.begin(), got.targets.begin() + (end - got.positions.begin()));
  }
  EXPECT_EQ(from_packed, from_padded);
  EXPECT_EQ(packed_loss, padded_loss);
  std::set<int32_t> seen;  // each example once per epoch: its completion's id, 200 + d
  for (const auto& targets : from_padded) {
    seen.insert(*std::find_if(targets.begin(), targets.end(), [](int32_t t) { return t >= 0; }));
  }
  EXPECT_EQ(seen.size(), 40u);
  EXPECT_EQ(*seen.begin(), 200);
}

TEST(ExampleSampler, EpochsReshuffleAndAreTheSameForAnyReadingOrder) {
  TempDir tmp;
  const Examples e = write_examples(tmp, 30);
  const IndexedDataset data(e.prefix);
  const ExampleSampler a(data, 16, 3, SampleOrder::shuffled, ExamplePacking::packed);
  const ExampleSampler b(data, 16, 3, SampleOrder::shuffled, ExamplePacking::packed);
  const int64_t n = a.samples_per_epoch();
  Sample x(16), y(16);
  // b reaches a late epoch first: the epochs it packs on the way are the same.
  b.sample(5 * n + 1, y.view());
  a.sample(5 * n + 1, x.view());
  EXPECT_EQ(x.tokens, y.tokens);
  a.sample(0, x.view());
  a.sample(n, y.view());
  EXPECT_NE(x.tokens, y.tokens) << "epoch 1 is another shuffle";
}

TEST(ExampleSampler, CutsAnExampleLongerThanTheContext) {
  TempDir tmp;
  const Examples e = write_examples(tmp, 6);  // examples of 4 .. 7 tokens
  const IndexedDataset data(e.prefix);
  const ExampleSampler s(data, 4, 1, SampleOrder::stored, ExamplePacking::padded);
  EXPECT_EQ(s.cut_examples(), 5);
  Sample got(4);
  s.sample(2, got.view());  // prompt of 4: nothing of its completion fits
  EXPECT_EQ(s.loss_tokens(2), 0);
  EXPECT_TRUE(std::all_of(got.targets.begin(), got.targets.end(), [](int32_t t) { return t == kIgnoredTarget; }));
}

}  // namespace
}  // namespace jumbo
