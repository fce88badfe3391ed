// LoRA dropout's kernel (backend.h dropout, dropout_mask.h): the share of elements dropped is
// p, the kept ones are scaled by 1 / (1 - p) exactly, a column slice (a row-parallel rank's
// input) gets the slice of the whole tensor's mask, the same seed draws the same mask and
// another seed another, p = 0 leaves the tensor as it is, and bf16 drops the same elements.
#include <gtest/gtest.h>

#include <cmath>

#include "backend_test_support.h"

namespace jumbo::test {
namespace {

constexpr int64_t kRows = 96, kCols = 160;

Vec ones(int64_t n) { return Vec(static_cast<size_t>(n), 1.0); }

TEST(DropoutKernel, DropsAShareOfPAndScalesTheRest) {
  KernelBench kb;
  for (const float p : {0.1f, 0.5f}) {
    Tensor in = kb.upload(DType::f32, {kRows, kCols}, ones(kRows * kCols));
    Tensor out = kb.poisoned(DType::f32, {kRows, kCols});
    kb.be().dropout(out, in, {.seed = 17, .p = p});
    const Vec got = kb.download(out);
    int64_t dropped = 0;
    for (double v : got) {
      if (v == 0) {
        ++dropped;
      } else {
        EXPECT_EQ(v, static_cast<double>(1.0f / (1.0f - p)));
      }
    }
    const double n = static_cast<double>(got.size()), share = static_cast<double>(dropped) / n;
    // 4 standard deviations of a binomial share.
    EXPECT_NEAR(share, p, 4 * std::sqrt(p * (1 - p) / n)) << "p " << p;
  }
}

TEST(DropoutKernel, AColumnSliceGetsTheSliceOfTheWholeMask) {
  KernelBench kb;
  Rng rng(3);
  const Vec x = rng.uniform(kRows * kCols);
  Tensor whole_in = kb.upload(DType::f32, {kRows, kCols}, x);
  Tensor whole = kb.poisoned(DType::f32, {kRows, kCols});
  kb.be().dropout(whole, whole_in, {.seed = 99, .p = 0.3f});
  const Vec want = kb.download(whole);
  const int64_t parts = 4, part_cols = kCols / parts;
  for (int64_t k = 0; k < parts; ++k) {
    Vec slice;
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < part_cols; ++c) slice.push_back(x[static_cast<size_t>(r * kCols + k * part_cols + c)]);
    }
    Tensor in = kb.upload(DType::f32, {kRows, part_cols}, slice);
    kb.be().dropout(in, in, {.seed = 99, .p = 0.3f, .col_offset = k * part_cols, .cols_total = kCols});
    const Vec got = kb.download(in);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < part_cols; ++c) {
        ASSERT_EQ(got[static_cast<size_t>(r * part_cols + c)],
                  want[static_cast<size_t>(r * kCols + k * part_cols + c)])
            << "part " << k << " row " << r << " col " << c;
      }
    }
  }
}

TEST(DropoutKernel, TheSeedDecidesTheMask) {
  KernelBench kb;
  auto mask = [&](uint64_t seed, float p, DType dt) {
    Tensor t = kb.upload(dt, {kRows, kCols}, ones(kRows * kCols));
    kb.be().dropout(t, t, {.seed = seed, .p = p});
    return kb.download(t);
  };
  const Vec a = mask(5, 0.25f, DType::f32);
  EXPECT_EQ(a, mask(5, 0.25f, DType::f32));
  const Vec b = mask(6, 0.25f, DType::f32);
  int64_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += (a[i] == 0) != (b[i] == 0);
  EXPECT_GT(differ, static_cast<int64_t>(a.size()) / 5) << "another seed, another mask";
  const Vec half = mask(5, 0.25f, DType::bf16);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i] == 0, half[i] == 0) << "bf16 element " << i;
  EXPECT_EQ(mask(5, 0.0f, DType::f32), ones(kRows * kCols)) << "p = 0 keeps everything";
}

}  // namespace
}  // namespace jumbo::test
