// Causal attention: the CUDA backend's flash attention against the CPU reference on the same
// inputs, f32 and bf16 storage, head sizes 64, 128 and 144 (J1-Jumbo's), sequence lengths that
// are and are not multiples of the kernels' tiles (64 rows resident, 32 or 64 streamed), T = 1.
// The two backends keep different statistics for the backward (the CPU the probabilities, flash
// attention one log-sum-exp per row), so each side gets stats of its own attention_stats_cols.
// Also: the backward is bit-identical run to run, and the saved log-sum-exp matches a
// double-precision reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_support.h"

namespace jumbo::gputest {
namespace {

struct Shape {
  int64_t b, t, h, d;
};

std::string describe(DType dtype, const Shape& s) {
  std::ostringstream os;
  os << to_string(dtype) << " B=" << s.b << " T=" << s.t << " H=" << s.h << " D=" << s.d;
  return os.str();
}

Pair stats_for(DualBench& bench, const Shape& s) {
  return bench.scratch(DType::f32, {s.b, s.h, s.t, bench.cpu().attention_stats_cols(s.t)},
                       {s.b, s.h, s.t, bench.gpu().attention_stats_cols(s.t)});
}

// One of the (q, k, v) slots of a [B, T, H*3*D] gradient, GPU against CPU, relative to the larger
// of the slot's largest |CPU value| and a twentieth of the whole gradient's (at T = 1 the CPU's dq
// and dk are exactly zero while the GPU's are rounding-sized).
::testing::AssertionResult same_slot(const Values& cpu, const Values& gpu, const Shape& s, int slot,
                                     double tol, const char* what) {
  if (cpu.size() != gpu.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  double max_all = 0, max_slot = 0;
  for (double v : cpu) max_all = std::max(max_all, std::fabs(v));
  auto index = [&](int64_t b, int64_t t, int64_t h, int64_t i) {
    return static_cast<size_t>(((b * s.t + t) * s.h + h) * 3 * s.d + slot * s.d + i);
  };
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t t = 0; t < s.t; ++t)
      for (int64_t h = 0; h < s.h; ++h)
        for (int64_t i = 0; i < s.d; ++i)
          max_slot = std::max(max_slot, std::fabs(cpu[index(b, t, h, i)]));
  const double ref = std::max(max_slot, 0.05 * max_all);
  double worst = -1;
  std::string where;
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t t = 0; t < s.t; ++t) {
      for (int64_t h = 0; h < s.h; ++h) {
        for (int64_t i = 0; i < s.d; ++i) {
          const size_t k = index(b, t, h, i);
          const double err = std::isfinite(gpu[k]) ? std::fabs(gpu[k] - cpu[k]) : INFINITY;
          if (err > worst) {
            worst = err;
            std::ostringstream os;
            os << "[b=" << b << " t=" << t << " h=" << h << " i=" << i << "] gpu " << gpu[k]
               << " cpu " << cpu[k];
            where = os.str();
          }
        }
      }
    }
  }
  if (worst <= tol * ref) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max |gpu - cpu| = " << worst << " > " << tol
                                       << " * " << ref << " at " << where;
}

// Forward and backward on both backends from the same inputs; every output compared.
void check_against_cpu(DType dtype, const Shape& s, uint64_t seed) {
  SCOPED_TRACE(describe(dtype, s));
  DualBench bench;
  const int64_t c3 = s.h * 3 * s.d, c = s.h * s.d;
  const double tol = tolerance_for(dtype);

  Pair qkv = bench.upload(dtype, {s.b, s.t, c3}, random_normal(s.b * s.t * c3, 1.5, seed));
  Pair out = bench.poisoned(dtype, {s.b, s.t, c});
  Pair stats = stats_for(bench, s);
  bench.cpu().attention_fwd(out.cpu, stats.cpu, qkv.cpu);
  bench.gpu().attention_fwd(out.gpu, stats.gpu, qkv.gpu);
  EXPECT_TRUE(bench.same(out, tol, "attention out"));

  Pair dout = bench.upload(dtype, {s.b, s.t, c}, random_normal(s.b * s.t * c, 1.0, seed + 1));
  Pair dstats = stats_for(bench, s);
  Pair dqkv = bench.poisoned(dtype, {s.b, s.t, c3});
  bench.cpu().attention_bwd(dqkv.cpu, dstats.cpu, dout.cpu, qkv.cpu, out.cpu, stats.cpu);
  bench.gpu().attention_bwd(dqkv.gpu, dstats.gpu, dout.gpu, qkv.gpu, out.gpu, stats.gpu);
  EXPECT_TRUE(bench.same(dqkv, tol, "attention dqkv"));
  const Values cpu = bench.download(bench.cpu(), dqkv.cpu);
  const Values gpu = bench.download(bench.gpu(), dqkv.gpu);
  EXPECT_TRUE(same_slot(cpu, gpu, s, 0, tol, "dq"));
  EXPECT_TRUE(same_slot(cpu, gpu, s, 1, tol, "dk"));
  EXPECT_TRUE(same_slot(cpu, gpu, s, 2, tol, "dv"));
}

// T = 197 is no multiple of any tile (64 resident rows; 32 or 64 streamed), T = 64 exactly one
// resident tile, T = 33 one streamed tile and a row, T = 1 the degenerate row.
std::vector<Shape> shapes(int64_t d) {
  return {{2, 197, 3, d}, {1, 1, 2, d}, {1, 64, 1, d}, {2, 33, 2, d}};
}

void check_head_size(DType dtype, int64_t d) {
  uint64_t seed = 1000 * static_cast<uint64_t>(d) + (dtype == DType::bf16 ? 500 : 0);
  for (const Shape& s : shapes(d)) check_against_cpu(dtype, s, seed += 10);
}

TEST(GpuAttention, F32HeadSize64MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_head_size(DType::f32, 64);
}

TEST(GpuAttention, F32HeadSize128MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_head_size(DType::f32, 128);
}

TEST(GpuAttention, F32HeadSize144MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_head_size(DType::f32, 144);
}

TEST(GpuAttention, Bf16HeadSize64MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_head_size(DType::bf16, 64);
}

TEST(GpuAttention, Bf16HeadSize128MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_head_size(DType::bf16, 128);
}

TEST(GpuAttention, Bf16HeadSize144MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_head_size(DType::bf16, 144);
}

// Many key and query tiles per block (the online softmax's rescaling, the double buffers'
// alternation, the causal skip of whole tiles), T = 700 = 10 x 64 + 60.
TEST(GpuAttention, LongSequenceMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t d : {64, 144}) check_against_cpu(dtype, {1, 700, 2, d}, 77 + d);
  }
}

// The backward has no atomics: the same inputs give the same bits, and so does the forward.
TEST(GpuAttention, RunsAreBitIdentical) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Shape s{2, 197, 3, 144};
    SCOPED_TRACE(describe(dtype, s));
    DualBench bench;
    Backend& gpu = bench.gpu();
    const int64_t c3 = s.h * 3 * s.d, c = s.h * s.d;
    Pair qkv = bench.upload(dtype, {s.b, s.t, c3}, random_normal(s.b * s.t * c3, 1.5, 11));
    Pair dout = bench.upload(dtype, {s.b, s.t, c}, random_normal(s.b * s.t * c, 1.0, 12));
    Pair out1 = bench.poisoned(dtype, {s.b, s.t, c}), out2 = bench.poisoned(dtype, {s.b, s.t, c});
    Pair stats1 = stats_for(bench, s), stats2 = stats_for(bench, s), dstats = stats_for(bench, s);
    Pair dqkv1 = bench.poisoned(dtype, {s.b, s.t, c3}),
         dqkv2 = bench.poisoned(dtype, {s.b, s.t, c3});
    gpu.attention_fwd(out1.gpu, stats1.gpu, qkv.gpu);
    gpu.attention_fwd(out2.gpu, stats2.gpu, qkv.gpu);
    gpu.attention_bwd(dqkv1.gpu, dstats.gpu, dout.gpu, qkv.gpu, out1.gpu, stats1.gpu);
    gpu.attention_bwd(dqkv2.gpu, dstats.gpu, dout.gpu, qkv.gpu, out1.gpu, stats1.gpu);
    const std::pair<Pair*, Pair*> runs[] = {{&out1, &out2}, {&stats1, &stats2}, {&dqkv1, &dqkv2}};
    const char* names[] = {"out", "lse", "dqkv"};
    for (int r = 0; r < 3; ++r) {
      const Values a = bench.download(gpu, runs[r].first->gpu);
      const Values b = bench.download(gpu, runs[r].second->gpu);
      ASSERT_EQ(a.size(), b.size());
      size_t differing = 0, first = a.size();
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(std::isfinite(a[i])) << names[r] << " element " << i << " is " << a[i];
        if (a[i] != b[i]) {
          ++differing;
          first = std::min(first, i);
        }
      }
      EXPECT_EQ(differing, 0u) << names[r] << ": first difference at element " << first;
    }
  }
}

// lse[b, h, t] = log sum_{j <= t} exp(q_t . k_j / sqrt(D)), from the stored (rounded) q and k in
// double precision. The CPU keeps probabilities instead, so this is the lse's own check.
TEST(GpuAttention, LogSumExpMatchesDoubleReference) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t d : {64, 144}) {
      const Shape s{2, 5, 2, d};
      SCOPED_TRACE(describe(dtype, s));
      DualBench bench;
      ASSERT_EQ(bench.gpu().attention_stats_cols(s.t), 1);
      const int64_t c3 = s.h * 3 * s.d;
      Pair qkv = bench.upload(dtype, {s.b, s.t, c3}, random_normal(s.b * s.t * c3, 1.5, 5 + d));
      Pair out = bench.poisoned(dtype, {s.b, s.t, s.h * s.d});
      Pair stats = stats_for(bench, s);
      bench.gpu().attention_fwd(out.gpu, stats.gpu, qkv.gpu);
      const Values x = bench.download(bench.cpu(), qkv.cpu);
      const Values lse = bench.download(bench.gpu(), stats.gpu);
      ASSERT_EQ(lse.size(), static_cast<size_t>(s.b * s.h * s.t));
      const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
      for (int64_t b = 0; b < s.b; ++b) {
        for (int64_t h = 0; h < s.h; ++h) {
          for (int64_t t = 0; t < s.t; ++t) {
            const double* q = x.data() + (b * s.t + t) * c3 + h * 3 * s.d;
            std::vector<double> scores;
            for (int64_t j = 0; j <= t; ++j) {
              const double* k = x.data() + (b * s.t + j) * c3 + h * 3 * s.d + s.d;
              double dot = 0;
              for (int64_t i = 0; i < s.d; ++i) dot += q[i] * k[i];
              scores.push_back(dot * scale);
            }
            const double mx = *std::max_element(scores.begin(), scores.end());
            double sum = 0;
            for (double v : scores) sum += std::exp(v - mx);
            const double want = mx + std::log(sum);
            const double got = lse[(b * s.h + h) * s.t + t];
            EXPECT_NEAR(got, want, 1e-4 * std::max(1.0, std::fabs(want)))
                << "lse[b=" << b << " h=" << h << " t=" << t << "]";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace jumbo::gputest
