// CPU backend vs the double reference for the Llama-family kernels (RMSNorm, SwiGLU, rotary
// embedding, grouped-query attention in training and over a KV cache), for f32 and bf16
// storage, in test_kernels_layers.cpp's manner: inputs rounded to the storage dtype first,
// "=" outputs poisoned with NaN, "+=" outputs pre-filled with random values.
#include <gtest/gtest.h>

#include <stdexcept>

#include "backend_test_support.h"

namespace jumbo::test {
namespace {

class LlamaKernels : public DTypeKernelTest {
 protected:
  LlamaKernels() : DTypeKernelTest(43) {}
};

std::string shape_name(const ref::AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
         " G=" + std::to_string(s.kv()) + " D=" + std::to_string(s.D);
}

// Multi-query, two groups of two, groups of four, and multi-head (G = H).
const ref::AttentionShape kGqaShapes[] = {
    {2, 5, 3, 3, 1}, {2, 33, 4, 16, 2}, {1, 40, 8, 64, 2}, {2, 17, 2, 8, 2}};

TEST_P(LlamaKernels, RmsNormForwardAndBackward) {
  const float eps = 1e-5f;
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{6, 10}, {19, 203}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    Vec x = rng.normal(N * C, 2.0);
    for (auto& v : x) v += 0.7;  // rms is not the standard deviation
    x = round_to(dt(), x);
    const Vec w = round_to(dt(), rng.uniform(C, 0.5, 1.5));
    Tensor t_x = kb.upload(dt(), {N, C}, x), t_w = kb.upload(dt(), {C}, w);
    Tensor out = kb.poisoned(dt(), {N, C}), rstd = kb.poisoned(DType::f32, {N});
    kb.be().rmsnorm_fwd(out, rstd, t_x, t_w, eps);
    const auto want = ref::rmsnorm_fwd(x, w, N, C, eps);
    EXPECT_TRUE(close(kb.download(out), want.out, tol(), tag("rmsnorm_fwd out")));
    EXPECT_TRUE(close(kb.download(rstd), want.rstd, kTolF32, tag("rmsnorm_fwd rstd")));

    const Vec rstd32 = round_to(DType::f32, want.rstd);
    const Vec dout = round_to(dt(), rng.normal(N * C));
    Vec dx = round_to(dt(), rng.normal(N * C)), dw = round_to(DType::f32, rng.normal(C));
    Tensor t_dx = kb.upload(dt(), {N, C}, dx), t_dw = kb.upload(DType::f32, {C}, dw);
    Tensor t_dout = kb.upload(dt(), {N, C}, dout), t_rstd = kb.upload(DType::f32, {N}, rstd32);
    kb.be().rmsnorm_bwd(t_dx, t_dw, t_dout, t_x, t_w, t_rstd);
    ref::rmsnorm_bwd(dx, &dw, dout, x, w, rstd32, N, C);
    EXPECT_TRUE(close(kb.download(t_dx), dx, tol(), tag("rmsnorm_bwd dx +=")));
    EXPECT_TRUE(close(kb.download(t_dw), dw, kTolF32, tag("rmsnorm_bwd dweight +=")));

    // A frozen weight: no dweight, dx accumulates again.
    dx = kb.download(t_dx);
    const Vec dw_before = kb.download(t_dw);
    kb.be().rmsnorm_bwd(t_dx, Tensor{}, t_dout, t_x, t_w, t_rstd);
    ref::rmsnorm_bwd(dx, nullptr, dout, x, w, rstd32, N, C);
    EXPECT_TRUE(close(kb.download(t_dx), dx, tol(), tag("rmsnorm_bwd dx +=, empty dweight")));
    EXPECT_TRUE(close(kb.download(t_dw), dw_before, 0.0, tag("rmsnorm_bwd without dweight")));
  }
}

TEST_P(LlamaKernels, SwigluForwardAndBackward) {
  for (const auto& [N, F] : {std::pair<int64_t, int64_t>{3, 5}, {17, 203}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " F=" + std::to_string(F));
    Vec gu = rng.normal(N * 2 * F, 3.0);
    gu[0] = -100.0, gu[1] = 100.0, gu[2] = -30.0;  // saturated gates: silu ~ 0 and ~ x
    gu = round_to(dt(), gu);
    Tensor t_gu = kb.upload(dt(), {N, 2 * F}, gu);
    Tensor out = kb.poisoned(dt(), {N, F});
    kb.be().swiglu_fwd(out, t_gu);
    EXPECT_TRUE(close(kb.download(out), ref::swiglu_fwd(gu, N, F), tol(), tag("swiglu_fwd")));

    const Vec dout = round_to(dt(), rng.normal(N * F));
    Tensor dgu = kb.poisoned(dt(), {N, 2 * F});
    kb.be().swiglu_bwd(dgu, kb.upload(dt(), {N, F}, dout), t_gu);
    EXPECT_TRUE(close(kb.download(dgu), ref::swiglu_bwd(dout, gu, N, F), tol(),
                      tag("swiglu_bwd dgate_up")));
  }
}

TEST_P(LlamaKernels, RopeTurnsQueriesAndKeys) {
  // (G, R, D) with positions one per row and as a KV cache's (slot, position) pairs.
  struct Case {
    int64_t G, R, D;
  };
  const int64_t N = 7, P = 50;
  for (const Case c : {Case{1, 3, 8}, Case{2, 2, 64}, Case{3, 1, 6}}) {
    for (const bool pairs : {false, true}) {
      SCOPED_TRACE("G=" + std::to_string(c.G) + " R=" + std::to_string(c.R) + " D=" +
                   std::to_string(c.D) + (pairs ? " positions [N, 2]" : " positions [N]"));
      const int64_t W = c.G * (c.R + 2) * c.D;
      const Vec table = round_to(DType::f32, ref::rope_table(P, c.D, 10000.0));
      const Ids pos = rng.ints(N, 0, P - 1);
      Ids rows;
      for (int64_t n = 0; n < N; ++n) {
        rows.insert(rows.end(), {static_cast<int32_t>(n % 3), pos[n]});
      }
      Tensor t_pos = pairs ? kb.upload_ids({N, 2}, rows) : kb.upload_ids({N}, pos);
      Tensor t_table = kb.upload(DType::f32, {P, c.D}, table);
      const Vec x = round_to(dt(), rng.normal(N * W));
      Tensor t_x = kb.upload(dt(), {N, W}, x);
      kb.be().rope(t_x, t_table, t_pos, c.G, RopeDirection::forward);
      const Vec turned = kb.download(t_x), want = ref::rope(x, table, pos, c.G, c.D, false);
      EXPECT_TRUE(close(turned, want, tol(), tag("rope forward")));
      int64_t values_moved = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < c.G; ++g)
          for (int64_t d = 0; d < c.D; ++d) {
            const int64_t i = n * W + (g * (c.R + 2) + c.R + 1) * c.D + d;
            values_moved += turned[i] != x[i];
          }
      EXPECT_EQ(values_moved, 0) << tag("rope moved a value head");

      // The inverse of the stored values, as the backward runs it on dqkv.
      kb.be().rope(t_x, t_table, t_pos, c.G, RopeDirection::inverse);
      EXPECT_TRUE(close(kb.download(t_x), ref::rope(turned, table, pos, c.G, c.D, true), tol(),
                        tag("rope inverse")));
      EXPECT_TRUE(close(kb.download(t_x), x, 2 * tol(), tag("rope inverse after forward")));
    }
  }
}

TEST_P(LlamaKernels, RopeRefusesAPositionPastTheTable) {
  const int64_t D = 4, P = 3;
  Tensor table = kb.upload(DType::f32, {P, D}, round_to(DType::f32, ref::rope_table(P, D, 1e4)));
  Tensor qkv = kb.upload(dt(), {2, 3 * D}, Vec(6 * D, 1.0));
  EXPECT_THROW(kb.be().rope(qkv, table, kb.upload_ids({2}, {0, 3}), 1, RopeDirection::forward),
               std::logic_error);
  EXPECT_THROW(kb.be().rope(qkv, table, kb.upload_ids({2}, {-1, 0}), 1, RopeDirection::forward),
               std::logic_error);
}

TEST_P(LlamaKernels, GroupedQueryAttentionForwardAndBackward) {
  for (const ref::AttentionShape& s : kGqaShapes) {
    SCOPED_TRACE(shape_name(s));
    const int64_t n_out = s.B * s.T * s.H * s.D;
    const Vec qkv = round_to(dt(), rng.normal(s.B * s.T * s.width(), 1.5));
    Tensor t_qkv = kb.upload(dt(), {s.B, s.T, s.width()}, qkv);
    Tensor out = kb.poisoned(dt(), {s.B, s.T, s.H * s.D});
    Tensor probs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
    kb.be().attention_fwd(out, probs, t_qkv, s.kv());
    Vec want_out, want_probs;
    ref::attention_fwd(want_out, want_probs, qkv, s);
    EXPECT_TRUE(close(kb.download(out), want_out, tol(), tag("attention_fwd out")));
    EXPECT_TRUE(close(kb.download(probs), want_probs, kTolF32, tag("attention_fwd probs")));

    const Vec dout = round_to(dt(), rng.normal(n_out));
    const Vec probs32 = round_to(DType::f32, want_probs);
    Tensor dqkv = kb.poisoned(dt(), {s.B, s.T, s.width()});
    Tensor dprobs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
    kb.be().attention_bwd(dqkv, dprobs, kb.upload(dt(), {s.B, s.T, s.H * s.D}, dout), t_qkv, out,
                          kb.upload(DType::f32, {s.B, s.H, s.T, s.T}, probs32), s.kv());
    EXPECT_TRUE(close(kb.download(dqkv), ref::attention_bwd(dout, qkv, probs32, s), tol(),
                      tag("attention_bwd dqkv")));
  }
}

TEST_P(LlamaKernels, GroupedQueryAttentionWithPackedSequences) {
  // Rows of 12 tokens holding sequences of 5, 1, 6 and of 12.
  const ref::AttentionShape s{2, 12, 4, 8, 2};
  Ids pos;
  for (const int64_t len : {5, 1, 6, 12})
    for (int64_t j = 0; j < len; ++j) pos.push_back(static_cast<int32_t>(j));
  const Vec qkv = round_to(dt(), rng.normal(s.B * s.T * s.width(), 1.5));
  Tensor t_qkv = kb.upload(dt(), {s.B, s.T, s.width()}, qkv);
  Tensor t_pos = kb.upload_ids({s.B * s.T}, pos);
  Tensor out = kb.poisoned(dt(), {s.B, s.T, s.H * s.D});
  Tensor probs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
  kb.be().attention_fwd(out, probs, t_qkv, s.kv(), t_pos);
  Vec want_out, want_probs;
  ref::attention_fwd(want_out, want_probs, qkv, s, pos);
  EXPECT_TRUE(close(kb.download(out), want_out, tol(), tag("packed attention_fwd out")));
  EXPECT_TRUE(close(kb.download(probs), want_probs, kTolF32, tag("packed attention_fwd probs")));
  const Vec dout = round_to(dt(), rng.normal(s.B * s.T * s.H * s.D));
  Tensor dqkv = kb.poisoned(dt(), {s.B, s.T, s.width()});
  Tensor dprobs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
  const Vec probs32 = round_to(DType::f32, want_probs);
  kb.be().attention_bwd(dqkv, dprobs, kb.upload(dt(), {s.B, s.T, s.H * s.D}, dout), t_qkv, out,
                        kb.upload(DType::f32, {s.B, s.H, s.T, s.T}, probs32), s.kv(), t_pos);
  EXPECT_TRUE(close(kb.download(dqkv), ref::attention_bwd(dout, qkv, probs32, s, pos), tol(),
                    tag("packed attention_bwd dqkv")));
}

TEST_P(LlamaKernels, GroupedQueryAttentionIsMultiHeadWithSharedKeys) {
  // GQA equals multi-head attention whose heads carry copies of their group's k and v: the
  // forward and dq bit for bit (the same sgemms on the same values), dk and dv as the sums
  // of the copies' gradients.
  const ref::AttentionShape s{2, 21, 6, 16, 2};
  const int64_t R = s.H / s.G, W = s.width(), W3 = 3 * s.H * s.D, D = s.D;
  const Vec qkv = round_to(dt(), rng.normal(s.B * s.T * W, 1.5));
  Vec mha(s.B * s.T * W3);
  for (int64_t n = 0; n < s.B * s.T; ++n)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t grp = n * W + (h / R) * (R + 2) * D;
        mha[n * W3 + h * 3 * D + d] = qkv[grp + (h % R) * D + d];
        mha[n * W3 + h * 3 * D + D + d] = qkv[grp + R * D + d];
        mha[n * W3 + h * 3 * D + 2 * D + d] = qkv[grp + (R + 1) * D + d];
      }
  Tensor t_qkv = kb.upload(dt(), {s.B, s.T, W}, qkv), t_mha = kb.upload(dt(), {s.B, s.T, W3}, mha);
  Tensor out = kb.poisoned(dt(), {s.B, s.T, s.H * D});
  Tensor out_mha = kb.poisoned(dt(), {s.B, s.T, s.H * D});
  Tensor probs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
  Tensor probs_mha = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
  kb.be().attention_fwd(out, probs, t_qkv, s.G);
  kb.be().attention_fwd(out_mha, probs_mha, t_mha, s.H);
  EXPECT_EQ(kb.download(out), kb.download(out_mha)) << tag("GQA out vs MHA out");
  EXPECT_EQ(kb.download(probs), kb.download(probs_mha)) << tag("GQA probs vs MHA probs");

  Tensor dout =
      kb.upload(dt(), {s.B, s.T, s.H * D}, round_to(dt(), rng.normal(s.B * s.T * s.H * D)));
  Tensor dqkv = kb.poisoned(dt(), {s.B, s.T, W}), dmha = kb.poisoned(dt(), {s.B, s.T, W3});
  Tensor dprobs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
  kb.be().attention_bwd(dqkv, dprobs, dout, t_qkv, out, probs, s.G);
  kb.be().attention_bwd(dmha, dprobs, dout, t_mha, out_mha, probs_mha, s.H);
  const Vec got = kb.download(dqkv), per_head = kb.download(dmha);
  Vec want(got.size(), 0.0);
  int64_t dq_differs = 0;
  for (int64_t n = 0; n < s.B * s.T; ++n)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t grp = n * W + (h / R) * (R + 2) * D, at = n * W3 + h * 3 * D + d;
        want[grp + (h % R) * D + d] = per_head[at];
        want[grp + R * D + d] += per_head[at + D];
        want[grp + (R + 1) * D + d] += per_head[at + 2 * D];
        dq_differs += got[grp + (h % R) * D + d] != per_head[at];
      }
  EXPECT_EQ(dq_differs, 0) << tag("GQA dq vs MHA dq");
  EXPECT_TRUE(close(got, want, tol(), tag("GQA dk, dv vs the sums of MHA's")));
}

// Backend rope, then attention, against the reference rotating q and k in double; then the
// backward the model runs: attention_bwd, then the inverse rope on dqkv.
TEST_P(LlamaKernels, RopeThenAttention) {
  const ref::AttentionShape s{2, 19, 4, 16, 2};
  const int64_t N = s.B * s.T, P = 32;
  const Vec table = round_to(DType::f32, ref::rope_table(P, s.D, 10000.0));
  Ids pos;  // the second row holds two sequences, so positions restart
  for (int64_t t = 0; t < s.T; ++t) pos.push_back(static_cast<int32_t>(t));
  for (int64_t t = 0; t < s.T; ++t) pos.push_back(static_cast<int32_t>(t < 7 ? t : t - 7));
  const Vec qkv = round_to(dt(), rng.normal(N * s.width()));
  Tensor t_qkv = kb.upload(dt(), {s.B, s.T, s.width()}, qkv), t_pos = kb.upload_ids({N}, pos);
  Tensor t_table = kb.upload(DType::f32, {P, s.D}, table);
  kb.be().rope(t_qkv, t_table, t_pos, s.G, RopeDirection::forward);
  Tensor out = kb.poisoned(dt(), {s.B, s.T, s.H * s.D});
  Tensor probs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
  kb.be().attention_fwd(out, probs, t_qkv, s.G, t_pos);
  // The kernel stores the turned q and k in the storage dtype: so does the reference.
  const Vec turned = round_to(dt(), ref::rope(qkv, table, pos, s.G, s.D, false));
  Vec want_out, want_probs;
  ref::attention_fwd(want_out, want_probs, turned, s, pos);
  EXPECT_TRUE(close(kb.download(out), want_out, tol(), tag("rope then attention_fwd")));

  const Vec dout = round_to(dt(), rng.normal(N * s.H * s.D));
  Tensor dqkv = kb.poisoned(dt(), {s.B, s.T, s.width()});
  Tensor dprobs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
  kb.be().attention_bwd(dqkv, dprobs, kb.upload(dt(), {s.B, s.T, s.H * s.D}, dout), t_qkv, out,
                        probs, s.G, t_pos);
  kb.be().rope(dqkv, t_table, t_pos, s.G, RopeDirection::inverse);
  const Vec want_d = ref::rope(ref::attention_bwd(dout, turned, want_probs, s, pos), table, pos,
                               s.G, s.D, true);
  EXPECT_TRUE(close(kb.download(dqkv), want_d, tol(), tag("attention_bwd then inverse rope")));
}

TEST_P(LlamaKernels, GroupedQueryAttentionOverKvCache) {
  // The KV-cache test of test_kernels_layers.cpp with kv groups: one sequence's rows through
  // the cache in generation's step shapes against the reference over the whole sequence.
  // Step 1 is a 10-row prefill of slot 1; step 2 a decode row of slot 0, the prefill's 70
  // remaining rows and a 3-row prefill of slot 2 (row by row). Optionally with the rotary
  // embedding applied first at the rows' (slot, position) pairs, as generation runs it. Head
  // sizes with the blocked kernel (16, 64, 128) and without (40).
  const int64_t P = 96;
  for (const auto& [H, G] : {std::pair<int64_t, int64_t>{4, 2}, {3, 1}, {8, 2}}) {
    for (const int64_t d : {16, 64, 128, 40}) {
      for (const bool with_rope : {false, true}) {
        const ref::AttentionShape s{1, 80, H, d, G};
        SCOPED_TRACE(shape_name(s) + (with_rope ? " with rope" : ""));
        const int64_t w = s.width(), hd = H * d;
        const Vec qkv = round_to(dt(), rng.normal(s.T * w, 1.5));
        const Vec table = round_to(DType::f32, ref::rope_table(P, d, 10000.0));
        Ids seq_pos(s.T);
        for (int64_t t = 0; t < s.T; ++t) seq_pos[t] = static_cast<int32_t>(t);
        const Vec turned =
            with_rope ? round_to(dt(), ref::rope(qkv, table, seq_pos, G, d, false)) : qkv;
        Vec want, probs;
        ref::attention_fwd(want, probs, turned, s);
        Tensor k_cache = kb.poisoned(dt(), {3, G, P, d}), v_cache = kb.poisoned(dt(), {3, G, P, d});
        Tensor t_table = kb.upload(DType::f32, {P, d}, table);
        auto run_step = [&](const Ids& rows) {
          const int64_t n = static_cast<int64_t>(rows.size()) / 2;
          Vec step_qkv, expected;
          for (int64_t i = 0; i < n; ++i) {
            const auto at = qkv.begin() + rows[2 * i + 1] * w;
            step_qkv.insert(step_qkv.end(), at, at + w);
            const auto o = want.begin() + rows[2 * i + 1] * hd;
            expected.insert(expected.end(), o, o + hd);
          }
          Tensor t_rows = kb.upload_ids({n, 2}, rows), t_step = kb.upload(dt(), {n, w}, step_qkv);
          if (with_rope) kb.be().rope(t_step, t_table, t_rows, G, RopeDirection::forward);
          Tensor out = kb.poisoned(dt(), {n, hd});
          kb.be().attention_kv_cache(out, t_step, k_cache, v_cache, t_rows);
          return close(kb.download(out), expected, tol(), tag("attention_kv_cache out"));
        };
        Ids step1, step2 = {0, 0};
        for (int32_t p = 0; p < 10; ++p) step1.insert(step1.end(), {1, p});
        for (int32_t p = 10; p < 80; ++p) step2.insert(step2.end(), {1, p});
        for (int32_t p = 0; p < 3; ++p) step2.insert(step2.end(), {2, p});
        EXPECT_TRUE(run_step(step1));
        EXPECT_TRUE(run_step(step2));
        // Decode steps: slot 2 at 3, then at 4 beside slot 1's last row again (two sequences in
        // one step; rewriting position 79 stores the same key and value).
        EXPECT_TRUE(run_step({2, 3}));
        EXPECT_TRUE(run_step({2, 4, 1, 79}));
      }
    }
  }
}

TEST_P(LlamaKernels, KvCacheRefusesAQkvWidthThatIsNotGrouped) {
  // 4 query heads over 2 kv heads of 8: a row is (4 + 2 * 2) * 8 = 64 wide, not 48.
  Tensor kc = kb.poisoned(dt(), {1, 2, 4, 8}), vc = kb.poisoned(dt(), {1, 2, 4, 8});
  Tensor out = kb.poisoned(dt(), {1, 32});
  Tensor rows = kb.upload_ids({1, 2}, {0, 0});
  EXPECT_THROW(kb.be().attention_kv_cache(out, kb.poisoned(dt(), {1, 48}), kc, vc, rows),
               std::logic_error);
  Tensor out3 = kb.poisoned(dt(), {1, 24});  // 3 query heads do not split over 2 kv heads
  EXPECT_THROW(kb.be().attention_kv_cache(out3, kb.poisoned(dt(), {1, 56}), kc, vc, rows),
               std::logic_error);
}

INSTANTIATE_TEST_SUITE_P(Storage, LlamaKernels, ::testing::Values(DType::f32, DType::bf16),
                         DTypeName());

}  // namespace
}  // namespace jumbo::test
