#include "mpi_ring.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "mpi_types.h"

namespace jumbo {

RingCollectives::RingCollectives(MPI_Comm comm, int rank, int size, const std::string& name)
    : rank_(rank), size_(size), name_(name) {
  MPI_Comm_dup(comm, &comm_);
  // Not zeroed: its pages become resident only as far as the largest message reaches (a tp
  // group's reduce-scatters of activations use a small part of it).
  staging_.reset(new char[static_cast<size_t>(kPieceElems) * 4]);
  done_.assign(kMaxInFlight, true);
  for (int s = kMaxInFlight; s-- > 0;) free_.push_back(s);
  int provided = 0;
  MPI_Query_thread(&provided);
  threaded_ = provided == MPI_THREAD_MULTIPLE;
  if (threaded_) thread_ = std::thread([this] { loop(); });
}

RingCollectives::~RingCollectives() {
  if (threaded_) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

int RingCollectives::submit(RingKind kind, Tensor whole) {
  if (whole.numel() % size_ != 0) {
    throw std::logic_error(fmt::format("{}: ring over {} ranks of {}", name_, size_,
                                       whole.describe()));
  }
  if (kind != RingKind::all_gather && !reducible(whole.dtype)) {
    throw std::logic_error(fmt::format("{}: ring reduction of {}", name_, whole.describe()));
  }
  std::unique_lock lock(mu_);
  if (free_.empty()) {
    throw std::logic_error(fmt::format("{}: more than {} ring operations in flight", name_,
                                       kMaxInFlight));
  }
  const int slot = free_.back();
  free_.pop_back();
  done_[static_cast<size_t>(slot)] = false;
  if (!threaded_) {
    lock.unlock();
    run({kind, whole, slot});
    lock.lock();
    done_[static_cast<size_t>(slot)] = true;
    return slot;
  }
  queue_.push_back({kind, whole, slot});
  cv_.notify_all();
  return slot;
}

void RingCollectives::wait(int slot) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_[static_cast<size_t>(slot)]; });
  free_.push_back(slot);
}

void RingCollectives::loop() {
  for (;;) {
    Op op;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      op = queue_.front();
      queue_.pop_front();
    }
    run(op);
    {
      std::lock_guard lock(mu_);
      done_[static_cast<size_t>(op.slot)] = true;
    }
    cv_.notify_all();
  }
}

void RingCollectives::run(const Op& op) {
  char* base = static_cast<char*>(op.whole.data);
  const int64_t block = op.whole.numel() / size_;
  if (op.kind != RingKind::all_gather) reduce_scatter(base, op.whole.dtype, block);
  if (op.kind != RingKind::reduce_scatter) all_gather(base, op.whole.dtype, block);
}

// Step s (of size - 1): send block r - s - 1 to the next rank, receive block r - s - 2 from
// the previous one and add it into ours. After the last step block r has every rank's part.
void RingCollectives::reduce_scatter(char* base, DType t, int64_t block) {
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  const size_t elem = dtype_size(t);
  for (int s = 0; s < size_ - 1; ++s) {
    const int64_t send_block = (rank_ - s - 1 + 2 * size_) % size_;
    const int64_t recv_block = (rank_ - s - 2 + 2 * size_) % size_;
    for (int64_t at = 0; at < block; at += kPieceElems) {
      const int count = static_cast<int>(std::min(kPieceElems, block - at));
      const int bytes = count * static_cast<int>(elem);
      char* send = base + static_cast<size_t>(send_block * block + at) * elem;
      char* into = base + static_cast<size_t>(recv_block * block + at) * elem;
      MPI_Sendrecv(send, bytes, MPI_BYTE, next, 0, staging_.get(), bytes, MPI_BYTE, prev, 0,
                   comm_, MPI_STATUS_IGNORE);
      // into = received + into (exact for f32 sums of two; bf16 adds in fp32).
      MPI_Reduce_local(staging_.get(), into, count, mpi_type(t), mpi_op(t, ReduceOp::sum));
    }
  }
}

// Step s: send block r - s (ours first, then the one just received) to the next rank and
// receive block r - s - 1 from the previous one, straight into place.
void RingCollectives::all_gather(char* base, DType t, int64_t block) {
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  const size_t elem = dtype_size(t);
  for (int s = 0; s < size_ - 1; ++s) {
    const int64_t send_block = (rank_ - s + 2 * size_) % size_;
    const int64_t recv_block = (rank_ - s - 1 + 2 * size_) % size_;
    for (int64_t at = 0; at < block; at += kPieceElems) {
      const int bytes = static_cast<int>(std::min(kPieceElems, block - at) * static_cast<int64_t>(elem));
      MPI_Sendrecv(base + static_cast<size_t>(send_block * block + at) * elem, bytes, MPI_BYTE,
                   next, 1, base + static_cast<size_t>(recv_block * block + at) * elem, bytes,
                   MPI_BYTE, prev, 1, comm_, MPI_STATUS_IGNORE);
    }
  }
}

}  // namespace jumbo
