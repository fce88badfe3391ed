// A two-rank program that MPI's buffered sends let through and NCCL's rules deadlock: each rank
// sends first and receives after, in separate groups. Under comm.emulate = nccl (argument
// "nccl") a send completes only once its receive is posted and a group only as a whole, one
// group after another: both ranks wait in their first group for ever, and the watchdog (2 s)
// ends the job naming the operation and the group. Argument "mpi": it completes.
#include <cstdio>
#include <cstring>

#include "jumbo/comm/comm.h"
#include "jumbo/comm/watchdog.h"

int main(int argc, char** argv) {
  jumbo::mpi_init(&argc, &argv);
  const bool nccl = argc > 1 && std::strcmp(argv[1], "nccl") == 0;
  auto world = jumbo::mpi_world();
  auto comm = nccl ? jumbo::make_nccl_rules_comm(world) : world;
  jumbo::start_comm_watchdog(2.0);
  const int peer = 1 - comm->rank();
  float out = float(comm->rank()), in = -1;
  comm->group_start();
  jumbo::CommRequest sent = comm->isend(jumbo::Tensor(&out, jumbo::DType::f32, {1}), peer, 0);
  comm->group_end();
  comm->group_start();
  jumbo::CommRequest received = comm->irecv(jumbo::Tensor(&in, jumbo::DType::f32, {1}), peer, 0);
  comm->group_end();
  comm->wait(received);
  comm->wait(sent);
  std::printf("rank %d received %g\n", comm->rank(), in);
  comm.reset();
  world.reset();
  jumbo::mpi_finalize();
  return in == float(peer) ? 0 : 1;
}
