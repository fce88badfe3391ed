#pragma once
// Comm: one process group's collectives and point-to-point. MpiComm works on host memory;
// NcclComm (CUDA builds) on device memory. comm/ knows nothing of models.
#include <cstddef>
#include <memory>
#include <string>

#include "jumbo/backend/tensor.h"

namespace jumbo {

enum class ReduceOp { sum, max };

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "tp", "dp", ... for messages

  // In place over f32 tensors.
  virtual void all_reduce(Tensor t, ReduceOp op) = 0;
  virtual void broadcast(Tensor t, int root) = 0;
  virtual void barrier() = 0;
  // Sums a host scalar over the group (losses, norms).
  virtual double all_reduce_scalar(double value, ReduceOp op) = 0;
};

// The world communicator of this process; calls MPI_Init_thread on first use with
// MPI_THREAD_MULTIPLE and MPI_Finalize at exit.
std::shared_ptr<Comm> mpi_world();
// Starts MPI (idempotent); returns the world size.
int mpi_init(int* argc, char*** argv);
void mpi_finalize();
// Ends every rank of the job with this exit code (a rank failed; others must not hang).
[[noreturn]] void mpi_abort(int code);

}  // namespace jumbo
