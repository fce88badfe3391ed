// CUDA linear layers (cuBLASLt), elementwise kernels, AdamW and the sum of squares against the
// CPU backend on the same inputs (f32 and bf16), outputs poisoned before every call.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test_support.h"

namespace jumbo::gputest {
namespace {

constexpr DType kFloatTypes[] = {DType::f32, DType::bf16};

std::string tag(DType t, const std::string& what) { return std::string(to_string(t)) + " " + what; }

// A view that starts one element into a 1-d tensor of n + 1 elements: every pointer
// misaligned for 16-byte packs, so the kernels' scalar paths run.
Pair shifted(const Pair& p, int64_t n) { return {p.cpu.rows(1, n), p.gpu.rows(1, n)}; }

Values constant(int64_t n, double v) { return Values(static_cast<size_t>(n), v); }

// Nonnegative values (second moments).
Values squares(Values v) {
  for (double& x : v) x *= x;
  return v;
}

double tanh_gelu(double x) {
  const double c = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

double erf_gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

struct LinearShape {
  int64_t n, i, o;
};

std::string shape_name(const LinearShape& s) {
  return "N=" + std::to_string(s.n) + " I=" + std::to_string(s.i) + " O=" + std::to_string(s.o);
}

// ---------------------------------------------------------------- linear layers

TEST(GpuGemm, LinearFwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const LinearShape shapes[] = {{37, 64, 48}, {64, 128, 96}, {5, 32, 24}, {130, 96, 200}};
  for (DType dt : kFloatTypes) {
    for (const LinearShape& s : shapes) {
      for (bool with_bias : {true, false}) {
        const std::string what = tag(dt, "linear_fwd " + shape_name(s) +
                                             (with_bias ? " +bias" : " no bias"));
        SCOPED_TRACE(what);
        const Pair in = b.upload(dt, {s.n, s.i}, random_normal(s.n * s.i, 1.0, 11));
        const Pair w =
            b.upload(dt, {s.o, s.i}, random_normal(s.o * s.i, 1.0 / std::sqrt(s.i), 12));
        const Pair bias = b.upload(dt, {s.o}, random_normal(s.o, 0.5, 13));
        const Pair out = b.poisoned(dt, {s.n, s.o});
        b.cpu().linear_fwd(out.cpu, in.cpu, w.cpu, with_bias ? bias.cpu : Tensor{});
        b.gpu().linear_fwd(out.gpu, in.gpu, w.gpu, with_bias ? bias.gpu : Tensor{});
        EXPECT_TRUE(b.same(out, tolerance_for(dt), what));
        // The second call runs from the cached plan and gives the same bits.
        const Values first = b.download(b.gpu(), out.gpu);
        b.gpu().fill(out.gpu, std::numeric_limits<float>::quiet_NaN());
        b.gpu().linear_fwd(out.gpu, in.gpu, w.gpu, with_bias ? bias.gpu : Tensor{});
        const Values second = b.download(b.gpu(), out.gpu);
        EXPECT_EQ(first, second) << what << ": repeated call differs";
      }
    }
  }
}

// Shapes whose leading dimensions are not multiples of 16 bytes: cuBLASLt either computes
// them (then they must match) or the launcher refuses them with std::invalid_argument naming
// the shape; never garbage.
TEST(GpuGemm, LinearFwdOddShapesMatchOrRefuse) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const LinearShape shapes[] = {{37, 33, 50}, {7, 17, 3}};
  for (DType dt : kFloatTypes) {
    for (const LinearShape& s : shapes) {
      const std::string what = tag(dt, "linear_fwd " + shape_name(s));
      SCOPED_TRACE(what);
      const Pair in = b.upload(dt, {s.n, s.i}, random_normal(s.n * s.i, 1.0, 21));
      const Pair w = b.upload(dt, {s.o, s.i}, random_normal(s.o * s.i, 0.2, 22));
      const Pair bias = b.upload(dt, {s.o}, random_normal(s.o, 0.5, 23));
      const Pair out = b.poisoned(dt, {s.n, s.o});
      b.cpu().linear_fwd(out.cpu, in.cpu, w.cpu, bias.cpu);
      try {
        b.gpu().linear_fwd(out.gpu, in.gpu, w.gpu, bias.gpu);
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("no algorithm"), std::string::npos) << e.what();
        continue;
      }
      EXPECT_TRUE(b.same(out, tolerance_for(dt), what));
    }
  }
}

TEST(GpuGemm, LinearRejectsBadArguments) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const Pair in = b.upload(DType::f32, {8, 16}, random_normal(8 * 16, 1.0, 31));
  const Pair w16 = b.upload(DType::bf16, {24, 16}, random_normal(24 * 16, 0.3, 32));
  const Pair w32 = b.upload(DType::f32, {24, 16}, random_normal(24 * 16, 0.3, 33));
  const Pair out = b.poisoned(DType::f32, {8, 24});
  const Pair small = b.poisoned(DType::f32, {8, 23});
  EXPECT_THROW(b.gpu().linear_fwd(out.gpu, in.gpu, w16.gpu, Tensor{}), std::invalid_argument);
  EXPECT_THROW(b.gpu().linear_fwd(small.gpu, in.gpu, w32.gpu, Tensor{}), std::invalid_argument);
  const Pair dw16 = b.poisoned(DType::bf16, {24, 16});
  EXPECT_THROW(b.gpu().linear_bwd(Tensor{}, dw16.gpu, Tensor{}, out.gpu, in.gpu, w32.gpu),
               std::invalid_argument);
}

TEST(GpuGemm, LinearGeluFwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  // O % 8 == 0 takes the fused GELU_AUX_BIAS epilogue in bf16; O = 44 the unfused path.
  const LinearShape shapes[] = {{37, 64, 48}, {64, 128, 256}, {37, 64, 44}};
  for (DType dt : kFloatTypes) {
    for (const LinearShape& s : shapes) {
      for (bool with_bias : {true, false}) {
        const std::string what = tag(dt, "linear_gelu_fwd " + shape_name(s) +
                                             (with_bias ? " +bias" : " no bias"));
        SCOPED_TRACE(what);
        const Pair in = b.upload(dt, {s.n, s.i}, random_normal(s.n * s.i, 1.0, 41));
        const Pair w =
            b.upload(dt, {s.o, s.i}, random_normal(s.o * s.i, 1.5 / std::sqrt(s.i), 42));
        const Pair bias = b.upload(dt, {s.o}, random_normal(s.o, 0.5, 43));
        const Pair out = b.poisoned(dt, {s.n, s.o});
        const Pair pre = b.poisoned(dt, {s.n, s.o});
        b.cpu().linear_gelu_fwd(out.cpu, pre.cpu, in.cpu, w.cpu, with_bias ? bias.cpu : Tensor{});
        b.gpu().linear_gelu_fwd(out.gpu, pre.gpu, in.gpu, w.gpu, with_bias ? bias.gpu : Tensor{});
        EXPECT_TRUE(b.same(pre, tolerance_for(dt), what + " pre"));
        EXPECT_TRUE(b.same(out, tolerance_for(dt), what + " out"));
      }
    }
  }
}

// Pins the GELU formula of the forward epilogue on this device: with an identity weight,
// pre = x + bias exactly, and out must be the tanh-approximation GELU of it. In
// x in [-3.25, -2.5] the exact (erf) GELU differs from the tanh one by 3-25% relative, far
// above bf16 rounding (0.4%), so a cuBLASLt epilogue computing erf-GELU fails here.
TEST(GpuGemm, LinearGeluEpilogueIsTanhGelu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  constexpr int64_t kN = 64, kC = 64;  // O = I = 64: the fused path in bf16
  constexpr double kBias = 0.25;
  Values x(static_cast<size_t>(kN * kC));
  for (size_t i = 0; i < x.size(); ++i) x[i] = -4.0 + 6.0 * static_cast<double>(i) / x.size();
  Values eye(static_cast<size_t>(kC * kC), 0.0);
  for (int64_t i = 0; i < kC; ++i) eye[static_cast<size_t>(i * kC + i)] = 1.0;
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(to_string(dt));
    const Pair in = b.upload(dt, {kN, kC}, x);
    const Pair w = b.upload(dt, {kC, kC}, eye);
    const Pair bias = b.upload(dt, {kC}, constant(kC, kBias));
    const Pair out = b.poisoned(dt, {kN, kC});
    const Pair pre = b.poisoned(dt, {kN, kC});
    b.gpu().linear_gelu_fwd(out.gpu, pre.gpu, in.gpu, w.gpu, bias.gpu);
    const Values xin = b.download(b.gpu(), in.gpu);  // x as stored (rounded to dt)
    const Values got = b.download(b.gpu(), out.gpu);
    const Values got_pre = b.download(b.gpu(), pre.gpu);
    const double rel = dt == DType::bf16 ? 1.0 / 128 : 1e-5;  // 2 x bf16 rounding / f32 slack
    int checked_window = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double p = xin[i] + kBias;  // exact in fp32
      const double want = tanh_gelu(p);
      ASSERT_NEAR(got_pre[i], p, rel * std::abs(p) + 1e-30) << "pre at element " << i;
      ASSERT_NEAR(got[i], want, rel * std::abs(want) + 1e-6)
          << "gelu(" << p << "): not the tanh-approximation GELU (erf GELU gives "
          << erf_gelu(p) << "); if the fused cuBLASLt epilogue is at fault, set kFuseGeluBf16 "
          << "= false in src/backend/cuda/gemm.cpp";
      if (p >= -3.25 && p <= -2.5) {
        ++checked_window;
        // The erf GELU is out of reach here: the check above rejects it.
        ASSERT_GT(std::abs(erf_gelu(p) - want), 3.0 * rel * std::abs(want)) << "test bug";
      }
    }
    EXPECT_GT(checked_window, 100);
  }
}

TEST(GpuGemm, LinearBwdMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const LinearShape shapes[] = {{37, 64, 48}, {64, 128, 96}, {130, 96, 200}};
  for (DType dt : kFloatTypes) {
    for (const LinearShape& s : shapes) {
      {
        const std::string what = tag(dt, "linear_bwd " + shape_name(s));
        SCOPED_TRACE(what);
        const Pair in = b.upload(dt, {s.n, s.i}, random_normal(s.n * s.i, 1.0, 51));
        const Pair w = b.upload(dt, {s.o, s.i}, random_normal(s.o * s.i, 0.2, 52));
        const Pair dout = b.upload(dt, {s.n, s.o}, random_normal(s.n * s.o, 1.0, 53));
        // Main grads start non-zero: they must be accumulated into, not overwritten.
        const Pair dw = b.upload(DType::f32, {s.o, s.i}, random_normal(s.o * s.i, 2.0, 54));
        const Pair db = b.upload(DType::f32, {s.o}, random_normal(s.o, 2.0, 55));
        const Pair din = b.poisoned(dt, {s.n, s.i});
        b.cpu().linear_bwd(din.cpu, dw.cpu, db.cpu, dout.cpu, in.cpu, w.cpu);
        b.gpu().linear_bwd(din.gpu, dw.gpu, db.gpu, dout.gpu, in.gpu, w.gpu);
        EXPECT_TRUE(b.same(din, tolerance_for(dt), what + " din"));
        // Same rounded operands on both sides, fp32 sums: only the order differs.
        EXPECT_TRUE(b.same(dw, kTolF32, what + " dweight"));
        EXPECT_TRUE(b.same(db, kTolF32, what + " dbias"));
      }
    }
  }
}

TEST(GpuGemm, LinearBwdWithoutDinOrDbias) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  const LinearShape s{37, 64, 48};
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(to_string(dt));
    const Pair in = b.upload(dt, {s.n, s.i}, random_normal(s.n * s.i, 1.0, 61));
    const Pair w = b.upload(dt, {s.o, s.i}, random_normal(s.o * s.i, 0.2, 62));
    const Pair dout = b.upload(dt, {s.n, s.o}, random_normal(s.n * s.o, 1.0, 63));
    const Pair dw = b.upload(DType::f32, {s.o, s.i}, random_normal(s.o * s.i, 1.0, 64));
    // Two microbatches into one main grad.
    for (int micro = 0; micro < 2; ++micro) {
      b.cpu().linear_bwd(Tensor{}, dw.cpu, Tensor{}, dout.cpu, in.cpu, w.cpu);
      b.gpu().linear_bwd(Tensor{}, dw.gpu, Tensor{}, dout.gpu, in.gpu, w.gpu);
    }
    EXPECT_TRUE(b.same(dw, kTolF32, tag(dt, "linear_bwd dweight after two microbatches")));
  }
}

// ---------------------------------------------------------------- elementwise

constexpr int64_t kN = 1003;  // not a multiple of any pack width: vector body plus tail

TEST(GpuElementwise, FillAllDtypes) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    const Pair t = b.poisoned(dt, {kN});
    b.cpu().fill(t.cpu, -1.375f);
    b.gpu().fill(t.gpu, -1.375f);
    EXPECT_TRUE(b.same(t, tolerance_for(dt), tag(dt, "fill")));
    const Pair u = shifted(b.poisoned(dt, {kN + 1}), kN);
    b.cpu().fill(u.cpu, 3.0f);
    b.gpu().fill(u.gpu, 3.0f);
    EXPECT_TRUE(b.same(u, tolerance_for(dt), tag(dt, "fill (misaligned)")));
  }
  const Pair ids = b.upload_ids({kN}, random_ids(kN, 0, 1000, 71));
  b.cpu().fill(ids.cpu, 7.0f);
  b.gpu().fill(ids.gpu, 7.0f);
  EXPECT_TRUE(b.same(ids, 0.0, "i32 fill"));
}

TEST(GpuElementwise, ConvertCopy) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType from : kFloatTypes) {
    for (DType to : kFloatTypes) {
      for (bool misaligned : {false, true}) {
        const std::string what = std::string("copy ") + to_string(from) + " -> " + to_string(to) +
                                 (misaligned ? " (misaligned)" : "");
        Pair src = b.upload(from, {kN + 1}, random_normal(kN + 1, 3.0, 72));
        Pair dst = b.poisoned(to, {kN + 1});
        if (misaligned) {
          src = shifted(src, kN);
          dst = shifted(dst, kN);
        }
        b.cpu().copy(dst.cpu, src.cpu);
        b.gpu().copy(dst.gpu, src.gpu);
        // Conversions are exact or one rounding to nearest even: the same bits both sides.
        EXPECT_TRUE(b.same(dst, 0.0, what));
      }
    }
  }
  const Pair ids = b.upload_ids({kN}, random_ids(kN, -5, 50000, 73));
  const Pair ids2 = b.upload_ids({kN}, random_ids(kN, 0, 1, 74));
  b.cpu().copy(ids2.cpu, ids.cpu);
  b.gpu().copy(ids2.gpu, ids.gpu);
  EXPECT_TRUE(b.same(ids2, 0.0, "i32 copy"));
}

// (The GELU forward runs inside linear_gelu_fwd: LinearGeluFwdMatchesCpu covers it.)
TEST(GpuElementwise, GeluBwd) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (bool misaligned : {false, true}) {
      const std::string sfx = misaligned ? " (misaligned)" : "";
      const int64_t n = misaligned ? kN + 1 : kN;
      Pair x = b.upload(dt, {n}, random_normal(n, 2.5, 81));
      Pair g = b.upload(dt, {n}, random_normal(n, 1.0, 82));
      Pair dx = b.poisoned(dt, {n});
      if (misaligned) {
        x = shifted(x, kN);
        g = shifted(g, kN);
        dx = shifted(dx, kN);
      }
      b.cpu().gelu_bwd(dx.cpu, g.cpu, x.cpu);
      b.gpu().gelu_bwd(dx.gpu, g.gpu, x.gpu);
      EXPECT_TRUE(b.same(dx, tolerance_for(dt), tag(dt, "gelu_bwd" + sfx)));
    }
  }
}

TEST(GpuElementwise, Add) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (DType dt : kFloatTypes) {
    for (bool misaligned : {false, true}) {
      const std::string sfx = misaligned ? " (misaligned)" : "";
      const int64_t n = misaligned ? kN + 1 : kN;
      Pair x = b.upload(dt, {n}, random_normal(n, 1.0, 91));
      Pair y = b.upload(dt, {n}, random_normal(n, 1.0, 92));
      Pair out = b.poisoned(dt, {n});
      if (misaligned) {
        x = shifted(x, kN);
        y = shifted(y, kN);
        out = shifted(out, kN);
      }
      b.cpu().add(out.cpu, x.cpu, y.cpu);
      b.gpu().add(out.gpu, x.gpu, y.gpu);
      EXPECT_TRUE(b.same(out, tolerance_for(dt), tag(dt, "add" + sfx)));
    }
  }
}

TEST(GpuElementwise, FillColumns) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  constexpr int64_t kRows = 7, kCols = 50;
  for (DType dt : kFloatTypes) {
    for (int64_t first : {int64_t{45}, int64_t{0}, int64_t{49}, int64_t{50}, int64_t{80}}) {
      const std::string what = tag(dt, "fill_columns from " + std::to_string(first));
      const Pair t = b.upload(dt, {kRows, kCols}, random_normal(kRows * kCols, 1.0, 111));
      b.cpu().fill_columns(t.cpu, first, -3.5f);
      b.gpu().fill_columns(t.gpu, first, -3.5f);
      EXPECT_TRUE(b.same(t, tolerance_for(dt), what));
    }
    // -inf, the logits mask: the harness skips non-finite CPU values, so check it directly.
    const Pair t = b.upload(dt, {kRows, kCols}, random_normal(kRows * kCols, 1.0, 112));
    const float ninf = -std::numeric_limits<float>::infinity();
    b.cpu().fill_columns(t.cpu, 45, ninf);
    b.gpu().fill_columns(t.gpu, 45, ninf);
    EXPECT_TRUE(b.same(t, tolerance_for(dt), tag(dt, "fill_columns -inf (finite part)")));
    const Values got = b.download(b.gpu(), t.gpu);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 45; c < kCols; ++c) {
        const double v = got[static_cast<size_t>(r * kCols + c)];
        EXPECT_TRUE(std::isinf(v) && v < 0) << tag(dt, "row ") << r << " col " << c << ": " << v;
      }
    }
  }
}

// ---------------------------------------------------------------- optimizer and reductions

TEST(GpuOptim, AdamWSeveralSteps) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  // The compute copy in bf16, in f32, and none; aligned (float4 path) and misaligned.
  struct Case {
    bool has_copy;
    DType copy_type;
    bool misaligned;
  };
  const Case cases[] = {{true, DType::bf16, false}, {true, DType::f32, false},
                        {false, DType::f32, false}, {true, DType::bf16, true}};
  for (const Case& c : cases) {
    const std::string what =
        std::string("adamw copy=") + (c.has_copy ? to_string(c.copy_type) : "none") +
        (c.misaligned ? " (misaligned)" : "");
    SCOPED_TRACE(what);
    const int64_t n = c.misaligned ? kN + 1 : kN;
    Pair master = b.upload(DType::f32, {n}, random_normal(n, 1.0, 121));
    Pair m = b.upload(DType::f32, {n}, random_normal(n, 0.05, 122));
    Pair v = b.upload(DType::f32, {n}, squares(random_normal(n, 0.05, 123)));
    Pair copy = b.poisoned(c.copy_type, {n});
    if (c.misaligned) {
      master = shifted(master, kN);
      m = shifted(m, kN);
      v = shifted(v, kN);
      copy = shifted(copy, kN);
    }
    for (int64_t step = 1; step <= 4; ++step) {
      const int64_t gn = c.misaligned ? kN + 1 : kN;
      Pair grad = b.upload(DType::f32, {gn}, random_normal(gn, 0.3, 130 + step));
      if (c.misaligned) grad = shifted(grad, kN);
      AdamWStep s;
      s.lr = 1e-2f;
      s.beta1 = 0.9f;
      s.beta2 = 0.95f;
      s.eps = 1e-8f;
      s.weight_decay = 0.1f;
      s.step = step;
      s.grad_scale = 0.37f;
      // Three ranges, as ZeRO-1 cuts them: local offsets (moments and the sharded master)
      // that are not the flat ones, and ranges with and without weight decay.
      const std::vector<AdamWRange> ranges = {
          {.flat = 0, .local = 100, .count = 300, .master = 100, .weight_decay = true},
          {.flat = 300, .local = 0, .count = 100, .master = 0, .weight_decay = false},
          {.flat = 400, .local = 400, .count = n - 400, .master = 400, .weight_decay = true}};
      b.cpu().adamw(master.cpu, grad.cpu, m.cpu, v.cpu, c.has_copy ? copy.cpu : Tensor{}, ranges, s);
      b.gpu().adamw(master.gpu, grad.gpu, m.gpu, v.gpu, c.has_copy ? copy.gpu : Tensor{}, ranges, s);
    }
    EXPECT_TRUE(b.same(master, kTolF32, what + " master"));
    EXPECT_TRUE(b.same(m, kTolF32, what + " m"));
    EXPECT_TRUE(b.same(v, kTolF32, what + " v"));
    if (c.has_copy) {
      EXPECT_TRUE(b.same(copy, tolerance_for(c.copy_type), what + " copy"));
    }
  }
}

TEST(GpuOptim, SumSquares) {
  JUMBO_REQUIRE_GPU();
  DualBench b;
  for (int64_t n : {int64_t{5}, kN, int64_t{100003}}) {
    for (bool misaligned : {false, true}) {
      const std::string what = "sum_squares n=" + std::to_string(n) +
                               (misaligned ? " (misaligned)" : "");
      SCOPED_TRACE(what);
      const int64_t alloc = misaligned ? n + 1 : n;
      const Values values = random_normal(alloc, 1.5, 141 + static_cast<uint64_t>(n));
      Pair t = b.upload(DType::f32, {alloc}, values);
      if (misaligned) t = shifted(t, n);
      // The whole tensor, then several spans (one empty, one of a single element).
      for (const std::vector<FlatSpan>& spans :
           {std::vector<FlatSpan>{{0, n}},
            std::vector<FlatSpan>{{0, n / 2}, {n / 2, 0}, {n / 2, n - n / 2 - 1}, {n - 1, 1}}}) {
        const double want = b.cpu().sum_squares(t.cpu, spans);
        const double got = b.gpu().sum_squares(t.gpu, spans);
        EXPECT_NEAR(got, want, 1e-6 * want) << spans.size() << " spans";
        report_error_as("sum_squares", "f32", std::abs(got - want) / std::max(want, 1e-300), 1e-6,
                        what + ", " + std::to_string(spans.size()) + " spans");
        EXPECT_EQ(got, b.gpu().sum_squares(t.gpu, spans)) << "not deterministic";
      }
    }
  }
}

}  // namespace
}  // namespace jumbo::gputest
