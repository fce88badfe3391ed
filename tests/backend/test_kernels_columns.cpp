// Column blocks (backend.h's ColumnBlocks): a LoRA adapter's part of a packed output added in
// and read back, against plain loops in double; f32 and bf16; and bad placements refused.
#include <gtest/gtest.h>

#include <stdexcept>

#include "backend_test_support.h"

namespace jumbo::test {
namespace {

class ColumnBlockKernels : public DTypeKernelTest {
 protected:
  ColumnBlockKernels() : DTypeKernelTest(5) {}
};

TEST_P(ColumnBlockKernels, AddAndCopyTheBlocks) {
  const int64_t n = 7, d = 4, r = 2, g = 3, wide = g * (r + 2) * d;
  const struct {
    ColumnBlocks at;
    int64_t narrow, width;
  } parts[] = {{{r * d, 0, (r + 2) * d}, g * r * d, wide},   // q of grouped q/k/v rows
               {{d, r * d, (r + 2) * d}, g * d, wide},       // k
               {{d, (r + 1) * d, (r + 2) * d}, g * d, wide}, // v
               {{5, 5, 5}, 5, 10}};                          // SwiGLU's up half
  for (const auto& p : parts) {
    SCOPED_TRACE("block " + std::to_string(p.at.block) + " first " + std::to_string(p.at.first));
    const Vec w = round_to(dt(), rng.normal(n * p.width)), x = round_to(dt(), rng.normal(n * p.narrow));
    Vec want = w;
    for (int64_t row = 0; row < n; ++row) {
      for (int64_t c = 0; c < p.narrow; ++c) {
        want[row * p.width + p.at.first + c / p.at.block * p.at.period + c % p.at.block] +=
            x[row * p.narrow + c];
      }
    }
    Tensor t_w = kb.upload(dt(), {n, p.width}, w);
    kb.be().add_to_column_blocks(t_w, kb.upload(dt(), {n, p.narrow}, x), p.at);
    EXPECT_TRUE(close(kb.download(t_w), want, tolerance_for(dt()), "add_to_column_blocks"));
    Tensor out = kb.poisoned(dt(), {n, p.narrow});
    kb.be().copy_from_column_blocks(out, t_w, p.at);
    Vec back(static_cast<size_t>(n * p.narrow));
    const Vec got_w = kb.download(t_w);
    for (int64_t row = 0; row < n; ++row) {
      for (int64_t c = 0; c < p.narrow; ++c) {
        back[row * p.narrow + c] =
            got_w[row * p.width + p.at.first + c / p.at.block * p.at.period + c % p.at.block];
      }
    }
    EXPECT_TRUE(close(kb.download(out), back, 0.0, "copy_from_column_blocks"));
  }
}

TEST_P(ColumnBlockKernels, RefusesBlocksOutsideTheWideTensor) {
  Tensor w = kb.poisoned(dt(), {3, 10}), x = kb.poisoned(dt(), {3, 6});
  EXPECT_THROW(kb.be().add_to_column_blocks(w, x, {.block = 3, .first = 2, .period = 6}),
               std::logic_error);  // the second block ends at column 11
  EXPECT_THROW(kb.be().copy_from_column_blocks(x, w, {.block = 4, .first = 0, .period = 4}),
               std::logic_error);  // 6 columns are no whole number of blocks of 4
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ColumnBlockKernels, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return dtype_name(info.param); });

}  // namespace
}  // namespace jumbo::test
