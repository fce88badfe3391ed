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

// Repeats `op` (doing `work` units each) for about `seconds`: units per second of `op`'s own
// time. `untimed` runs before each, off the clock: a cache flush (writing a buffer larger than
// the last-level cache) for the GEMMs, which in a training step mostly find their operands
// out of cache (each layer has its own weights and activations, and a backward reads what
// its forward wrote long before).
template <typename Op, typename Untimed>
double rate_of(Backend& backend, double work, double seconds, Op op, Untimed untimed) {
  op();  // warm: pages touched, kernels loaded
  backend.stream().synchronize();
  int64_t count = 0;
  double timed = 0;
  const double start = now_s();
  do {
    untimed();
    backend.stream().synchronize();
    const double t0 = now_s();
    op();
    backend.stream().synchronize();
    timed += now_s() - t0;
    ++count;
  } while (now_s() - start < seconds);
  return work * static_cast<double>(count) / timed;
}
template <typename Op>
double rate_of(Backend& backend, double work, double seconds, Op op) {
  return rate_of(backend, work, seconds, op, [] {});
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
  r.peak_flops = measure_fp32_peak_gflops(seconds / 6) * 1e9;
  // A layer's MLP GEMM of a small model on a CPU (512 -> 2048), of a large one in bf16 on a
  // GPU (4096 -> 16384), at row counts around a microbatch's tokens; the forward (2 N I O
  // FLOPs) and the backward (both gradients: 4 N I O) timed apart.
  r.gemm_rows = gpu ? std::vector<double>{512, 1024, 2048, 4096, 8192, 16384}
                    : std::vector<double>{32, 64, 128, 256, 512, 1024, 2048};
  const int64_t n = static_cast<int64_t>(r.gemm_rows.back());
  const int64_t in_f = gpu ? 4096 : 512, out_f = gpu ? 16384 : 2048;
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
  Tensor a = arena.alloc(DType::f32, {stream_elems}), b = arena.alloc(DType::f32, {stream_elems});
  Tensor c = arena.alloc(DType::f32, {stream_elems});
  for (Tensor z : {a, b, c}) backend.fill(z, 1.0f);
  const auto flush = [&] { backend.fill(c, 1.0f); };  // 64 MiB: more than a CPU's or GPU's L2/L3
  const double per_gemm = seconds / 2 / (2.0 * static_cast<double>(r.gemm_rows.size()));
  for (double rows_d : r.gemm_rows) {
    const int64_t rows = static_cast<int64_t>(rows_d);
    Tensor xr = x.rows(0, rows), dxr = dx.rows(0, rows), yr = y.rows(0, rows), dyr = dy.rows(0, rows);
    const double fwd_flops = 2.0 * static_cast<double>(rows * in_f * out_f);
    r.gemm_forward_flops.push_back(rate_of(
        backend, fwd_flops, per_gemm, [&] { backend.linear_fwd(yr, xr, w, Tensor{}); }, flush));
    r.gemm_backward_flops.push_back(rate_of(
        backend, 2 * fwd_flops, per_gemm,
        [&] { backend.linear_bwd(dxr, dw, Tensor{}, dyr, xr, w); }, flush));
  }
  // Attention at sequence lengths x head sizes around training's, over a fixed number of
  // tokens (CPU 2048 in 2 heads, GPU 16384 in 16), FLOPs as the model counts them: 6 B s^2 C
  // for forward and backward, causal at half, a third forward.
  r.attention_seq = gpu ? std::vector<double>{512, 2048, 8192} : std::vector<double>{128, 512, 2048};
  r.attention_head_dim = gpu ? std::vector<double>{64, 128} : std::vector<double>{32, 64, 128};
  const int64_t tokens = gpu ? 16384 : 2048, heads = gpu ? 16 : 2;
  const double per_attention = seconds / 3 /
      (2.0 * static_cast<double>(r.attention_seq.size() * r.attention_head_dim.size()));
  for (double seq_d : r.attention_seq) {
    for (double head_dim_d : r.attention_head_dim) {
      const int64_t at = static_cast<int64_t>(seq_d), ad = static_cast<int64_t>(head_dim_d);
      const int64_t ab = tokens / at, cols = backend.attention_stats_cols(at);
      Arena attn = backend.device().make_arena(
          static_cast<size_t>(4 * (2 * tokens * 3 * heads * ad + 2 * tokens * heads * ad +
                                   2 * ab * heads * at * cols)) + 16 * Arena::kAlign,
          "bench machine attention");
      Tensor qkv = attn.alloc(t, {ab, at, 3 * heads * ad});
      Tensor dqkv = attn.alloc(t, {ab, at, 3 * heads * ad});
      Tensor out = attn.alloc(t, {ab, at, heads * ad}), dout = attn.alloc(t, {ab, at, heads * ad});
      Tensor stats = attn.alloc(DType::f32, {ab, heads, at, cols});
      Tensor dstats = attn.alloc(DType::f32, {ab, heads, at, cols});
      backend.fill(qkv, 0.01f);
      backend.fill(dout, 0.001f);
      const double flops = 6.0 * static_cast<double>(ab * at * at * heads * ad);
      // Hot: the core reads the q, k, v its layer's GEMM has just written (the backward, the
      // output and statistics of the forward or the recompute just before).
      r.attention_forward_flops.push_back(
          rate_of(backend, flops / 3, per_attention,
                  [&] { backend.attention_fwd(out, stats, qkv, heads); }));
      r.attention_backward_flops.push_back(
          rate_of(backend, flops * 2 / 3, per_attention,
                  [&] { backend.attention_bwd(dqkv, dstats, dout, qkv, out, stats, heads); }));
    }
  }
  r.memory_bandwidth = rate_of(backend, 12.0 * static_cast<double>(stream_elems), seconds / 6,
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
  // The rates a step runs at are its slowest rank's: every collective and the step's end wait
  // for it. (The check of the time model on a 2-core VM: with the ranks' mean, 2-rank layouts
  // measured 10-19% over their plans while one rank measured 6% over; one core was slower.)
  const auto slowest = [&](double mine_value) {
    return -world.all_reduce_scalar(-mine_value, ReduceOp::max);
  };
  // A pass at a rate r of a third (forward) and two thirds (backward) of the FLOPs: the rate
  // of both together.
  const auto both = [](double forward, double backward) {
    return 1.0 / (1.0 / 3.0 / forward + 2.0 / 3.0 / backward);
  };
  m.gemm_by_rows.rows = mine.gemm_rows;
  for (size_t i = 0; i < mine.gemm_rows.size(); ++i) {
    m.gemm_by_rows.forward.push_back(slowest(mine.gemm_forward_flops[i]) / m.peak_flops);
    m.gemm_by_rows.backward.push_back(slowest(mine.gemm_backward_flops[i]) / m.peak_flops);
  }
  // The one figure: forward and backward at the reference rows (CPU 1024, GPU 8192).
  const double reference_rows = m.device == Device::cuda ? 8192 : 1024;
  const double gemm = both(m.gemm_rate(reference_rows, Pass::forward),
                           m.gemm_rate(reference_rows, Pass::backward));
  m.gemm_efficiency = gemm / m.peak_flops;
  AttentionTable& a = m.attention_by_shape;
  a.seq = mine.attention_seq;
  a.head_dim = mine.attention_head_dim;
  for (size_t i = 0; i < mine.attention_forward_flops.size(); ++i) {
    a.forward.push_back(slowest(mine.attention_forward_flops[i]) / m.peak_flops);
    a.backward.push_back(slowest(mine.attention_backward_flops[i]) / m.peak_flops);
  }
  // The one figure: forward and backward at the reference shape (CPU 512 x 64, GPU 2048 x 128).
  const double reference_seq = m.device == Device::cuda ? 2048 : 512;
  const double reference_head = m.device == Device::cuda ? 128 : 64;
  const double attention =
      both(m.attention_rate(reference_seq, reference_head, Pass::forward),
           m.attention_rate(reference_seq, reference_head, Pass::backward));
  m.attention_efficiency = attention / m.peak_flops;
  m.memory_bandwidth = slowest(mine.memory_bandwidth);
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
  m.source = fmt::format(
      "measured by `{}`: FMA peak {:.1f}, GEMM {:.1f} ({:.0f} rows, forward and backward; "
      "by rows in [gemm]) and attention {:.1f} (seq {:.0f}, heads of {:.0f}; by shape in "
      "[attention]) GFLOP/s per rank, streaming add {:.2f} GB/s, all ranks at once",
      command, m.peak_flops / 1e9, gemm / 1e9, reference_rows, attention / 1e9, reference_seq,
      reference_head, m.memory_bandwidth / 1e9);
  return m;
}

}  // namespace jumbo
