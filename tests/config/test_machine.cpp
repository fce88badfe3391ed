// Machine descriptions: the collective cost curves, the compute rates by shape, the TOML round
// trip, and one-line errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "jumbo/config/config.h"
#include "jumbo/config/machine.h"

namespace jumbo {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = std::string(::testing::TempDir()) + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Machine, LatencyBandwidthCostUsesBusBytes) {
  const CollectiveCost c{.latency_s = 1e-5, .busbw = 1e9, .points = {}};
  // All-reduce of 1 GB over 4 ranks: 2 x 3/4 = 1.5 GB of bus bytes at 1 GB/s.
  EXPECT_DOUBLE_EQ(c.seconds(Collective::all_reduce, 1e9, 4), 1e-5 + 1.5);
  EXPECT_DOUBLE_EQ(c.seconds(Collective::all_gather, 1e9, 4), 1e-5 + 0.75);
  EXPECT_EQ(c.seconds(Collective::all_reduce, 1e9, 1), 0);  // a group of one moves nothing
}

TEST(Machine, MeasuredPointsInterpolateInLogLog) {
  const CollectiveCost c{.latency_s = 0, .busbw = 0, .points = {{1e3, 1e-6}, {1e6, 1e-3}}};
  // Bus bytes 3.16e4 (p2p, factor 1) lie halfway in log between the points.
  EXPECT_NEAR(c.seconds(Collective::p2p, 31622.7766, 2), 31.6227766e-6, 1e-9);
  EXPECT_DOUBLE_EQ(c.seconds(Collective::p2p, 10, 2), 1e-6);     // below: the first point
  EXPECT_DOUBLE_EQ(c.seconds(Collective::p2p, 2e6, 2), 2e-3);    // above: the last bandwidth
}

TEST(Machine, TomlRoundTrip) {
  Machine m = machine_of_gpu(*find_gpu("a100-40gb"), 8);
  m.device = Device::cpu;
  m.overlap = 0.5;
  m.inter.p2p.points = {{8, 2e-5}, {1 << 20, 1e-4}};
  const Machine back = load_machine(write_temp("machine.toml", machine_toml(m)));
  EXPECT_EQ(back.name, m.name);
  EXPECT_EQ(back.device, Device::cpu);
  EXPECT_EQ(back.ranks_per_host, 8);
  EXPECT_NEAR(back.peak_flops, 312e12, 1e8);
  EXPECT_NEAR(back.memory_bandwidth, 1555e9, 1e6);
  EXPECT_DOUBLE_EQ(back.overlap, 0.5);
  ASSERT_EQ(back.inter.p2p.points.size(), 2u);
  EXPECT_NEAR(back.inter.p2p.seconds(Collective::p2p, 1 << 20, 2), 1e-4, 1e-10);
  EXPECT_NEAR(back.intra.all_reduce.busbw, 230e9, 1e6);
  // The gradient buckets' path: unmeasured, it is the blocking path's; measured, its own.
  EXPECT_DOUBLE_EQ(back.seconds(NetLevel::intra, Collective::reduce_scatter, 1 << 20, 8,
                                CommPath::bucketed),
                   back.seconds(NetLevel::intra, Collective::reduce_scatter, 1 << 20, 8));
  m.inter.bucket_reduce_scatter.points = {{8, 3e-5}, {1 << 20, 5e-4}};
  const Machine bucketed = load_machine(write_temp("machine.toml", machine_toml(m)));
  // Points are keyed by bus bytes: a reduce-scatter of 2 MiB over 2 ranks moves 1 MiB.
  EXPECT_NEAR(bucketed.seconds(NetLevel::inter, Collective::reduce_scatter, 2 << 20, 2,
                               CommPath::bucketed),
              5e-4, 1e-10);
  EXPECT_NE(machine_toml(m).find("[inter.bucket_reduce_scatter]"), std::string::npos);
}

TEST(Machine, ComputeRatesByShapeAndPass) {
  Machine m = machine_of_gpu(*find_gpu("a100-40gb"), 8);
  // Without measured shapes: one efficiency for every shape and pass.
  EXPECT_DOUBLE_EQ(m.gemm_rate(64, Pass::forward), m.peak_flops * 0.6);
  EXPECT_DOUBLE_EQ(m.attention_rate(128, 32, Pass::backward), m.peak_flops * 0.4);
  m.gemm_by_rows = {.rows = {64, 256, 1024}, .forward = {0.8, 0.8, 0.5}, .backward = {0.4, 0.5, 0.5}};
  EXPECT_DOUBLE_EQ(m.gemm_rate(256, Pass::forward), m.peak_flops * 0.8);
  EXPECT_DOUBLE_EQ(m.gemm_rate(512, Pass::forward), m.peak_flops * 0.65);  // halfway in log
  EXPECT_DOUBLE_EQ(m.gemm_rate(128, Pass::backward), m.peak_flops * 0.45);
  EXPECT_DOUBLE_EQ(m.gemm_rate(8, Pass::backward), m.peak_flops * 0.4);     // held flat
  EXPECT_DOUBLE_EQ(m.gemm_rate(1e6, Pass::forward), m.peak_flops * 0.5);
  m.attention_by_shape = {.seq = {128, 512}, .head_dim = {32, 128},
                          .forward = {0.1, 0.2, 0.3, 0.4}, .backward = {0.2, 0.2, 0.2, 0.2}};
  EXPECT_DOUBLE_EQ(m.attention_rate(512, 32, Pass::forward), m.peak_flops * 0.3);
  EXPECT_NEAR(m.attention_rate(256, 64, Pass::forward), m.peak_flops * 0.25, 1e3);  // the middle
  EXPECT_DOUBLE_EQ(m.attention_rate(2048, 256, Pass::forward), m.peak_flops * 0.4);
  EXPECT_DOUBLE_EQ(m.attention_rate(100, 64, Pass::backward), m.peak_flops * 0.2);
  // Written and read back alike.
  const Machine back = load_machine(write_temp("shapes.toml", machine_toml(m)));
  EXPECT_EQ(back.gemm_by_rows.rows, m.gemm_by_rows.rows);
  EXPECT_EQ(back.gemm_by_rows.backward, m.gemm_by_rows.backward);
  EXPECT_EQ(back.attention_by_shape.head_dim, m.attention_by_shape.head_dim);
  EXPECT_EQ(back.attention_by_shape.forward, m.attention_by_shape.forward);
  EXPECT_NEAR(back.attention_rate(256, 64, Pass::forward), m.attention_rate(256, 64, Pass::forward),
              1e3);
}

TEST(Machine, BadFilesNameTheKey) {
  const auto error_of = [](const std::string& text) {
    try {
      load_machine(write_temp("bad.toml", text));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string base =
      "ranks_per_host = 2\npeak_tflops = 0.1\ngemm_efficiency = 0.8\nattention_efficiency = 0.3\n"
      "memory_gib = 4\nmemory_gbps = 20\n";
  EXPECT_NE(error_of(base).find("no collective costs"), std::string::npos);
  const std::string ok = base + "[intra.all_reduce]\nlatency_us = 1\nbusbw_gbps = 5\n";
  EXPECT_EQ(error_of(ok), "no error");
  EXPECT_NE(error_of("ranks_per_host = 0\n").find("ranks_per_host: expected a positive number"),
            std::string::npos);
  EXPECT_NE(error_of("overlap = 2\n" + ok).find("overlap: expected a number from 0 to 1"),
            std::string::npos);
  EXPECT_NE(error_of(base + "[inter.p2p]\npoints = [[8, 1e-6], [4, 2e-6]]\n")
                .find("inter.p2p.points: expected [bus bytes, seconds] pairs"),
            std::string::npos);
  EXPECT_NE(error_of(ok + "[gemm]\nrows = [256, 64]\nforward_efficiency = [0.5, 0.5]\n"
                          "backward_efficiency = [0.5, 0.5]\n")
                .find("gemm.rows: expected values increasing"),
            std::string::npos);
  EXPECT_NE(error_of(ok + "[gemm]\nrows = [64, 256]\nforward_efficiency = [0.5]\n"
                          "backward_efficiency = [0.5, 0.5]\n")
                .find("gemm.forward_efficiency: 1 values for the 2 of gemm.rows"),
            std::string::npos);
  EXPECT_NE(error_of(ok + "[attention]\nseq = [128, 512]\nhead_dim = [64]\n"
                          "forward_efficiency = [[0.1], [0.2]]\nbackward_efficiency = [[0.1, 0.2]]\n")
                .find("attention.backward_efficiency: expected 2 arrays of 1 positive numbers"),
            std::string::npos);
  EXPECT_NE(error_of(ok + "[attention]\nseq = [128]\nhead_dim = [64]\n"
                          "forward_efficiency = [[-1]]\nbackward_efficiency = [[0.1]]\n")
                .find("attention.forward_efficiency: expected 1 arrays of 1 positive numbers"),
            std::string::npos);
  // A level the file has no numbers for is refused when a layout needs it.
  const Machine m = load_machine(write_temp("ok.toml", ok));
  try {
    m.seconds(NetLevel::inter, Collective::all_reduce, 1e6, 2);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no inter.all_reduce costs"), std::string::npos);
  }
}

}  // namespace
}  // namespace jumbo
