#include <mpi.h>

#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>

#include "jumbo/comm/comm.h"

namespace jumbo {
namespace {

MPI_Datatype mpi_type(DType t) {
  if (t == DType::f32) return MPI_FLOAT;
  if (t == DType::i32) return MPI_INT;
  throw std::logic_error(fmt::format("MpiComm: no MPI type for {}", to_string(t)));
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::sum ? MPI_SUM : MPI_MAX; }

class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void all_reduce(Tensor t, ReduceOp op) override {
    if (size_ == 1) return;
    MPI_Allreduce(MPI_IN_PLACE, t.data, static_cast<int>(t.numel()), mpi_type(t.dtype),
                  mpi_op(op), comm_);
  }
  void broadcast(Tensor t, int root) override {
    if (size_ == 1) return;
    MPI_Bcast(t.data, static_cast<int>(t.bytes()), MPI_BYTE, root, comm_);
  }
  void barrier() override { MPI_Barrier(comm_); }
  double all_reduce_scalar(double value, ReduceOp op) override {
    if (size_ == 1) return value;
    double out = 0;
    MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, mpi_op(op), comm_);
    return out;
  }

 private:
  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

int mpi_init(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  }
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

void mpi_finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void mpi_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

std::shared_ptr<Comm> mpi_world() {
  mpi_init(nullptr, nullptr);
  static auto world = std::make_shared<MpiComm>(MPI_COMM_WORLD, "world");
  return world;
}

}  // namespace jumbo
