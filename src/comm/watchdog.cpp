// Watchdog on blocking communication. A rank that dies is noticed by the launcher, which ends
// the job; a rank that hangs (or a network that stops delivering) is not, and its peers would
// wait for ever inside MPI. This thread notices a blocking operation that has waited longer
// than parallel.comm_timeout_s, says which operation on which group of which rank, and
// aborts the whole job.
#include "jumbo/comm/watchdog.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

namespace jumbo {
namespace {

struct WatchState {
  std::atomic<int64_t> started_ns{0};  // 0: no blocking operation in progress
  std::atomic<const char*> op{nullptr};
  std::atomic<const char*> group{nullptr};
  std::atomic<double> timeout_s{0};
  std::atomic<bool> running{false};
};

WatchState& state() {
  static WatchState s;
  return s;
}

struct AsyncChecks {
  std::mutex mutex;
  std::map<int, std::function<std::string()>> checks;
  int next_id = 0;
};

// Nanoseconds inside BlockingOps on communication groups (comm_wait_seconds).
std::atomic<int64_t>& comm_wait_ns() {
  static std::atomic<int64_t> ns{0};
  return ns;
}

AsyncChecks& async_checks() {
  static AsyncChecks c;
  return c;
}

// The first failure any registered check reports, or "".
std::string async_failure() {
  AsyncChecks& c = async_checks();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [id, check] : c.checks) {
    std::string failure = check();
    if (!failure.empty()) return failure;
  }
  return "";
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void watch() {
  WatchState& s = state();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (const std::string failure = async_failure(); !failure.empty()) {
      std::fprintf(stderr, "jumbo: rank %d: %s; aborting the job\n", rank, failure.c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 4);
    }
    const int64_t start = s.started_ns.load();
    if (start == 0) continue;
    const double waited = static_cast<double>(now_ns() - start) * 1e-9;
    if (waited < s.timeout_s.load()) continue;
    std::fprintf(stderr,
                 "jumbo: rank %d: %s on the %s group has waited %.0f s (parallel.comm_timeout_s "
                 "= %g): a peer rank failed or hangs; aborting the job\n",
                 rank, s.op.load(), s.group.load(), waited, s.timeout_s.load());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 4);
  }
}

}  // namespace

void start_comm_watchdog(double timeout_s) {
  WatchState& s = state();
  s.timeout_s = timeout_s;
  if (!s.running.exchange(true)) std::thread(watch).detach();
}

int add_async_error_check(std::function<std::string()> check) {
  AsyncChecks& c = async_checks();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.checks.emplace(c.next_id, std::move(check));
  return c.next_id++;
}

void remove_async_error_check(int id) {
  AsyncChecks& c = async_checks();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.checks.erase(id);
}

namespace {
thread_local bool comm_worker_thread = false;
}  // namespace

void mark_thread_as_comm_worker() { comm_worker_thread = true; }

double comm_wait_seconds() { return static_cast<double>(comm_wait_ns().load()) * 1e-9; }

BlockingOp::BlockingOp(const char* op, std::string_view group) {
  if (comm_worker_thread) return;
  if (group != "device") started_ns_ = now_ns();
  WatchState& s = state();
  if (!s.running.load()) return;
  const size_t n = std::min(group.size(), group_.size() - 1);
  std::memcpy(group_.data(), group.data(), n);
  group_[n] = '\0';
  s.op = op;
  s.group = group_.data();
  s.started_ns = now_ns();
  armed_ = true;
}

BlockingOp::~BlockingOp() {
  if (armed_) state().started_ns = 0;
  if (started_ns_ != 0) comm_wait_ns() += now_ns() - started_ns_;
}

}  // namespace jumbo
