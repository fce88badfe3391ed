// CPU backend vs the double reference for the layer kernels (embeddings, layernorm, linear,
// attention), for f32 and bf16 storage. Inputs are rounded to the storage dtype first and the
// reference runs on the rounded values; "=" outputs are poisoned with NaN before each call,
// "+=" outputs are pre-filled with random values so accumulation is checked.
#include <gtest/gtest.h>

#include "backend_test_support.h"

namespace jumbo::test {
namespace {

class LayerKernels : public DTypeKernelTest {
 protected:
  LayerKernels() : DTypeKernelTest(42) {}
};

TEST_P(LayerKernels, TokenEmbeddingWithVocabSlice) {
  // This rank holds vocab rows [13, 24); tokens range over [5, 30] with repeats.
  const int64_t N = 23, C = 37, rows = 11, vocab_start = 13;
  const Ids tokens = rng.ints(N, 5, 30);
  const Vec wte = round_to(dt(), rng.normal(rows * C));
  Tensor t_tokens = kb.upload_ids({N}, tokens);
  Tensor t_wte = kb.upload(dt(), {rows, C}, wte);
  Tensor out = kb.poisoned(dt(), {N, C});
  kb.be().token_embedding_fwd(out, t_tokens, t_wte, vocab_start);
  // A row copy is exact in either dtype; out-of-slice tokens must give exact zeros.
  EXPECT_TRUE(close(kb.download(out), ref::token_embedding_fwd(tokens, wte, rows, C, vocab_start),
                    0.0, tag("token_embedding_fwd (exact)")));

  const Vec dout = round_to(dt(), rng.normal(N * C));
  Vec dwte = round_to(DType::f32, rng.normal(rows * C));  // "+=": starts from known values
  Tensor t_dwte = kb.upload(DType::f32, {rows, C}, dwte);
  kb.be().token_embedding_bwd(t_dwte, kb.upload(dt(), {N, C}, dout), t_tokens, vocab_start);
  ref::token_embedding_bwd(dwte, dout, tokens, rows, C, vocab_start);
  EXPECT_TRUE(close(kb.download(t_dwte), dwte, kTolF32, tag("token_embedding_bwd dwte +=")));
}

TEST_P(LayerKernels, PositionEmbedding) {
  const int64_t B = 3, T = 7, C = 37, wpe_rows = 10;  // T < wpe rows: the rest is unused
  const Vec wpe = round_to(dt(), rng.normal(wpe_rows * C));
  Vec out = round_to(dt(), rng.normal(B * T * C));  // "+=" onto the token embeddings
  Tensor t_out = kb.upload(dt(), {B, T, C}, out);
  kb.be().position_embedding_fwd(t_out, kb.upload(dt(), {wpe_rows, C}, wpe));
  ref::position_embedding_fwd(out, wpe, B, T, C);
  EXPECT_TRUE(close(kb.download(t_out), out, tol(), tag("position_embedding_fwd out +=")));

  const Vec dout = round_to(dt(), rng.normal(B * T * C));
  Vec dwpe = round_to(DType::f32, rng.normal(wpe_rows * C));
  Tensor t_dwpe = kb.upload(DType::f32, {wpe_rows, C}, dwpe);
  kb.be().position_embedding_bwd(t_dwpe, kb.upload(dt(), {B, T, C}, dout));
  ref::position_embedding_bwd(dwpe, dout, B, T, C);
  EXPECT_TRUE(close(kb.download(t_dwpe), dwpe, kTolF32, tag("position_embedding_bwd dwpe +=")));
}

TEST_P(LayerKernels, LayerNormForwardAndBackward) {
  const float eps = 1e-5f;
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{6, 10}, {19, 203}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    // An offset mean and non-unit spread, so mean and rstd matter.
    Vec x = rng.normal(N * C, 2.0);
    for (auto& v : x) v += 0.7;
    x = round_to(dt(), x);
    const Vec w = round_to(dt(), rng.uniform(C, 0.5, 1.5)), b = round_to(dt(), rng.uniform(C));
    Tensor t_x = kb.upload(dt(), {N, C}, x);
    Tensor t_w = kb.upload(dt(), {C}, w), t_b = kb.upload(dt(), {C}, b);
    Tensor out = kb.poisoned(dt(), {N, C});
    Tensor mean = kb.poisoned(DType::f32, {N}), rstd = kb.poisoned(DType::f32, {N});
    kb.be().layernorm_fwd(out, mean, rstd, t_x, t_w, t_b, eps);
    const auto want = ref::layernorm_fwd(x, w, b, N, C, eps);
    EXPECT_TRUE(close(kb.download(out), want.out, tol(), tag("layernorm_fwd out")));
    EXPECT_TRUE(close(kb.download(mean), want.mean, kTolF32, tag("layernorm_fwd mean")));
    EXPECT_TRUE(close(kb.download(rstd), want.rstd, kTolF32, tag("layernorm_fwd rstd")));

    // Backward from the reference's statistics as f32, which the reference also uses.
    const Vec mean32 = round_to(DType::f32, want.mean), rstd32 = round_to(DType::f32, want.rstd);
    const Vec dout = round_to(dt(), rng.normal(N * C));
    Vec dx = round_to(dt(), rng.normal(N * C));
    Vec dw = round_to(DType::f32, rng.normal(C)), db = round_to(DType::f32, rng.normal(C));
    Tensor t_dx = kb.upload(dt(), {N, C}, dx);
    Tensor t_dw = kb.upload(DType::f32, {C}, dw), t_db = kb.upload(DType::f32, {C}, db);
    kb.be().layernorm_bwd(t_dx, t_dw, t_db, kb.upload(dt(), {N, C}, dout), t_x, t_w,
                          kb.upload(DType::f32, {N}, mean32), kb.upload(DType::f32, {N}, rstd32));
    ref::layernorm_bwd(dx, dw, db, dout, x, w, mean32, rstd32, N, C);
    EXPECT_TRUE(close(kb.download(t_dx), dx, tol(), tag("layernorm_bwd dx +=")));
    EXPECT_TRUE(close(kb.download(t_dw), dw, kTolF32, tag("layernorm_bwd dweight +=")));
    EXPECT_TRUE(close(kb.download(t_db), db, kTolF32, tag("layernorm_bwd dbias +=")));
  }
}

struct LinearShape {
  int64_t N, I, O;
};

TEST_P(LayerKernels, LinearForward) {
  // Few rows (the decode kernel), a prefill chunk's (the rows kernel), and rows past its
  // 128-row chunks with inputs deeper than its 256-wide passes; sgemm for training's many rows.
  for (const LinearShape s : {LinearShape{6, 10, 7}, LinearShape{67, 131, 45},
                              LinearShape{150, 300, 40}, LinearShape{300, 20, 30}}) {
    SCOPED_TRACE("N=" + std::to_string(s.N) + " I=" + std::to_string(s.I) +
                 " O=" + std::to_string(s.O));
    const Vec in = round_to(dt(), rng.normal(s.N * s.I)), w = round_to(dt(), rng.normal(s.O * s.I));
    const Vec b = round_to(dt(), rng.normal(s.O));
    Tensor t_in = kb.upload(dt(), {s.N, s.I}, in), t_w = kb.upload(dt(), {s.O, s.I}, w);
    Tensor out = kb.poisoned(dt(), {s.N, s.O});
    kb.be().linear_fwd(out, t_in, t_w, kb.upload(dt(), {s.O}, b));
    EXPECT_TRUE(close(kb.download(out), ref::linear_fwd(in, w, b, s.N, s.I, s.O), tol(),
                      tag("linear_fwd with bias")));
    kb.poison(out);
    kb.be().linear_fwd(out, t_in, t_w, Tensor{});
    EXPECT_TRUE(close(kb.download(out), ref::linear_fwd(in, w, {}, s.N, s.I, s.O), tol(),
                      tag("linear_fwd, empty bias")));
  }
}

TEST_P(LayerKernels, LinearBackward) {
  for (const LinearShape s : {LinearShape{6, 10, 7}, LinearShape{67, 131, 45}}) {
    SCOPED_TRACE("N=" + std::to_string(s.N) + " I=" + std::to_string(s.I) +
                 " O=" + std::to_string(s.O));
    const Vec in = round_to(dt(), rng.normal(s.N * s.I)), w = round_to(dt(), rng.normal(s.O * s.I));
    const Vec dout = round_to(dt(), rng.normal(s.N * s.O));
    Tensor t_in = kb.upload(dt(), {s.N, s.I}, in), t_w = kb.upload(dt(), {s.O, s.I}, w);
    Tensor t_dout = kb.upload(dt(), {s.N, s.O}, dout);
    Vec dw = round_to(DType::f32, rng.normal(s.O * s.I)), db = round_to(DType::f32, rng.normal(s.O));
    Tensor t_dw = kb.upload(DType::f32, {s.O, s.I}, dw), t_db = kb.upload(DType::f32, {s.O}, db);

    // 1. din overwritten, dweight and dbias accumulated.
    Vec din(s.N * s.I);
    Tensor t_din = kb.poisoned(dt(), {s.N, s.I});
    kb.be().linear_bwd(t_din, t_dw, t_db, t_dout, t_in, t_w);
    ref::linear_bwd(&din, dw, &db, dout, in, w, s.N, s.I, s.O);
    EXPECT_TRUE(close(kb.download(t_din), din, tol(), tag("linear_bwd din =")));
    EXPECT_TRUE(close(kb.download(t_dw), dw, kTolF32, tag("linear_bwd dweight +=")));
    EXPECT_TRUE(close(kb.download(t_db), db, kTolF32, tag("linear_bwd dbias +=")));

    // 2. Again over din's old values: din is overwritten, the weight grads accumulate twice.
    kb.be().linear_bwd(t_din, t_dw, t_db, t_dout, t_in, t_w);
    ref::linear_bwd(&din, dw, &db, dout, in, w, s.N, s.I, s.O);
    EXPECT_TRUE(close(kb.download(t_din), din, tol(), tag("linear_bwd din = (2nd call)")));
    EXPECT_TRUE(close(kb.download(t_dw), dw, kTolF32, tag("linear_bwd dweight += (2nd call)")));
    EXPECT_TRUE(close(kb.download(t_db), db, kTolF32, tag("linear_bwd dbias += (2nd call)")));

    // 3. No din and no bias: only dweight; the dbias buffer is not passed, so it stays put.
    const Vec db_before = kb.download(t_db);
    kb.be().linear_bwd(Tensor{}, t_dw, Tensor{}, t_dout, t_in, t_w);
    ref::linear_bwd(nullptr, dw, nullptr, dout, in, w, s.N, s.I, s.O);
    EXPECT_TRUE(close(kb.download(t_dw), dw, kTolF32, tag("linear_bwd dweight, empty din/dbias")));
    EXPECT_TRUE(close(kb.download(t_db), db_before, 0.0, tag("linear_bwd without dbias")));
  }
}

// qkv[B,T,H,3,D] is five dims; a Tensor holds four, and the CPU backend takes it as the qkv
// linear's output viewed [B, T, H*3*D] (the head count comes from probs [B,H,T,T]; kv_heads =
// H: multi-head).
Tensor upload_qkv(KernelBench& kb, DType dt, const ref::AttentionShape& s, const Vec& v) {
  return kb.upload(dt, {s.B, s.T, s.H * 3 * s.D}, v);
}

TEST_P(LayerKernels, AttentionForwardAndBackward) {
  for (const ref::AttentionShape s : {ref::AttentionShape{2, 5, 2, 3}, {2, 33, 3, 16}}) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" +
                 std::to_string(s.H) + " D=" + std::to_string(s.D));
    const int64_t n_out = s.B * s.T * s.H * s.D;
    const Vec qkv = round_to(dt(), rng.normal(3 * n_out, 1.5));  // peaked enough softmaxes
    Tensor t_qkv = upload_qkv(kb, dt(), s, qkv);
    Tensor out = kb.poisoned(dt(), {s.B, s.T, s.H, s.D});
    Tensor probs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
    kb.be().attention_fwd(out, probs, t_qkv, s.H);
    Vec want_out, want_probs;
    ref::attention_fwd(want_out, want_probs, qkv, s);
    EXPECT_TRUE(close(kb.download(out), want_out, tol(), tag("attention_fwd out")));
    const Vec got_probs = kb.download(probs);
    EXPECT_TRUE(close(got_probs, want_probs, kTolF32, tag("attention_fwd probs")));
    int64_t nonzero_above_diagonal = 0;
    for (int64_t row = 0; row < s.B * s.H * s.T; ++row)
      for (int64_t u = row % s.T + 1; u < s.T; ++u)
        nonzero_above_diagonal += got_probs[row * s.T + u] != 0.0;  // NaN counts too
    EXPECT_EQ(nonzero_above_diagonal, 0) << tag("attention_fwd probs must be 0 above diagonal");

    const Vec dout = round_to(dt(), rng.normal(n_out));
    const Vec probs32 = round_to(DType::f32, want_probs);
    Tensor dqkv = kb.poisoned(dt(), {s.B, s.T, s.H * 3 * s.D});
    Tensor dprobs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
    kb.be().attention_bwd(dqkv, dprobs, kb.upload(dt(), {s.B, s.T, s.H, s.D}, dout), t_qkv, out,
                          kb.upload(DType::f32, {s.B, s.H, s.T, s.T}, probs32), s.H);
    EXPECT_TRUE(close(kb.download(dqkv), ref::attention_bwd(dout, qkv, probs32, s), tol(),
                      tag("attention_bwd dqkv")));
  }
}

TEST_P(LayerKernels, AttentionIsCausal) {
  // Changing token t's q, k and v must leave every output before t bit for bit unchanged.
  const ref::AttentionShape s{2, 9, 2, 8};
  const int64_t row = s.H * s.D, changed_t = 4;
  Vec qkv = round_to(dt(), rng.normal(3 * s.B * s.T * row));
  Tensor t_qkv = upload_qkv(kb, dt(), s, qkv);
  Tensor out = kb.poisoned(dt(), {s.B, s.T, s.H, s.D});
  Tensor probs = kb.poisoned(DType::f32, {s.B, s.H, s.T, s.T});
  kb.be().attention_fwd(out, probs, t_qkv, s.H);
  const Vec before = kb.download(out);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < 3 * row; ++i)
      qkv[(b * s.T + changed_t) * 3 * row + i] = round_to(dt(), rng.normal(1)[0] * 3.0);
  kb.write(t_qkv, qkv);
  kb.poison(out);
  kb.be().attention_fwd(out, probs, t_qkv, s.H);
  const Vec after = kb.download(out);
  int64_t earlier_changed = 0, later_changed = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t i = 0; i < row; ++i) {
        const int64_t k = (b * s.T + t) * row + i;
        if (t < changed_t) earlier_changed += before[k] != after[k];
        else later_changed += before[k] != after[k];
      }
  EXPECT_EQ(earlier_changed, 0) << tag("outputs before the changed token moved: not causal");
  EXPECT_GT(later_changed, 0) << tag("outputs from the changed token on did not move");
}

TEST_P(LayerKernels, AttentionOverKvCacheIsTheCausalAttention) {
  // One sequence's rows through the cache in generation's step shapes, against the training
  // attention of the whole sequence: step 1 is a 10-row prefill of slot 1; step 2 a decode
  // row of a fresh slot 0, the prefill's 70 remaining rows (more than one block of queries,
  // after 10 cached keys) and a 3-row prefill of slot 2 (short runs go row by row). Head
  // sizes with and without the blocked kernel (16 and 64; 40).
  for (const int64_t d : {16, 64, 40}) {
    const ref::AttentionShape s{1, 80, 2, d};
    SCOPED_TRACE("D=" + std::to_string(d));
    const int64_t c3 = s.H * 3 * d, hd = s.H * d;
    const Vec qkv = round_to(dt(), rng.normal(s.T * c3, 1.5));
    Vec want, probs;
    ref::attention_fwd(want, probs, qkv, s);
    Tensor k_cache = kb.poisoned(dt(), {3, s.H, 96, d}), v_cache = kb.poisoned(dt(), {3, s.H, 96, d});
    // (slot, position) per row; the qkv row of position p is the sequence's row p.
    auto run_step = [&](const Ids& rows) {
      const int64_t n = static_cast<int64_t>(rows.size()) / 2;
      Vec step_qkv;
      for (int64_t i = 0; i < n; ++i) {
        const auto at = qkv.begin() + rows[2 * i + 1] * c3;
        step_qkv.insert(step_qkv.end(), at, at + c3);
      }
      Tensor out = kb.poisoned(dt(), {n, hd});
      kb.be().attention_kv_cache(out, kb.upload(dt(), {n, c3}, step_qkv), k_cache, v_cache,
                                 kb.upload_ids({n, 2}, rows));
      Vec expected;
      for (int64_t i = 0; i < n; ++i) {
        const auto at = want.begin() + rows[2 * i + 1] * hd;
        expected.insert(expected.end(), at, at + hd);
      }
      return close(kb.download(out), expected, tol(), tag("attention_kv_cache out"));
    };
    Ids step1, step2 = {0, 0};
    for (int32_t p = 0; p < 10; ++p) step1.insert(step1.end(), {1, p});
    for (int32_t p = 10; p < 80; ++p) step2.insert(step2.end(), {1, p});
    for (int32_t p = 0; p < 3; ++p) step2.insert(step2.end(), {2, p});
    EXPECT_TRUE(run_step(step1));
    EXPECT_TRUE(run_step(step2));
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, LayerKernels, ::testing::Values(DType::f32, DType::bf16),
                         DTypeName());

}  // namespace
}  // namespace jumbo::test
