// The double-precision reference checked against itself: every layer's backward against
// central finite differences of its forward, plus a few hand-computed forward values. The
// backend tests trust this reference, so it must be right first.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "backend_test_support.h"

namespace jumbo::test {
namespace {

// Finite differences: a step of 1e-5 in double gives truncation error ~1e-10 and round-off
// ~1e-11 on these O(1) losses, so 1e-6 relative (to the gradient's largest entry) is tight.
constexpr double kStep = 1e-5;
constexpr double kFdTol = 1e-6;

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of loss(x) at every element of x.
Vec finite_difference(const std::function<double(const Vec&)>& loss, const Vec& x) {
  Vec grad(x.size());
  Vec probe = x;
  for (size_t i = 0; i < x.size(); ++i) {
    probe[i] = x[i] + kStep;
    const double up = loss(probe);
    probe[i] = x[i] - kStep;
    const double down = loss(probe);
    probe[i] = x[i];
    grad[i] = (up - down) / (2 * kStep);
  }
  return grad;
}

TEST(ReferenceGradcheck, LayerNorm) {
  const int64_t N = 6, C = 10;
  const double eps = 1e-5;
  Rng rng(1);
  const Vec x = rng.normal(N * C, 1.5), w = rng.uniform(C, 0.5, 1.5), b = rng.uniform(C);
  const Vec g = rng.normal(N * C);  // loss = sum(out * g), so dout = g
  const auto fwd = ref::layernorm_fwd(x, w, b, N, C, eps);
  Vec dx(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
  ref::layernorm_bwd(dx, dw, db, g, x, w, fwd.mean, fwd.rstd, N, C);

  auto loss_x = [&](const Vec& v) { return dot(ref::layernorm_fwd(v, w, b, N, C, eps).out, g); };
  auto loss_w = [&](const Vec& v) { return dot(ref::layernorm_fwd(x, v, b, N, C, eps).out, g); };
  auto loss_b = [&](const Vec& v) { return dot(ref::layernorm_fwd(x, w, v, N, C, eps).out, g); };
  EXPECT_TRUE(close(dx, finite_difference(loss_x, x), kFdTol, "layernorm dx vs FD"));
  EXPECT_TRUE(close(dw, finite_difference(loss_w, w), kFdTol, "layernorm dweight vs FD"));
  EXPECT_TRUE(close(db, finite_difference(loss_b, b), kFdTol, "layernorm dbias vs FD"));
}

TEST(ReferenceGradcheck, LayerNormForwardKnownValues) {
  // Row [1, 2, 3]: mean 2, biased variance 2/3.
  const auto r = ref::layernorm_fwd({1, 2, 3}, {1, 2, 1}, {0, 0, 0.5}, 1, 3, 0.0);
  const double rstd = 1.0 / std::sqrt(2.0 / 3.0);
  EXPECT_DOUBLE_EQ(r.mean[0], 2.0);
  EXPECT_DOUBLE_EQ(r.rstd[0], rstd);
  EXPECT_DOUBLE_EQ(r.out[0], -rstd);
  EXPECT_DOUBLE_EQ(r.out[1], 0.0);
  EXPECT_DOUBLE_EQ(r.out[2], rstd + 0.5);
}

TEST(ReferenceGradcheck, Linear) {
  const int64_t N = 5, I = 7, O = 3;
  Rng rng(2);
  const Vec in = rng.normal(N * I), w = rng.normal(O * I), b = rng.normal(O), g = rng.normal(N * O);
  Vec din(N * I, 0.0), dw(O * I, 0.0), db(O, 0.0);
  ref::linear_bwd(&din, dw, &db, g, in, w, N, I, O);

  auto loss_in = [&](const Vec& v) { return dot(ref::linear_fwd(v, w, b, N, I, O), g); };
  auto loss_w = [&](const Vec& v) { return dot(ref::linear_fwd(in, v, b, N, I, O), g); };
  auto loss_b = [&](const Vec& v) { return dot(ref::linear_fwd(in, w, v, N, I, O), g); };
  EXPECT_TRUE(close(din, finite_difference(loss_in, in), kFdTol, "linear din vs FD"));
  EXPECT_TRUE(close(dw, finite_difference(loss_w, w), kFdTol, "linear dweight vs FD"));
  EXPECT_TRUE(close(db, finite_difference(loss_b, b), kFdTol, "linear dbias vs FD"));

  // Known value: [1 2] @ [[3 4] [5 6]]^T + [0.5 -1] = [11.5 16].
  const Vec out = ref::linear_fwd({1, 2}, {3, 4, 5, 6}, {0.5, -1}, 1, 2, 2);
  EXPECT_DOUBLE_EQ(out[0], 11.5);
  EXPECT_DOUBLE_EQ(out[1], 16.0);
}

TEST(ReferenceGradcheck, Attention) {
  const ref::AttentionShape s{2, 5, 2, 3};
  const int64_t n_qkv = s.B * s.T * s.H * 3 * s.D;
  Rng rng(3);
  const Vec qkv = rng.normal(n_qkv), g = rng.normal(s.B * s.T * s.H * s.D);
  Vec out, probs;
  ref::attention_fwd(out, probs, qkv, s);
  const Vec dqkv = ref::attention_bwd(g, qkv, probs, s);
  auto loss = [&](const Vec& v) {
    Vec o, p;
    ref::attention_fwd(o, p, v, s);
    return dot(o, g);
  };
  EXPECT_TRUE(close(dqkv, finite_difference(loss, qkv), kFdTol, "attention dqkv vs FD"));

  // Probabilities: rows sum to one, zero above the diagonal; the first token sees only itself.
  for (int64_t bh = 0; bh < s.B * s.H; ++bh)
    for (int64_t t = 0; t < s.T; ++t) {
      double row = 0;
      for (int64_t u = 0; u < s.T; ++u) {
        const double p = probs[(bh * s.T + t) * s.T + u];
        if (u > t) {
          EXPECT_EQ(p, 0.0);
        }
        row += p;
      }
      EXPECT_NEAR(row, 1.0, 1e-12);
    }
  for (int64_t h = 0; h < s.H; ++h)  // out[b=0,t=0,h] = v[b=0,t=0,h]
    for (int64_t d = 0; d < s.D; ++d)
      EXPECT_DOUBLE_EQ(out[h * s.D + d], qkv[(h * 3 + 2) * s.D + d]);
}

TEST(ReferenceGradcheck, GroupedQueryAttention) {
  // Multi-query (G = 1), two groups of two, and packed sequences with groups: a key or value
  // head's gradient must collect from every query head of its group.
  struct Case {
    ref::AttentionShape s;
    Ids positions;
  };
  const Ids packed{0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5};  // rows of 6: [3, 2, 1] and [6]
  for (const Case& c : {Case{{2, 5, 3, 3, 1}, {}}, Case{{2, 4, 4, 2, 2}, {}},
                        Case{{2, 6, 4, 2, 2}, packed}}) {
    const ref::AttentionShape& s = c.s;
    SCOPED_TRACE("H=" + std::to_string(s.H) + " G=" + std::to_string(s.G) +
                 (c.positions.empty() ? "" : " packed"));
    Rng rng(7);
    const Vec qkv = rng.normal(s.B * s.T * s.width()), g = rng.normal(s.B * s.T * s.H * s.D);
    Vec out, probs;
    ref::attention_fwd(out, probs, qkv, s, c.positions);
    const Vec dqkv = ref::attention_bwd(g, qkv, probs, s, c.positions);
    auto loss = [&](const Vec& v) {
      Vec o, p;
      ref::attention_fwd(o, p, v, s, c.positions);
      return dot(o, g);
    };
    EXPECT_TRUE(close(dqkv, finite_difference(loss, qkv), kFdTol, "GQA attention dqkv vs FD"));
    // Token 0 sees only itself: each query head of group g outputs the group's value.
    const int64_t R = s.H / s.G;
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t d = 0; d < s.D; ++d)
        EXPECT_DOUBLE_EQ(out[h * s.D + d], qkv[((h / R) * (R + 2) + R + 1) * s.D + d]);
  }
}

TEST(ReferenceGradcheck, RmsNorm) {
  const int64_t N = 6, C = 10;
  const double eps = 1e-5;
  Rng rng(8);
  const Vec x = rng.normal(N * C, 1.5), w = rng.uniform(C, 0.5, 1.5), g = rng.normal(N * C);
  const auto fwd = ref::rmsnorm_fwd(x, w, N, C, eps);
  Vec dx(N * C, 0.0), dw(C, 0.0);
  ref::rmsnorm_bwd(dx, &dw, g, x, w, fwd.rstd, N, C);
  auto loss_x = [&](const Vec& v) { return dot(ref::rmsnorm_fwd(v, w, N, C, eps).out, g); };
  auto loss_w = [&](const Vec& v) { return dot(ref::rmsnorm_fwd(x, v, N, C, eps).out, g); };
  EXPECT_TRUE(close(dx, finite_difference(loss_x, x), kFdTol, "rmsnorm dx vs FD"));
  EXPECT_TRUE(close(dw, finite_difference(loss_w, w), kFdTol, "rmsnorm dweight vs FD"));
  // Without dweight, dx is the same.
  Vec dx2(N * C, 0.0);
  ref::rmsnorm_bwd(dx2, nullptr, g, x, w, fwd.rstd, N, C);
  EXPECT_EQ(dx2, dx);
  // Known value: [3, 4] has mean square 12.5.
  const auto r = ref::rmsnorm_fwd({3, 4}, {1, 2}, 1, 2, 0.0);
  EXPECT_DOUBLE_EQ(r.rstd[0], 1.0 / std::sqrt(12.5));
  EXPECT_DOUBLE_EQ(r.out[1], 8.0 / std::sqrt(12.5));
}

TEST(ReferenceGradcheck, Swiglu) {
  const int64_t N = 4, F = 9;
  Rng rng(9);
  const Vec gu = rng.uniform(N * 2 * F, -6.0, 6.0), g = rng.normal(N * F);
  auto loss = [&](const Vec& v) { return dot(ref::swiglu_fwd(v, N, F), g); };
  EXPECT_TRUE(close(ref::swiglu_bwd(g, gu, N, F), finite_difference(loss, gu), kFdTol,
                    "swiglu dgate_up vs FD"));
  // silu(1) * 2 = 2 / (1 + e^-1).
  EXPECT_NEAR(ref::swiglu_fwd({1.0, 2.0}, 1, 1)[0], 2.0 / (1.0 + std::exp(-1.0)), 1e-15);
}

TEST(ReferenceGradcheck, RopeInverseIsTheTranspose) {
  // rope is linear in qkv, so its backward is its transpose: <rope(x), y> = <x, rope^T(y)>,
  // and the transpose of a rotation is the rotation by minus the angle (the inverse).
  const int64_t N = 5, G = 2, R = 2, D = 6, P = 9;
  const int64_t W = G * (R + 2) * D;
  Rng rng(10);
  const Vec table = ref::rope_table(P, D, 10000.0);
  const Ids positions{0, 3, 8, 1, 3};
  const Vec x = rng.normal(N * W), y = rng.normal(N * W);
  const double lhs = dot(ref::rope(x, table, positions, G, D, false), y);
  const double rhs = dot(x, ref::rope(y, table, positions, G, D, true));
  EXPECT_NEAR(lhs, rhs, 1e-12 * std::fabs(lhs) + 1e-12);
  EXPECT_TRUE(close(ref::rope(ref::rope(x, table, positions, G, D, false), table, positions, G,
                              D, true),
                    x, 1e-14, "rope inverse after rope"));
  // Value heads are untouched; position 0 turns nothing.
  const Vec turned = ref::rope(x, table, positions, G, D, false);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d) {
      const int64_t v = 3 * W + (g * (R + 2) + R + 1) * D + d;
      EXPECT_EQ(turned[v], x[v]);
    }
  for (int64_t i = 0; i < W; ++i) EXPECT_EQ(turned[i], x[i]);
  // Known value, D = 2: (1, 0) at angle a becomes (cos a, sin a); the first frequency is 1.
  const Vec t2 = ref::rope_table(4, 2, 10000.0);
  const Vec one = ref::rope({1, 0, 0, 0, 0, 0}, t2, {3}, 1, 2, false);
  EXPECT_NEAR(one[0], std::cos(3.0), 1e-15);
  EXPECT_NEAR(one[1], std::sin(3.0), 1e-15);
}

TEST(ReferenceGradcheck, Gelu) {
  Rng rng(4);
  Vec x = rng.uniform(40, -6.0, 6.0);
  x.push_back(0.0);
  const Vec g = rng.normal(x.size());
  auto loss = [&](const Vec& v) { return dot(ref::gelu_fwd(v), g); };
  EXPECT_TRUE(close(ref::gelu_bwd(g, x), finite_difference(loss, x), kFdTol, "gelu vs FD"));
  // tanh form at 1: 0.5 * (1 + tanh(sqrt(2/pi) * 1.044715)).
  EXPECT_NEAR(ref::gelu(1.0), 0.8411919906082768, 1e-15);
  EXPECT_EQ(ref::gelu(0.0), 0.0);
  EXPECT_NEAR(ref::gelu_grad(0.0), 0.5, 1e-15);
}

TEST(ReferenceGradcheck, Embeddings) {
  // A vocab slice [7, 12) of a 15-token vocabulary: tokens 3..14 include some outside it.
  const int64_t B = 2, T = 3, C = 4, rows = 5, vocab_start = 7, wpe_rows = 6;
  Rng rng(5);
  const Ids tokens{3, 7, 11, 12, 9, 7};
  const Vec wte = rng.normal(rows * C), wpe = rng.normal(wpe_rows * C), g = rng.normal(B * T * C);
  auto forward = [&](const Vec& te, const Vec& pe) {
    Vec out = ref::token_embedding_fwd(tokens, te, rows, C, vocab_start);
    ref::position_embedding_fwd(out, pe, B, T, C);
    return out;
  };
  Vec dwte(rows * C, 0.0), dwpe(wpe_rows * C, 0.0);
  ref::token_embedding_bwd(dwte, g, tokens, rows, C, vocab_start);
  ref::position_embedding_bwd(dwpe, g, B, T, C);
  auto loss_te = [&](const Vec& v) { return dot(forward(v, wpe), g); };
  auto loss_pe = [&](const Vec& v) { return dot(forward(wte, v), g); };
  EXPECT_TRUE(close(dwte, finite_difference(loss_te, wte), kFdTol, "token embedding vs FD"));
  EXPECT_TRUE(close(dwpe, finite_difference(loss_pe, wpe), kFdTol, "position embedding vs FD"));

  const Vec out = ref::token_embedding_fwd(tokens, wte, rows, C, vocab_start);
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(out[0 * C + c], 0.0);  // token 3 is below the slice
    EXPECT_EQ(out[3 * C + c], 0.0);  // token 12 is past it
    EXPECT_EQ(out[1 * C + c], wte[0 * C + c]);  // token 7 is the slice's first row
    EXPECT_EQ(dwpe[(wpe_rows - 1) * C + c], 0.0);  // positions past T get no gradient
  }
}

TEST(ReferenceGradcheck, CrossEntropyFromTwoVocabSlices) {
  // Vocabulary 11 split as two tensor-parallel ranks would: [0, 5) and [5, 11). The parts,
  // combined as the all-reduces would, must give log-softmax loss and its gradient.
  const int64_t N = 6, V = 11, split = 5;
  Rng rng(6);
  const Vec logits = rng.normal(N * V, 2.0);
  const Ids targets{0, 4, 5, 10, 7, 2};
  auto slice = [&](const Vec& full, int64_t start, int64_t width) {
    Vec out(N * width);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t v = 0; v < width; ++v) out[n * width + v] = full[n * V + start + v];
    return out;
  };
  struct Parts {
    Vec max, sumexp, target, loss;
  };
  auto parts = [&](const Vec& full) {
    const Vec a = slice(full, 0, split), b = slice(full, split, V - split);
    const Vec max_a = ref::ce_local_max(a, N, split), max_b = ref::ce_local_max(b, N, V - split);
    Parts p{Vec(N), Vec(N), Vec(N), {}};
    for (int64_t n = 0; n < N; ++n) p.max[n] = std::max(max_a[n], max_b[n]);  // all-reduce max
    const Vec s_a = ref::ce_local_sumexp(a, p.max, N, split);
    const Vec s_b = ref::ce_local_sumexp(b, p.max, N, V - split);
    const Vec t_a = ref::ce_target_logit(a, targets, N, split, 0);
    const Vec t_b = ref::ce_target_logit(b, targets, N, V - split, split);
    for (int64_t n = 0; n < N; ++n) {
      p.sumexp[n] = s_a[n] + s_b[n];  // all-reduce sum
      p.target[n] = t_a[n] + t_b[n];  // all-reduce sum: exactly one slice holds the target
      EXPECT_TRUE((t_a[n] == 0) != (t_b[n] == 0)) << "token " << n;
    }
    p.loss = ref::ce_loss(p.max, p.sumexp, p.target);
    return p;
  };
  const Parts p = parts(logits);
  EXPECT_TRUE(close(p.loss, ref::cross_entropy_direct(logits, targets, N, V), 1e-14,
                    "loss from parts vs direct log-softmax"));

  // Gradient of the mean loss: each slice's ce_bwd with the global max and sum, scale 1/N.
  const Vec d_a = ref::ce_bwd(slice(logits, 0, split), p.max, p.sumexp, targets, N, split, 0,
                              1.0 / N);
  const Vec d_b = ref::ce_bwd(slice(logits, split, V - split), p.max, p.sumexp, targets, N,
                              V - split, split, 1.0 / N);
  Vec grad(N * V);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v)
      grad[n * V + v] = v < split ? d_a[n * split + v] : d_b[n * (V - split) + v - split];
  auto mean_loss = [&](const Vec& l) {
    double s = 0;
    for (double x : parts(l).loss) s += x;
    return s / N;
  };
  EXPECT_TRUE(close(grad, finite_difference(mean_loss, logits), kFdTol, "cross-entropy vs FD"));
}

TEST(ReferenceGradcheck, AdamWFirstStepKnownValue) {
  // Step 1: mhat = g, vhat = g^2, so the update is lr * (g / (|g| + eps) + wd * p).
  Vec p{1.0, -2.0}, m{0, 0}, v{0, 0};
  AdamWStep s;
  s.lr = 0.1f;
  s.weight_decay = 0.5f;
  s.eps = 0;
  s.grad_scale = 0.5f;
  ref::adamw(p, {4.0, -6.0}, m, v, s);
  EXPECT_NEAR(p[0], 1.0 - 0.1 * (1.0 + 0.5 * 1.0), 1e-7);   // f32 betas: ~1e-8 off
  EXPECT_NEAR(p[1], -2.0 - 0.1 * (-1.0 - 0.5 * 2.0), 1e-7);
  EXPECT_NEAR(m[0], (1 - 0.9) * 2.0, 1e-7);
  EXPECT_NEAR(v[1], (1 - 0.95) * 9.0, 1e-6);
}

TEST(ReferenceGradcheck, Bf16RoundingReference) {
  EXPECT_EQ(ref::round_to_bf16(1.0 + std::ldexp(1.0, -8)), 1.0);  // tie: to even (down)
  EXPECT_EQ(ref::round_to_bf16(1.0 + 3 * std::ldexp(1.0, -8)), 1.0 + std::ldexp(1.0, -6));
  EXPECT_EQ(ref::round_to_bf16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -20)),
            1.0 + std::ldexp(1.0, -7));
  EXPECT_EQ(ref::round_to_bf16(-3.0), -3.0);
  EXPECT_TRUE(std::isnan(ref::round_to_bf16(std::nan(""))));
  EXPECT_TRUE(std::isinf(ref::round_to_bf16(3.4e38)));
}

}  // namespace
}  // namespace jumbo::test
