#pragma once
// Watchdog on blocking communication: once started, any blocking operation of this process
// that waits longer than the timeout ends the whole job with a line naming the rank, the
// group and the operation (a peer died or hangs; without it the job would hang for ever).
#include <array>
#include <functional>
#include <string>
#include <string_view>

namespace jumbo {

void start_comm_watchdog(double timeout_s);

// Checks the watchdog runs on every poll, for failures a blocked host never sees (NCCL's
// asynchronous errors while the host waits on the GPU): a non-empty result ends the job with
// that line. Returns an id for remove_async_error_check.
int add_async_error_check(std::function<std::string()> check);
void remove_async_error_check(int id);

// Seconds this process has spent inside BlockingOps on communication groups (every group but
// "device", a wait for the GPU's own work): what the straggler report calls waiting.
double comm_wait_seconds();

// For a thread that runs communication on behalf of another which waits for it under its own
// BlockingOp (an emulated NCCL communicator's stream): this thread's BlockingOps neither arm
// the watchdog (they would disarm the waiting thread's) nor count as waiting (twice).
void mark_thread_as_comm_worker();

// Marks a blocking operation for the watchdog for the lifetime of the object, and times it. `op` is a
// string literal; the group's name is copied (a temporary may name it), cut to 47 characters.
class BlockingOp {
 public:
  BlockingOp(const char* op, std::string_view group);
  ~BlockingOp();
  BlockingOp(const BlockingOp&) = delete;
  BlockingOp& operator=(const BlockingOp&) = delete;

 private:
  bool armed_ = false;
  int64_t started_ns_ = 0;  // 0: not timed (the "device" group)
  std::array<char, 48> group_{};
};

}  // namespace jumbo
