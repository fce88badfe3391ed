// Idealised pipeline timeline: every rank runs its op list in order against the data
// dependencies between virtual stages; measures the bubble and detects deadlocks.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "jumbo/parallel/pipeline_schedule.h"

namespace jumbo {
namespace {

constexpr double not_done = -1.0;

std::string describe(const PipeOp& op) {
  return std::string(op.kind == PipeOp::forward ? "forward" : "backward") + " of microbatch " +
         std::to_string(op.microbatch) + " chunk " + std::to_string(op.chunk);
}

// End times of every (virtual stage, microbatch) forward and backward seen so far.
class Finished {
 public:
  Finished(int virtual_stage_count, int microbatches)
      : microbatches_(microbatches),
        forward_(static_cast<size_t>(virtual_stage_count) * microbatches, not_done),
        backward_(forward_.size(), not_done) {}
  double& at(PipeOp::Kind kind, int s, int k) {
    auto& table = kind == PipeOp::forward ? forward_ : backward_;
    return table[static_cast<size_t>(s) * microbatches_ + k];
  }

 private:
  int microbatches_;
  std::vector<double> forward_, backward_;
};

}  // namespace

Timeline simulate_pipeline(const std::vector<std::vector<PipeOp>>& ops, int virtual_stages,
                           double t_forward, double t_backward) {
  const int stages = static_cast<int>(ops.size());
  if (stages < 1 || virtual_stages < 1)
    throw std::invalid_argument("simulate_pipeline: need >= 1 rank and >= 1 virtual stage");
  const int last = stages * virtual_stages - 1;
  int microbatches = 0;
  for (const auto& rank_ops : ops)
    for (const PipeOp& op : rank_ops) {
      if (op.microbatch < 0 || op.chunk < 0 || op.chunk >= virtual_stages)
        throw std::invalid_argument("simulate_pipeline: op out of range: " + describe(op));
      microbatches = std::max(microbatches, op.microbatch + 1);
    }

  Timeline tl;
  tl.stages = stages;
  tl.microbatches = microbatches;
  tl.virtual_stages = virtual_stages;
  tl.t_forward = t_forward;
  tl.t_backward = t_backward;
  tl.busy.resize(stages);

  Finished finished(last + 1, microbatches);
  std::vector<size_t> next(stages, 0);  // index of each rank's next op
  std::vector<double> free_at(stages, 0.0);
  // Ends of the ops an op waits for; not_done if one has not run yet.
  auto ready_time = [&](int rank, const PipeOp& op) {
    const int s = virtual_stage(rank, op.chunk, stages);
    double ready = free_at[rank];
    auto after = [&](PipeOp::Kind kind, int stage) {
      const double end = finished.at(kind, stage, op.microbatch);
      ready = end == not_done || ready == not_done ? not_done : std::max(ready, end);
    };
    if (op.kind == PipeOp::forward) {
      if (s > 0) after(PipeOp::forward, s - 1);
    } else {
      after(PipeOp::forward, s);
      if (s < last) after(PipeOp::backward, s + 1);
    }
    return ready;
  };

  // Each pass runs every op that can start; a pass that runs nothing while ops remain is a
  // dependency cycle. The start times do not depend on the pass order: an op starts at the
  // latest end among its rank's previous op and its inputs.
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int r = 0; r < stages; ++r) {
      while (next[r] < ops[r].size()) {
        const PipeOp& op = ops[r][next[r]];
        const double start = ready_time(r, op);
        if (start == not_done) break;
        double& end = finished.at(op.kind, virtual_stage(r, op.chunk, stages), op.microbatch);
        if (end != not_done)
          throw std::invalid_argument("simulate_pipeline: rank " + std::to_string(r) +
                                      " runs the " + describe(op) + " twice");
        end = start + (op.kind == PipeOp::forward ? t_forward : t_backward) / virtual_stages;
        tl.busy[r].push_back({op, start, end});
        free_at[r] = end;
        ++next[r];
        progressed = true;
      }
    }
  }

  std::string stuck;
  for (int r = 0; r < stages; ++r)
    if (next[r] < ops[r].size())
      stuck += (stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
               " waits to run the " + describe(ops[r][next[r]]);
  if (!stuck.empty()) throw std::logic_error("pipeline deadlock: " + stuck);

  double busy_time = 0;
  for (int r = 0; r < stages; ++r) {
    tl.makespan = std::max(tl.makespan, free_at[r]);
    for (const PipeInterval& iv : tl.busy[r]) busy_time += iv.end - iv.start;
  }
  tl.bubble_fraction = tl.makespan > 0 ? 1.0 - busy_time / (stages * tl.makespan) : 0.0;
  return tl;
}

Timeline simulate_pipeline(int stages, int microbatches, int virtual_stages, double t_forward,
                           double t_backward) {
  std::vector<std::vector<PipeOp>> ops;
  for (int r = 0; r < stages; ++r)
    ops.push_back(pipeline_schedule(stages, r, microbatches, virtual_stages));
  return simulate_pipeline(ops, virtual_stages, t_forward, t_backward);
}

std::string render_timeline(const Timeline& tl, int columns) {
  if (columns < 1) throw std::invalid_argument("render_timeline: columns must be >= 1");
  const std::string prefix_width = std::to_string(std::max(tl.stages - 1, 0));
  std::string out;
  for (int r = 0; r < tl.stages; ++r) {
    std::string cells(columns, '.');
    const double scale = tl.makespan > 0 ? columns / tl.makespan : 0.0;
    for (const PipeInterval& iv : tl.busy[r]) {
      // Rounded cell boundaries: adjacent ops share a boundary, so none overlap.
      const int begin = std::clamp(static_cast<int>(std::lround(iv.start * scale)), 0, columns);
      const int end = std::clamp(static_cast<int>(std::lround(iv.end * scale)), begin, columns);
      const bool fwd = iv.op.kind == PipeOp::forward;
      std::string label(1, fwd ? 'F' : 'B');
      if (tl.virtual_stages == 2 && iv.op.chunk == 1) label[0] = fwd ? 'f' : 'b';
      label += std::to_string(iv.op.microbatch);
      if (tl.virtual_stages > 2) label.append(".").append(std::to_string(iv.op.chunk));
      for (int c = begin; c < end; ++c)
        cells[c] = c - begin < static_cast<int>(label.size()) ? label[c - begin] : '-';
    }
    const std::string name = std::to_string(r);
    out.append("rank ").append(prefix_width.size() - name.size(), ' ').append(name);
    out.append(" |").append(cells).append("\n");
  }
  return out;
}

}  // namespace jumbo
