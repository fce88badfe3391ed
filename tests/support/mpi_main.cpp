// gtest main for tests launched under mpirun: MPI first, every rank runs every test, only
// rank 0 prints; a failure on any rank makes that rank (and so mpirun) exit non-zero.
#include <gtest/gtest.h>

#include "jumbo/comm/comm.h"

int main(int argc, char** argv) {
  jumbo::mpi_init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (jumbo::mpi_world()->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int result = RUN_ALL_TESTS();
  // Every rank learns whether any failed, so mpirun's status is the same everywhere.
  const double failed = jumbo::mpi_world()->all_reduce_scalar(result != 0 ? 1 : 0,
                                                              jumbo::ReduceOp::max);
  if (failed > 0 && jumbo::mpi_world()->rank() == 0 && result == 0) {
    std::fprintf(stderr, "a test failed on another rank (its output is not printed)\n");
  }
  jumbo::mpi_finalize();
  return failed > 0 ? 1 : 0;
}
