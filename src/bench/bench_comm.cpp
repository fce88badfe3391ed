#include "jumbo/bench/bench_comm.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <chrono>
#include <nlohmann/json.hpp>

#include "jumbo/comm/grid.h"
#include "jumbo/config/config.h"

namespace jumbo {

namespace {

// S rounded up to whole f32 elements, a multiple of the group's ranks (the blocks of
// reduce-scatter and all-gather).
int64_t elements_for(int64_t bytes, int n) {
  const int64_t per = std::max<int64_t>(1, (bytes + 4 * n - 1) / (4 * n));
  return per * n;
}

// One operation of `op` on S = elements x 4 bytes over `g`: `big` holds S, `small` S / n.
void run_once(Collective op, CommPath path, Comm& g, Tensor big, Tensor small) {
  const int n = g.size(), r = g.rank();
  if (path == CommPath::bucketed && op != Collective::p2p) {
    CommRequest q = op == Collective::all_reduce       ? g.iall_reduce(big, ReduceOp::sum)
                    : op == Collective::reduce_scatter ? g.ireduce_scatter(big, small)
                                                       : g.iall_gather(small, big);
    g.wait(q);
    return;
  }
  switch (op) {
    case Collective::all_reduce: g.all_reduce(big, ReduceOp::sum); break;
    case Collective::reduce_scatter: g.reduce_scatter(big, small); break;
    case Collective::all_gather: g.all_gather(small, big); break;
    case Collective::p2p: {
      // Each rank sends S to the next of the ring and receives S from the one before: `big`
      // goes out, `small`'s room would not hold it, so the receive lands in big's second half
      // of a buffer twice S (the caller's layout).
      const int64_t e = big.numel() / 2;
      Tensor out = big.rows(0, e), in = big.rows(e, e);
      g.group_start();
      CommRequest s = g.isend(out, (r + 1) % n, 7);
      CommRequest q = g.irecv(in, (r + n - 1) % n, 7);
      g.group_end();
      g.wait(s);
      g.wait(q);
      break;
    }
  }
}

}  // namespace

double host_id() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  // 52 bits: exact in the double the scalar all-reduces carry.
  return static_cast<double>(std::hash<std::string>{}(name) & ((uint64_t{1} << 52) - 1));
}

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Every size of `op` over `g` on the path, each row (less its group's name and level) to `add`.
void time_sizes(const CommBenchOptions& o, Backend& backend, Comm& g, Tensor all, Collective op,
                CommPath path, const std::function<void(CommBenchRow)>& add) {
  int64_t previous = 0;
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const int64_t e = elements_for(bytes, g.size());
    if (e == previous) continue;  // rounded up to the size already timed
    previous = e;
    const Tensor big = all.rows(0, op == Collective::p2p ? 2 * e : e);
    const Tensor small = all.rows(e, e / g.size());
    auto timed = [&](int64_t count) {
      g.barrier();
      const double t0 = now_s();
      for (int64_t i = 0; i < count; ++i) run_once(op, path, g, big, small);
      backend.stream().synchronize();
      return g.all_reduce_scalar(now_s() - t0, ReduceOp::max);
    };
    timed(o.warmup);
    // The first timed operation decides how many more fit the size's time, alike on every
    // rank (the slowest rank's time).
    const double one = timed(1);
    const int64_t iters = std::clamp<int64_t>(
        static_cast<int64_t>(o.seconds_per_size / std::max(one, 1e-9)), 1, o.iters);
    CommBenchRow row;
    row.op = op;
    row.ranks = g.size();
    row.bytes = e * 4;
    row.iters = iters;
    row.seconds = timed(iters) / static_cast<double>(iters);
    row.algbw = static_cast<double>(row.bytes) / row.seconds;
    row.busbw = row.algbw * bus_bandwidth_factor(op, g.size());
    row.path = path;
    add(std::move(row));
  }
}

}  // namespace

std::vector<CommBenchRow> bench_comm(const CommBenchOptions& o, Backend& backend,
                                     std::shared_ptr<Comm> world) {
  std::string problem;
  if (o.min_bytes < 4 || o.max_bytes < o.min_bytes) {
    problem = fmt::format("bench comm: --min-bytes {} --max-bytes {}: expected 4 <= min <= max",
                          o.min_bytes, o.max_bytes);
  } else if (o.tp < 1 || o.pp < 1 || world->size() % (o.tp * o.pp) != 0) {
    problem = fmt::format("bench comm: --tp {} x --pp {} does not divide the {} ranks", o.tp,
                          o.pp, world->size());
  }
  if (!problem.empty()) {  // the same on every rank: said once, rank 0's error ends them all
    if (world->rank() == 0) throw UserError(problem);
    world->barrier();
  }
  Grid grid(world, static_cast<int>(o.tp), static_cast<int>(o.pp));
  // What each group is timed with: the layout's groups with the calls training makes on them
  // (dp: the buckets' non-blocking calls; tp, pp: blocking), the levels' groups with both.
  struct Timed {
    const char* name;
    Comm* comm;
    std::vector<CommPath> paths;
  };
  std::vector<Timed> groups = {{"tp", &grid.tp(), {CommPath::blocking}},
                               {"dp", &grid.dp(), {CommPath::bucketed}},
                               {"pp", &grid.pp(), {CommPath::blocking}},
                               {"world", world.get(), {CommPath::blocking}}};
  const double host = host_id();
  std::shared_ptr<Comm> this_host, across_hosts;
  if (o.levels) {
    // Ranks are placed in blocks per host (the launchers' default, which the grid's tp-in-a-
    // node rule assumes too): the ranks of this rank's host, and the ranks of the same local
    // index on every host. Whether each really is one host, or one rank per host, is checked
    // below as for every group, from the host names.
    const int world_rank = world->rank();
    const double host0 = world->all_reduce_scalar(world_rank == 0 ? host : 0, ReduceOp::max);
    const int per_host =
        static_cast<int>(world->all_reduce_scalar(host == host0 ? 1 : 0, ReduceOp::sum));
    this_host = world->split(world_rank / per_host, world_rank, "host");
    across_hosts = world->split(world_rank % per_host, world_rank, "across");
    groups.push_back({"host", this_host.get(), {CommPath::blocking, CommPath::bucketed}});
    groups.push_back({"across", across_hosts.get(), {CommPath::blocking, CommPath::bucketed}});
  }
  // One buffer for every size: twice the largest S (p2p's send and receive halves).
  const int64_t most = 2 * elements_for(o.max_bytes, world->size());
  Arena arena = backend.device().make_arena(static_cast<size_t>(most) * 4 + 2 * Arena::kAlign,
                                            "bench comm");
  Tensor all = arena.alloc(DType::f32, {most});
  backend.fill(all, 0.0f);  // sums of zeros stay zeros, however many operations run
  std::vector<CommBenchRow> rows;
  for (const Timed& timed_group : groups) {
    Comm& g = *timed_group.comm;
    if (g.size() < 2) continue;
    const bool one_host = -g.all_reduce_scalar(-host, ReduceOp::max) ==
                          g.all_reduce_scalar(host, ReduceOp::max);
    for (size_t i = 0; i < timed_group.paths.size(); ++i) {
      for (Collective op : kCollectives) {
        // Point to point has one call (isend/irecv), timed once per group.
        if (op == Collective::p2p && i > 0) continue;
        const CommPath path = op == Collective::p2p ? CommPath::blocking : timed_group.paths[i];
        time_sizes(o, backend, g, all, op, path, [&](CommBenchRow row) {
          row.group = timed_group.name;
          row.one_host = one_host;
          rows.push_back(std::move(row));
        });
      }
    }
  }
  return rows;
}

std::string describe(const std::vector<CommBenchRow>& rows, const CommBenchOptions& o,
                     int world_size, const std::string& device) {
  std::string out = fmt::format(
      "bench comm: {} ranks, tp {} x pp {} x dp {}, {}; bus bandwidth as nccl-tests defines it "
      "(all_reduce x 2(n-1)/n, reduce_scatter and all_gather x (n-1)/n, p2p x 1)\n",
      world_size, o.tp, o.pp, world_size / (o.tp * o.pp), device);
  nlohmann::json all = nlohmann::json::array();
  std::string shown;
  for (const CommBenchRow& r : rows) {
    const std::string key = r.group + " " + cost_name(r.op, r.path);
    if (key != shown) {
      out += fmt::format("{} ({} ranks{}) {}\n{:>12} {:>8} {:>12} {:>12} {:>12}\n", r.group,
                         r.ranks, r.one_host ? ", one host" : ", across hosts",
                         r.path == CommPath::bucketed
                             ? fmt::format("{} (the gradient buckets' non-blocking call)", to_string(r.op))
                             : std::string(to_string(r.op)),
                         "bytes", "iters", "time us", "algbw GB/s",
                         "busbw GB/s");
      shown = key;
    }
    out += fmt::format("{:>12} {:>8} {:>12.2f} {:>12.3f} {:>12.3f}\n", r.bytes, r.iters,
                       1e6 * r.seconds, r.algbw / 1e9, r.busbw / 1e9);
    all.push_back({{"group", r.group}, {"op", to_string(r.op)}, {"ranks", r.ranks},
                   {"bytes", r.bytes}, {"iters", r.iters}, {"seconds", r.seconds},
                   {"algbw", r.algbw}, {"busbw", r.busbw}, {"one_host", r.one_host},
                   {"path", r.path == CommPath::bucketed ? "bucketed" : "blocking"}});
  }
  out += nlohmann::json{{"world", world_size}, {"tp", o.tp}, {"pp", o.pp}, {"device", device},
                        {"rows", all}}
             .dump();
  return out;
}

}  // namespace jumbo
