#pragma once
// Comm: one process group's collectives and point-to-point. MpiComm works on host memory;
// NcclComm (CUDA builds) on device memory. comm/ knows nothing of models.
//
// Byte accounting: every call adds the payload this rank hands to the operation (the
// tensor's bytes; for reduce_scatter the input, for all_gather the local part, for send the
// message) to bytes_sent(); a group of one sends nothing. It counts what the algorithm asks of the network, not the wire
// bytes of a particular MPI algorithm (a ring all-reduce moves 2(n-1)/n of it per rank).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "jumbo/backend/stream.h"
#include "jumbo/backend/tensor.h"

namespace jumbo {

enum class ReduceOp { sum, max };

// Handle of a non-blocking operation; wait() on the Comm that issued it.
struct CommRequest {
  int slot = -1;
  bool pending() const { return slot >= 0; }
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "tp", "dp", ... for messages

  // In place; f32, bf16 (summed in fp32 per element) or i32.
  virtual void all_reduce(Tensor t, ReduceOp op) = 0;
  virtual CommRequest iall_reduce(Tensor t, ReduceOp op) = 0;
  // Several tensors of one dtype reduced as one operation (PyTorch's all_reduce_coalesced):
  // one message instead of one per tensor. Each tensor's result is what all_reduce gives it.
  virtual void all_reduce_coalesced(std::span<const Tensor> ts, ReduceOp op) = 0;
  // in holds size() equal blocks; out (one block) receives this rank's block of the sum.
  // in's contents are undefined after (MPI reduces in place through its rings).
  virtual void reduce_scatter(Tensor in, Tensor out) = 0;
  // The same, non-blocking and in place: pass out = in's block of this rank (NCCL's and the
  // MPI ring's in-place form; no temporary of `in`). in's other blocks are undefined after.
  virtual CommRequest ireduce_scatter(Tensor in, Tensor out) = 0;
  // out (size() blocks) receives every rank's `in` in rank order.
  virtual void all_gather(Tensor in, Tensor out) = 0;
  // The same, non-blocking; in place when `in` is out's block of this rank.
  virtual CommRequest iall_gather(Tensor in, Tensor out) = 0;
  virtual void broadcast(Tensor t, int root) = 0;
  virtual CommRequest isend(Tensor t, int peer, int tag) = 0;
  virtual CommRequest irecv(Tensor t, int peer, int tag) = 0;
  virtual void wait(CommRequest& r) = 0;
  // Brackets point-to-point operations that must start together (a pipeline stage's send to
  // the next stage and receive from it): NCCL fuses them so two ranks sending to each other
  // cannot deadlock. MPI's non-blocking operations need nothing.
  virtual void group_start() {}
  virtual void group_end() {}
  virtual void barrier() = 0;
  virtual double all_reduce_scalar(double value, ReduceOp op) = 0;
  // Small control messages (checkpoint manifests), not tensors: `root` receives every rank's
  // bytes in rank order (others get an empty vector); broadcast_bytes replaces `bytes` on
  // every rank with root's.
  virtual std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int root) = 0;
  virtual void broadcast_bytes(std::vector<char>& bytes, int root) = 0;

  // A sub-group of the ranks passing the same color, ordered by key; nullptr for color < 0.
  virtual std::shared_ptr<Comm> split(int color, int key, const std::string& name) = 0;

  uint64_t bytes_sent() const { return bytes_sent_; }
  void reset_bytes() { bytes_sent_ = 0; }

 protected:
  uint64_t bytes_sent_ = 0;
};

// MpiComm runs its non-blocking collectives (the data-parallel buckets) and its blocking
// reduce-scatter (sequence parallelism's) as in-place rings with one staging piece of this
// many bytes per communicator that uses them (touched as far as its largest message).
inline constexpr int64_t kMpiRingStagingBytes = int64_t{4} << 20;

// A process started by a launcher (mpirun, srun, any PMI/PMIx launcher: their environment
// variables say so) runs MPI; one started alone does not start MPI at all and its world is a
// one-rank communicator. JUMBO_MPI=1 forces MPI (a singleton), JUMBO_MPI=0 forbids it.
bool started_by_launcher();
std::shared_ptr<Comm> make_solo_comm(const std::string& name);
// The world communicator of this process; MPI_Init_thread(MPI_THREAD_MULTIPLE) on first use
// when started by a launcher, else the one-rank world.
std::shared_ptr<Comm> mpi_world();
// Starts MPI (idempotent); returns the world size.
int mpi_init(int* argc, char*** argv);
void mpi_finalize();
// NCCL communicator of the same group as `bootstrap` (an MPI communicator): tensor
// collectives and point-to-point on device memory, ordered against `stream` (the CUDA
// backend's; any other is a logic error); scalars, bytes, barrier and split go through
// `bootstrap`. The NCCL unique id is created by rank 0 and broadcast over `bootstrap`.
// Without -DJUMBO_CUDA=ON it throws UserError.
std::shared_ptr<Comm> make_nccl_comm(std::shared_ptr<Comm> bootstrap, Stream& stream);
bool nccl_built();
// comm.emulate = nccl: a communicator of the same group as `bootstrap` (an MPI communicator;
// collective over its ranks) held to NCCL's rules where NCCL is stricter than MPI: a send
// completes only once its receive is posted, tags are ignored (point-to-point between two
// ranks matches in posting order), a group's operations are posted together at group_end and
// complete together, and one communicator's operations run in issue order (one stream).
// Host operations (scalars, bytes, barrier, split) go through `bootstrap`, as NcclComm's do;
// its splits are emulated too. src/comm/nccl_rules_comm.cpp.
std::shared_ptr<Comm> make_nccl_rules_comm(std::shared_ptr<Comm> bootstrap);

// What `jumbo doctor` reports of the MPI library: "Open MPI v4.1.4", thread support, host.
struct MpiInfo {
  bool started = false;  // MPI initialised (a launcher started this process)
  std::string library;
  bool thread_multiple = false;
  std::string processor;  // MPI_Get_processor_name: the node
};
MpiInfo mpi_info();
// Ends every rank of the job with this exit code (a rank failed; others must not hang).
[[noreturn]] void mpi_abort(int code);

}  // namespace jumbo
