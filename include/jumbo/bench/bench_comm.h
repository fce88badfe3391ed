#pragma once
// `jumbo bench comm`: the collectives jumbo runs, timed over the tp, dp and pp groups of a
// layout and over the world (with `levels`, also the ranks of a host and one rank per host),
// at sizes from bytes to a GiB, with the algorithm and bus bandwidth nccl-tests reports
// (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md): algbw = S / t for a collective of S
// bytes (all-gather: the gathered output; reduce-scatter: the input), busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and
// reduce-scatter, x 1 for point-to-point (each rank sends S to the next of its group's ring
// and receives S from the one before, as nccl-tests' sendrecv). MPI on the CPU backend, NCCL
// on the CUDA one: the same Comm calls training makes. A benchmark, not a test.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/machine.h"

namespace jumbo {

// The collectives and their bus bandwidth factors: config/machine.h (Collective,
// bus_bandwidth_factor), which the planner's time model reads too.

struct CommBenchOptions {
  int64_t tp = 1, pp = 1;  // the layout whose groups are timed; dp = world / (tp x pp)
  int64_t min_bytes = 8, max_bytes = int64_t{1} << 30;  // doubling from min to max
  int64_t iters = 20, warmup = 5;  // per size, as nccl-tests' defaults
  // A size stops repeating once its iterations took this long (its first timed run decides,
  // on every rank alike): large sizes over slow links still end in reasonable time.
  double seconds_per_size = 1.0;
  // Also the ranks of each host and one rank per host, each with the blocking and the
  // buckets' calls: both levels of a machine description for every collective, whatever
  // the layout's groups (--write-machine).
  bool levels = false;
};

struct CommBenchRow {
  std::string group;  // "tp", "dp", "pp", "world"; with levels "host", "across"
  Collective op = Collective::all_reduce;
  int ranks = 0;
  int64_t bytes = 0;      // S
  int64_t iters = 0;
  double seconds = 0;     // per operation: the slowest rank's mean
  double algbw = 0, busbw = 0;  // bytes per second
  bool one_host = false;  // every rank of the group on one host (the machine's intra level)
  // dp: the non-blocking calls the gradient and weight buckets make (bucketed); the other
  // groups: the blocking calls of the tp regions and pipeline sends.
  CommPath path = CommPath::blocking;
};

// This host's name hashed to 52 bits (a double the scalar collectives carry exactly): ranks
// with equal ids share a host.
double host_id();
// Collective over `world` (the communicator the backend's tensors go through: MPI, or NCCL
// on a GPU). Groups of one rank are skipped. Throws UserError naming --tp / --pp when the
// world is not a multiple of tp x pp, or the sizes are out of order.
std::vector<CommBenchRow> bench_comm(const CommBenchOptions& opts, Backend& backend,
                                     std::shared_ptr<Comm> world);
// A table per (group, op), then one JSON line of every row.
std::string describe(const std::vector<CommBenchRow>& rows, const CommBenchOptions& opts,
                     int world_size, const std::string& device);

}  // namespace jumbo
