// CUDA embeddings, layernorm and the cross-entropy parts against the CPU backend on the same
// inputs (f32 and bf16, C from 64 to J1-Jumbo's 13824 and its tp=8 slice 1728). Outputs that
// are overwritten are poisoned (NaN) before every call; "+=" outputs start from the same
// random non-zero values on both sides. Token ids include ids outside this rank's vocabulary
// slice; the logits carry a padded tail of -inf as fill_columns leaves it. The deterministic
// backward kernels (token embedding, layernorm) must give bit-identical results run to run.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test_support.h"

namespace jumbo::gputest {
namespace {

constexpr DType kFloatTypes[] = {DType::f32, DType::bf16};

struct Shape {
  int64_t n, c;
};
// 1728 = 13824 / 8 (J1-Jumbo's FFN slice at tp 8); 99 is a multiple of neither vector width
// (scalar paths), and its 520 rows make layernorm_bwd combine several row chunks.
constexpr Shape kShapes[] = {{64, 64}, {64, 768}, {24, 1728}, {6, 13824}, {520, 99}};

std::string name(DType t, const Shape& s, const std::string& what) {
  return std::string(to_string(t)) + " " + what + " N=" + std::to_string(s.n) +
         " C=" + std::to_string(s.c);
}

// A [n, c] view that starts one element into its buffer: every row pointer misaligned for
// 16-byte packs, so the scalar paths run even where C is a multiple of the vector width.
Pair shifted(DualBench& b, DType dt, int64_t n, int64_t c, const Values& v) {
  Values padded(v.size() + 1, 0.5);
  std::copy(v.begin(), v.end(), padded.begin() + 1);
  const Pair p = b.upload(dt, {n * c + 1}, padded);
  return {p.cpu.rows(1, n * c).view({n, c}), p.gpu.rows(1, n * c).view({n, c})};
}

Pair shifted_poisoned(DualBench& b, DType dt, int64_t n, int64_t c) {
  const Pair p = b.poisoned(dt, {n * c + 1});
  return {p.cpu.rows(1, n * c).view({n, c}), p.gpu.rows(1, n * c).view({n, c})};
}

Values offset(Values v, double by) {
  for (double& x : v) x += by;
  return v;
}

// Bit for bit (the values came from f32/bf16, so double equality is exact equality).
::testing::AssertionResult identical(const Values& a, const Values& b, const std::string& what) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) {
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << a[i]
                                           << " on the first run, " << b[i] << " on the second";
    }
  }
  return ::testing::AssertionSuccess();
}

constexpr int64_t kVocabStart = 100;  // this rank's slice: [100, 100 + kSliceRows)
constexpr int64_t kSliceRows = 50;
// Ids from below the slice to above it (random_ids is inclusive of both ends).
std::vector<int32_t> slice_ids(int64_t n, uint64_t seed) {
  return random_ids(n, static_cast<int32_t>(kVocabStart - 20),
                    static_cast<int32_t>(kVocabStart + kSliceRows + 20), seed);
}

// ---------------------------------------------------------------- embeddings

TEST(GpuEmbedding, TokenFwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (const Shape& s : kShapes) {
      const std::string what = name(dt, s, "token_embedding_fwd");
      SCOPED_TRACE(what);
      const Pair wte = b.upload(dt, {kSliceRows, s.c}, random_normal(kSliceRows * s.c, 1.0, 21));
      const Pair tokens = b.upload_ids({s.n}, slice_ids(s.n, 22));
      const Pair out = b.poisoned(dt, {s.n, s.c});
      b.cpu().token_embedding_fwd(out.cpu, tokens.cpu, wte.cpu, kVocabStart);
      b.gpu().token_embedding_fwd(out.gpu, tokens.gpu, wte.gpu, kVocabStart);
      EXPECT_TRUE(b.same(out, 0.0, what));  // a copy of the stored rows, or zeros
    }
    // Misaligned rows: the scalar path at a vector-friendly C.
    const Shape s{16, 768};
    const std::string what = name(dt, s, "token_embedding_fwd (misaligned)");
    SCOPED_TRACE(what);
    const Pair wte = shifted(b, dt, kSliceRows, s.c, random_normal(kSliceRows * s.c, 1.0, 23));
    const Pair tokens = b.upload_ids({s.n}, slice_ids(s.n, 24));
    const Pair out = shifted_poisoned(b, dt, s.n, s.c);
    b.cpu().token_embedding_fwd(out.cpu, tokens.cpu, wte.cpu, kVocabStart);
    b.gpu().token_embedding_fwd(out.gpu, tokens.gpu, wte.gpu, kVocabStart);
    EXPECT_TRUE(b.same(out, 0.0, what));
  }
}

TEST(GpuEmbedding, TokenBwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (const Shape& s : kShapes) {
      const std::string what = name(dt, s, "token_embedding_bwd");
      SCOPED_TRACE(what);
      // 50 rows for up to 520 tokens: most rows repeat, some (and the out-of-slice ids) not.
      const Pair dwte =
          b.upload(DType::f32, {kSliceRows, s.c}, random_normal(kSliceRows * s.c, 1.0, 31));
      const Pair dout = b.upload(dt, {s.n, s.c}, random_normal(s.n * s.c, 1.0, 32));
      const Pair tokens = b.upload_ids({s.n}, slice_ids(s.n, 33));
      b.cpu().token_embedding_bwd(dwte.cpu, dout.cpu, tokens.cpu, kVocabStart);
      b.gpu().token_embedding_bwd(dwte.gpu, dout.gpu, tokens.gpu, kVocabStart);
      EXPECT_TRUE(b.same(dwte, kTolF32, what));
    }
  }
}

TEST(GpuEmbedding, TokenBwdIsDeterministic) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  // 16384 tokens (8 x 2048): large enough for CUB's multi-pass (onesweep) sort, where the
  // shapes above fit one tile.
  const int64_t n = 16384, c = 256, rows = 1000, vocab_start = 2000;
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(to_string(dt));
    std::vector<int32_t> ids = random_ids(n, vocab_start - 100, vocab_start + 400, 41);
    for (int64_t i = 0; i < n; i += 7) ids[static_cast<size_t>(i)] = vocab_start + 3;  // a hot row
    const Values init = random_normal(rows * c, 1.0, 42);
    const Pair tokens = b.upload_ids({n}, ids);
    const Pair dout = b.upload(dt, {n, c}, random_normal(n * c, 1.0, 43));
    const Pair first = b.upload(DType::f32, {rows, c}, init);
    const Pair second = b.upload(DType::f32, {rows, c}, init);
    b.gpu().token_embedding_bwd(first.gpu, dout.gpu, tokens.gpu, vocab_start);
    b.gpu().token_embedding_bwd(second.gpu, dout.gpu, tokens.gpu, vocab_start);
    EXPECT_TRUE(identical(b.download(b.gpu(), first.gpu), b.download(b.gpu(), second.gpu),
                          "token_embedding_bwd twice"));
    b.cpu().token_embedding_bwd(first.cpu, dout.cpu, tokens.cpu, vocab_start);
    EXPECT_TRUE(b.same(first, kTolF32, "token_embedding_bwd vs cpu"));
  }
}

TEST(GpuEmbedding, PositionFwdBwdMatchCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (const Shape& s : kShapes) {
      const int64_t batch = s.n % 4 == 0 ? 4 : 2, t = s.n / batch;
      const int64_t wpe_rows = t + 3;  // T <= wpe rows; the rows past T are left alone
      {
        const std::string what = name(dt, s, "position_embedding_fwd");
        SCOPED_TRACE(what);
        const Pair out = b.upload(dt, {batch, t, s.c}, random_normal(s.n * s.c, 1.0, 51));
        const Pair wpe = b.upload(dt, {wpe_rows, s.c}, random_normal(wpe_rows * s.c, 1.0, 52));
        b.cpu().position_embedding_fwd(out.cpu, wpe.cpu);
        b.gpu().position_embedding_fwd(out.gpu, wpe.gpu);
        EXPECT_TRUE(b.same(out, tolerance_for(dt), what));
      }
      {
        const std::string what = name(dt, s, "position_embedding_bwd");
        SCOPED_TRACE(what);
        const Pair dwpe =
            b.upload(DType::f32, {wpe_rows, s.c}, random_normal(wpe_rows * s.c, 1.0, 53));
        const Pair dout = b.upload(dt, {batch, t, s.c}, random_normal(s.n * s.c, 1.0, 54));
        b.cpu().position_embedding_bwd(dwpe.cpu, dout.cpu);
        b.gpu().position_embedding_bwd(dwpe.gpu, dout.gpu);
        EXPECT_TRUE(b.same(dwpe, kTolF32, what));
      }
    }
  }
}

// ---------------------------------------------------------------- layernorm

TEST(GpuLayernorm, FwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (const Shape& s : kShapes) {
      const std::string what = name(dt, s, "layernorm_fwd");
      SCOPED_TRACE(what);
      // A mean far from zero: a one-pass E[x^2] - mean^2 would lose digits here.
      const Pair x = b.upload(dt, {s.n, s.c}, offset(random_normal(s.n * s.c, 1.0, 61), 3.0));
      const Pair w = b.upload(dt, {s.c}, offset(random_normal(s.c, 0.3, 62), 1.0));
      const Pair bias = b.upload(dt, {s.c}, random_normal(s.c, 0.3, 63));
      const Pair out = b.poisoned(dt, {s.n, s.c});
      const Pair mean = b.poisoned(DType::f32, {s.n});
      const Pair rstd = b.poisoned(DType::f32, {s.n});
      b.cpu().layernorm_fwd(out.cpu, mean.cpu, rstd.cpu, x.cpu, w.cpu, bias.cpu, 1e-5f);
      b.gpu().layernorm_fwd(out.gpu, mean.gpu, rstd.gpu, x.gpu, w.gpu, bias.gpu, 1e-5f);
      EXPECT_TRUE(b.same(out, tolerance_for(dt), what + " out"));
      EXPECT_TRUE(b.same(mean, kTolF32, what + " mean"));
      EXPECT_TRUE(b.same(rstd, kTolF32, what + " rstd"));
    }
  }
}

// The statistics of x computed on the CPU, uploaded to both sides (so the backward compares
// only itself).
struct Stats {
  Pair mean, rstd;
};
Stats cpu_stats(DualBench& b, DType dt, const Pair& x, const Pair& w, const Pair& bias,
                int64_t n, int64_t c) {
  const Pair out = b.poisoned(dt, {n, c});
  const Pair mean = b.poisoned(DType::f32, {n});
  const Pair rstd = b.poisoned(DType::f32, {n});
  b.cpu().layernorm_fwd(out.cpu, mean.cpu, rstd.cpu, x.cpu, w.cpu, bias.cpu, 1e-5f);
  return {b.upload(DType::f32, {n}, b.download(b.cpu(), mean.cpu)),
          b.upload(DType::f32, {n}, b.download(b.cpu(), rstd.cpu))};
}

TEST(GpuLayernorm, BwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (const Shape& s : kShapes) {
      const std::string what = name(dt, s, "layernorm_bwd");
      SCOPED_TRACE(what);
      const Pair x = b.upload(dt, {s.n, s.c}, offset(random_normal(s.n * s.c, 1.0, 71), 1.5));
      const Pair w = b.upload(dt, {s.c}, offset(random_normal(s.c, 0.3, 72), 1.0));
      const Pair bias = b.upload(dt, {s.c}, random_normal(s.c, 0.3, 73));
      const Stats st = cpu_stats(b, dt, x, w, bias, s.n, s.c);
      const Pair dout = b.upload(dt, {s.n, s.c}, random_normal(s.n * s.c, 1.0, 74));
      const Pair dx = b.upload(dt, {s.n, s.c}, random_normal(s.n * s.c, 1.0, 75));
      const Pair dw = b.upload(DType::f32, {s.c}, random_normal(s.c, 1.0, 76));
      const Pair db = b.upload(DType::f32, {s.c}, random_normal(s.c, 1.0, 77));
      b.cpu().layernorm_bwd(dx.cpu, dw.cpu, db.cpu, dout.cpu, x.cpu, w.cpu, st.mean.cpu,
                            st.rstd.cpu);
      b.gpu().layernorm_bwd(dx.gpu, dw.gpu, db.gpu, dout.gpu, x.gpu, w.gpu, st.mean.gpu,
                            st.rstd.gpu);
      EXPECT_TRUE(b.same(dx, tolerance_for(dt), what + " dx"));
      EXPECT_TRUE(b.same(dw, kTolF32, what + " dweight"));
      EXPECT_TRUE(b.same(db, kTolF32, what + " dbias"));
    }
  }
}

TEST(GpuLayernorm, BwdIsDeterministic) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  // 2048 rows: 32 row chunks for the dweight/dbias partials; 768 (warp per row) and 1728
  // (block per row).
  for (DType dt : kFloatTypes) {
    for (const Shape& s : {Shape{2048, 768}, Shape{2048, 1728}}) {
      const std::string what = name(dt, s, "layernorm_bwd twice");
      SCOPED_TRACE(what);
      const Pair x = b.upload(dt, {s.n, s.c}, random_normal(s.n * s.c, 1.0, 81));
      const Pair w = b.upload(dt, {s.c}, offset(random_normal(s.c, 0.3, 82), 1.0));
      const Pair bias = b.upload(dt, {s.c}, random_normal(s.c, 0.3, 83));
      const Stats st = cpu_stats(b, dt, x, w, bias, s.n, s.c);
      const Pair dout = b.upload(dt, {s.n, s.c}, random_normal(s.n * s.c, 1.0, 84));
      const Values dx0 = random_normal(s.n * s.c, 1.0, 85);
      const Values dw0 = random_normal(s.c, 1.0, 86), db0 = random_normal(s.c, 1.0, 87);
      Values got[2][3];
      for (Values* run : {got[0], got[1]}) {
        const Pair dx = b.upload(dt, {s.n, s.c}, dx0);
        const Pair dw = b.upload(DType::f32, {s.c}, dw0);
        const Pair db = b.upload(DType::f32, {s.c}, db0);
        b.gpu().layernorm_bwd(dx.gpu, dw.gpu, db.gpu, dout.gpu, x.gpu, w.gpu, st.mean.gpu,
                              st.rstd.gpu);
        run[0] = b.download(b.gpu(), dx.gpu);
        run[1] = b.download(b.gpu(), dw.gpu);
        run[2] = b.download(b.gpu(), db.gpu);
      }
      EXPECT_TRUE(identical(got[0][0], got[1][0], what + " dx"));
      EXPECT_TRUE(identical(got[0][1], got[1][1], what + " dweight"));
      EXPECT_TRUE(identical(got[0][2], got[1][2], what + " dbias"));
    }
  }
}

// ---------------------------------------------------------------- cross-entropy

struct CeCase {
  int64_t n, cols, real;  // logits [n, cols]; columns from `real` on are padding (-inf)
  bool misaligned;
};

TEST(GpuCrossEntropy, ChainMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const int64_t vocab_start = 5000;
  const CeCase cases[] = {
      {64, 1024, 1000, false}, {16, 32000, 31990, false}, {9, 1001, 999, false},
      {8, 1024, 1000, true}};
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : kFloatTypes) {
    for (const CeCase& k : cases) {
      const std::string what = std::string(to_string(dt)) + " cross-entropy N=" +
                               std::to_string(k.n) + " V=" + std::to_string(k.cols) +
                               (k.misaligned ? " (misaligned)" : "");
      SCOPED_TRACE(what);
      Values logit_values = random_normal(k.n * k.cols, 2.0, 91);
      for (int64_t r = 0; r < k.n; ++r) {
        for (int64_t col = k.real; col < k.cols; ++col) {
          logit_values[static_cast<size_t>(r * k.cols + col)] = -inf;
        }
      }
      // Targets: in the slice's real columns, below it, and (a few) past its end.
      std::vector<int32_t> ids =
          random_ids(k.n, static_cast<int32_t>(vocab_start - 200),
                     static_cast<int32_t>(vocab_start + k.real - 1), 92);
      for (int64_t r = 3; r < k.n; r += 5) {
        ids[static_cast<size_t>(r)] = static_cast<int32_t>(vocab_start + k.cols + 7);
      }
      ids[0] = static_cast<int32_t>(vocab_start);  // the slice's first column
      const Pair logits = k.misaligned ? shifted(b, dt, k.n, k.cols, logit_values)
                                       : b.upload(dt, {k.n, k.cols}, logit_values);
      const Pair targets = b.upload_ids({k.n}, ids);

      const Pair mx = b.poisoned(DType::f32, {k.n});
      b.cpu().ce_local_max(mx.cpu, logits.cpu);
      b.gpu().ce_local_max(mx.gpu, logits.gpu);
      EXPECT_TRUE(b.same(mx, 0.0, what + " ce_local_max"));  // exact: a max rounds nothing

      const Pair se = b.poisoned(DType::f32, {k.n});
      b.cpu().ce_local_sumexp(se.cpu, logits.cpu, mx.cpu);
      b.gpu().ce_local_sumexp(se.gpu, logits.gpu, mx.gpu);
      EXPECT_TRUE(b.same(se, kTolF32, what + " ce_local_sumexp"));

      const Pair tl = b.poisoned(DType::f32, {k.n});
      b.cpu().ce_target_logit(tl.cpu, logits.cpu, targets.cpu, vocab_start);
      b.gpu().ce_target_logit(tl.gpu, logits.gpu, targets.gpu, vocab_start);
      EXPECT_TRUE(b.same(tl, 0.0, what + " ce_target_logit"));

      const Pair loss = b.poisoned(DType::f32, {k.n});
      b.cpu().ce_loss(loss.cpu, mx.cpu, se.cpu, tl.cpu);
      b.gpu().ce_loss(loss.gpu, mx.gpu, se.gpu, tl.gpu);
      EXPECT_TRUE(b.same(loss, kTolF32, what + " ce_loss"));

      const float scale = 1.0f / static_cast<float>(k.n);
      const Pair dlogits = k.misaligned ? shifted_poisoned(b, dt, k.n, k.cols)
                                        : b.poisoned(dt, {k.n, k.cols});
      b.cpu().ce_bwd(dlogits.cpu, logits.cpu, mx.cpu, se.cpu, targets.cpu, vocab_start, scale);
      b.gpu().ce_bwd(dlogits.gpu, logits.gpu, mx.gpu, se.gpu, targets.gpu, vocab_start, scale);
      EXPECT_TRUE(b.same(dlogits, tolerance_for(dt), what + " ce_bwd"));

      // In place, as the model runs it: the logits buffer becomes its gradient.
      const Pair inplace = k.misaligned ? shifted(b, dt, k.n, k.cols, logit_values)
                                        : b.upload(dt, {k.n, k.cols}, logit_values);
      b.cpu().ce_bwd(inplace.cpu, inplace.cpu, mx.cpu, se.cpu, targets.cpu, vocab_start, scale);
      b.gpu().ce_bwd(inplace.gpu, inplace.gpu, mx.gpu, se.gpu, targets.gpu, vocab_start, scale);
      EXPECT_TRUE(b.same(inplace, tolerance_for(dt), what + " ce_bwd in place"));
    }
  }
}

// ---------------------------------------------------------------- contract checks

TEST(GpuNormLossEmbedding, LaunchersRejectBadArguments) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const int64_t n = 8, c = 64;
  const Pair wte = b.upload(DType::f32, {kSliceRows, c}, random_normal(kSliceRows * c, 1.0, 1));
  const Pair out = b.poisoned(DType::f32, {n, c});
  const Pair ids = b.upload_ids({n}, slice_ids(n, 2));
  const Pair float_ids = b.upload(DType::f32, {n}, random_normal(n, 1.0, 3));
  const Pair x = b.upload(DType::f32, {n, c}, random_normal(n * c, 1.0, 4));
  const Pair w_short = b.upload(DType::f32, {c - 1}, random_normal(c - 1, 1.0, 5));
  const Pair bias = b.upload(DType::f32, {c}, random_normal(c, 1.0, 6));
  const Pair mean = b.poisoned(DType::f32, {n});
  const Pair rstd = b.poisoned(DType::f32, {n});
  const Pair max_short = b.poisoned(DType::f32, {n - 1});

  EXPECT_THROW(b.gpu().token_embedding_fwd(out.gpu, float_ids.gpu, wte.gpu, kVocabStart),
               std::invalid_argument);
  EXPECT_THROW(b.gpu().token_embedding_fwd(out.gpu, ids.cpu, wte.gpu, kVocabStart),
               std::invalid_argument);  // host memory
  EXPECT_THROW(b.gpu().layernorm_fwd(out.gpu, mean.gpu, rstd.gpu, x.gpu, w_short.gpu, bias.gpu,
                                     1e-5f),
               std::invalid_argument);
  EXPECT_THROW(b.gpu().ce_local_max(max_short.gpu, x.gpu), std::invalid_argument);
}

}  // namespace
}  // namespace jumbo::gputest
