// Idealised pipeline timeline: every rank runs its op list in order against the data
// dependencies between virtual stages and the transfers between ranks, event by event;
// measures the bubble and the exposed transfers, and detects deadlocks.
#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <stdexcept>
#include <string>
#include <tuple>

#include "jumbo/parallel/pipeline_schedule.h"

namespace jumbo {
namespace {

constexpr double not_done = -1.0;

std::string describe(const PipeOp& op) {
  return std::string(op.kind == PipeOp::forward ? "forward" : "backward") + " of microbatch " +
         std::to_string(op.microbatch) + " chunk " + std::to_string(op.chunk);
}

// The step as a discrete-event simulation. A rank is running an op or waiting between two
// (inside the communication library); a message is the input of one (kind, virtual stage,
// microbatch) op coming from another rank.
class PipelineSimulation {
 public:
  PipelineSimulation(const std::vector<std::vector<PipeOp>>& ops, int virtual_stages,
                     int microbatches, double t_forward, double t_backward, PipeTransfer transfer)
      : ops_(ops),
        stages_(static_cast<int>(ops.size())),
        v_(virtual_stages),
        microbatches_(microbatches),
        t_forward_(t_forward),
        t_backward_(t_backward),
        transfer_(transfer),
        next_(ops.size(), 0),
        running_(ops.size(), false),
        unstarted_sends_(ops.size()),
        finished_(2 * static_cast<size_t>(stages_ * v_) * microbatches, not_done),
        messages_(finished_.size()) {}

  Timeline run() {
    Timeline tl;
    tl.stages = stages_;
    tl.microbatches = microbatches_;
    tl.virtual_stages = v_;
    tl.t_forward = t_forward_;
    tl.t_backward = t_backward_;
    tl.busy.resize(stages_);
    busy_ = &tl.busy;
    for (int r = 0; r < stages_; ++r) post_receive(r, 0.0);
    for (int r = 0; r < stages_; ++r) try_run(r, 0.0);
    touched_.clear();  // nothing is sent yet
    // All events of one instant at once: the ops ending (their sends issued, their ranks'
    // next receives posted), then the ops that can start, then the transfers that can.
    std::vector<int> woken;
    while (!events_.empty()) {
      const double now = std::get<0>(events_.top());
      woken.clear();
      touched_.clear();
      while (!events_.empty() && std::get<0>(events_.top()) == now) {
        const auto [time, is_arrival, who] = events_.top();
        events_.pop();
        if (is_arrival) {
          woken.push_back(messages_[static_cast<size_t>(who)].receiver);
        } else {
          end_op(who, now);
          woken.push_back(who);
        }
      }
      for (int r : woken) try_run(r, now);
      for (int r : touched_) start_transfers(r, now);
    }
    std::string stuck;
    for (int r = 0; r < stages_; ++r)
      if (next_[r] < ops_[r].size())
        stuck += (stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                 " waits to run the " + describe(ops_[r][next_[r]]);
    if (!stuck.empty()) throw std::logic_error("pipeline deadlock: " + stuck);

    double busy_time = 0;
    for (int r = 0; r < stages_; ++r)
      for (const PipeInterval& iv : tl.busy[r]) {
        busy_time += iv.end - iv.start;
        tl.makespan = std::max(tl.makespan, iv.end);
      }
    tl.bubble_fraction = tl.makespan > 0 ? 1.0 - busy_time / (stages_ * tl.makespan) : 0.0;
    return tl;
  }

 private:
  struct Message {
    double sent = not_done, posted = not_done, arrives = not_done;
    int receiver = -1;
  };

  size_t index(PipeOp::Kind kind, int virtual_stage, int microbatch) const {
    return (static_cast<size_t>(kind) * stages_ * v_ + virtual_stage) * microbatches_ + microbatch;
  }
  int last() const { return stages_ * v_ - 1; }
  // The op's input from another virtual stage: its predecessor's output or successor's
  // gradient; npos for virtual stage 0's forward and the last one's backward.
  size_t input_of(int rank, const PipeOp& op) const {
    const int s = virtual_stage(rank, op.chunk, stages_);
    if (op.kind == PipeOp::forward) return s > 0 ? index(op.kind, s, op.microbatch) : npos;
    return s < last() ? index(op.kind, s, op.microbatch) : npos;
  }

  // The receive for rank r's next op, posted once its previous op has ended.
  void post_receive(int r, double now) {
    if (next_[r] >= ops_[r].size()) return;
    const PipeOp& op = ops_[r][next_[r]];
    const size_t m = input_of(r, op);
    if (m == npos) return;
    const int s = virtual_stage(r, op.chunk, stages_);
    const int sender = owner_of(op.kind == PipeOp::forward ? s - 1 : s + 1, stages_);
    if (sender == r) return;  // one rank's chunks: no transfer
    Message& msg = messages_[m];
    msg.receiver = r;
    msg.posted = now;
    unstarted_sends_[sender].push_back(m);
    touched_.push_back(sender);
  }

  // Starts rank r's sends that have been issued and whose receives are posted; with
  // needs_sender_progress only while r waits between ops (a rank that ends an op and starts
  // the next at once never waits: the receiver's reply to its send finds it computing).
  void start_transfers(int r, double now) {
    if (transfer_.needs_sender_progress && running_[r]) return;
    std::erase_if(unstarted_sends_[r], [&](size_t m) {
      Message& msg = messages_[m];
      if (msg.arrives != not_done) return true;
      if (msg.sent == not_done || msg.posted == not_done) return false;
      msg.arrives = now + transfer_.seconds;
      events_.emplace(msg.arrives, true, static_cast<int>(m));
      return true;
    });
  }

  void try_run(int r, double now) {
    if (running_[r] || next_[r] >= ops_[r].size()) return;
    const PipeOp& op = ops_[r][next_[r]];
    const int s = virtual_stage(r, op.chunk, stages_);
    double& end = finished_[index(op.kind, s, op.microbatch)];
    if (end != not_done)
      throw std::invalid_argument("simulate_pipeline: rank " + std::to_string(r) + " runs the " +
                                  describe(op) + " twice");
    // A backward needs its own forward (on this rank) and the gradient from s + 1.
    if (op.kind == PipeOp::backward && finished_[index(PipeOp::forward, s, op.microbatch)] == not_done)
      return;
    const size_t m = input_of(r, op);
    if (m != npos) {
      const Message& msg = messages_[m];
      const int from = op.kind == PipeOp::forward ? s - 1 : s + 1;
      if (owner_of(from, stages_) == r) {  // the same rank: no transfer
        if (finished_[index(op.kind, from, op.microbatch)] == not_done) return;
      } else if (msg.arrives == not_done || msg.arrives > now) {
        return;
      }
    }
    running_[r] = true;
    const double t = (op.kind == PipeOp::forward ? t_forward_ : t_backward_) / v_;
    (*busy_)[r].push_back({op, now, now + t});
    events_.emplace(now + t, false, r);
  }

  void end_op(int r, double now) {
    const PipeOp& op = ops_[r][next_[r]];
    const int s = virtual_stage(r, op.chunk, stages_);
    finished_[index(op.kind, s, op.microbatch)] = now;
    running_[r] = false;
    touched_.push_back(r);  // between ops: its earlier sends may move now
    const int to = op.kind == PipeOp::forward ? s + 1 : s - 1;
    if (to >= 0 && to <= last() && owner_of(to, stages_) != r) {
      const size_t m = index(op.kind, to, op.microbatch);
      messages_[m].sent = now;
      unstarted_sends_[r].push_back(m);
    }
    ++next_[r];
    post_receive(r, now);
  }

  static constexpr size_t npos = static_cast<size_t>(-1);
  const std::vector<std::vector<PipeOp>>& ops_;
  const int stages_, v_, microbatches_;
  const double t_forward_, t_backward_;
  const PipeTransfer transfer_;
  std::vector<size_t> next_;  // index of each rank's next op
  std::vector<bool> running_;
  std::vector<std::vector<size_t>> unstarted_sends_;  // per sender
  std::vector<int> touched_;  // ranks with sends issued or receives posted this instant
  std::vector<double> finished_;                      // end of each (kind, stage, microbatch)
  std::vector<Message> messages_;                     // indexed like finished_
  std::vector<std::vector<PipeInterval>>* busy_ = nullptr;
  // (time, is an arrival, rank or message); earliest first.
  using Event = std::tuple<double, bool, int>;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
};

}  // namespace

Timeline simulate_pipeline(const std::vector<std::vector<PipeOp>>& ops, int virtual_stages,
                           double t_forward, double t_backward, PipeTransfer transfer) {
  const int stages = static_cast<int>(ops.size());
  if (stages < 1 || virtual_stages < 1)
    throw std::invalid_argument("simulate_pipeline: need >= 1 rank and >= 1 virtual stage");
  if (!(transfer.seconds >= 0))
    throw std::invalid_argument("simulate_pipeline: transfer seconds must be >= 0");
  int microbatches = 0;
  for (const auto& rank_ops : ops)
    for (const PipeOp& op : rank_ops) {
      if (op.microbatch < 0 || op.chunk < 0 || op.chunk >= virtual_stages)
        throw std::invalid_argument("simulate_pipeline: op out of range: " + describe(op));
      microbatches = std::max(microbatches, op.microbatch + 1);
    }
  return PipelineSimulation(ops, virtual_stages, microbatches, t_forward, t_backward, transfer).run();
}

Timeline simulate_pipeline(int stages, int microbatches, int virtual_stages, double t_forward,
                           double t_backward, PipeTransfer transfer) {
  std::vector<std::vector<PipeOp>> ops;
  for (int r = 0; r < stages; ++r)
    ops.push_back(pipeline_schedule(stages, r, microbatches, virtual_stages));
  return simulate_pipeline(ops, virtual_stages, t_forward, t_backward, transfer);
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
