// NcclRulesComm (comm.emulate = nccl): MPI on CPU ranks held to NCCL's rules wherever NCCL is
// stricter, so the CPU suite finds the GPU path's deadlocks. It has NcclComm's shape: host
// operations (scalars, bytes, barrier, split) go to the MPI `bootstrap_`; tensor operations go
// to `device_`, a duplicate of it with NCCL's point-to-point rules (synchronous sends, tags
// ignored, equal counts: mpi_comm.h), in issue order, as on one CUDA stream:
// - non-blocking collectives and point-to-point groups are queued on one worker thread (the
//   communicator's "stream"), which runs them one after another: a group's operations are
//   posted together and the group completes only when all of them have; a later operation
//   cannot start before an earlier one ends. wait() blocks until the operation completed
//   (on a GPU the compute stream waits; here the host is the compute stream);
// - blocking collectives first wait for everything queued before them, then run on the
//   calling thread (the result is needed at once, as a later kernel would need it).
// A program that would deadlock under NCCL deadlocks here, and the watchdog ends it naming
// the operation and the group. The queue and the request slots are fixed: nothing allocates
// per step; groups of one rank run on the calling thread and never start a worker.
#include <fmt/format.h>

#include <array>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "jumbo/comm/comm.h"
#include "jumbo/comm/watchdog.h"
#include "mpi_comm.h"

namespace jumbo {
namespace {

class NcclRulesComm final : public Comm {
 public:
  static constexpr int kMaxInFlight = 1024;  // requests
  static constexpr int kMaxQueued = 256;     // operations on the stream not yet run
  static constexpr int kMaxGroupOps = 4;     // a pipeline exchange posts at most 4

  explicit NcclRulesComm(std::shared_ptr<Comm> bootstrap)
      : bootstrap_(std::move(bootstrap)),
        device_(duplicate_with_nccl_p2p(*bootstrap_)),
        rank_(bootstrap_->rank()),
        size_(bootstrap_->size()) {
    queue_.resize(kMaxQueued);
    done_.assign(kMaxInFlight, 1);
    label_.assign(kMaxInFlight, nullptr);
    free_.reserve(kMaxInFlight);
    for (int s = kMaxInFlight - 1; s >= 0; --s) free_.push_back(s);
  }
  ~NcclRulesComm() override {
    if (!worker_.joinable()) return;
    {
      std::unique_lock lock(mu_);
      if (queued_ > 0 || busy_) {  // a stream that never drains is the watchdog's to end
        const BlockingOp watch("the stream's last operations", name());
        cv_.wait(lock, [&] { return queued_ == 0 && !busy_; });
      }
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return bootstrap_->name(); }

  void all_reduce(Tensor t, ReduceOp op) override {
    count(t);
    after_queue("all_reduce");
    device_->all_reduce(t, op);
  }
  void all_reduce_coalesced(std::span<const Tensor> ts, ReduceOp op) override {
    for (const Tensor& t : ts) count(t);
    after_queue("all_reduce (coalesced)");
    device_->all_reduce_coalesced(ts, op);
  }
  void reduce_scatter(Tensor in, Tensor out) override {
    count(in);
    after_queue("reduce_scatter");
    device_->reduce_scatter(in, out);
  }
  void all_gather(Tensor in, Tensor out) override {
    count(in);
    after_queue("all_gather");
    device_->all_gather(in, out);
  }
  void broadcast(Tensor t, int root) override {
    if (rank_ == root && size_ > 1) bytes_sent_ += t.bytes();
    after_queue("broadcast");
    device_->broadcast(t, root);
  }
  CommRequest iall_reduce(Tensor t, ReduceOp op) override {
    count(t);
    return enqueue(collective(Kind::all_reduce, t, t, op));
  }
  CommRequest ireduce_scatter(Tensor in, Tensor out) override {
    count(in);
    return enqueue(collective(Kind::reduce_scatter, in, out, ReduceOp::sum));
  }
  CommRequest iall_gather(Tensor in, Tensor out) override {
    count(in);
    return enqueue(collective(Kind::all_gather, in, out, ReduceOp::sum));
  }
  CommRequest isend(Tensor t, int peer, int) override {
    count(t);
    return add_p2p({.send = true, .t = t, .peer = peer});
  }
  CommRequest irecv(Tensor t, int peer, int) override {
    return add_p2p({.send = false, .t = t, .peer = peer});
  }
  void group_start() override {
    if (in_group_) throw std::logic_error(name() + ": group_start inside a group");
    in_group_ = true;
    group_ = Work{};
  }
  // The group's operations are posted together, on the stream.
  void group_end() override {
    if (!in_group_) throw std::logic_error(name() + ": group_end without group_start");
    in_group_ = false;
    if (group_.p2p_count > 0) push(group_);
  }
  void wait(CommRequest& req) override {
    if (!req.pending()) return;
    const int slot = req.slot;
    req.slot = -1;
    std::unique_lock lock(mu_);
    if (!done_[static_cast<size_t>(slot)]) {
      const BlockingOp watch(label_[static_cast<size_t>(slot)], name());
      cv_.wait(lock, [&] { return done_[static_cast<size_t>(slot)] != 0; });
    }
    free_.push_back(slot);
    rethrow_failure();
  }
  // Every queued operation has completed and every rank got here (NcclComm drains its streams).
  void barrier() override {
    after_queue("barrier (queued operations)");
    bootstrap_->barrier();
  }
  double all_reduce_scalar(double value, ReduceOp op) override {
    return host_op([&] { return bootstrap_->all_reduce_scalar(value, op); });
  }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int root) override {
    return host_op([&] { return bootstrap_->gather_bytes(mine, root); });
  }
  void broadcast_bytes(std::vector<char>& bytes, int root) override {
    host_op([&] {
      bootstrap_->broadcast_bytes(bytes, root);
      return 0;
    });
  }
  std::shared_ptr<Comm> split(int color, int key, const std::string& name) override {
    std::shared_ptr<Comm> sub = bootstrap_->split(color, key, name);
    if (!sub) return nullptr;
    return std::make_shared<NcclRulesComm>(std::move(sub));
  }

 private:
  enum class Kind { all_reduce, reduce_scatter, all_gather, p2p_group };
  struct P2p {
    bool send = false;
    Tensor t;
    int peer = -1;
  };
  struct Work {
    Kind kind = Kind::p2p_group;
    Tensor a, b;
    ReduceOp op = ReduceOp::sum;
    int slot = -1;  // the collective's request; a group's are its operations' own
    std::array<P2p, kMaxGroupOps> p2p{};
    std::array<int, kMaxGroupOps> p2p_slot{};
    int p2p_count = 0;
  };

  static Work collective(Kind kind, Tensor a, Tensor b, ReduceOp op) {
    Work w;
    w.kind = kind;
    w.a = a;
    w.b = b;
    w.op = op;
    return w;
  }
  CommRequest add_p2p(const P2p& op) {
    if (size_ == 1) throw std::logic_error(name() + ": point-to-point in a group of one rank");
    if (!in_group_) {  // an operation outside a group is a group of its own (as in NCCL)
      Work one{};
      const CommRequest r = add_to(one, op);
      push(one);
      return r;
    }
    return add_to(group_, op);
  }
  CommRequest add_to(Work& group, const P2p& op) {
    if (group.p2p_count == kMaxGroupOps) {
      throw std::logic_error(fmt::format("{}: more than {} operations in one group", name(),
                                         kMaxGroupOps));
    }
    const int slot = take_slot(op.send ? "wait for a send of a point-to-point group"
                                       : "wait for a receive of a point-to-point group");
    group.p2p[static_cast<size_t>(group.p2p_count)] = op;
    group.p2p_slot[static_cast<size_t>(group.p2p_count++)] = slot;
    return {slot};
  }
  CommRequest enqueue(Work w) {
    if (in_group_) {
      throw std::logic_error(name() + ": a collective inside a point-to-point group");
    }
    // Nothing to order against in a group of one: device_ does the local copy, if any, at once
    // (MpiComm returns no pending request there).
    if (size_ == 1) return start_on(*device_, w);
    w.slot = take_slot("wait for a non-blocking collective");
    push(w);
    return {w.slot};
  }
  int take_slot(const char* label) {
    std::unique_lock lock(mu_);
    if (free_.empty()) {
      throw std::logic_error(fmt::format("{}: more than {} operations in flight", name(),
                                         kMaxInFlight));
    }
    const int slot = free_.back();
    free_.pop_back();
    done_[static_cast<size_t>(slot)] = 0;
    label_[static_cast<size_t>(slot)] = label;
    return slot;
  }
  void push(const Work& w) {
    std::unique_lock lock(mu_);
    if (queued_ == kMaxQueued) {
      throw std::logic_error(fmt::format("{}: more than {} operations queued", name(), kMaxQueued));
    }
    queue_[static_cast<size_t>((head_ + queued_) % kMaxQueued)] = w;
    ++queued_;
    if (!worker_.joinable()) worker_ = std::thread([this] { run_stream(); });
    cv_.notify_all();
  }
  // A blocking operation: everything queued before it completes first.
  void after_queue(const char* op) {
    if (in_group_) throw std::logic_error(name() + ": a collective inside a point-to-point group");
    std::unique_lock lock(mu_);
    if (queued_ > 0 || busy_) {
      const BlockingOp watch(op, name());
      cv_.wait(lock, [&] { return queued_ == 0 && !busy_; });
    }
    rethrow_failure();
  }
  // Host operations run on the MPI bootstrap at once (NcclComm's do not wait for the GPU);
  // their bytes count as this group's.
  template <class F>
  auto host_op(F&& f) -> decltype(f()) {
    const uint64_t before = bootstrap_->bytes_sent();
    auto result = f();
    bytes_sent_ += bootstrap_->bytes_sent() - before;
    return result;
  }
  void rethrow_failure() {
    if (failure_) std::rethrow_exception(failure_);
  }

  // The stream: one operation at a time, in issue order.
  void run_stream() {
    mark_thread_as_comm_worker();
    for (;;) {
      Work w;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || queued_ > 0; });
        if (queued_ == 0) return;
        w = queue_[static_cast<size_t>(head_)];
        head_ = (head_ + 1) % kMaxQueued;
        --queued_;
        busy_ = true;
      }
      if (!failure_) {
        try {
          run(w);
        } catch (...) {  // the host rethrows it at its next wait
          std::unique_lock lock(mu_);
          failure_ = std::current_exception();
        }
      }
      {
        std::unique_lock lock(mu_);
        if (w.kind == Kind::p2p_group) {
          for (int i = 0; i < w.p2p_count; ++i) done_[static_cast<size_t>(w.p2p_slot[i])] = 1;
        } else {
          done_[static_cast<size_t>(w.slot)] = 1;
        }
        busy_ = false;
      }
      cv_.notify_all();
    }
  }
  // Runs `w` on device_ to completion: a group's operations all posted, then all waited.
  void run(const Work& w) {
    if (w.kind != Kind::p2p_group) {
      CommRequest r = start_on(*device_, w);
      device_->wait(r);
      return;
    }
    std::array<CommRequest, kMaxGroupOps> posted{};
    for (int i = 0; i < w.p2p_count; ++i) {
      const P2p& op = w.p2p[static_cast<size_t>(i)];
      posted[static_cast<size_t>(i)] =
          op.send ? device_->isend(op.t, op.peer, 0) : device_->irecv(op.t, op.peer, 0);
    }
    for (int i = 0; i < w.p2p_count; ++i) device_->wait(posted[static_cast<size_t>(i)]);
  }
  // The same calls MPI mode makes, so both modes compute the same bits.
  static CommRequest start_on(Comm& c, const Work& w) {
    switch (w.kind) {
      case Kind::all_reduce: return c.iall_reduce(w.a, w.op);
      case Kind::reduce_scatter: return c.ireduce_scatter(w.a, w.b);
      case Kind::all_gather: return c.iall_gather(w.a, w.b);
      case Kind::p2p_group: break;
    }
    throw std::logic_error("NcclRulesComm: a group is not a collective");
  }
  void count(const Tensor& t) {
    if (size_ > 1) bytes_sent_ += t.bytes();
  }

  std::shared_ptr<Comm> bootstrap_;  // host operations, MPI's rules
  std::shared_ptr<Comm> device_;     // tensor operations, NCCL's rules
  int rank_ = 0, size_ = 1;
  bool in_group_ = false;
  Work group_;  // the group being built between group_start and group_end
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Work> queue_;  // ring of kMaxQueued
  int head_ = 0, queued_ = 0;
  bool busy_ = false, stop_ = false;
  std::vector<char> done_;           // by request slot
  std::vector<const char*> label_;   // by request slot: what a wait on it waits for
  std::vector<int> free_;
  std::exception_ptr failure_;
  std::thread worker_;
};

}  // namespace

std::shared_ptr<Comm> make_nccl_rules_comm(std::shared_ptr<Comm> bootstrap) {
  return std::make_shared<NcclRulesComm>(std::move(bootstrap));
}

}  // namespace jumbo
