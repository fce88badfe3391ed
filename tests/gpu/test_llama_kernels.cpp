// The Llama-family kernels of the CUDA backend against the CPU backend on the same inputs, f32
// and bf16: RMSNorm (forward; backward with and without the weight's gradient, bit-identical run
// to run), qk-norm (per query and key head, in place too), rotary embedding (forward and
// inverse, positions [N] and [N, 2], grouped heads; value heads untouched) and SwiGLU. Shapes
// include widths that are no multiple of the vector widths (scalar paths) and misaligned rows.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_support.h"

namespace jumbo::gputest {
namespace {

constexpr DType kFloatTypes[] = {DType::f32, DType::bf16};

struct Shape {
  int64_t n, c;
};
// 99: no multiple of either vector width; 4096 and 13824 (> 1024) take a block per row; 520 rows
// make the weight gradient combine several row chunks.
constexpr Shape kShapes[] = {{64, 64}, {64, 768}, {24, 4096}, {6, 13824}, {520, 99}};

std::string name(DType t, int64_t n, int64_t c, const std::string& what) {
  return what + " " + to_string(t) + " N=" + std::to_string(n) + " C=" + std::to_string(c);
}

Values offset(Values v, double by) {
  for (double& x : v) x += by;
  return v;
}

// A [n, c] view one element into its buffer: every row misaligned for 16-byte vectors.
Pair shifted(DualBench& b, DType dt, int64_t n, int64_t c, const Values& v) {
  Values padded(v.size() + 1, 0.5);
  std::copy(v.begin(), v.end(), padded.begin() + 1);
  const Pair p = b.upload(dt, {n * c + 1}, padded);
  return {p.cpu.rows(1, n * c).view({n, c}), p.gpu.rows(1, n * c).view({n, c})};
}

::testing::AssertionResult bit_equal(const Values& a, const Values& b, const std::string& what) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) {
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << a[i]
                                           << " on the first run, " << b[i] << " on the second";
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------- RMSNorm

TEST(GpuRmsnorm, FwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (const Shape& s : kShapes) {
      const std::string what = name(dt, s.n, s.c, "rmsnorm_fwd");
      SCOPED_TRACE(what);
      const Pair x = b.upload(dt, {s.n, s.c}, offset(random_normal(s.n * s.c, 1.0, 11), 0.5));
      const Pair w = b.upload(dt, {s.c}, offset(random_normal(s.c, 0.3, 12), 1.0));
      const Pair out = b.poisoned(dt, {s.n, s.c});
      const Pair rstd = b.poisoned(DType::f32, {s.n});
      b.cpu().rmsnorm_fwd(out.cpu, rstd.cpu, x.cpu, w.cpu, 1e-5f);
      b.gpu().rmsnorm_fwd(out.gpu, rstd.gpu, x.gpu, w.gpu, 1e-5f);
      EXPECT_TRUE(b.same(out, tolerance_for(dt), what + " out"));
      EXPECT_TRUE(b.same(rstd, kTolF32, what + " rstd"));
    }
    const std::string what = name(dt, 16, 768, "rmsnorm_fwd (misaligned)");
    SCOPED_TRACE(what);
    const Pair x = shifted(b, dt, 16, 768, random_normal(16 * 768, 1.0, 13));
    const Pair w = b.upload(dt, {768}, offset(random_normal(768, 0.3, 14), 1.0));
    const Pair out = b.poisoned(dt, {16, 768});
    const Pair rstd = b.poisoned(DType::f32, {16});
    b.cpu().rmsnorm_fwd(out.cpu, rstd.cpu, x.cpu, w.cpu, 1e-6f);
    b.gpu().rmsnorm_fwd(out.gpu, rstd.gpu, x.gpu, w.gpu, 1e-6f);
    EXPECT_TRUE(b.same(out, tolerance_for(dt), what + " out"));
    EXPECT_TRUE(b.same(rstd, kTolF32, what + " rstd"));
  }
}

// rstd from the CPU's forward, uploaded to both sides: the backward compares only itself.
Pair cpu_rstd(DualBench& b, DType dt, const Pair& x, const Pair& w, int64_t n, int64_t c) {
  const Pair out = b.poisoned(dt, {n, c});
  const Pair rstd = b.poisoned(DType::f32, {n});
  b.cpu().rmsnorm_fwd(out.cpu, rstd.cpu, x.cpu, w.cpu, 1e-5f);
  return b.upload(DType::f32, {n}, b.download(b.cpu(), rstd.cpu));
}

TEST(GpuRmsnorm, BwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (const Shape& s : kShapes) {
      for (bool frozen : {false, true}) {
        const std::string what =
            name(dt, s.n, s.c, "rmsnorm_bwd") + (frozen ? " (frozen weight)" : "");
        SCOPED_TRACE(what);
        const Pair x = b.upload(dt, {s.n, s.c}, offset(random_normal(s.n * s.c, 1.0, 21), 0.5));
        const Pair w = b.upload(dt, {s.c}, offset(random_normal(s.c, 0.3, 22), 1.0));
        const Pair rstd = cpu_rstd(b, dt, x, w, s.n, s.c);
        const Pair dout = b.upload(dt, {s.n, s.c}, random_normal(s.n * s.c, 1.0, 23));
        const Pair dx = b.upload(dt, {s.n, s.c}, random_normal(s.n * s.c, 1.0, 24));  // +=
        const Pair dw =
            frozen ? Pair{} : b.upload(DType::f32, {s.c}, random_normal(s.c, 1.0, 25));
        b.cpu().rmsnorm_bwd(dx.cpu, dw.cpu, dout.cpu, x.cpu, w.cpu, rstd.cpu);
        b.gpu().rmsnorm_bwd(dx.gpu, dw.gpu, dout.gpu, x.gpu, w.gpu, rstd.gpu);
        EXPECT_TRUE(b.same(dx, tolerance_for(dt), what + " dx"));
        if (!frozen) {
          EXPECT_TRUE(b.same(dw, kTolF32, what + " dweight"));
        }
      }
    }
  }
}

TEST(GpuRmsnorm, BwdIsDeterministic) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const int64_t n = 2048, c = 1024;  // the weight gradient in 32 row chunks
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(to_string(dt));
    const Pair x = b.upload(dt, {n, c}, random_normal(n * c, 1.0, 31));
    const Pair w = b.upload(dt, {c}, offset(random_normal(c, 0.3, 32), 1.0));
    const Pair rstd = cpu_rstd(b, dt, x, w, n, c);
    const Pair dout = b.upload(dt, {n, c}, random_normal(n * c, 1.0, 33));
    const Values dx0 = random_normal(n * c, 1.0, 34), dw0 = random_normal(c, 1.0, 35);
    Values dx_runs[2], dw_runs[2];
    for (int run = 0; run < 2; ++run) {
      const Pair dx = b.upload(dt, {n, c}, dx0);
      const Pair dw = b.upload(DType::f32, {c}, dw0);
      b.gpu().rmsnorm_bwd(dx.gpu, dw.gpu, dout.gpu, x.gpu, w.gpu, rstd.gpu);
      dx_runs[run] = b.download(b.gpu(), dx.gpu);
      dw_runs[run] = b.download(b.gpu(), dw.gpu);
    }
    EXPECT_TRUE(bit_equal(dx_runs[0], dx_runs[1], "rmsnorm_bwd dx twice"));
    EXPECT_TRUE(bit_equal(dw_runs[0], dw_runs[1], "rmsnorm_bwd dweight twice"));
  }
}

// ---------------------------------------------------------------- qk-norm

struct Heads {
  int64_t n, g, r, d;
  int64_t width() const { return g * (r + 2) * d; }
  int64_t normed() const { return g * (r + 1); }  // H + G
};

std::string name(DType t, const Heads& h, const std::string& what) {
  return what + " " + to_string(t) + " N=" + std::to_string(h.n) + " G=" + std::to_string(h.g) +
         " R=" + std::to_string(h.r) + " D=" + std::to_string(h.d);
}

// Multi-head (R = 1), grouped (G = 2, R = 4), multi-query (G = 1, R = 3) at D = 128 and 64, and
// D = 40 (no multiple of the bf16 vector width).
constexpr Heads kHeads[] = {{37, 4, 1, 64}, {64, 2, 4, 128}, {19, 1, 3, 128}, {33, 2, 2, 40}};

TEST(GpuQkNorm, FwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (const Heads& h : kHeads) {
      for (bool in_place : {false, true}) {
        const std::string what = name(dt, h, "qk_norm_fwd") + (in_place ? " (in place)" : "");
        SCOPED_TRACE(what);
        const Pair qkv =
            b.upload(dt, {h.n, h.width()}, offset(random_normal(h.n * h.width(), 1.0, 41), 0.3));
        const Pair wq = b.upload(dt, {h.d}, offset(random_normal(h.d, 0.3, 42), 1.0));
        const Pair wk = b.upload(dt, {h.d}, offset(random_normal(h.d, 0.3, 43), 1.0));
        const Pair out = in_place ? qkv : b.poisoned(dt, {h.n, h.width()});
        const Pair rstd = b.poisoned(DType::f32, {h.n, h.normed()});
        b.cpu().qk_norm_fwd(out.cpu, rstd.cpu, qkv.cpu, wq.cpu, wk.cpu, h.g, 1e-6f);
        b.gpu().qk_norm_fwd(out.gpu, rstd.gpu, qkv.gpu, wq.gpu, wk.gpu, h.g, 1e-6f);
        EXPECT_TRUE(b.same(out, tolerance_for(dt), what + " out"));
        EXPECT_TRUE(b.same(rstd, kTolF32, what + " rstd"));
      }
    }
  }
}

TEST(GpuQkNorm, BwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (const Heads& h : kHeads) {
      for (int variant = 0; variant < 3; ++variant) {  // 0: out of place, 1: in place, 2: frozen
        const std::string what = name(dt, h, "qk_norm_bwd") +
                                 (variant == 1 ? " (in place)" : variant == 2 ? " (frozen)" : "");
        SCOPED_TRACE(what);
        const int64_t wd = h.width();
        const Pair qkv = b.upload(dt, {h.n, wd}, offset(random_normal(h.n * wd, 1.0, 51), 0.3));
        const Pair wq = b.upload(dt, {h.d}, offset(random_normal(h.d, 0.3, 52), 1.0));
        const Pair wk = b.upload(dt, {h.d}, offset(random_normal(h.d, 0.3, 53), 1.0));
        const Pair out = b.poisoned(dt, {h.n, wd});
        const Pair rstd0 = b.poisoned(DType::f32, {h.n, h.normed()});
        b.cpu().qk_norm_fwd(out.cpu, rstd0.cpu, qkv.cpu, wq.cpu, wk.cpu, h.g, 1e-6f);
        const Pair rstd =
            b.upload(DType::f32, {h.n, h.normed()}, b.download(b.cpu(), rstd0.cpu));
        const Pair dout = b.upload(dt, {h.n, wd}, random_normal(h.n * wd, 1.0, 54));
        const Pair dqkv = variant == 1 ? dout : b.poisoned(dt, {h.n, wd});
        const bool frozen = variant == 2;
        const Pair dwq =
            frozen ? Pair{} : b.upload(DType::f32, {h.d}, random_normal(h.d, 1.0, 55));
        const Pair dwk =
            frozen ? Pair{} : b.upload(DType::f32, {h.d}, random_normal(h.d, 1.0, 56));
        b.cpu().qk_norm_bwd(dqkv.cpu, dwq.cpu, dwk.cpu, dout.cpu, qkv.cpu, wq.cpu, wk.cpu,
                            rstd.cpu, h.g);
        b.gpu().qk_norm_bwd(dqkv.gpu, dwq.gpu, dwk.gpu, dout.gpu, qkv.gpu, wq.gpu, wk.gpu,
                            rstd.gpu, h.g);
        EXPECT_TRUE(b.same(dqkv, tolerance_for(dt), what + " dqkv"));
        if (!frozen) {
          EXPECT_TRUE(b.same(dwq, kTolF32, what + " dq_weight"));
          EXPECT_TRUE(b.same(dwk, kTolF32, what + " dk_weight"));
        }
      }
    }
  }
}

// ---------------------------------------------------------------- rotary embedding

// f32 [P, D]: cos(p f_i) for i < D/2, then sin(p f_i), f_i = 10000^(-2i/D) (model/rope.h's
// table without scaling).
Values rope_table(int64_t p_rows, int64_t d) {
  Values t(static_cast<size_t>(p_rows * d));
  for (int64_t p = 0; p < p_rows; ++p) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const double f = std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      t[static_cast<size_t>(p * d + i)] = std::cos(static_cast<double>(p) * f);
      t[static_cast<size_t>(p * d + d / 2 + i)] = std::sin(static_cast<double>(p) * f);
    }
  }
  return t;
}

// Forward and inverse, with positions [N] and as (slot, position) rows [N, 2], on the same
// values both sides; the whole qkv compared (value heads must come back as they were).
TEST(GpuRope, MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const int64_t p_rows = 4096;
  for (DType dt : kFloatTypes) {
    for (const Heads& h : {Heads{300, 4, 1, 64}, Heads{77, 2, 4, 128}, Heads{50, 1, 3, 128},
                           Heads{41, 2, 3, 144}}) {
      const Pair table = b.upload(DType::f32, {p_rows, h.d}, rope_table(p_rows, h.d));
      const std::vector<int32_t> pos = random_ids(h.n, 0, static_cast<int32_t>(p_rows - 1), 61);
      std::vector<int32_t> pairs;
      for (int32_t p : pos) pairs.insert(pairs.end(), {3, p});
      const Pair pos1 = b.upload_ids({h.n}, pos), pos2 = b.upload_ids({h.n, 2}, pairs);
      for (RopeDirection dir : {RopeDirection::forward, RopeDirection::inverse}) {
        for (const Pair* p : {&pos1, &pos2}) {
          const std::string what = name(dt, h, "rope") +
                                   (dir == RopeDirection::forward ? " forward" : " inverse") +
                                   (p == &pos2 ? " rows [N, 2]" : " positions [N]");
          SCOPED_TRACE(what);
          const Pair qkv =
              b.upload(dt, {h.n, h.width()}, random_normal(h.n * h.width(), 1.0, 62));
          b.cpu().rope(qkv.cpu, table.cpu, p->cpu, h.g, dir);
          b.gpu().rope(qkv.gpu, table.gpu, p->gpu, h.g, dir);
          EXPECT_TRUE(b.same(qkv, tolerance_for(dt), what));
        }
      }
    }
  }
}

// The inverse undoes the forward (f32: to rounding), and the value heads keep their bits.
TEST(GpuRope, InverseUndoesForward) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const Heads h{64, 2, 4, 128};
  const int64_t p_rows = 2048;
  const Pair table = b.upload(DType::f32, {p_rows, h.d}, rope_table(p_rows, h.d));
  const Pair pos = b.upload_ids({h.n}, random_ids(h.n, 0, static_cast<int32_t>(p_rows - 1), 71));
  const Values x = random_normal(h.n * h.width(), 1.0, 72);
  const Pair qkv = b.upload(DType::f32, {h.n, h.width()}, x);
  b.gpu().rope(qkv.gpu, table.gpu, pos.gpu, h.g, RopeDirection::forward);
  b.gpu().rope(qkv.gpu, table.gpu, pos.gpu, h.g, RopeDirection::inverse);
  const Values y = b.download(b.gpu(), qkv.gpu);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::fabs(y[i] - static_cast<float>(x[i])));
  }
  EXPECT_LE(worst, 1e-5);
  for (int64_t row = 0; row < h.n; ++row) {
    for (int64_t g = 0; g < h.g; ++g) {
      for (int64_t i = 0; i < h.d; ++i) {
        const int64_t v_col = (g * (h.r + 2) + h.r + 1) * h.d;
        const auto at = static_cast<size_t>(row * h.width() + v_col + i);
        ASSERT_EQ(y[at], static_cast<float>(x[at])) << "value head of row " << row;
      }
    }
  }
}

// ---------------------------------------------------------------- SwiGLU

// F = 1000: no multiple of 8 (bf16 vectors); 2816 (Llama-ish); misaligned rows for the scalar
// path at a vector-friendly width.
TEST(GpuSwiglu, MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (const Shape& s : {Shape{64, 64}, Shape{33, 1000}, Shape{16, 2816}}) {
      for (bool misaligned : {false, true}) {
        const std::string what =
            name(dt, s.n, s.c, "swiglu") + (misaligned ? " (misaligned)" : "");
        SCOPED_TRACE(what);
        // Gates over a wide range: silu's tails and its dip near -1.28.
        const Values gu = random_normal(s.n * 2 * s.c, 3.0, 81);
        const Pair gate_up = misaligned ? shifted(b, dt, s.n, 2 * s.c, gu)
                                        : b.upload(dt, {s.n, 2 * s.c}, gu);
        const Pair out = b.poisoned(dt, {s.n, s.c});
        b.cpu().swiglu_fwd(out.cpu, gate_up.cpu);
        b.gpu().swiglu_fwd(out.gpu, gate_up.gpu);
        EXPECT_TRUE(b.same(out, tolerance_for(dt), "swiglu_fwd " + what));
        const Values g = random_normal(s.n * s.c, 1.0, 82);
        const Pair dout = misaligned ? shifted(b, dt, s.n, s.c, g) : b.upload(dt, {s.n, s.c}, g);
        const Pair dgu = b.poisoned(dt, {s.n, 2 * s.c});
        b.cpu().swiglu_bwd(dgu.cpu, dout.cpu, gate_up.cpu);
        b.gpu().swiglu_bwd(dgu.gpu, dout.gpu, gate_up.gpu);
        EXPECT_TRUE(b.same(dgu, tolerance_for(dt), "swiglu_bwd " + what));
      }
    }
  }
}

// ---------------------------------------------------------------- column blocks (LoRA parts)

// A LoRA adapter's part of a packed output: q, k, v of grouped q/k/v rows (G 2, R 3, D 16)
// and SwiGLU's up half; added in, and read back out.
TEST(GpuColumnBlocks, MatchCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const int64_t n = 37, d = 16, r = 3, g = 2, wide = g * (r + 2) * d, f = 40;
  const struct {
    const char* what;
    ColumnBlocks at;
    int64_t narrow, width;
  } parts[] = {{"q", {r * d, 0, (r + 2) * d}, g * r * d, wide},
               {"k", {d, r * d, (r + 2) * d}, g * d, wide},
               {"v", {d, (r + 1) * d, (r + 2) * d}, g * d, wide},
               {"up", {f, f, f}, f, 2 * f}};
  for (DType dt : kFloatTypes) {
    for (const auto& p : parts) {
      const std::string what = std::string(p.what) + " " + to_string(dt);
      SCOPED_TRACE(what);
      const Pair w = b.upload(dt, {n, p.width}, random_normal(n * p.width, 1.0, 91));
      const Pair x = b.upload(dt, {n, p.narrow}, random_normal(n * p.narrow, 1.0, 92));
      b.cpu().add_to_column_blocks(w.cpu, x.cpu, p.at);
      b.gpu().add_to_column_blocks(w.gpu, x.gpu, p.at);
      EXPECT_TRUE(b.same(w, tolerance_for(dt), "add_to_column_blocks " + what));
      const Pair out = b.poisoned(dt, {n, p.narrow});
      b.cpu().copy_from_column_blocks(out.cpu, w.cpu, p.at);
      b.gpu().copy_from_column_blocks(out.gpu, w.gpu, p.at);
      EXPECT_TRUE(b.same(out, 0.0, "copy_from_column_blocks " + what));
    }
  }
}

}  // namespace
}  // namespace jumbo::gputest
