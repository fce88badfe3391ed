// NcclComm: the Comm contract on device memory. Tensor collectives run on NCCL; everything the
// host needs an answer to (scalars, bytes, barrier, split) runs on the MPI communicator of the
// same group, which also carries the NCCL unique id.
//
// Ordering without host waits:
// - "blocking" collectives (all_reduce, reduce_scatter, all_gather, broadcast) are queued on
//   the compute stream: later kernels see their result, the host does not wait;
// - non-blocking ones (iall_reduce, ireduce_scatter, iall_gather) run on a communication stream that
//   first waits for the compute stream's work so far; wait() makes the compute stream wait
//   for them. The data-parallel reduce-scatter of each bucket thus overlaps the rest of
//   the backward;
// - sends and receives run on a point-to-point stream; between group_start() and group_end()
//   they are one NCCL group, so a rank that sends to a peer which sends back (1F1B) cannot
//   deadlock. Their completion events are recorded when the group is launched.
// Requests are fixed slots of pre-created events: the step loop allocates nothing.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <array>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "../backend/cuda/cuda_stream.h"
#include "jumbo/comm/comm.h"
#include "jumbo/comm/nccl_log.h"
#include "jumbo/comm/watchdog.h"

namespace jumbo {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
  }
  throw std::logic_error("NcclComm: unknown dtype");
}

void check_cuda(cudaError_t e, const char* what, const std::string& group) {
  if (e != cudaSuccess)
    throw std::runtime_error(fmt::format("{} on group {}: {}", what, group, cudaGetErrorString(e)));
}

class NcclComm final : public Comm {
 public:
  static constexpr int kMaxInFlight = 256;

  NcclComm(std::shared_ptr<Comm> bootstrap, cudaStream_t compute, std::string name)
      : bootstrap_(std::move(bootstrap)), compute_(compute), name_(std::move(name)) {
    rank_ = bootstrap_->rank();
    size_ = bootstrap_->size();
    ncclUniqueId id{};
    std::vector<char> bytes(sizeof id);
    if (rank_ == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      std::memcpy(bytes.data(), &id, sizeof id);
    }
    bootstrap_->broadcast_bytes(bytes, 0);
    std::memcpy(&id, bytes.data(), sizeof id);
    {
      const BlockingOp watch("ncclCommInitRank", name_);
      check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    }
    for (cudaStream_t* s : {&collective_stream_, &p2p_stream_})
      check_cuda(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), "cudaStreamCreate", name_);
    for (auto& e : events_)
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", name_);
    check_cuda(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming),
               "cudaEventCreate", name_);
    free_.reserve(kMaxInFlight);
    grouped_.reserve(kMaxInFlight);
    for (int i = kMaxInFlight - 1; i >= 0; --i) free_.push_back(i);
    // The host may be blocked waiting on the GPU when a peer fails: the watchdog asks NCCL.
    watch_id_ = add_async_error_check([comm = comm_, name = name_, rank = rank_, size = size_] {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async == ncclSuccess)
        return std::string();
      return fmt::format("NCCL on group {} (rank {} of {}) failed: {}; a peer died or the "
                         "network failed", name, rank, size, ncclGetErrorString(async));
    });
  }

  ~NcclComm() override {
    remove_async_error_check(watch_id_);
    if (comm_) ncclCommDestroy(comm_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cudaEventDestroy(compute_ready_);
    for (cudaStream_t s : {collective_stream_, p2p_stream_}) cudaStreamDestroy(s);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void all_reduce(Tensor t, ReduceOp op) override {
    count(t);
    if (size_ == 1) return;
    check(ncclAllReduce(t.data, t.data, t.numel(), nccl_type(t.dtype), nccl_op(op), comm_,
                        compute_),
          "ncclAllReduce");
  }
  // One NCCL group: NCCL fuses the reductions into one launch, with no staging copy.
  void all_reduce_coalesced(std::span<const Tensor> ts, ReduceOp op) override {
    for (const Tensor& t : ts) count(t);
    if (size_ == 1 || ts.empty()) return;
    check(ncclGroupStart(), "ncclGroupStart");
    for (const Tensor& t : ts) {
      check(ncclAllReduce(t.data, t.data, t.numel(), nccl_type(t.dtype), nccl_op(op), comm_,
                          compute_),
            "ncclAllReduce");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  }
  CommRequest iall_reduce(Tensor t, ReduceOp op) override {
    count(t);
    if (size_ == 1) return {};
    return on_stream(collective_stream_, [&](cudaStream_t s) {
      check(ncclAllReduce(t.data, t.data, t.numel(), nccl_type(t.dtype), nccl_op(op), comm_, s),
            "ncclAllReduce");
    });
  }
  void reduce_scatter(Tensor in, Tensor out) override {
    check_blocks(in, out, "reduce_scatter");
    count(in);
    if (size_ == 1) return copy_if_distinct(out, in, compute_);
    check(ncclReduceScatter(in.data, out.data, out.numel(), nccl_type(in.dtype), ncclSum, comm_,
                            compute_),
          "ncclReduceScatter");
  }
  CommRequest ireduce_scatter(Tensor in, Tensor out) override {
    check_blocks(in, out, "reduce_scatter");
    count(in);
    if (size_ == 1) {
      copy_if_distinct(out, in, compute_);
      return {};
    }
    return on_stream(collective_stream_, [&](cudaStream_t s) {
      check(ncclReduceScatter(in.data, out.data, out.numel(), nccl_type(in.dtype), ncclSum,
                              comm_, s),
            "ncclReduceScatter");
    });
  }
  // The weights' gather after the optimizer: on the communication stream, so the next
  // forward runs until it first needs a bucket (wait() on its request).
  CommRequest iall_gather(Tensor in, Tensor out) override {
    check_blocks(out, in, "all_gather");
    count(in);
    if (size_ == 1) {
      copy_if_distinct(out, in, compute_);
      return {};
    }
    return on_stream(collective_stream_, [&](cudaStream_t s) {
      check(ncclAllGather(in.data, out.data, in.numel(), nccl_type(in.dtype), comm_, s),
            "ncclAllGather");
    });
  }
  void all_gather(Tensor in, Tensor out) override {
    check_blocks(out, in, "all_gather");
    count(in);
    if (size_ == 1) return copy_if_distinct(out, in, compute_);
    check(ncclAllGather(in.data, out.data, in.numel(), nccl_type(in.dtype), comm_, compute_),
          "ncclAllGather");
  }
  void broadcast(Tensor t, int root) override {
    if (rank_ == root && size_ > 1) bytes_sent_ += t.bytes();
    if (size_ == 1) return;
    check(ncclBroadcast(t.data, t.data, t.numel(), nccl_type(t.dtype), root, comm_, compute_),
          "ncclBroadcast");
  }
  CommRequest isend(Tensor t, int peer, int tag) override {
    count(t);
    return on_stream(p2p_stream_, [&](cudaStream_t s) {
      check(ncclSend(t.data, t.numel(), nccl_type(t.dtype), peer, comm_, s), "ncclSend");
    });
  }
  CommRequest irecv(Tensor t, int peer, int tag) override {
    return on_stream(p2p_stream_, [&](cudaStream_t s) {
      check(ncclRecv(t.data, t.numel(), nccl_type(t.dtype), peer, comm_, s), "ncclRecv");
    });
  }
  void group_start() override {
    if (in_group_) throw std::logic_error(name_ + ": group_start inside a group");
    check(ncclGroupStart(), "ncclGroupStart");
    in_group_ = true;
  }
  void group_end() override {
    if (!in_group_) throw std::logic_error(name_ + ": group_end without group_start");
    in_group_ = false;
    check(ncclGroupEnd(), "ncclGroupEnd");
    // The operations are queued only now: record their completion events.
    for (int slot : grouped_)
      check_cuda(cudaEventRecord(events_[slot], p2p_stream_), "cudaEventRecord", name_);
    grouped_.clear();
  }
  // The compute stream waits for the operation; the host does not.
  void wait(CommRequest& req) override {
    if (!req.pending()) return;
    check_async_error();
    check_cuda(cudaStreamWaitEvent(compute_, events_[req.slot], 0), "cudaStreamWaitEvent", name_);
    free_.push_back(req.slot);
    req.slot = -1;
  }
  // Device work queued so far is finished and every rank got here: every stream this
  // communicator queues on (a send or a gather not yet waited for is on its own stream).
  void barrier() override {
    {
      const BlockingOp watch("barrier (device work)", name_);
      for (cudaStream_t s : {compute_, collective_stream_, p2p_stream_})
        check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize", name_);
    }
    check_async_error();
    bootstrap_->barrier();
  }
  double all_reduce_scalar(double value, ReduceOp op) override {
    check_async_error();
    return bootstrap_->all_reduce_scalar(value, op);
  }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int root) override {
    return bootstrap_->gather_bytes(mine, root);
  }
  void broadcast_bytes(std::vector<char>& bytes, int root) override {
    bootstrap_->broadcast_bytes(bytes, root);
  }
  std::shared_ptr<Comm> split(int color, int key, const std::string& name) override {
    std::shared_ptr<Comm> sub = bootstrap_->split(color, key, name);
    if (!sub) return nullptr;
    return std::make_shared<NcclComm>(std::move(sub), compute_, name);
  }

 private:
  template <class Launch>
  CommRequest on_stream(cudaStream_t stream, Launch&& launch) {
    if (free_.empty())
      throw std::logic_error(fmt::format("{}: more than {} operations in flight", name_,
                                         kMaxInFlight));
    const int slot = free_.back();
    free_.pop_back();
    // The operation reads what the compute stream has produced so far.
    check_cuda(cudaEventRecord(compute_ready_, compute_), "cudaEventRecord", name_);
    check_cuda(cudaStreamWaitEvent(stream, compute_ready_, 0), "cudaStreamWaitEvent", name_);
    launch(stream);
    if (in_group_) {
      grouped_.push_back(slot);  // launched, and recorded, at group_end()
    } else {
      check_cuda(cudaEventRecord(events_[slot], stream), "cudaEventRecord", name_);
    }
    return {slot};
  }
  static ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }
  void check(ncclResult_t r, const char* what) const {
    if (r == ncclSuccess) return;
    const char* last = ncclGetLastError(comm_);
    // NCCL's own lines (its WARNs included) go to the file capture_nccl_log arranged.
    const std::string& log = nccl_log_setup().path;
    throw std::runtime_error(fmt::format("{} on group {} (rank {} of {}): {}{}{}{}", what, name_,
                                         rank_, size_, ncclGetErrorString(r),
                                         last && *last ? ": " : "", last ? last : "",
                                         log.empty() ? "" : "; NCCL's log: " + log));
  }
  // A peer that failed (or a network error) shows up here, not as a hang of the next wait.
  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    if (comm_ && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess) {
      remove_async_error_check(watch_id_);
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw std::runtime_error(fmt::format("NCCL on group {} (rank {} of {}) failed: {}; a peer "
                                           "died or the network failed", name_, rank_, size_,
                                           ncclGetErrorString(async)));
    }
  }
  void count(const Tensor& t) {
    if (size_ > 1) bytes_sent_ += t.bytes();
  }
  void check_blocks(const Tensor& whole, const Tensor& block, const char* what) const {
    if (whole.numel() != block.numel() * size_ || whole.dtype != block.dtype)
      throw std::logic_error(fmt::format("{} on {}: {} is not {} blocks of {}", what, name_,
                                         whole.describe(), size_, block.describe()));
  }
  void copy_if_distinct(Tensor dst, Tensor src, cudaStream_t s) const {
    if (dst.data != src.data)
      check_cuda(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, s),
                 "cudaMemcpyAsync", name_);
  }

  std::shared_ptr<Comm> bootstrap_;
  cudaStream_t compute_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t collective_stream_ = nullptr, p2p_stream_ = nullptr;
  bool in_group_ = false;
  int watch_id_ = -1;
  std::vector<int> grouped_;
  cudaEvent_t compute_ready_ = nullptr;
  std::array<cudaEvent_t, kMaxInFlight> events_{};
  std::vector<int> free_;
};

}  // namespace

std::shared_ptr<Comm> make_nccl_comm(std::shared_ptr<Comm> bootstrap, Stream& stream) {
  const auto* cuda_stream = dynamic_cast<const cuda::CudaStream*>(&stream);
  if (!cuda_stream) {
    throw std::logic_error(fmt::format("make_nccl_comm({}): NCCL needs the CUDA backend's stream, "
                                       "got a {} one", bootstrap->name(), to_string(stream.device())));
  }
  // Before NCCL's first call in this process: it reads NCCL_DEBUG* once (src/debug.cc).
  capture_nccl_log(bootstrap->rank());
  const std::string name = bootstrap->name();
  return std::make_shared<NcclComm>(std::move(bootstrap), cuda_stream->handle(), name);
}

bool nccl_built() { return true; }

}  // namespace jumbo
