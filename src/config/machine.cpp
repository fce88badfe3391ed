// Machine descriptions (config/machine.h): collective cost curves, the GPU clusters from
// data sheets, and the TOML of a measured machine.
#include "jumbo/config/machine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
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

double Machine::gemm_rate(double rows, Pass pass) const {
  return peak_flops * (gemm_by_rows.empty() ? gemm_efficiency
                                            : gemm_by_rows.efficiency(rows, pass));
}

namespace {

// Where `x` falls on `axis` (increasing): the lower index and the fraction towards the next,
// linear in log(x), clamped to the ends.
std::pair<size_t, double> log_position(const std::vector<double>& axis, double x) {
  if (axis.size() == 1 || x <= axis.front()) return {0, 0.0};
  if (x >= axis.back()) return {axis.size() - 2, 1.0};
  const size_t hi = static_cast<size_t>(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin());
  return {hi - 1, std::log(x / axis[hi - 1]) / std::log(axis[hi] / axis[hi - 1])};
}

}  // namespace

double GemmCurve::efficiency(double at_rows, Pass pass) const {
  const std::vector<double>& e = pass == Pass::forward ? forward : backward;
  const auto [i, f] = log_position(rows, at_rows);
  return rows.size() == 1 ? e[0] : e[i] + f * (e[i + 1] - e[i]);
}

double AttentionTable::efficiency(double at_seq, double at_head_dim, Pass pass) const {
  const std::vector<double>& e = pass == Pass::forward ? forward : backward;
  const size_t cols = head_dim.size();
  const auto [i, fi] = log_position(seq, at_seq);
  const auto [j, fj] = log_position(head_dim, at_head_dim);
  const auto at = [&](size_t a, size_t b) {
    return e[std::min(a, seq.size() - 1) * cols + std::min(b, cols - 1)];
  };
  const double low = at(i, j) + fj * (at(i, j + 1) - at(i, j));
  const double high = at(i + 1, j) + fj * (at(i + 1, j + 1) - at(i + 1, j));
  return low + fi * (high - low);
}

double Machine::attention_rate(double seq, double head_dim, Pass pass) const {
  return peak_flops * (attention_by_shape.empty()
                           ? attention_efficiency
                           : attention_by_shape.efficiency(seq, head_dim, pass));
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

// table[key]: a non-empty array of positive numbers (an array of such arrays, flattened,
// when `rows_of` > 0: that many arrays of `row_length` each).
std::vector<double> positive_numbers(const toml::table& table, const std::string& path,
                                     const std::string& where, const char* key,
                                     size_t rows_of = 0, size_t row_length = 0) {
  const std::string name = fmt::format("{}.{}", where, key);
  const toml::array* a = table.get(key) ? table.get(key)->as_array() : nullptr;
  const std::string expected = rows_of > 0
                                   ? fmt::format("expected {} arrays of {} positive numbers",
                                                 rows_of, row_length)
                                   : std::string("expected an array of positive numbers");
  if (!a || a->empty() || (rows_of > 0 && a->size() != rows_of)) bad(path, name, expected);
  std::vector<double> out;
  const auto add = [&](const toml::node& e) {
    const std::optional<double> v = e.value<double>();
    if (!v || !std::isfinite(*v) || *v <= 0) bad(path, name, expected);
    out.push_back(*v);
  };
  for (const toml::node& e : *a) {
    if (rows_of == 0) {
      add(e);
      continue;
    }
    const toml::array* row = e.as_array();
    if (!row || row->size() != row_length) bad(path, name, expected);
    for (const toml::node& v : *row) add(v);
  }
  return out;
}

void require_increasing(const std::vector<double>& axis, const std::string& path,
                        const std::string& name) {
  if (std::adjacent_find(axis.begin(), axis.end(), std::greater_equal<>()) != axis.end())
    bad(path, name, "expected values increasing");
}

// [gemm]: rows increasing, one efficiency per row count and pass.
GemmCurve read_gemm_curve(const toml::table& g, const std::string& path) {
  GemmCurve c;
  c.rows = positive_numbers(g, path, "gemm", "rows");
  require_increasing(c.rows, path, "gemm.rows");
  c.forward = positive_numbers(g, path, "gemm", "forward_efficiency");
  c.backward = positive_numbers(g, path, "gemm", "backward_efficiency");
  for (const auto* e : {&c.forward, &c.backward}) {
    if (e->size() != c.rows.size()) {
      bad(path, e == &c.forward ? "gemm.forward_efficiency" : "gemm.backward_efficiency",
          fmt::format("{} values for the {} of gemm.rows", e->size(), c.rows.size()));
    }
  }
  return c;
}

// [attention]: seq and head_dim increasing, per pass one array per seq of one efficiency per
// head size.
AttentionTable read_attention_table(const toml::table& a, const std::string& path) {
  AttentionTable t;
  t.seq = positive_numbers(a, path, "attention", "seq");
  require_increasing(t.seq, path, "attention.seq");
  t.head_dim = positive_numbers(a, path, "attention", "head_dim");
  require_increasing(t.head_dim, path, "attention.head_dim");
  t.forward = positive_numbers(a, path, "attention", "forward_efficiency", t.seq.size(),
                               t.head_dim.size());
  t.backward = positive_numbers(a, path, "attention", "backward_efficiency", t.seq.size(),
                                t.head_dim.size());
  return t;
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
  if (const toml::node* g = t.get("gemm")) {
    if (!g->as_table()) bad(path, "gemm", "expected a table (rows, forward_efficiency, backward_efficiency)");
    m.gemm_by_rows = read_gemm_curve(*g->as_table(), path);
  }
  if (const toml::node* a = t.get("attention")) {
    if (!a->as_table())
      bad(path, "attention", "expected a table (seq, head_dim, forward_efficiency, backward_efficiency)");
    m.attention_by_shape = read_attention_table(*a->as_table(), path);
  }
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
  // "[a, b, c]" of v[from, from + count), each with `digits` decimals.
  const auto list = [](const std::vector<double>& v, int digits, size_t from = 0,
                       size_t count = SIZE_MAX) {
    std::string s;
    for (size_t i = from; i < std::min(v.size(), from + count); ++i)
      s += fmt::format("{}{:.{}f}", s.empty() ? "" : ", ", v[i], digits);
    return "[" + s + "]";
  };
  if (!m.gemm_by_rows.empty()) {
    const GemmCurve& g = m.gemm_by_rows;
    out += fmt::format("\n[gemm]  # efficiency by the GEMM's rows (a microbatch's tokens)\n"
                       "rows = {}\nforward_efficiency = {}\nbackward_efficiency = {}\n",
                       list(g.rows, 0), list(g.forward, 4), list(g.backward, 4));
  }
  if (!m.attention_by_shape.empty()) {
    const AttentionTable& a = m.attention_by_shape;
    out += fmt::format("\n[attention]  # efficiency by sequence length and head size\n"
                       "seq = {}\nhead_dim = {}\n", list(a.seq, 0), list(a.head_dim, 0));
    for (const auto& [name, e] : {std::pair{"forward_efficiency", &a.forward},
                                  std::pair{"backward_efficiency", &a.backward}}) {
      out += fmt::format("{} = [  # one row per seq\n", name);
      for (size_t i = 0; i < a.seq.size(); ++i)
        out += fmt::format("  {},\n", list(*e, 4, i * a.head_dim.size(), a.head_dim.size()));
      out += "]\n";
    }
  }
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
