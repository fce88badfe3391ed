// Machine descriptions (config/machine.h): collective cost curves, the GPU clusters from
// data sheets, and the TOML of a measured machine.
#include "jumbo/config/machine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <toml++/toml.h>

#include "jumbo/config/config.h"

namespace jumbo {

const char* to_string(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_gather: return "all_gather";
    case Collective::p2p: return "p2p";
  }
  return "?";
}

const char* to_string(NetLevel l) { return l == NetLevel::intra ? "intra" : "inter"; }

double bus_bandwidth_factor(Collective c, int64_t n) {
  const double ranks = static_cast<double>(n);
  switch (c) {
    case Collective::all_reduce: return 2.0 * (ranks - 1) / ranks;
    case Collective::reduce_scatter:
    case Collective::all_gather: return (ranks - 1) / ranks;
    case Collective::p2p: return 1.0;
  }
  return 1.0;
}

double CollectiveCost::seconds(Collective c, double bytes, int64_t n) const {
  if (n <= 1 || bytes <= 0) return 0;
  const double bus = bytes * bus_bandwidth_factor(c, n);
  if (points.empty()) return latency_s + bus / busbw;
  if (bus <= points.front().first) return points.front().second;
  if (bus >= points.back().first) {  // beyond the largest size: its bus bandwidth
    return points.back().second * bus / points.back().first;
  }
  const auto hi = std::upper_bound(points.begin(), points.end(), bus,
                                   [](double b, const auto& p) { return b < p.first; });
  const auto lo = hi - 1;
  const double f = std::log(bus / lo->first) / std::log(hi->first / lo->first);
  return std::exp(std::log(lo->second) + f * std::log(hi->second / lo->second));
}

const CollectiveCost& LinkCosts::of(Collective c, CommPath path) const {
  if (path == CommPath::bucketed) {
    const CollectiveCost* bucket = c == Collective::all_reduce       ? &bucket_all_reduce
                                   : c == Collective::reduce_scatter ? &bucket_reduce_scatter
                                   : c == Collective::all_gather     ? &bucket_all_gather
                                                                     : nullptr;
    if (bucket && bucket->known()) return *bucket;
  }
  switch (c) {
    case Collective::all_reduce: return all_reduce;
    case Collective::reduce_scatter: return reduce_scatter;
    case Collective::all_gather: return all_gather;
    case Collective::p2p: return p2p;
  }
  return all_reduce;
}

CollectiveCost& LinkCosts::of(Collective c, CommPath path) {
  if (path == CommPath::bucketed) {
    switch (c) {
      case Collective::all_reduce: return bucket_all_reduce;
      case Collective::reduce_scatter: return bucket_reduce_scatter;
      case Collective::all_gather: return bucket_all_gather;
      case Collective::p2p: break;
    }
  }
  return const_cast<CollectiveCost&>(static_cast<const LinkCosts&>(*this).of(c));
}

std::string cost_name(Collective c, CommPath path) {
  return (path == CommPath::bucketed && c != Collective::p2p ? "bucket_" : "") +
         std::string(to_string(c));
}

namespace {
constexpr CommPath kPaths[] = {CommPath::blocking, CommPath::bucketed};
}  // namespace

double Machine::seconds(NetLevel level, Collective c, double bytes, int64_t n,
                        CommPath path) const {
  const CollectiveCost& cost = link(level).of(c, path);
  if (!cost.known()) {
    throw UserError(fmt::format("machine {}: no {}.{} costs ({} between ranks {}): measure them "
                                "with jumbo bench comm --write-machine over {}",
                                name, to_string(level), to_string(c), to_string(c),
                                level == NetLevel::intra ? "of one host" : "of different hosts",
                                level == NetLevel::intra ? "one host" : "two or more hosts"));
  }
  return cost.seconds(c, bytes, n);
}

Machine machine_of_gpu(const GpuSpec& g, int64_t gpus_per_node) {
  Machine m;
  m.name = fmt::format("{} ({} x {})", g.instance, gpus_per_node, g.label);
  m.ranks_per_host = gpus_per_node;
  m.peak_flops = g.bf16_tflops * 1e12;
  m.gemm_efficiency = 0.6;
  m.attention_efficiency = 0.4;
  m.memory_bytes = static_cast<double>(g.memory_bytes);
  m.memory_bandwidth = g.hbm_gbps * 1e9;
  // Inside a node: NCCL's ring bus bandwidth over NVLink/NVSwitch (gpus.cpp), ~10 us small-
  // message latency (nccl-tests on 8 GPUs of one node); send/recv runs one direction of a
  // link, about 60% of the all-reduce's bus bandwidth.
  const double nvlink = g.nvlink_bus_gbps * 1e9;
  m.intra.all_reduce = {.latency_s = 10e-6, .busbw = nvlink, .points = {}};
  m.intra.reduce_scatter = {.latency_s = 10e-6, .busbw = nvlink, .points = {}};
  m.intra.all_gather = {.latency_s = 10e-6, .busbw = nvlink, .points = {}};
  m.intra.p2p = {.latency_s = 8e-6, .busbw = 0.6 * nvlink, .points = {}};
  // Between nodes: the node's EFA shared by its GPUs (each dp or pp ring of a layout runs one
  // GPU's share at a time with the others), at 85% of line rate, 30 us small-message
  // latency across nodes. Assumed, not measured: replace with a cluster's
  // `jumbo bench comm --write-machine` (docs/plan.md).
  const double efa = 0.85 * g.node_network_gbits / 8.0 * 1e9 / static_cast<double>(gpus_per_node);
  m.inter.all_reduce = {.latency_s = 30e-6, .busbw = efa, .points = {}};
  m.inter.reduce_scatter = {.latency_s = 30e-6, .busbw = efa, .points = {}};
  m.inter.all_gather = {.latency_s = 30e-6, .busbw = efa, .points = {}};
  m.inter.p2p = {.latency_s = 20e-6, .busbw = efa, .points = {}};
  m.source = fmt::format(
      "data sheets: {} TFLOP/s bf16 dense, {} GB/s HBM, {:.0f} GiB; assumed: GEMMs at 60% of "
      "peak, flash attention at 40% (FlashAttention-2 reports 50-73% forward, less backward), NCCL {} GB/s bus bandwidth in a node (~77% of NVLink), EFA {} Gbit/s per node at "
      "85% of line rate shared by {} GPUs, latencies 10 us (node) and 30 us (network)",
      g.bf16_tflops, g.hbm_gbps, static_cast<double>(g.memory_bytes) / (1ull << 30),
      g.nvlink_bus_gbps, g.node_network_gbits, gpus_per_node);
  return m;
}

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& key, const std::string& what) {
  throw UserError(fmt::format("{}: {}: {}", path, key, what));
}

// t[key] as a positive number; `where` names it in messages (its dotted path).
double positive(const toml::table& t, const std::string& path, const std::string& key,
                const std::string& where, bool required) {
  const toml::node* n = t.get(key);
  if (!n) {
    if (required) bad(path, where, "missing (a positive number)");
    return 0;
  }
  const std::optional<double> v = n->value<double>();
  if (!v || !std::isfinite(*v) || *v <= 0) bad(path, where, "expected a positive number");
  return *v;
}

double positive(const toml::table& t, const std::string& path, const std::string& key) {
  return positive(t, path, key, key, true);
}

CollectiveCost read_cost(const toml::table& t, const std::string& path, const std::string& key) {
  CollectiveCost c;
  c.latency_s = positive(t, path, "latency_us", key + ".latency_us", false) * 1e-6;
  c.busbw = positive(t, path, "busbw_gbps", key + ".busbw_gbps", false) * 1e9;
  if (const toml::node* p = t.get("points")) {
    const toml::array* a = p->as_array();
    if (!a) bad(path, key + ".points", "expected an array of [bus bytes, seconds]");
    for (const toml::node& e : *a) {
      const toml::array* pair = e.as_array();
      const auto b = pair && pair->size() == 2 ? (*pair)[0].value<double>() : std::nullopt;
      const auto s = pair && pair->size() == 2 ? (*pair)[1].value<double>() : std::nullopt;
      if (!b || !s || *b <= 0 || *s <= 0 ||
          (!c.points.empty() && *b <= c.points.back().first)) {
        bad(path, key + ".points",
            "expected [bus bytes, seconds] pairs of positive numbers, bus bytes increasing");
      }
      c.points.emplace_back(*b, *s);
    }
  }
  if (!c.known()) bad(path, key, "expected busbw_gbps (with latency_us) or points");
  return c;
}

}  // namespace

Machine load_machine(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw UserError(fmt::format("{}:{}: {}", path, e.source().begin.line, e.description()));
  }
  Machine m;
  m.name = t["name"].value_or(std::string(path));
  m.source = t["source"].value_or(std::string());
  const double ranks = positive(t, path, "ranks_per_host");
  if (ranks != std::floor(ranks)) bad(path, "ranks_per_host", "expected a whole number");
  m.ranks_per_host = static_cast<int64_t>(ranks);
  m.peak_flops = positive(t, path, "peak_tflops") * 1e12;
  m.gemm_efficiency = positive(t, path, "gemm_efficiency");
  m.attention_efficiency = positive(t, path, "attention_efficiency");
  m.memory_bytes = positive(t, path, "memory_gib") * (1ull << 30);
  m.memory_bandwidth = positive(t, path, "memory_gbps") * 1e9;
  const toml::node* overlap = t.get("overlap");
  if (overlap) {
    const std::optional<double> o = overlap->value<double>();
    if (!o || !(*o >= 0 && *o <= 1)) bad(path, "overlap", "expected a number from 0 to 1");
    m.overlap = *o;
  }
  const std::string device = t["device"].value_or(std::string("cuda"));
  if (device != "cpu" && device != "cuda")
    bad(path, "device", fmt::format("{}: expected \"cpu\" or \"cuda\"", toml_quoted(device)));
  m.device = device == "cpu" ? Device::cpu : Device::cuda;
  for (NetLevel level : {NetLevel::intra, NetLevel::inter}) {
    const toml::table* lt = t[to_string(level)].as_table();
    if (!lt) continue;
    for (CommPath p : kPaths) {
      for (Collective c : kCollectives) {
        if (p == CommPath::bucketed && c == Collective::p2p) continue;
        const std::string name = cost_name(c, p);
        const toml::table* ct = (*lt)[name].as_table();
        if (ct) {
          m.link(level).of(c, p) =
              read_cost(*ct, path, fmt::format("{}.{}", to_string(level), name));
        }
      }
    }
  }
  if (!m.intra.all_reduce.known() && !m.inter.all_reduce.known())
    bad(path, "intra", "no collective costs ([intra.all_reduce] or [inter.all_reduce])");
  return m;
}

std::string machine_toml(const Machine& m) {
  std::string out = fmt::format(
      "# A jumbo machine description (docs/plan.md \"Machine descriptions\"): jumbo plan "
      "--machine THIS\nname = {}\nsource = {}\ndevice = \"{}\"\nranks_per_host = {}\n"
      "peak_tflops = {:.6g}\ngemm_efficiency = {:.4f}\nattention_efficiency = {:.4f}\n"
      "memory_gib = {:.3f}\nmemory_gbps = {:.4g}\noverlap = {:.2f}\n",
      toml_quoted(m.name), toml_quoted(m.source), to_string(m.device), m.ranks_per_host,
      m.peak_flops / 1e12, m.gemm_efficiency, m.attention_efficiency,
      m.memory_bytes / (1ull << 30),
      m.memory_bandwidth / 1e9, m.overlap);
  for (NetLevel level : {NetLevel::intra, NetLevel::inter}) {
    for (CommPath p : kPaths) {
    for (Collective c : kCollectives) {
      if (p == CommPath::bucketed && c == Collective::p2p) continue;
      const CollectiveCost& cost = m.link(level).of(c, p);
      // The bucketed path falls back to the blocking one: written only when it is its own.
      if (!cost.known() || (p == CommPath::bucketed && &cost == &m.link(level).of(c))) continue;
      out += fmt::format("\n[{}.{}]\n", to_string(level), cost_name(c, p));
      if (cost.latency_s > 0) out += fmt::format("latency_us = {:.4g}\n", cost.latency_s * 1e6);
      if (cost.busbw > 0) out += fmt::format("busbw_gbps = {:.4g}\n", cost.busbw / 1e9);
      if (!cost.points.empty()) {
        out += "points = [  # [bus bytes, seconds]\n";
        for (const auto& [b, s] : cost.points) out += fmt::format("  [{:.0f}, {:.6g}],\n", b, s);
        out += "]\n";
      }
    }
    }
  }
  return out;
}

}  // namespace jumbo
