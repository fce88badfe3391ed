// A job in which rank 1 hangs (sleeps) before a barrier the others are already waiting in.
// With the watchdog at 2 s the job must end, non-zero, naming the operation and group.
#include <chrono>
#include <thread>

#include "jumbo/comm/comm.h"
#include "jumbo/comm/watchdog.h"

int main(int argc, char** argv) {
  jumbo::mpi_init(&argc, &argv);
  auto world = jumbo::mpi_world();
  jumbo::start_comm_watchdog(2.0);
  if (world->rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(120));
  world->barrier();
  jumbo::mpi_finalize();
  return 0;
}
