// Causal attention: the CUDA backend's flash attention against the CPU reference on the same
// inputs, f32 and bf16 storage, head sizes 64, 128 and 144 (J1-Jumbo's), sequence lengths that
// are and are not multiples of the kernels' tiles (64 rows resident, 32 or 64 streamed), T = 1.
// The two backends keep different statistics for the backward (the CPU the probabilities, flash
// attention one log-sum-exp per row), so each side gets stats of its own attention_stats_cols.
// Also: the backward is bit-identical run to run, and the saved log-sum-exp matches a
// double-precision reference.
// Packed sequences (positions: each token's position in its own sequence, attending only to
// it): the same comparisons with the same positions on both sides, several sequences per row of
// random lengths (length 1, starting mid-tile, spanning tiles, one token each), plus the lse
// against the masked double reference; and positions 0 .. T-1 (one sequence per row) give the
// plain causal call's bits.
// Every call here is multi-head (kv_heads = H); grouped-query attention: test_attention_gqa.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
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

// Packed positions for B rows of T tokens: each row's sequences have the lengths `first` (row
// b uses first[b % first.size()]) and then random ones (a third of them 1, the rest 2 ..
// max_len), the row's last sequence cut at T. Positions count 0, 1, ... in each sequence.
using Lengths = std::vector<std::vector<int64_t>>;
std::vector<int32_t> packed_positions(const Shape& s, const Lengths& first, int64_t max_len,
                                      uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> len_dist(2, std::max<int64_t>(2, max_len));
  std::uniform_int_distribution<int> third(0, 2);
  std::vector<int32_t> pos(static_cast<size_t>(s.b * s.t));
  for (int64_t b = 0; b < s.b; ++b) {
    const std::vector<int64_t> none;
    const std::vector<int64_t>& given = first.empty() ? none : first[b % first.size()];
    size_t k = 0;
    for (int64_t t = 0; t < s.t;) {
      const int64_t len = k < given.size() ? given[k] : (third(gen) == 0 ? 1 : len_dist(gen));
      ++k;
      for (int64_t j = 0; j < len && t < s.t; ++j, ++t) {
        pos[static_cast<size_t>(b * s.t + t)] = static_cast<int32_t>(j);
      }
    }
  }
  return pos;
}

// Rows of the positions, as "b=0: 37 1 1 90 ..." (the sequence lengths), for failure messages.
std::string describe_lengths(const Shape& s, const std::vector<int32_t>& pos) {
  std::ostringstream os;
  for (int64_t b = 0; b < s.b; ++b) {
    os << (b ? "; " : "") << "b=" << b << ":";
    int64_t len = 0;
    for (int64_t t = 0; t < s.t; ++t) {
      if (pos[static_cast<size_t>(b * s.t + t)] == 0 && len > 0) {
        os << ' ' << len;
        len = 0;
      }
      ++len;
    }
    os << ' ' << len;
  }
  return os.str();
}

// The GPU's lse against sum over the visible keys (t - pos[t] .. t, or 0 .. t when pos is
// empty) of exp(q_t . k_j / sqrt(D)) in double precision, from the stored (rounded) q and k.
void expect_lse_matches_reference(DualBench& bench, const Pair& qkv, const Pair& stats,
                                  const Shape& s, const std::vector<int32_t>& pos) {
  const int64_t c3 = s.h * 3 * s.d;
  const Values x = bench.download(bench.cpu(), qkv.cpu);
  const Values lse = bench.download(bench.gpu(), stats.gpu);
  ASSERT_EQ(lse.size(), static_cast<size_t>(s.b * s.h * s.t));
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  int64_t failures = 0;
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t h = 0; h < s.h; ++h) {
      for (int64_t t = 0; t < s.t; ++t) {
        const int64_t lo = pos.empty() ? 0 : t - pos[static_cast<size_t>(b * s.t + t)];
        const double* q = x.data() + (b * s.t + t) * c3 + h * 3 * s.d;
        std::vector<double> scores;
        for (int64_t j = lo; j <= t; ++j) {
          const double* k = x.data() + (b * s.t + j) * c3 + h * 3 * s.d + s.d;
          double dot = 0;
          for (int64_t i = 0; i < s.d; ++i) dot += q[i] * k[i];
          scores.push_back(dot * scale);
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double v : scores) sum += std::exp(v - mx);
        const double want = mx + std::log(sum);
        const double got = lse[static_cast<size_t>((b * s.h + h) * s.t + t)];
        if (!(std::fabs(got - want) <= 1e-4 * std::max(1.0, std::fabs(want))) && failures++ < 5) {
          ADD_FAILURE() << "lse[b=" << b << " h=" << h << " t=" << t << "] = " << got
                        << ", want " << want << " (keys " << lo << " .. " << t << ")";
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << "lse rows off the double reference";
}

// Forward and backward on both backends from the same inputs; every output compared. With
// positions (i32 [B*T]) both sides attend within the packed sequences, and the GPU's lse is
// checked against the masked double reference too.
void check_against_cpu(DType dtype, const Shape& s, uint64_t seed,
                       const std::vector<int32_t>& positions = {}) {
  SCOPED_TRACE(describe(dtype, s));
  SCOPED_TRACE(positions.empty() ? std::string("causal")
                                 : "packed sequences " + describe_lengths(s, positions));
  DualBench bench;
  const int64_t c3 = s.h * 3 * s.d, c = s.h * s.d;
  const double tol = tolerance_for(dtype);
  Pair pos;  // empty on both sides: plain causal
  if (!positions.empty()) {
    ASSERT_EQ(static_cast<int64_t>(positions.size()), s.b * s.t) << "test bug: positions size";
    pos = bench.upload_ids({s.b * s.t}, positions);
  }

  Pair qkv = bench.upload(dtype, {s.b, s.t, c3}, random_normal(s.b * s.t * c3, 1.5, seed));
  Pair out = bench.poisoned(dtype, {s.b, s.t, c});
  Pair stats = stats_for(bench, s);
  bench.cpu().attention_fwd(out.cpu, stats.cpu, qkv.cpu, s.h, pos.cpu);
  bench.gpu().attention_fwd(out.gpu, stats.gpu, qkv.gpu, s.h, pos.gpu);
  EXPECT_TRUE(bench.same(out, tol, "attention_fwd out"));
  if (!positions.empty()) expect_lse_matches_reference(bench, qkv, stats, s, positions);

  Pair dout = bench.upload(dtype, {s.b, s.t, c}, random_normal(s.b * s.t * c, 1.0, seed + 1));
  Pair dstats = stats_for(bench, s);
  Pair dqkv = bench.poisoned(dtype, {s.b, s.t, c3});
  bench.cpu().attention_bwd(dqkv.cpu, dstats.cpu, dout.cpu, qkv.cpu, out.cpu, stats.cpu, s.h,
                            pos.cpu);
  bench.gpu().attention_bwd(dqkv.gpu, dstats.gpu, dout.gpu, qkv.gpu, out.gpu, stats.gpu, s.h,
                            pos.gpu);
  EXPECT_TRUE(bench.same(dqkv, tol, "attention_bwd dqkv"));
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
    gpu.attention_fwd(out1.gpu, stats1.gpu, qkv.gpu, s.h);
    gpu.attention_fwd(out2.gpu, stats2.gpu, qkv.gpu, s.h);
    gpu.attention_bwd(dqkv1.gpu, dstats.gpu, dout.gpu, qkv.gpu, out1.gpu, stats1.gpu, s.h);
    gpu.attention_bwd(dqkv2.gpu, dstats.gpu, dout.gpu, qkv.gpu, out1.gpu, stats1.gpu, s.h);
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

// ---- packed sequences ----

// Shapes with several sequences per row: T = 197 (no multiple of any tile), 64 (one resident
// tile), 33 (a streamed tile and a row), 130 (two resident tiles and a bit), 1. The first
// lengths put a sequence start mid-tile (at 37), length-1 sequences right after it, one across
// tile boundaries (tokens 39 .. 128: the block of rows 64 .. 127 starts past key tile 0, and
// the rows from 129 on meet whole key tiles before their own sequences), one starting exactly
// on a tile (at 64), and a long one after a run of length-1 sequences.
void check_packed_head_size(DType dtype, int64_t d) {
  uint64_t seed = 7000 + 1000 * static_cast<uint64_t>(d) + (dtype == DType::bf16 ? 500 : 0);
  const Lengths first = {{37, 1, 1, 90, 1}, {64, 1, 5, 17}, {3, 1, 1, 1, 100}};
  const std::vector<Shape> packed_shapes = {
      {2, 197, 3, d}, {3, 130, 2, d}, {1, 64, 1, d}, {2, 33, 2, d}, {1, 1, 2, d}};
  for (const Shape& s : packed_shapes) {
    seed += 10;
    check_against_cpu(dtype, s, seed, packed_positions(s, first, 40, seed + 5));
  }
}

TEST(GpuAttention, PackedF32HeadSize64MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_packed_head_size(DType::f32, 64);
}

TEST(GpuAttention, PackedF32HeadSize128MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_packed_head_size(DType::f32, 128);
}

TEST(GpuAttention, PackedF32HeadSize144MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_packed_head_size(DType::f32, 144);
}

TEST(GpuAttention, PackedBf16HeadSize64MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_packed_head_size(DType::bf16, 64);
}

TEST(GpuAttention, PackedBf16HeadSize128MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_packed_head_size(DType::bf16, 128);
}

TEST(GpuAttention, PackedBf16HeadSize144MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_packed_head_size(DType::bf16, 144);
}

// Long rows: many tiles per block, so the forward and dQ blocks start past key tile 0, the
// dK/dV blocks stop early, and warps skip tiles; T = 700 = 10 x 64 + 60. Row 0 mixes a 300-token
// sequence (many tiles, the online softmax rescaling across them) with short ones, row 1 has
// short random ones only, row 2 is one token per sequence (each query sees only itself).
TEST(GpuAttention, PackedLongSequenceMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t d : {64, 144}) {
      const Shape s{3, 700, 2, d};
      std::vector<int32_t> pos = packed_positions(s, {{45, 300, 1, 2}, {}}, 120, 91 + d);
      for (int64_t t = 0; t < s.t; ++t) pos[static_cast<size_t>(2 * s.t + t)] = 0;
      check_against_cpu(dtype, s, 88 + d, pos);
    }
  }
}

// Positions 0 .. T-1 in every row are one sequence per row: the same bits as the plain causal
// call (out, lse and dqkv); and packed runs are bit-identical run to run.
TEST(GpuAttention, OneSequencePerRowEqualsCausalBitwise) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t d : {64, 128, 144}) {
      const Shape s{2, 197, 3, d};
      SCOPED_TRACE(describe(dtype, s));
      DualBench bench;
      Backend& gpu = bench.gpu();
      const int64_t c3 = s.h * 3 * s.d, c = s.h * s.d;
      std::vector<int32_t> ramp(static_cast<size_t>(s.b * s.t));
      for (int64_t i = 0; i < s.b * s.t; ++i) {
        ramp[static_cast<size_t>(i)] = static_cast<int32_t>(i % s.t);
      }
      const Pair pos = bench.upload_ids({s.b * s.t}, ramp);
      const Pair packed = bench.upload_ids({s.b * s.t}, packed_positions(s, {{37, 1, 90}}, 50, d));
      Pair qkv = bench.upload(dtype, {s.b, s.t, c3}, random_normal(s.b * s.t * c3, 1.5, 21 + d));
      Pair dout = bench.upload(dtype, {s.b, s.t, c}, random_normal(s.b * s.t * c, 1.0, 22 + d));
      Pair dstats = stats_for(bench, s);
      struct Run {
        Pair out, stats, dqkv;
      };
      std::vector<Run> runs;
      // 0: causal, 1: positions 0 .. T-1, 2 and 3: packed twice.
      const Tensor run_positions[] = {Tensor{}, pos.gpu, packed.gpu, packed.gpu};
      for (const Tensor& p : run_positions) {
        Run r{bench.poisoned(dtype, {s.b, s.t, c}), stats_for(bench, s),
              bench.poisoned(dtype, {s.b, s.t, c3})};
        gpu.attention_fwd(r.out.gpu, r.stats.gpu, qkv.gpu, s.h, p);
        gpu.attention_bwd(r.dqkv.gpu, dstats.gpu, dout.gpu, qkv.gpu, r.out.gpu, r.stats.gpu, s.h,
                          p);
        runs.push_back(r);
      }
      const std::pair<int, int> same_bits[] = {{0, 1}, {2, 3}};
      for (const auto& [x, y] : same_bits) {
        const Pair* a[] = {&runs[x].out, &runs[x].stats, &runs[x].dqkv};
        const Pair* b[] = {&runs[y].out, &runs[y].stats, &runs[y].dqkv};
        const char* names[] = {"out", "lse", "dqkv"};
        for (int k = 0; k < 3; ++k) {
          const Values va = bench.download(gpu, a[k]->gpu);
          const Values vb = bench.download(gpu, b[k]->gpu);
          ASSERT_EQ(va.size(), vb.size());
          size_t differing = 0, first = va.size();
          for (size_t i = 0; i < va.size(); ++i) {
            ASSERT_TRUE(std::isfinite(va[i]) && std::isfinite(vb[i]))
                << names[k] << " element " << i << ": " << va[i] << " vs " << vb[i]
                << " (runs " << x << ", " << y << ")";
            if (va[i] != vb[i]) {
              ++differing;
              first = std::min(first, i);
            }
          }
          EXPECT_EQ(differing, 0u) << names[k] << " (runs " << x << " and " << y
                                   << "): first difference at element " << first;
        }
      }
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
      bench.gpu().attention_fwd(out.gpu, stats.gpu, qkv.gpu, s.h);
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
