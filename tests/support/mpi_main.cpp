// gtest main for tests launched under mpirun: MPI first, every rank runs every test, only
// rank 0 prints; a failure on any rank makes that rank (and so mpirun) exit non-zero.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "jumbo/comm/comm.h"

namespace {
// Other ranks print only their failures, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // The name is taken here: asking gtest for it inside OnTestPartResult would deadlock.
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: %s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  int rank_;
  std::string test_;
};
}  // namespace

int main(int argc, char** argv) {
  jumbo::mpi_init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (jumbo::mpi_world()->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(jumbo::mpi_world()->rank()));
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
