// CPU backend vs the double reference for the elementwise kernels, memory kernels (fill,
// copy with f32 <-> bf16 casts) and the sum of squares over spans. Sizes are odd and large
// enough to cross vector tails and thread chunks.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>

#include "jumbo/backend/bf16.h"
#include "backend_test_support.h"

namespace jumbo::test {
namespace {

constexpr int64_t kBig = 100003;  // prime: no kernel's chunking divides it

class ElementwiseKernels : public DTypeKernelTest {
 protected:
  ElementwiseKernels() : DTypeKernelTest(7) {}
};

TEST_P(ElementwiseKernels, Gelu) {
  for (const int64_t n : {int64_t{13}, kBig}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    Vec in = rng.uniform(n, -6.0, 6.0);
    in[0] = 0.0;
    in = round_to(dt(), in);
    Tensor t_in = kb.upload(dt(), {n}, in);
    // The forward through linear_gelu_fwd with an identity weight: out = gelu(in).
    Tensor eye = kb.upload(dt(), {1, 1}, {1.0});
    Tensor out = kb.poisoned(dt(), {n}), pre = kb.poisoned(dt(), {n});
    kb.be().linear_gelu_fwd(out.view({n, 1}), pre.view({n, 1}), t_in.view({n, 1}), eye, Tensor{});
    EXPECT_TRUE(close(kb.download(out), ref::gelu_fwd(in), tol(), tag("gelu_fwd")));
    EXPECT_TRUE(close(kb.download(pre), in, 0.0, tag("gelu_fwd keeps its input")));

    const Vec dout = round_to(dt(), rng.normal(n));
    Tensor din = kb.poisoned(dt(), {n});
    kb.be().gelu_bwd(din, kb.upload(dt(), {n}, dout), t_in);
    EXPECT_TRUE(close(kb.download(din), ref::gelu_bwd(dout, in), tol(), tag("gelu_bwd din =")));
  }
}

TEST_P(ElementwiseKernels, Add) {
  for (const int64_t n : {int64_t{13}, kBig}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const Vec a = round_to(dt(), rng.normal(n)), b = round_to(dt(), rng.normal(n));
    Tensor t_a = kb.upload(dt(), {n}, a), t_b = kb.upload(dt(), {n}, b);
    Tensor out = kb.poisoned(dt(), {n});
    kb.be().add(out, t_a, t_b);
    Vec sum(n);
    for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
    EXPECT_TRUE(close(kb.download(out), sum, tol(), tag("add out = a + b")));
    EXPECT_TRUE(close(kb.download(t_b), b, 0.0, tag("add leaves its inputs alone")));
  }
}

TEST_P(ElementwiseKernels, Fill) {
  Tensor t = kb.poisoned(dt(), {7, 11});
  kb.be().fill(t, 0.37f);
  EXPECT_TRUE(close(kb.download(t), Vec(77, round_to(dt(), 0.37)), 0.0, tag("fill 0.37")));
  kb.be().fill(t, 0.0f);
  EXPECT_TRUE(close(kb.download(t), Vec(77, 0.0), 0.0, tag("fill 0")));
}

TEST_P(ElementwiseKernels, CopyToEitherDtype) {
  // Values over many binades; the cast must round to nearest even, so compare exactly with
  // the reference rounding.
  Vec values = rng.normal(kBig);
  for (int64_t i = 0; i < kBig; ++i) values[i] *= std::ldexp(1.0, static_cast<int>(i % 41) - 20);
  values = round_to(dt(), values);
  Tensor src = kb.upload(dt(), {kBig}, values);
  for (const DType to : {DType::f32, DType::bf16}) {
    Tensor dst = kb.poisoned(to, {kBig});
    kb.be().copy(dst, src);
    EXPECT_TRUE(close(kb.download(dst), round_to(to, values), 0.0,
                      tag("copy to " + dtype_name(to) + " (exact)")));
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, ElementwiseKernels, ::testing::Values(DType::f32, DType::bf16),
                         DTypeName());

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Bf16, BackendCopyRoundsToNearestEven) {
  KernelBench kb;
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);  // bf16 spacing just above 1
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    float in, want;
    const char* why;
  };
  const Case cases[] = {
      {one + ulp / 2, one, "1 + 2^-8 is a tie: to even (1)"},
      {-(one + ulp / 2), -one, "-(1 + 2^-8): tie to even (-1)"},
      {one + 3 * ulp / 2, one + 2 * ulp, "1 + 3*2^-8 is a tie: to even (1 + 2^-6)"},
      {one + ulp / 2 + std::ldexp(1.0f, -20), one + ulp, "just above the tie rounds up"},
      {one + ulp / 2 - std::ldexp(1.0f, -20), one, "just below the tie rounds down"},
      {one + ulp, one + ulp, "representable stays"},
      {3.0f, 3.0f, "small integer stays"},
      {-0.0f, -0.0f, "negative zero stays"},
      {inf, inf, "infinity stays"},
      {-inf, -inf, "-infinity stays"},
      {std::numeric_limits<float>::max(), inf, "f32 max rounds past bf16 max: infinity"},
      {from_bits(0x7f7f7fffu), from_bits(0x7f7f0000u), "bf16 max stays below the tie"},
      {from_bits(0x00018000u), from_bits(0x00020000u), "subnormal tie to even (up)"},
      {from_bits(0x00008000u), 0.0f, "smallest subnormal tie to even (zero)"},
  };
  const int64_t n = std::size(cases) + 1;
  Vec in(n), want(n);
  for (int64_t i = 0; i + 1 < n; ++i) {
    in[i] = cases[i].in;
    want[i] = cases[i].want;
  }
  in[n - 1] = nan;
  Tensor src = kb.upload(DType::f32, {n}, in);
  Tensor dst = kb.poisoned(DType::bf16, {n});
  std::memset(dst.data, 0, dst.bytes());  // so NaN below can only come from the cast
  kb.be().copy(dst, src);
  const Vec got = kb.download(dst);
  for (int64_t i = 0; i + 1 < n; ++i) {
    EXPECT_EQ(got[i], want[i]) << "copy f32->bf16 of " << in[i] << ": " << cases[i].why;
    EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << cases[i].why;
    EXPECT_EQ(ref::round_to_bf16(in[i]), want[i]) << "reference: " << cases[i].why;
  }
  EXPECT_TRUE(std::isnan(got[n - 1])) << "copy f32->bf16: NaN must stay NaN";
}

TEST(Bf16, HeaderConversionMatchesReferenceOnRandomBitPatterns) {
  // bf16.h's f32_to_bf16 against the significand-rounding reference, on every kind of float.
  std::mt19937 gen(11);
  int64_t mismatches = 0;
  uint32_t first_bad = 0;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = gen();
    const float f = from_bits(bits);
    const double got = bf16_to_f32(f32_to_bf16(f));
    const double want = ref::round_to_bf16(f);
    const bool same = std::isnan(want) ? std::isnan(got) : got == want;
    if (!same && mismatches++ == 0) first_bad = bits;
  }
  EXPECT_EQ(mismatches, 0) << "first mismatch at f32 bits 0x" << std::hex << first_bad;
}

// The grad norm's reduction: spans of one flat buffer in one call, each span's sum in double,
// the spans added in order, whatever the number of OpenMP threads.
TEST(Reductions, SumSquaresOverSpans) {
  KernelBench kb;
  Rng rng(9);
  const Vec x = round_to(DType::f32, rng.normal(kBig));
  Tensor t = kb.upload(DType::f32, {kBig}, x);
  const std::vector<FlatSpan> spans = {{0, 13}, {100, 0}, {200, kBig / 2}, {kBig / 2 + 300, 5000},
                                       {kBig - 7, 7}};
  double want = 0;
  for (const FlatSpan& s : spans) {
    for (int64_t i = s.offset; i < s.offset + s.count; ++i) want += x[i] * x[i];
  }
  // Returns a double: accumulating in double (or f32 per short chunk) is good to 1e-6.
  const double got = kb.be().sum_squares(t, spans);
  EXPECT_NEAR(got, want, 1e-6 * want) << "sum_squares of " << spans.size() << " spans";
  EXPECT_EQ(kb.be().sum_squares(t, {}), 0.0);
  const double whole = kb.be().sum_squares(t, std::vector<FlatSpan>{{0, kBig}});
  EXPECT_NEAR(whole, ref::sum_squares(x), 1e-6 * whole);
  // The same bits on 1 and 2 threads.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = kb.be().sum_squares(t, spans);
  omp_set_num_threads(2);
  const double two = kb.be().sum_squares(t, spans);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, got);
}

}  // namespace
}  // namespace jumbo::test

namespace jumbo {
namespace {

TEST(FillColumns, MasksTheColumnsFromFirstColOnInEveryRow) {
  auto backend = make_cpu_backend();
  Arena arena(1 << 12, "test");
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor t = arena.alloc(dt, {3, 7});
    backend->fill(t, 2.0f);
    backend->fill_columns(t, 4, -INFINITY);
    Tensor f = arena.alloc(DType::f32, {3, 7});
    backend->copy(f, t);
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 7; ++c) {
        const float v = f.as<float>()[r * 7 + c];
        if (c < 4) EXPECT_EQ(v, 2.0f) << r << "," << c;
        else EXPECT_TRUE(std::isinf(v) && v < 0) << r << "," << c;
      }
    }
    backend->fill_columns(t, 7, 5.0f);  // nothing past the last column
    backend->copy(f, t);
    EXPECT_EQ(f.as<float>()[0], 2.0f);
  }
}

}  // namespace
}  // namespace jumbo
