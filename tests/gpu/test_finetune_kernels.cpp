// What fine-tuning adds to the CUDA kernels, against the CPU backend on the same inputs (f32
// and bf16): the position embedding by position (packed sequences; the backward through the
// sorted scatter), the cross-entropy with ignored targets (-1: no loss, a zero gradient row),
// scale and GELU alone (LoRA's scaled products and its fc1 adapter before the GELU), the
// linear backward of a frozen weight (no weight gradient), and LoRA dropout's counter-based
// mask (the CPU's bits).
#include <string>
#include <vector>

#include "gpu_test_support.h"

namespace jumbo::gputest {
namespace {

constexpr DType kFloatTypes[] = {DType::f32, DType::bf16};

// Rows of packed sequences of lengths 1 .. 9 in a row of t positions.
std::vector<int32_t> packed_positions(int64_t rows, int64_t t) {
  std::vector<int32_t> pos;
  for (int64_t r = 0; r < rows; ++r) {
    int32_t len = static_cast<int32_t>(1 + r % 9), p = 0;
    for (int64_t i = 0; i < t; ++i) {
      if (p == len) p = 0, len = 1 + (len * 7 + 3) % 9;
      pos.push_back(p++);
    }
  }
  return pos;
}

TEST(GpuFinetuneKernels, PositionEmbeddingByPositionMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const int64_t batch = 3, t = 70, c = 136, wpe_rows = 80;
  const Pair pos = b.upload_ids({batch * t}, packed_positions(batch, t));
  for (DType dt : kFloatTypes) {
    const std::string what = std::string(to_string(dt)) + " position embedding by position";
    SCOPED_TRACE(what);
    const Pair out = b.upload(dt, {batch, t, c}, random_normal(batch * t * c, 1.0, 61));
    const Pair wpe = b.upload(dt, {wpe_rows, c}, random_normal(wpe_rows * c, 1.0, 62));
    b.cpu().position_embedding_fwd(out.cpu, wpe.cpu, pos.cpu);
    b.gpu().position_embedding_fwd(out.gpu, wpe.gpu, pos.gpu);
    const std::string dts = to_string(dt);
    EXPECT_TRUE(b.same(out, tolerance_for(dt), dts + " position_embedding_fwd by position"));
    const Pair dwpe = b.upload(DType::f32, {wpe_rows, c}, random_normal(wpe_rows * c, 1.0, 63));
    const Pair dout = b.upload(dt, {batch, t, c}, random_normal(batch * t * c, 1.0, 64));
    b.cpu().position_embedding_bwd(dwpe.cpu, dout.cpu, pos.cpu);
    b.gpu().position_embedding_bwd(dwpe.gpu, dout.gpu, pos.gpu);
    EXPECT_TRUE(b.same(dwpe, kTolF32, dts + " position_embedding_bwd by position"));
  }
}

TEST(GpuFinetuneKernels, IgnoredTargetsHaveNoLossAndNoGradient) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const int64_t n = 40, v = 264;
  std::vector<int32_t> targets = random_ids(n, 0, static_cast<int32_t>(v - 1), 71);
  for (int64_t i = 0; i < n; i += 3) targets[static_cast<size_t>(i)] = -1;
  const Pair t = b.upload_ids({n}, targets);
  for (DType dt : kFloatTypes) {
    const std::string what = std::string(to_string(dt)) + " cross-entropy, ignored targets";
    SCOPED_TRACE(what);
    const Pair logits = b.upload(dt, {n, v}, random_normal(n * v, 2.0, 72));
    const Pair mx = b.poisoned(DType::f32, {n}), se = b.poisoned(DType::f32, {n});
    const Pair tl = b.poisoned(DType::f32, {n}), loss = b.poisoned(DType::f32, {n});
    for (Backend* side : {&b.cpu(), &b.gpu()}) {
      const bool gpu = side == &b.gpu();
      auto pick = [gpu](const Pair& p) { return gpu ? p.gpu : p.cpu; };
      side->ce_local_max(pick(mx), pick(logits));
      side->ce_local_sumexp(pick(se), pick(logits), pick(mx));
      side->ce_target_logit(pick(tl), pick(logits), pick(t), 0);
      side->ce_loss(pick(loss), pick(mx), pick(se), pick(tl), pick(t));
    }
    EXPECT_TRUE(b.same(loss, kTolF32, what + " ce_loss"));
    const Values got = b.download(b.gpu(), loss.gpu);
    for (int64_t i = 0; i < n; i += 3) EXPECT_EQ(got[static_cast<size_t>(i)], 0.0) << "row " << i;
    const Pair dlogits = b.poisoned(dt, {n, v});
    b.cpu().ce_bwd(dlogits.cpu, logits.cpu, mx.cpu, se.cpu, t.cpu, 0, 0.25f);
    b.gpu().ce_bwd(dlogits.gpu, logits.gpu, mx.gpu, se.gpu, t.gpu, 0, 0.25f);
    EXPECT_TRUE(b.same(dlogits, tolerance_for(dt), what + " ce_bwd"));
    const Values d = b.download(b.gpu(), dlogits.gpu);
    for (int64_t i = 0; i < n; i += 3) {
      for (int64_t k = 0; k < v; ++k) ASSERT_EQ(d[static_cast<size_t>(i * v + k)], 0.0) << "row " << i;
    }
  }
}

TEST(GpuFinetuneKernels, ScaleGeluAndAFrozenWeightsBackwardMatchCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const int64_t n = 48, in = 72, out = 40;
  for (DType dt : kFloatTypes) {
    const std::string what = to_string(dt);
    SCOPED_TRACE(what);
    const Pair x = b.upload(dt, {n, in}, random_normal(n * in, 1.0, 81));
    b.cpu().scale(x.cpu, 0.375f);
    b.gpu().scale(x.gpu, 0.375f);
    EXPECT_TRUE(b.same(x, tolerance_for(dt), what + " scale"));
    const Pair g = b.poisoned(dt, {n, in});
    b.cpu().gelu_fwd(g.cpu, x.cpu);
    b.gpu().gelu_fwd(g.gpu, x.gpu);
    EXPECT_TRUE(b.same(g, tolerance_for(dt), what + " gelu_fwd"));
    const Pair w = b.upload(dt, {out, in}, random_normal(out * in, 0.1, 82));
    const Pair dout = b.upload(dt, {n, out}, random_normal(n * out, 1.0, 83));
    const Pair din = b.poisoned(dt, {n, in});
    b.cpu().linear_bwd(din.cpu, Tensor{}, Tensor{}, dout.cpu, x.cpu, w.cpu);
    b.gpu().linear_bwd(din.gpu, Tensor{}, Tensor{}, dout.gpu, x.gpu, w.gpu);
    EXPECT_TRUE(b.same(din, tolerance_for(dt), what + " linear_bwd of a frozen weight (din only)"));
  }
}

TEST(GpuFinetuneKernels, LoraDropoutDrawsTheCpuMask) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const int64_t rows = 70, cols = 136;
  for (DType dt : kFloatTypes) {
    const std::string what = std::string(to_string(dt)) + " dropout";
    SCOPED_TRACE(what);
    // A row-parallel rank's slice: columns 136 .. 271 of a 544-column input.
    const DropoutMask mask{.seed = 0x5eed, .p = 0.3f, .col_offset = cols, .cols_total = 4 * cols};
    const Pair in = b.upload(dt, {rows, cols}, random_normal(rows * cols, 1.0, 71));
    const Pair out = b.upload(dt, {rows, cols}, random_normal(rows * cols, 1.0, 72));
    b.cpu().dropout(out.cpu, in.cpu, mask);
    b.gpu().dropout(out.gpu, in.gpu, mask);
    EXPECT_TRUE(b.same(out, 0.0, what)) << "the same elements kept, scaled alike";
  }
}

}  // namespace
}  // namespace jumbo::gputest
