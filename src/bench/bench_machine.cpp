// A machine description measured on this launch's ranks (bench/bench_machine.h).
#include "jumbo/bench/bench_machine.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <cmath>
#include <map>
#include <tuple>

#include "jumbo/runtime/peak.h"

namespace jumbo {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Repeats `op` (doing `work` units each) for about `seconds`: units per second.
template <typename Op>
double rate_of(Backend& backend, double work, double seconds, Op op) {
  op();  // warm: pages touched, kernels loaded
  backend.stream().synchronize();
  int64_t count = 0;
  const double t0 = now_s();
  double elapsed = 0;
  do {
    op();
    backend.stream().synchronize();
    ++count;
    elapsed = now_s() - t0;
  } while (elapsed < seconds);
  return work * static_cast<double>(count) / elapsed;
}

double host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

}  // namespace

ComputeRates measure_compute(Backend& backend, double seconds) {
  ComputeRates r;
  const bool gpu = backend.device().kind() == Device::cuda;
  r.peak_flops = measure_fp32_peak_gflops(seconds / 4) * 1e9;
  // A layer's MLP GEMM of a small model on a CPU (1024 tokens, 512 -> 2048), of a large one
  // in bf16 on a GPU; forward and both backward GEMMs: 6 N I O FLOPs.
  const int64_t n = gpu ? 8192 : 1024, in_f = gpu ? 4096 : 512, out_f = gpu ? 16384 : 2048;
  const DType t = gpu ? DType::bf16 : DType::f32;
  const int64_t stream_elems = int64_t{16} << 20;  // 64 MiB of f32 per array
  const size_t bytes = static_cast<size_t>(4 * (2 * n * in_f + 2 * out_f * in_f + 2 * n * out_f) +
                                           3 * 4 * stream_elems) + 16 * Arena::kAlign;
  Arena arena = backend.device().make_arena(bytes, "bench machine");
  Tensor x = arena.alloc(t, {n, in_f}), dx = arena.alloc(t, {n, in_f});
  Tensor w = arena.alloc(t, {out_f, in_f}), dw = arena.alloc(DType::f32, {out_f, in_f});
  Tensor y = arena.alloc(t, {n, out_f}), dy = arena.alloc(t, {n, out_f});
  for (Tensor z : {x, w, dy}) backend.fill(z, 0.01f);
  backend.fill(dw, 0.0f);
  const double gemm_flops = 6.0 * static_cast<double>(n * in_f * out_f);
  r.gemm_flops = rate_of(backend, gemm_flops, seconds / 4, [&] {
    backend.linear_fwd(y, x, w, Tensor{});
    backend.linear_bwd(dx, dw, Tensor{}, dy, x, w);
  });
  // Attention: a training shape (CPU: 2 x 256 tokens, 8 heads of 64; GPU: 4 x 2048, 16 of
  // 128), FLOPs as the model counts them: 6 B T^2 C for forward and backward, causal at half.
  const int64_t ab = gpu ? 4 : 2, at = gpu ? 2048 : 256, ah = gpu ? 16 : 8, ad = gpu ? 128 : 64;
  const int64_t cols = backend.attention_stats_cols(at);
  Arena attn = backend.device().make_arena(
      static_cast<size_t>(4 * (2 * ab * at * 3 * ah * ad + 2 * ab * at * ah * ad +
                               2 * ab * ah * at * cols)) + 16 * Arena::kAlign,
      "bench machine attention");
  Tensor qkv = attn.alloc(t, {ab, at, 3 * ah * ad}), dqkv = attn.alloc(t, {ab, at, 3 * ah * ad});
  Tensor out = attn.alloc(t, {ab, at, ah * ad}), dout = attn.alloc(t, {ab, at, ah * ad});
  Tensor stats = attn.alloc(DType::f32, {ab, ah, at, cols});
  Tensor dstats = attn.alloc(DType::f32, {ab, ah, at, cols});
  backend.fill(qkv, 0.01f);
  backend.fill(dout, 0.001f);
  const double attention_flops = 6.0 * static_cast<double>(ab * at * at * ah * ad);
  r.attention_flops = rate_of(backend, attention_flops, seconds / 4, [&] {
    backend.attention_fwd(out, stats, qkv);
    backend.attention_bwd(dqkv, dstats, dout, qkv, out, stats);
  });
  Tensor a = arena.alloc(DType::f32, {stream_elems}), b = arena.alloc(DType::f32, {stream_elems});
  Tensor c = arena.alloc(DType::f32, {stream_elems});
  for (Tensor z : {a, b, c}) backend.fill(z, 1.0f);
  r.memory_bandwidth = rate_of(backend, 12.0 * static_cast<double>(stream_elems), seconds / 4,
                               [&] { backend.add(c, a, b); });
  return r;
}

Machine measure_machine(const std::vector<CommBenchRow>& rows, Backend& backend, Comm& world,
                        const std::string& command) {
  const double n = static_cast<double>(world.size());
  world.barrier();  // every rank measures at once: a rank's rate beside busy neighbours
  const ComputeRates mine = measure_compute(backend, 3.0);
  const double host = host_id();
  const double host0 = world.all_reduce_scalar(world.rank() == 0 ? host : 0, ReduceOp::max);
  const double on_host0 = world.all_reduce_scalar(host == host0 ? 1 : 0, ReduceOp::sum);
  Machine m;
  m.device = backend.device().kind();
  m.ranks_per_host = static_cast<int64_t>(on_host0);
  m.peak_flops = world.all_reduce_scalar(mine.peak_flops, ReduceOp::sum) / n;
  const double gemm = world.all_reduce_scalar(mine.gemm_flops, ReduceOp::sum) / n;
  m.gemm_efficiency = gemm / m.peak_flops;
  const double attention = world.all_reduce_scalar(mine.attention_flops, ReduceOp::sum) / n;
  m.attention_efficiency = attention / m.peak_flops;
  m.memory_bandwidth = world.all_reduce_scalar(mine.memory_bandwidth, ReduceOp::sum) / n;
  m.memory_bytes = m.device == Device::cuda
                       ? static_cast<double>(backend.device().memory().total)
                       : host_memory_bytes() / static_cast<double>(m.ranks_per_host);
  // A CPU rank's one core runs its ring thread and its GEMMs by turns; a GPU's copies and
  // NCCL kernels run beside the compute kernels.
  m.overlap = m.device == Device::cuda ? 1.0 : 0.0;
  // Per level, path and collective: the rows of the largest group. The world's rows count
  // where they are of one level (all on one host, or one rank per host).
  const auto usable = [&](const CommBenchRow& r) {
    return r.group != "world" || r.one_host || m.ranks_per_host == 1;
  };
  std::map<std::tuple<bool, CommPath, Collective>, int> largest;
  for (const CommBenchRow& r : rows) {
    if (!usable(r)) continue;
    int& most = largest[{r.one_host, r.path, r.op}];
    most = std::max(most, r.ranks);
  }
  for (const CommBenchRow& r : rows) {
    if (!usable(r) || largest[{r.one_host, r.path, r.op}] != r.ranks) continue;
    CollectiveCost& cost = m.link(r.one_host ? NetLevel::intra : NetLevel::inter).of(r.op, r.path);
    const double bus = static_cast<double>(r.bytes) * bus_bandwidth_factor(r.op, r.ranks);
    if (!cost.points.empty() && bus <= cost.points.back().first) continue;  // a second group
    if (cost.points.empty()) cost.latency_s = r.seconds;
    cost.points.emplace_back(bus, r.seconds);
    cost.busbw = std::max(cost.busbw, r.busbw);
  }
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  const int64_t hosts = static_cast<int64_t>(std::llround(n / on_host0));
  m.name = fmt::format("{} ranks on {} host{} of {} ({} per host{})", world.size(), hosts,
                       hosts == 1 ? "" : "s", name, m.ranks_per_host,
                       m.device == Device::cuda ? ", cuda" : ", cpu");
  m.source = fmt::format("measured by `{}`: FMA peak {:.1f}, GEMM {:.1f} and attention {:.1f} "
                         "GFLOP/s per rank, streaming add {:.2f} GB/s, all ranks at once",
                         command, m.peak_flops / 1e9, gemm / 1e9, attention / 1e9,
                         m.memory_bandwidth / 1e9);
  return m;
}

}  // namespace jumbo
