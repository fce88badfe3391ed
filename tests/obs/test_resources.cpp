// Measured fp32 peak and process memory: the denominators and figures behind MFU and mem.
#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "jumbo/obs/memory.h"
#include "jumbo/runtime/peak.h"

TEST(Peak, MeasuredFp32PeakIsPlausible) {
  const double gflops = jumbo::measure_fp32_peak_gflops(0.2);
  RecordProperty("fp32_peak_gflops", std::to_string(gflops));
  std::printf("fp32 peak (%s): %.1f GFLOP/s\n", jumbo::fp32_peak_kernel(), gflops);
  EXPECT_GT(gflops, 10.0);
  EXPECT_LT(gflops, 1e5) << "more than 100 TFLOP/s on a CPU: the loop was optimised away";
}

TEST(Peak, LongerRunMeasuresTheSameRate) {
  // The rate is per second, not per call: doubling the time must not double the result.
  const double short_run = jumbo::measure_fp32_peak_gflops(0.1);
  const double long_run = jumbo::measure_fp32_peak_gflops(0.2);
  EXPECT_GT(long_run, 0.5 * short_run);
  EXPECT_LT(long_run, 2.0 * short_run);
}

TEST(Memory, RssGrowsAfterTouching100MB) {
  constexpr size_t kBytes = 100u << 20;
  const uint64_t before = jumbo::current_rss_bytes();
  ASSERT_GT(before, 0u);
  auto* block = static_cast<unsigned char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 0x5a, kBytes);  // touching every page makes it resident
  const uint64_t during = jumbo::current_rss_bytes();
  const uint64_t peak = jumbo::peak_rss_bytes();
  // Read the memory back so the writes cannot be elided.
  unsigned sum = 0;
  for (size_t i = 0; i < kBytes; i += 4096) sum += block[i];
  std::free(block);
  EXPECT_EQ(sum, 0x5au * (kBytes / 4096));
  EXPECT_GE(during, before + 90u * (1u << 20)) << "before " << before << " during " << during;
  EXPECT_GE(peak, during - (1u << 20)) << "peak is at least what is resident now";
}
