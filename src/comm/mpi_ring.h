#pragma once
// RingCollectives: the data-parallel collectives of MpiComm (non-blocking reduce-scatter,
// all-gather and all-reduce of gradient buckets and weights) as ring algorithms over
// point-to-point messages, run in order by one worker thread per communicator.
//
// Why not MPI_Ireduce_scatter_block and friends: Open MPI's non-blocking collectives (libnbc)
// allocate temporaries of the whole buffer (two for a reduce-scatter) for every call, which
// at the sizes of a stage's gradients is more memory than the ZeRO optimizer saves, and they
// progress only while the caller is inside MPI. The rings here work in place on the caller's
// buffer with one fixed staging piece, and the worker thread progresses them while the
// caller computes (the backward, the next forward).
//
// In place: the buffer holds size equal blocks; a reduce-scatter leaves the sum of block r
// in block r of rank r (its other blocks are partial sums afterwards); an all-gather fills
// every block from block r of rank r; an all-reduce is both. Every rank must submit the same
// operations in the same order (as for any MPI collective).
//
// Lifetime: the worker reads and writes the caller's buffer until wait() returns, and the peers'
// single-copy transport reads it from their side, so the buffer must outlive the operation on
// every path, errors included: wait() before it can be freed (GradSync's destructor drains its
// buckets and gathers), never unwind past it (docs/architecture.md, "One rule for errors that
// cross ranks"). The destructor still runs what is queued; it cannot know the buffers are gone.
#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "jumbo/backend/tensor.h"
#include "jumbo/comm/comm.h"

namespace jumbo {

enum class RingKind { reduce_scatter, all_gather, all_reduce };

class RingCollectives {
 public:
  static constexpr int kMaxInFlight = 1024;
  // Elements of one message: the staging piece holds this many f32.
  static constexpr int64_t kPieceElems = kMpiRingStagingBytes / 4;

  // `comm` is duplicated: the rings' messages never meet the caller's.
  RingCollectives(MPI_Comm comm, int rank, int size, const std::string& name);
  ~RingCollectives();
  RingCollectives(const RingCollectives&) = delete;
  RingCollectives& operator=(const RingCollectives&) = delete;

  // Queues the operation on `whole` (size blocks, f32 or bf16; all-gather any dtype);
  // returns its slot for wait().
  int submit(RingKind kind, Tensor whole);
  void wait(int slot);
  // Sums of the dtype the reduce-scatter accepts.
  static bool reducible(DType t) { return t == DType::f32 || t == DType::bf16; }

 private:
  struct Op {
    RingKind kind;
    Tensor whole;
    int slot;
  };
  void loop();
  void run(const Op& op);
  void reduce_scatter(char* base, DType t, int64_t block);
  void all_gather(char* base, DType t, int64_t block);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::string name_;
  bool threaded_ = false;  // MPI_THREAD_MULTIPLE: a worker thread; else run at submit
  std::unique_ptr<char[]> staging_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  std::vector<bool> done_;  // by slot
  std::vector<int> free_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace jumbo
