// Grouped-query attention (backend.h: qkv rows of G groups, each R = H/G query heads, a key head
// and a value head) on the CUDA backend: flash attention forward and backward and attention over
// a KV cache against the CPU reference, f32 and bf16, G = 1 (multi-query), G = 2 of H = 4 and
// G = H; packed sequences; head sizes 64, 128, 144 (and the cache's run-time sizes). Independent
// of the CPU: GQA equals multi-head attention on the same queries with each group's key and value
// repeated per query head (forward and dQ bit for bit, dK and dV the sums over the group's
// heads), and its backward is bit-identical run to run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_test_support.h"

namespace jumbo::gputest {
namespace {

struct GqaShape {
  int64_t b, t, h, g, d;
  int64_t r() const { return h / g; }
  int64_t width() const { return g * (r() + 2) * d; }
  // Columns in a qkv row: query head hq, and the key and value heads of group kv.
  int64_t q_col(int64_t hq) const { return (hq / r()) * (r() + 2) * d + (hq % r()) * d; }
  int64_t k_col(int64_t kv) const { return kv * (r() + 2) * d + r() * d; }
  int64_t v_col(int64_t kv) const { return k_col(kv) + d; }
};

std::string describe(DType dtype, const GqaShape& s) {
  std::ostringstream os;
  os << to_string(dtype) << " B=" << s.b << " T=" << s.t << " H=" << s.h << " G=" << s.g
     << " D=" << s.d;
  return os.str();
}

Pair stats_for(DualBench& bench, const GqaShape& s) {
  return bench.scratch(DType::f32, {s.b, s.h, s.t, bench.cpu().attention_stats_cols(s.t)},
                       {s.b, s.h, s.t, bench.gpu().attention_stats_cols(s.t)});
}

// The D columns at `col` of every row (b, t) of a [B, T, width] tensor, in order.
Values head_columns(const Values& x, const GqaShape& s, int64_t width, int64_t col) {
  Values out;
  out.reserve(static_cast<size_t>(s.b * s.t * s.d));
  for (int64_t row = 0; row < s.b * s.t; ++row) {
    for (int64_t i = 0; i < s.d; ++i) out.push_back(x[static_cast<size_t>(row * width + col + i)]);
  }
  return out;
}

// One kind of head of dqkv ("dq": every query head, "dk", "dv": every group's), GPU against
// CPU, relative to the larger of the kind's largest |CPU value| and a twentieth of the whole
// gradient's (at T = 1 the CPU's dq and dk are exactly zero, the GPU's rounding-sized).
::testing::AssertionResult same_heads(const Values& cpu, const Values& gpu, const GqaShape& s,
                                      const std::string& kind, DType dtype, double tol,
                                      const std::string& what) {
  double max_all = 0;
  for (double v : cpu) max_all = std::max(max_all, std::fabs(v));
  Values want, got;
  const int64_t heads = kind == "dq" ? s.h : s.g;
  for (int64_t j = 0; j < heads; ++j) {
    const int64_t col = kind == "dq" ? s.q_col(j) : kind == "dk" ? s.k_col(j) : s.v_col(j);
    const Values w = head_columns(cpu, s, s.width(), col);
    const Values g = head_columns(gpu, s, s.width(), col);
    want.insert(want.end(), w.begin(), w.end());
    got.insert(got.end(), g.begin(), g.end());
  }
  double max_kind = 0, worst = -1;
  size_t at = 0;
  for (double v : want) max_kind = std::max(max_kind, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::isfinite(got[i]) ? std::fabs(got[i] - want[i]) : INFINITY;
    if (err > worst) worst = err, at = i;
  }
  const double ref = std::max(max_kind, 0.05 * max_all);
  report_error(what + " " + kind, dtype, ref > 0 ? worst / ref : worst, tol);
  if (worst <= tol * ref) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " " << kind << ": max |gpu - cpu| = " << worst
                                       << " > " << tol << " * " << ref << " at element " << at
                                       << " of the kind (gpu " << got[at] << ", cpu " << want[at]
                                       << ")";
}

// The same bits (values from f32 or bf16, so double equality is bit equality), all finite.
::testing::AssertionResult bit_equal(const Values& a, const Values& b, const std::string& what) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || a[i] != b[i]) {
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << a[i]
                                           << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Packed positions: each row's sequences of random lengths 1 .. max_len, counting 0, 1, ...
std::vector<int32_t> packed_positions(const GqaShape& s, int64_t max_len, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> len_dist(1, max_len);
  std::vector<int32_t> pos(static_cast<size_t>(s.b * s.t));
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t t = 0; t < s.t;) {
      const int64_t len = len_dist(gen);
      for (int64_t j = 0; j < len && t < s.t; ++j, ++t) {
        pos[static_cast<size_t>(b * s.t + t)] = static_cast<int32_t>(j);
      }
    }
  }
  return pos;
}

// Forward and backward on both backends from the same inputs; out and every head kind of dqkv
// compared.
void check_against_cpu(DType dtype, const GqaShape& s, uint64_t seed,
                       const std::vector<int32_t>& positions = {}) {
  SCOPED_TRACE(describe(dtype, s) + (positions.empty() ? " causal" : " packed"));
  DualBench bench;
  const int64_t w = s.width(), c = s.h * s.d;
  const double tol = tolerance_for(dtype);
  Pair pos;
  if (!positions.empty()) pos = bench.upload_ids({s.b * s.t}, positions);
  Pair qkv = bench.upload(dtype, {s.b, s.t, w}, random_normal(s.b * s.t * w, 1.5, seed));
  Pair out = bench.poisoned(dtype, {s.b, s.t, c});
  Pair stats = stats_for(bench, s);
  bench.cpu().attention_fwd(out.cpu, stats.cpu, qkv.cpu, s.g, pos.cpu);
  bench.gpu().attention_fwd(out.gpu, stats.gpu, qkv.gpu, s.g, pos.gpu);
  EXPECT_TRUE(bench.same(out, tol, "attention_fwd gqa out " + describe(dtype, s)));

  Pair dout = bench.upload(dtype, {s.b, s.t, c}, random_normal(s.b * s.t * c, 1.0, seed + 1));
  Pair dstats = stats_for(bench, s);
  Pair dqkv = bench.poisoned(dtype, {s.b, s.t, w});
  bench.cpu().attention_bwd(dqkv.cpu, dstats.cpu, dout.cpu, qkv.cpu, out.cpu, stats.cpu, s.g,
                            pos.cpu);
  bench.gpu().attention_bwd(dqkv.gpu, dstats.gpu, dout.gpu, qkv.gpu, out.gpu, stats.gpu, s.g,
                            pos.gpu);
  const Values cpu = bench.download(bench.cpu(), dqkv.cpu);
  const Values gpu = bench.download(bench.gpu(), dqkv.gpu);
  const std::string what = "attention_bwd gqa " + describe(dtype, s);
  for (const char* kind : {"dq", "dk", "dv"}) {
    EXPECT_TRUE(same_heads(cpu, gpu, s, kind, dtype, tol, what));
  }
}

// H = 4 query heads in G = 1, 2, 4 groups; T = 197 (no multiple of any tile), 33 (a streamed
// tile and a row), 1.
void check_groups(DType dtype, int64_t d, uint64_t seed) {
  for (int64_t g : {1, 2, 4}) {
    for (const GqaShape& s : {GqaShape{2, 197, 4, g, d}, GqaShape{1, 33, 4, g, d},
                              GqaShape{1, 1, 4, g, d}}) {
      check_against_cpu(dtype, s, seed += 10);
    }
  }
}

TEST(GpuAttentionGqa, F32MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_groups(DType::f32, 64, 100);
  check_groups(DType::f32, 128, 200);
}

TEST(GpuAttentionGqa, Bf16MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  check_groups(DType::bf16, 64, 300);
  check_groups(DType::bf16, 128, 400);
}

// D = 144 with R = 3 (H = 6, G = 2), and a long row (T = 700: many query tiles per head, so the
// dK/dV pipeline crosses from one query head to the next mid-stream) with G = 1 of H = 4.
TEST(GpuAttentionGqa, HeadSize144AndLongRowsMatchCpu) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    check_against_cpu(dtype, {1, 130, 6, 2, 144}, 500);
    check_against_cpu(dtype, {1, 700, 4, 1, 64}, 510);
  }
}

TEST(GpuAttentionGqa, PackedMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  uint64_t seed = 600;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const GqaShape& s : {GqaShape{2, 197, 4, 2, 64}, GqaShape{1, 300, 4, 1, 128},
                              GqaShape{2, 130, 6, 2, 144}}) {
      seed += 10;
      check_against_cpu(dtype, s, seed, packed_positions(s, 90, seed + 5));
    }
  }
}

// The same queries as multi-head attention with each group's key and value repeated for each of
// its query heads: the forward (out, lse) and dQ are the same arithmetic, so the same bits; a
// group's dK and dV are the sums of its heads' (one fp32 sum on the GPU, so to a rounding).
TEST(GpuAttentionGqa, EqualsMultiHeadWithRepeatedKeysAndValues) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const GqaShape& s : {GqaShape{2, 197, 4, 2, 128}, GqaShape{1, 150, 4, 1, 64}}) {
      SCOPED_TRACE(describe(dtype, s));
      DualBench bench;
      Backend& gpu = bench.gpu();
      const GqaShape m{s.b, s.t, s.h, s.h, s.d};  // the multi-head twin
      const int64_t rows = s.b * s.t, c = s.h * s.d;
      const Values x = random_normal(rows * s.width(), 1.5, 700 + s.d);
      Values xm(static_cast<size_t>(rows * m.width()));
      for (int64_t row = 0; row < rows; ++row) {
        for (int64_t hq = 0; hq < s.h; ++hq) {
          const int64_t kv = hq / s.r();
          for (int64_t i = 0; i < s.d; ++i) {
            const auto from = [&](int64_t col) {
              return x[static_cast<size_t>(row * s.width() + col + i)];
            };
            double* to = xm.data() + row * m.width() + m.q_col(hq) + i;
            to[0] = from(s.q_col(hq));
            to[s.d] = from(s.k_col(kv));
            to[2 * s.d] = from(s.v_col(kv));
          }
        }
      }
      Pair qkv = bench.upload(dtype, {s.b, s.t, s.width()}, x);
      Pair qkv_m = bench.upload(dtype, {s.b, s.t, m.width()}, xm);
      Pair dout = bench.upload(dtype, {s.b, s.t, c}, random_normal(rows * c, 1.0, 710 + s.d));
      Pair out = bench.poisoned(dtype, {s.b, s.t, c});
      Pair out_m = bench.poisoned(dtype, {s.b, s.t, c});
      Pair lse = stats_for(bench, s), lse_m = stats_for(bench, s), scratch = stats_for(bench, s);
      Pair dqkv = bench.poisoned(dtype, {s.b, s.t, s.width()});
      Pair dqkv_m = bench.poisoned(dtype, {s.b, s.t, m.width()});
      gpu.attention_fwd(out.gpu, lse.gpu, qkv.gpu, s.g);
      gpu.attention_fwd(out_m.gpu, lse_m.gpu, qkv_m.gpu, m.g);
      gpu.attention_bwd(dqkv.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, s.g);
      gpu.attention_bwd(dqkv_m.gpu, scratch.gpu, dout.gpu, qkv_m.gpu, out_m.gpu, lse_m.gpu, m.g);
      EXPECT_TRUE(bit_equal(bench.download(gpu, out.gpu), bench.download(gpu, out_m.gpu), "out"));
      EXPECT_TRUE(bit_equal(bench.download(gpu, lse.gpu), bench.download(gpu, lse_m.gpu), "lse"));
      const Values d = bench.download(gpu, dqkv.gpu), dm = bench.download(gpu, dqkv_m.gpu);
      for (int64_t hq = 0; hq < s.h; ++hq) {
        EXPECT_TRUE(bit_equal(head_columns(d, s, s.width(), s.q_col(hq)),
                              head_columns(dm, m, m.width(), m.q_col(hq)),
                              "dq of query head " + std::to_string(hq)));
      }
      // dK, dV of each group against the sums of its heads' in the multi-head run.
      for (int kind = 0; kind < 2; ++kind) {
        double worst = 0, scale = 0;
        for (int64_t kv = 0; kv < s.g; ++kv) {
          const Values got = head_columns(d, s, s.width(), kind == 0 ? s.k_col(kv) : s.v_col(kv));
          Values want(got.size(), 0.0);
          for (int64_t hq = kv * s.r(); hq < (kv + 1) * s.r(); ++hq) {
            const int64_t col = m.q_col(hq) + (kind + 1) * s.d;
            const Values part = head_columns(dm, m, m.width(), col);
            for (size_t i = 0; i < want.size(); ++i) want[i] += part[i];
          }
          for (size_t i = 0; i < want.size(); ++i) {
            scale = std::max(scale, std::fabs(want[i]));
            const double err = std::fabs(got[i] - want[i]);
            worst = std::max(worst, std::isfinite(err) ? err : INFINITY);
          }
        }
        EXPECT_LE(worst, tolerance_for(dtype) * scale) << (kind == 0 ? "dk" : "dv")
                                                       << " against the heads' sums";
      }
    }
  }
}

// No atomics in the group sums: the same inputs give the same bits, causal and packed.
TEST(GpuAttentionGqa, BackwardIsBitIdentical) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const GqaShape s{2, 197, 8, 2, 128};
    SCOPED_TRACE(describe(dtype, s));
    DualBench bench;
    Backend& gpu = bench.gpu();
    const int64_t w = s.width(), c = s.h * s.d;
    const Pair pos = bench.upload_ids({s.b * s.t}, packed_positions(s, 70, 81));
    Pair qkv = bench.upload(dtype, {s.b, s.t, w}, random_normal(s.b * s.t * w, 1.5, 82));
    Pair dout = bench.upload(dtype, {s.b, s.t, c}, random_normal(s.b * s.t * c, 1.0, 83));
    for (const Tensor& p : {Tensor{}, pos.gpu}) {
      Pair out = bench.poisoned(dtype, {s.b, s.t, c});
      Pair lse = stats_for(bench, s), scratch = stats_for(bench, s);
      Pair d1 = bench.poisoned(dtype, {s.b, s.t, w}), d2 = bench.poisoned(dtype, {s.b, s.t, w});
      gpu.attention_fwd(out.gpu, lse.gpu, qkv.gpu, s.g, p);
      gpu.attention_bwd(d1.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, s.g, p);
      gpu.attention_bwd(d2.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, s.g, p);
      const Values a = bench.download(gpu, d1.gpu), b = bench.download(gpu, d2.gpu);
      ASSERT_EQ(a.size(), b.size());
      size_t differing = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(std::isfinite(a[i])) << "dqkv element " << i << " is " << a[i];
        differing += a[i] != b[i];
      }
      EXPECT_EQ(differing, 0u) << (p.empty() ? "causal" : "packed");
    }
  }
}

// ---- attention over a KV cache with grouped heads ----

struct CacheShape {
  int64_t slots, g, r, p, d;
  int64_t h() const { return g * r; }
  int64_t width() const { return g * (r + 2) * d; }
};

std::string describe(DType dtype, const CacheShape& s) {
  std::ostringstream os;
  os << to_string(dtype) << " slots=" << s.slots << " G=" << s.g << " R=" << s.r << " P=" << s.p
     << " D=" << s.d;
  return os.str();
}

// One step (slots >= 5): decode rows of slots 0 and 2, a 13-row prefill of slot 1 at positions
// 5..17, a new sequence in slot 3, and a decode row at the last slot's last position.
std::vector<int32_t> step_rows(const CacheShape& s) {
  std::vector<int32_t> r = {0, 9, 2, 1};
  for (int32_t pos = 5; pos < 18; ++pos) r.insert(r.end(), {1, pos});
  r.insert(r.end(), {3, 0});
  r.insert(r.end(), {static_cast<int32_t>(s.slots - 1), static_cast<int32_t>(s.p - 1)});
  return r;
}

void check_cache_against_cpu(DType dtype, const CacheShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(dtype, s));
  DualBench bench;
  const std::vector<int32_t> rows = step_rows(s);
  const int64_t n = static_cast<int64_t>(rows.size()) / 2, cache = s.slots * s.g * s.p * s.d;
  Pair qkv = bench.upload(dtype, {n, s.width()}, random_normal(n * s.width(), 1.5, seed));
  Pair kc = bench.upload(dtype, {s.slots, s.g, s.p, s.d}, random_normal(cache, 1.5, seed + 1));
  Pair vc = bench.upload(dtype, {s.slots, s.g, s.p, s.d}, random_normal(cache, 1.0, seed + 2));
  Pair rw = bench.upload_ids({n, 2}, rows);
  Pair out = bench.poisoned(dtype, {n, s.h() * s.d});
  bench.cpu().attention_kv_cache(out.cpu, qkv.cpu, kc.cpu, vc.cpu, rw.cpu);
  bench.gpu().attention_kv_cache(out.gpu, qkv.gpu, kc.gpu, vc.gpu, rw.gpu);
  EXPECT_TRUE(bench.same(out, tolerance_for(dtype), "attention_kv_cache gqa out"));
  EXPECT_TRUE(bench.same(kc, 0.0, "attention_kv_cache gqa k_cache"));  // copies of the bits
  EXPECT_TRUE(bench.same(vc, 0.0, "attention_kv_cache gqa v_cache"));
}

// G = 1 with R = 4 (multi-query), G = 2 with R = 2, R = 3 (a block of 4 heads with one idle),
// R = 8 (two blocks per group), the run-time head sizes (40: pair loads; 33: scalar) with R = 5.
TEST(GpuAttentionCacheGqa, MatchesCpu) {
  JUMBO_REQUIRE_GPU();
  uint64_t seed = 900;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const CacheShape& s :
         {CacheShape{5, 1, 4, 300, 64}, CacheShape{5, 2, 2, 300, 128},
          CacheShape{5, 2, 3, 200, 144}, CacheShape{5, 1, 8, 700, 128},
          CacheShape{5, 3, 5, 100, 40}, CacheShape{5, 2, 2, 100, 33}}) {
      check_cache_against_cpu(dtype, s, seed += 10);
    }
  }
}

// Grouped caches give what multi-head caches give holding each group's rows once per query
// head. A head's operations are the same however many heads share a block, but the blocks are
// other template instantiations (ptxas may fuse a multiply-add differently): to a rounding.
TEST(GpuAttentionCacheGqa, EqualsMultiHeadWithRepeatedCaches) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const CacheShape s{5, 2, 3, 300, 128}, m{5, 6, 1, 300, 128};
    SCOPED_TRACE(describe(dtype, s));
    DualBench bench;
    Backend& gpu = bench.gpu();
    const std::vector<int32_t> rows = step_rows(s);
    const int64_t n = static_cast<int64_t>(rows.size()) / 2, d = s.d;
    const Values x = random_normal(n * s.width(), 1.5, 950);
    const Values k = random_normal(s.slots * s.g * s.p * d, 1.5, 951);
    const Values v = random_normal(s.slots * s.g * s.p * d, 1.0, 952);
    Values xm(static_cast<size_t>(n * m.width())), km, vm;
    for (int64_t row = 0; row < n; ++row) {
      for (int64_t hq = 0; hq < s.h(); ++hq) {
        const int64_t g = hq / s.r, from = row * s.width() + g * (s.r + 2) * d;
        for (int64_t i = 0; i < d; ++i) {
          double* to = xm.data() + row * m.width() + hq * 3 * d + i;
          to[0] = x[static_cast<size_t>(from + (hq % s.r) * d + i)];
          to[d] = x[static_cast<size_t>(from + s.r * d + i)];
          to[2 * d] = x[static_cast<size_t>(from + (s.r + 1) * d + i)];
        }
      }
    }
    for (int64_t slot = 0; slot < s.slots; ++slot) {
      for (int64_t hq = 0; hq < s.h(); ++hq) {
        const auto first = static_cast<size_t>((slot * s.g + hq / s.r) * s.p * d);
        km.insert(km.end(), k.begin() + first, k.begin() + first + s.p * d);
        vm.insert(vm.end(), v.begin() + first, v.begin() + first + s.p * d);
      }
    }
    Pair qkv = bench.upload(dtype, {n, s.width()}, x);
    Pair qkv_m = bench.upload(dtype, {n, m.width()}, xm);
    Pair kc = bench.upload(dtype, {s.slots, s.g, s.p, d}, k);
    Pair vc = bench.upload(dtype, {s.slots, s.g, s.p, d}, v);
    Pair kc_m = bench.upload(dtype, {m.slots, m.g, m.p, d}, km);
    Pair vc_m = bench.upload(dtype, {m.slots, m.g, m.p, d}, vm);
    Pair rw = bench.upload_ids({n, 2}, rows);
    Pair out = bench.poisoned(dtype, {n, s.h() * d});
    Pair out_m = bench.poisoned(dtype, {n, s.h() * d});
    gpu.attention_kv_cache(out.gpu, qkv.gpu, kc.gpu, vc.gpu, rw.gpu);
    gpu.attention_kv_cache(out_m.gpu, qkv_m.gpu, kc_m.gpu, vc_m.gpu, rw.gpu);
    const Values a = bench.download(gpu, out.gpu), b = bench.download(gpu, out_m.gpu);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      scale = std::max(scale, std::fabs(b[i]));
      const double err = std::fabs(a[i] - b[i]);
      worst = std::max(worst, std::isfinite(err) ? err : INFINITY);
    }
    // f32: a few ulps; bf16: one rounding of the stored output.
    EXPECT_LE(worst, (dtype == DType::bf16 ? 1e-2 : 1e-5) * scale) << "out";
  }
}

}  // namespace
}  // namespace jumbo::gputest
