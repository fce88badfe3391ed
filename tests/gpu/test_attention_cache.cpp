// Attention over a KV cache (generation): the CUDA backend's attention_kv_cache against the CPU
// reference on the same inputs, f32 and bf16 storage. One step mixes a prefill (consecutive
// positions of one slot, after earlier positions already cached) with decode rows of other
// slots, including a fresh sequence at position 0 and a long context that spans every warp's
// tiles many times. Caches start full of random values (the "earlier steps"), so a kernel that
// reads the wrong slot, head or position, or stores to the wrong place, is caught. Head sizes:
// the instantiated 64, 128, 144 and the run-time path (even 40 and 256, odd 33).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test_support.h"

namespace jumbo::gputest {
namespace {

struct CacheShape {
  int64_t slots, h, p, d;
};

std::string describe(DType dtype, const CacheShape& s) {
  std::ostringstream os;
  os << to_string(dtype) << " slots=" << s.slots << " H=" << s.h << " P=" << s.p << " D=" << s.d;
  return os.str();
}

// (slot, position) pairs of one step (slots >= 5): decode rows of slots 0 and 2, a 13-row
// prefill of slot 1 at positions 5..17 (0..4 cached earlier), a new sequence in slot 3 at
// position 0, and a decode row of the last slot at the cache's last position (P - 1).
std::vector<int32_t> step_rows(const CacheShape& s) {
  std::vector<int32_t> r = {0, 9, 2, 1};
  for (int32_t pos = 5; pos < 18; ++pos) r.insert(r.end(), {1, pos});
  r.insert(r.end(), {3, 0});
  r.insert(r.end(), {static_cast<int32_t>(s.slots - 1), static_cast<int32_t>(s.p - 1)});
  return r;
}

struct Step {
  Pair qkv, k_cache, v_cache, rows;
  int64_t n;
};

Step make_step(DualBench& bench, DType dtype, const CacheShape& s, uint64_t seed) {
  const std::vector<int32_t> rows = step_rows(s);
  const int64_t n = static_cast<int64_t>(rows.size()) / 2;
  const int64_t cache = s.slots * s.h * s.p * s.d, c3 = s.h * 3 * s.d;
  Step st;
  st.n = n;
  st.qkv = bench.upload(dtype, {n, c3}, random_normal(n * c3, 1.5, seed));
  st.k_cache = bench.upload(dtype, {s.slots, s.h, s.p, s.d}, random_normal(cache, 1.5, seed + 1));
  st.v_cache = bench.upload(dtype, {s.slots, s.h, s.p, s.d}, random_normal(cache, 1.0, seed + 2));
  st.rows = bench.upload_ids({n, 2}, rows);
  return st;
}

// The values of two tensors on the GPU are the same bits (both finite).
::testing::AssertionResult bit_identical(DualBench& bench, Tensor a, Tensor b, const char* what) {
  const Values x = bench.download(bench.gpu(), a), y = bench.download(bench.gpu(), b);
  if (x.size() != y.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]))
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << x[i];
    if (x[i] != y[i])
      return ::testing::AssertionFailure()
             << what << ": first difference at element " << i << " (" << x[i] << " vs " << y[i]
             << ")";
  }
  return ::testing::AssertionSuccess();
}

void check_against_cpu(DType dtype, const CacheShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(dtype, s));
  DualBench bench;
  Step st = make_step(bench, dtype, s, seed);
  Pair out = bench.poisoned(dtype, {st.n, s.h * s.d});
  bench.cpu().attention_kv_cache(out.cpu, st.qkv.cpu, st.k_cache.cpu, st.v_cache.cpu,
                                 st.rows.cpu);
  bench.gpu().attention_kv_cache(out.gpu, st.qkv.gpu, st.k_cache.gpu, st.v_cache.gpu,
                                 st.rows.gpu);
  EXPECT_TRUE(bench.same(out, tolerance_for(dtype), "attention_kv_cache out"));
  // The stores are copies of the stored bits on both sides: exact (stricter than the
  // tolerance), and every untouched position keeps its initial value.
  EXPECT_TRUE(bench.same(st.k_cache, 0.0, "attention_kv_cache k_cache"));
  EXPECT_TRUE(bench.same(st.v_cache, 0.0, "attention_kv_cache v_cache"));
}

uint64_t seed_for(DType dtype, int64_t d) {
  return 7000 + 100 * static_cast<uint64_t>(d) + (dtype == DType::bf16 ? 50 : 0);
}

TEST(GpuAttentionCache, F32InstantiatedHeadSizesMatchCpu) {
  JUMBO_REQUIRE_GPU();
  for (int64_t d : {64, 128, 144}) {
    check_against_cpu(DType::f32, {5, 3, 300, d}, seed_for(DType::f32, d));
  }
}

TEST(GpuAttentionCache, Bf16InstantiatedHeadSizesMatchCpu) {
  JUMBO_REQUIRE_GPU();
  for (int64_t d : {64, 128, 144}) {
    check_against_cpu(DType::bf16, {5, 3, 300, d}, seed_for(DType::bf16, d));
  }
}

// The run-time head-size path: even (pair loads, a partial last chunk at 40), the largest (256)
// and odd (scalar loads).
TEST(GpuAttentionCache, RuntimeHeadSizesMatchCpu) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t d : {40, 256, 33}) check_against_cpu(dtype, {5, 2, 200, d}, seed_for(dtype, d));
  }
}

// A long context: the last row attends to 1500 positions, 47 tiles per warp (the online
// softmax's rescaling across tiles and the warps' merge).
TEST(GpuAttentionCache, LongContextMatchesCpu) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    check_against_cpu(dtype, {5, 2, 1500, 128}, 99 + (dtype == DType::bf16 ? 1 : 0));
  }
}

// No atomics: two runs from the same caches give the same bits. The second run stores the same
// k and v again, so its caches equal the first's.
TEST(GpuAttentionCache, RunsAreBitIdentical) {
  JUMBO_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const CacheShape s{5, 3, 700, 144};
    SCOPED_TRACE(describe(dtype, s));
    DualBench bench;
    Step st = make_step(bench, dtype, s, 31);
    Pair out1 = bench.poisoned(dtype, {st.n, s.h * s.d});
    Pair out2 = bench.poisoned(dtype, {st.n, s.h * s.d});
    Pair k1 = bench.poisoned(dtype, {s.slots, s.h, s.p, s.d});
    Pair v1 = bench.poisoned(dtype, {s.slots, s.h, s.p, s.d});
    Backend& gpu = bench.gpu();
    gpu.attention_kv_cache(out1.gpu, st.qkv.gpu, st.k_cache.gpu, st.v_cache.gpu, st.rows.gpu);
    gpu.copy(k1.gpu, st.k_cache.gpu);
    gpu.copy(v1.gpu, st.v_cache.gpu);
    gpu.attention_kv_cache(out2.gpu, st.qkv.gpu, st.k_cache.gpu, st.v_cache.gpu, st.rows.gpu);
    EXPECT_TRUE(bit_identical(bench, out1.gpu, out2.gpu, "out"));
    EXPECT_TRUE(bit_identical(bench, k1.gpu, st.k_cache.gpu, "k_cache"));
    EXPECT_TRUE(bit_identical(bench, v1.gpu, st.v_cache.gpu, "v_cache"));
  }
}

// rows is device memory, so the host cannot check it: a row outside the cache gets NaN output
// and stores nothing, and the other rows are unaffected. (The CPU reference throws instead.)
TEST(GpuAttentionCache, RowOutsideTheCacheGivesNanAndStoresNothing) {
  JUMBO_REQUIRE_GPU();
  const DType dtype = DType::f32;
  const CacheShape s{2, 2, 16, 64};
  DualBench bench;
  const int64_t c3 = s.h * 3 * s.d, cache = s.slots * s.h * s.p * s.d;
  const Values init = random_normal(cache, 1.0, 3), x = random_normal(3 * c3, 1.5, 4);
  Pair qkv = bench.upload(dtype, {3, c3}, x);
  Pair kc = bench.upload(dtype, {s.slots, s.h, s.p, s.d}, init);
  Pair vc = bench.upload(dtype, {s.slots, s.h, s.p, s.d}, init);
  Pair rows = bench.upload_ids({3, 2}, {0, 3, 2, 0, 1, 16});  // slot 2 and position 16 are out
  Pair out = bench.poisoned(dtype, {3, s.h * s.d});
  bench.gpu().attention_kv_cache(out.gpu, qkv.gpu, kc.gpu, vc.gpu, rows.gpu);
  const Values got = bench.download(bench.gpu(), out.gpu);
  const int64_t c = s.h * s.d;
  for (int64_t j = 0; j < c; ++j) {
    ASSERT_TRUE(std::isfinite(got[j])) << "row 0 element " << j;
    ASSERT_TRUE(std::isnan(got[c + j])) << "row 1 element " << j;
    ASSERT_TRUE(std::isnan(got[2 * c + j])) << "row 2 element " << j;
  }
  // Only row 0's (slot 0, position 3) changed in the caches.
  const Values k = bench.download(bench.gpu(), kc.gpu);
  size_t changed = 0;
  for (size_t i = 0; i < k.size(); ++i) changed += k[i] != static_cast<float>(init[i]);
  EXPECT_LE(changed, static_cast<size_t>(s.h * s.d));
  for (int64_t head = 0; head < s.h; ++head) {
    for (int64_t j = 0; j < s.d; ++j) {
      const size_t at = static_cast<size_t>((head * s.p + 3) * s.d + j);
      EXPECT_EQ(k[at], static_cast<float>(x[static_cast<size_t>(head * 3 * s.d + s.d + j)]))
          << "k of head " << head << " element " << j;
    }
  }
}

// The host refuses what it can check without reading rows: a head size over 256, host memory.
TEST(GpuAttentionCache, RefusesBadShapesOnTheHost) {
  JUMBO_REQUIRE_GPU();
  DualBench bench;
  Pair qkv = bench.upload(DType::f32, {1, 3 * 264}, random_normal(3 * 264, 1.0, 5));
  Pair kc = bench.poisoned(DType::f32, {1, 1, 4, 264});
  Pair vc = bench.poisoned(DType::f32, {1, 1, 4, 264});
  Pair rows = bench.upload_ids({1, 2}, {0, 0});
  Pair out = bench.poisoned(DType::f32, {1, 264});
  EXPECT_THROW(bench.gpu().attention_kv_cache(out.gpu, qkv.gpu, kc.gpu, vc.gpu, rows.gpu),
               std::invalid_argument);
  EXPECT_THROW(bench.gpu().attention_kv_cache(out.gpu, qkv.gpu, kc.gpu, vc.gpu, rows.cpu),
               std::invalid_argument);
}

}  // namespace
}  // namespace jumbo::gputest
