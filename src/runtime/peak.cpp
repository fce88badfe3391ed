// This machine's fp32 FMA ceiling, measured: every OpenMP thread runs a chain-free FMA loop
// whose operands never leave registers, so the only limit is FMA throughput.
#include "jumbo/runtime/peak.h"

#include <chrono>
#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace jumbo {
namespace {

using Clock = std::chrono::steady_clock;

// Independent accumulators: FMA latency (4-5 cycles) x 2 FMA ports needs at least 8-10 in
// flight; 12 covers both with margin and still fits the 16 ymm registers.
constexpr int kAccumulators = 12;
// FMAs per accumulator between clock reads: long enough that reading the clock is noise.
constexpr int64_t kInnerIterations = 1 << 14;

// The sum of all accumulators lands here, so the compiler must compute them.
volatile float g_peak_sink = 0;

// acc = acc * 0.5 + 0.5 converges to 1: no overflow and no denormals however long it runs.
// The widest vectors the build targets: OpenBLAS picks AVX-512 sgemm kernels on hosts that
// have it (SkylakeX and later), so an AVX2 ceiling there would be half the real one and MFU
// could pass 100%.
#if defined(__AVX512F__)
struct Simd {
  static constexpr const char* kName = "avx512";
  static constexpr int kLanes = 16;
  using V = __m512;
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  // Not _mm512_reduce_add_ps: GCC 12's header warns on it.
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
};
#elif defined(__AVX2__) && defined(__FMA__)
struct Simd {
  static constexpr const char* kName = "avx2+fma";
  static constexpr int kLanes = 8;
  using V = __m256;
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
};
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
constexpr const char* kKernelName = Simd::kName;
constexpr int kLanes = Simd::kLanes;
int64_t fma_until(Clock::time_point deadline, float& checksum) {
  const Simd::V mul = Simd::set1(0.5f), add = Simd::set1(0.5f);
  Simd::V acc[kAccumulators];
  for (int a = 0; a < kAccumulators; ++a) acc[a] = Simd::set1(float(a));
  int64_t blocks = 0;
  do {
    for (int64_t i = 0; i < kInnerIterations; ++i) {
#pragma GCC unroll 12
      for (int a = 0; a < kAccumulators; ++a) acc[a] = Simd::fma(acc[a], mul, add);
    }
    ++blocks;
  } while (Clock::now() < deadline);
  Simd::V total = acc[0];
  for (int a = 1; a < kAccumulators; ++a) total = Simd::add(total, acc[a]);
  float lanes[kLanes];
  Simd::store(lanes, total);
  checksum = 0;
  for (float v : lanes) checksum += v;
  return blocks;
}
#else
// Portable fallback: the compiler may vectorise it; we count what the source asks for.
constexpr const char* kKernelName = "scalar";
constexpr int kLanes = 1;
int64_t fma_until(Clock::time_point deadline, float& checksum) {
  float acc[kAccumulators];
  for (int a = 0; a < kAccumulators; ++a) acc[a] = float(a);
  int64_t blocks = 0;
  do {
    for (int64_t i = 0; i < kInnerIterations; ++i) {
      for (int a = 0; a < kAccumulators; ++a) acc[a] = acc[a] * 0.5f + 0.5f;
    }
    ++blocks;
  } while (Clock::now() < deadline);
  checksum = 0;
  for (float v : acc) checksum += v;
  return blocks;
}
#endif

constexpr double kFlopsPerBlock = 2.0 * kLanes * kAccumulators * double(kInnerIterations);

}  // namespace

const char* fp32_peak_kernel() { return kKernelName; }

double measure_fp32_peak_gflops(double seconds) {
  const auto timed = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  // A short untimed run first lets the cores reach their vector clock, so the timed run
  // measures the steady state rather than the frequency ramp.
  const auto warmup = timed / 8;
  double gflops = 0;
  float checksum = 0;
#pragma omp parallel reduction(+ : gflops, checksum)
  {
    float thread_checksum = 0;
    fma_until(Clock::now() + warmup, thread_checksum);
    checksum += thread_checksum;
#pragma omp barrier
    // Each thread times itself, so thread start-up never counts against the rate.
    const auto start = Clock::now();
    const int64_t blocks = fma_until(start + timed, thread_checksum);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    checksum += thread_checksum;
    if (elapsed > 0) gflops += double(blocks) * kFlopsPerBlock / elapsed / 1e9;
  }
  g_peak_sink = checksum;
  return gflops;
}

}  // namespace jumbo
