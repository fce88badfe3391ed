// qk-norm (Qwen 3, OLMo 2) against the double reference: it is RMSNorm over each query head
// with one [D] weight and over each key head with another, on the grouped qkv rows
// (backend.h), value heads passed through. f32 and bf16; in place and not, frozen weights.
#include <gtest/gtest.h>

#include "backend_test_support.h"

namespace jumbo::test {
namespace {

class QkNormKernels : public DTypeKernelTest {
 protected:
  QkNormKernels() : DTypeKernelTest(71) {}
};

struct Shape {
  int64_t n, groups, per_group, d;
  int64_t width() const { return groups * (per_group + 2) * d; }
  int64_t q_heads() const { return groups * per_group; }
  // Column of query head h, of key head g, of value head g in a row.
  int64_t q_col(int64_t h) const { return (h / per_group) * (per_group + 2) * d + (h % per_group) * d; }
  int64_t k_col(int64_t g) const { return g * (per_group + 2) * d + per_group * d; }
  int64_t v_col(int64_t g) const { return k_col(g) + d; }
};

// The rows' query heads ([n x H, D]) or key heads ([n x G, D]) as a matrix, and back.
Vec heads(const Vec& qkv, const Shape& s, bool keys) {
  Vec out;
  for (int64_t r = 0; r < s.n; ++r) {
    for (int64_t j = 0; j < (keys ? s.groups : s.q_heads()); ++j) {
      const int64_t c = keys ? s.k_col(j) : s.q_col(j);
      for (int64_t i = 0; i < s.d; ++i) out.push_back(qkv[r * s.width() + c + i]);
    }
  }
  return out;
}
void put_heads(Vec& qkv, const Vec& m, const Shape& s, bool keys) {
  size_t at = 0;
  for (int64_t r = 0; r < s.n; ++r) {
    for (int64_t j = 0; j < (keys ? s.groups : s.q_heads()); ++j) {
      const int64_t c = keys ? s.k_col(j) : s.q_col(j);
      for (int64_t i = 0; i < s.d; ++i) qkv[r * s.width() + c + i] = m[at++];
    }
  }
}

TEST_P(QkNormKernels, IsRmsNormOverEachQueryAndKeyHead) {
  const double tol = tolerance_for(dt());
  const float eps = 1e-6f;
  for (const Shape s : {Shape{3, 1, 1, 8}, Shape{5, 2, 2, 16}, Shape{4, 1, 3, 24}}) {
    SCOPED_TRACE("n=" + std::to_string(s.n) + " G=" + std::to_string(s.groups) +
                 " R=" + std::to_string(s.per_group) + " D=" + std::to_string(s.d));
    const Vec x = round_to(dt(), rng.normal(s.n * s.width(), 1.5));
    const Vec qw = round_to(dt(), rng.uniform(s.d, 0.5, 1.5));
    const Vec kw = round_to(dt(), rng.uniform(s.d, 0.5, 1.5));
    const int64_t normed = s.q_heads() + s.groups;
    Tensor t_x = kb.upload(dt(), {s.n, s.width()}, x);
    Tensor t_qw = kb.upload(dt(), {s.d}, qw), t_kw = kb.upload(dt(), {s.d}, kw);
    Tensor out = kb.poisoned(dt(), {s.n, s.width()}), rstd = kb.poisoned(DType::f32, {s.n, normed});
    kb.be().qk_norm_fwd(out, rstd, t_x, t_qw, t_kw, s.groups, eps);

    const auto q = ref::rmsnorm_fwd(heads(x, s, false), qw, s.n * s.q_heads(), s.d, eps);
    const auto k = ref::rmsnorm_fwd(heads(x, s, true), kw, s.n * s.groups, s.d, eps);
    Vec want = x;  // value heads pass through
    put_heads(want, q.out, s, false);
    put_heads(want, k.out, s, true);
    EXPECT_TRUE(close(kb.download(out), want, tol, tag("qk_norm_fwd out")));
    Vec want_rstd;  // per row: query heads, then key heads
    for (int64_t r = 0; r < s.n; ++r) {
      for (int64_t h = 0; h < s.q_heads(); ++h) want_rstd.push_back(q.rstd[r * s.q_heads() + h]);
      for (int64_t g = 0; g < s.groups; ++g) want_rstd.push_back(k.rstd[r * s.groups + g]);
    }
    const Vec got_rstd = kb.download(rstd);
    EXPECT_TRUE(close(got_rstd, want_rstd, kTolF32, tag("qk_norm_fwd rstd")));

    // Backward, from the kernel's own rstd: dx = each head's rmsnorm_bwd, values passed.
    const Vec dout = round_to(dt(), rng.normal(s.n * s.width()));
    Vec q_rstd, k_rstd;
    for (int64_t r = 0; r < s.n; ++r) {
      for (int64_t j = 0; j < normed; ++j) (j < s.q_heads() ? q_rstd : k_rstd).push_back(got_rstd[r * normed + j]);
    }
    Vec dq(static_cast<size_t>(s.n * s.q_heads() * s.d), 0.0), dk(static_cast<size_t>(s.n * s.groups * s.d), 0.0);
    Vec dqw = round_to(DType::f32, rng.normal(s.d)), dkw = round_to(DType::f32, rng.normal(s.d));
    Tensor t_dqw = kb.upload(DType::f32, {s.d}, dqw), t_dkw = kb.upload(DType::f32, {s.d}, dkw);
    ref::rmsnorm_bwd(dq, &dqw, heads(dout, s, false), heads(x, s, false), qw, q_rstd, s.n * s.q_heads(), s.d);
    ref::rmsnorm_bwd(dk, &dkw, heads(dout, s, true), heads(x, s, true), kw, k_rstd, s.n * s.groups, s.d);
    Vec want_dx = dout;
    put_heads(want_dx, dq, s, false);
    put_heads(want_dx, dk, s, true);
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(in_place ? "in place" : "separate");
      Tensor t_dout = kb.upload(dt(), {s.n, s.width()}, dout);
      Tensor dx = in_place ? t_dout : kb.poisoned(dt(), {s.n, s.width()});
      Tensor t_rstd = kb.upload(DType::f32, {s.n, normed}, got_rstd);
      if (in_place) {  // frozen weights: nothing accumulates
        kb.be().qk_norm_bwd(dx, Tensor{}, Tensor{}, t_dout, t_x, t_qw, t_kw, t_rstd, s.groups);
      } else {
        kb.be().qk_norm_bwd(dx, t_dqw, t_dkw, t_dout, t_x, t_qw, t_kw, t_rstd, s.groups);
      }
      EXPECT_TRUE(close(kb.download(dx), want_dx, tol, tag("qk_norm_bwd dx")));
    }
    EXPECT_TRUE(close(kb.download(t_dqw), dqw, kTolF32, tag("qk_norm_bwd dq_weight +=")));
    EXPECT_TRUE(close(kb.download(t_dkw), dkw, kTolF32, tag("qk_norm_bwd dk_weight +=")));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QkNormKernels, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return dtype_name(info.param); });

}  // namespace
}  // namespace jumbo::test
