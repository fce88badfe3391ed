// CPU backend vs the double reference for the vocab-parallel cross-entropy parts and AdamW.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "jumbo/backend/bf16.h"
#include "backend_test_support.h"

namespace jumbo::test {
namespace {

class LossKernels : public DTypeKernelTest {
 protected:
  LossKernels() : DTypeKernelTest(21) {}
};

// Two vocab slices as two tensor-parallel ranks hold them: [0, V0) and [V0, V0 + V1). Each
// slice's parts go through the backend; the "all-reduces" are done here in double.
TEST_P(LossKernels, CrossEntropyPartsOverTwoVocabSlices) {
  struct Shape {
    int64_t N, V0, V1;
  };
  for (const Shape s : {Shape{6, 5, 6}, Shape{37, 389, 412}}) {
    SCOPED_TRACE("N=" + std::to_string(s.N) + " slices " + std::to_string(s.V0) + "+" +
                 std::to_string(s.V1));
    const int64_t N = s.N, V = s.V0 + s.V1;
    const Ids targets = rng.ints(N, 0, static_cast<int32_t>(V - 1));
    const int64_t width[2] = {s.V0, s.V1}, start[2] = {0, s.V0};
    Vec logits[2];
    Tensor t_logits[2];
    Tensor t_targets = kb.upload_ids({N}, targets);
    Vec max(N, -INFINITY), sumexp(N, 0.0), target(N, 0.0);
    for (int r = 0; r < 2; ++r) {
      logits[r] = round_to(dt(), rng.normal(N * width[r], 3.0));
      t_logits[r] = kb.upload(dt(), {N, width[r]}, logits[r]);
      Tensor t_max = kb.poisoned(DType::f32, {N});
      kb.be().ce_local_max(t_max, t_logits[r]);
      const Vec want_max = ref::ce_local_max(logits[r], N, width[r]);
      EXPECT_TRUE(close(kb.download(t_max), want_max, 0.0, tag("ce_local_max (exact)")));
      for (int64_t n = 0; n < N; ++n) max[n] = std::max(max[n], want_max[n]);
    }
    Tensor t_max = kb.upload(DType::f32, {N}, max);  // the all-reduced max, exact in f32
    for (int r = 0; r < 2; ++r) {
      Tensor t_sumexp = kb.poisoned(DType::f32, {N}), t_target = kb.poisoned(DType::f32, {N});
      kb.be().ce_local_sumexp(t_sumexp, t_logits[r], t_max);
      kb.be().ce_target_logit(t_target, t_logits[r], t_targets, start[r]);
      const Vec want_sumexp = ref::ce_local_sumexp(logits[r], max, N, width[r]);
      const Vec want_target = ref::ce_target_logit(logits[r], targets, N, width[r], start[r]);
      EXPECT_TRUE(close(kb.download(t_sumexp), want_sumexp, kTolF32,
                        tag("ce_local_sumexp slice " + std::to_string(r))));
      EXPECT_TRUE(close(kb.download(t_target), want_target, 0.0,
                        tag("ce_target_logit slice " + std::to_string(r) + " (exact)")));
      for (int64_t n = 0; n < N; ++n) {
        sumexp[n] += want_sumexp[n];
        target[n] += want_target[n];
      }
    }
    sumexp = round_to(DType::f32, sumexp);
    Tensor t_sumexp = kb.upload(DType::f32, {N}, sumexp);
    Tensor t_target = kb.upload(DType::f32, {N}, target);
    Tensor losses = kb.poisoned(DType::f32, {N});
    kb.be().ce_loss(losses, t_max, t_sumexp, t_target);
    EXPECT_TRUE(close(kb.download(losses), ref::ce_loss(max, sumexp, target), kTolF32,
                      tag("ce_loss")));

    // Backward for each slice with the global max and sum: into a separate tensor, then in
    // place (dlogits aliasing logits, as the model does to save memory).
    const double scale = 1.0 / N;
    for (int r = 0; r < 2; ++r) {
      const Vec want = ref::ce_bwd(logits[r], max, sumexp, targets, N, width[r], start[r], scale);
      Tensor dlogits = kb.poisoned(dt(), {N, width[r]});
      kb.be().ce_bwd(dlogits, t_logits[r], t_max, t_sumexp, t_targets, start[r],
                     static_cast<float>(scale));
      EXPECT_TRUE(close(kb.download(dlogits), want, tol(),
                        tag("ce_bwd slice " + std::to_string(r))));
      kb.be().ce_bwd(t_logits[r], t_logits[r], t_max, t_sumexp, t_targets, start[r],
                     static_cast<float>(scale));
      EXPECT_TRUE(close(kb.download(t_logits[r]), want, tol(),
                        tag("ce_bwd in place (dlogits aliases logits) slice " +
                            std::to_string(r))));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, LossKernels, ::testing::Values(DType::f32, DType::bf16),
                         DTypeName());

// AdamW over three steps from zero state, with weight decay and a grad scale, and a compute
// copy in each dtype (or none). Master, m and v are f32: tolerance 1e-5 of their scale.
class AdamWKernel : public ::testing::TestWithParam<int> {};  // 0: no copy, 1: f32, 2: bf16

TEST_P(AdamWKernel, ThreeStepsMatchReference) {
  const int copy_kind = GetParam();
  KernelBench kb;
  Rng rng(33);
  const int64_t n = 10007;
  Vec master = round_to(DType::f32, rng.normal(n, 0.5)), m(n, 0.0), v(n, 0.0);
  Tensor t_master = kb.upload(DType::f32, {n}, master);
  Tensor t_m = kb.upload(DType::f32, {n}, m), t_v = kb.upload(DType::f32, {n}, v);
  Tensor t_grad = kb.upload(DType::f32, {n}, Vec(n, 0.0));
  Tensor copy;
  if (copy_kind == 1) copy = kb.poisoned(DType::f32, {n});
  if (copy_kind == 2) copy = kb.poisoned(DType::bf16, {n});
  AdamWStep s;
  s.lr = 3e-3f;
  s.weight_decay = 0.1f;
  s.grad_scale = 0.7f;
  for (int64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    s.step = step;
    Vec grad = round_to(DType::f32, rng.normal(n, 0.02));
    for (int64_t i = 0; i < n; i += 97) grad[i] = 0;  // no gradient: only decay moves it
    kb.write(t_grad, grad);
    const Vec before = kb.download(t_master);
    const std::vector<AdamWRange> all = {{.flat = 0, .local = 0, .count = n, .weight_decay = true}};
    kb.be().adamw(t_master, t_grad, t_m, t_v, copy, all, s);
    master = before;  // both sides step from the same f32 weights
    ref::adamw(master, grad, m, v, s);
    const Vec got_master = kb.download(t_master);
    EXPECT_TRUE(close(got_master, master, kTolF32, "adamw master"));
    // The step itself (~lr, far below the weights' scale) to 1e-3 of its size: f32 rounding
    // of the weights is ~1e-7 absolute against steps of ~3e-3.
    Vec got_step(n), want_step(n);
    for (int64_t i = 0; i < n; ++i) {
      got_step[i] = got_master[i] - before[i];
      want_step[i] = master[i] - before[i];
    }
    EXPECT_TRUE(close(got_step, want_step, 1e-3, "adamw update (master after - before)"));
    EXPECT_TRUE(close(kb.download(t_m), m, kTolF32, "adamw m"));
    EXPECT_TRUE(close(kb.download(t_v), v, kTolF32, "adamw v"));
    EXPECT_TRUE(close(kb.download(t_grad), grad, 0.0, "adamw must not change grad"));
    if (!copy.empty()) {
      // The compute copy is exactly the new master in the copy's dtype.
      EXPECT_TRUE(close(kb.download(copy), round_to(copy.dtype, got_master), 0.0,
                        "adamw compute_copy = master in " + dtype_name(copy.dtype)));
    }
  }
  // The update moved every weight (decay alone moves those with zero gradient).
  const Vec start = round_to(DType::f32, Rng(33).normal(n, 0.5));
  const Vec got = kb.download(t_master);
  int64_t unmoved = 0;
  for (int64_t i = 0; i < n; ++i) unmoved += got[i] == start[i] && start[i] != 0;
  EXPECT_EQ(unmoved, 0);
}

// Several ranges in one call, as ZeRO-1 gives them in mixed precision: each at its own flat
// offset of the gradient and the compute copy, local offset of the moments and offset of the
// (sharded) master, here deliberately not the local one, with or without decay; elements no
// range names are left alone.
TEST(AdamWKernelRanges, EachRangeStepsLikeTheReferenceOnItsElements) {
  KernelBench kb;
  Rng rng(34);
  const int64_t n = 3000, state = 1700;
  const Vec start = round_to(DType::f32, rng.normal(state, 0.5));
  const Vec grad = round_to(DType::f32, rng.normal(n, 0.02));
  Tensor t_master = kb.upload(DType::f32, {state}, start);
  Tensor t_grad = kb.upload(DType::f32, {n}, grad);
  Tensor t_m = kb.upload(DType::f32, {state}, Vec(state, 0.0));
  Tensor t_v = kb.upload(DType::f32, {state}, Vec(state, 0.0));
  Tensor copy = kb.poisoned(DType::bf16, {n});
  kb.be().fill(copy, 0.0f);
  const std::vector<AdamWRange> ranges = {
      {.flat = 0, .local = 0, .count = 1000, .master = 700, .weight_decay = true},
      {.flat = 1500, .local = 1000, .count = 700, .master = 0, .weight_decay = false}};
  AdamWStep s;
  s.lr = 3e-3f;
  s.weight_decay = 0.1f;
  s.step = 1;
  kb.be().adamw(t_master, t_grad, t_m, t_v, copy, ranges, s);
  const Vec got = kb.download(t_master), got_copy = kb.download(copy);
  Vec want = start, want_copy(n, 0.0);
  for (const AdamWRange& r : ranges) {
    Vec part(start.begin() + r.master, start.begin() + r.master + r.count);
    Vec g(grad.begin() + r.flat, grad.begin() + r.flat + r.count), m(r.count, 0.0), v(r.count, 0.0);
    AdamWStep rs = s;
    rs.weight_decay = r.weight_decay ? s.weight_decay : 0.0f;
    ref::adamw(part, g, m, v, rs);
    std::copy(part.begin(), part.end(), want.begin() + r.master);
    for (int64_t i = 0; i < r.count; ++i) want_copy[r.flat + i] = ref::round_to_bf16(part[i]);
  }
  EXPECT_TRUE(close(got, want, kTolF32, "adamw master over two ranges"));
  EXPECT_TRUE(close(got_copy, want_copy, 1e-2, "adamw compute copy at the flat offsets"));
  for (int64_t i : {int64_t{1000}, int64_t{1499}, int64_t{2200}, n - 1}) {
    EXPECT_EQ(got_copy[i], 0.0) << "copy element " << i << " is in no range";
  }
  EXPECT_EQ(got_copy[5], ref::round_to_bf16(got[705]));
  EXPECT_EQ(got_copy[1500], ref::round_to_bf16(got[0]));
}

INSTANTIATE_TEST_SUITE_P(ComputeCopy, AdamWKernel, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == 0   ? "none"
                                              : info.param == 1 ? "f32"
                                                                : "bf16");
                         });

}  // namespace
}  // namespace jumbo::test
