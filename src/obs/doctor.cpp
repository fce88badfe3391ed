// `jumbo doctor`: the node-local checks under a timeout each (child processes), the
// collective checks, and the reports (per node, and rank 0's for the whole job).
#include "jumbo/obs/doctor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/timex.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "doctor_checks.h"
#include "jumbo/comm/grid.h"
#include "jumbo/config/config.h"

namespace jumbo {
namespace {

using Status = DoctorCheck::Status;
using doctor::make_check;

DoctorCheck check_mpi(Comm& world) {
  const MpiInfo info = mpi_info();
  if (!info.started) {
    return make_check("mpi", Status::ok,
                      fmt::format("{}, not started: no launcher (mpirun/srun), one process", info.library));
  }
  return make_check("mpi", info.thread_multiple ? Status::ok : Status::warn,
                    fmt::format("{}, {} rank{}, {}", info.library, world.size(), world.size() == 1 ? "" : "s",
                                info.thread_multiple ? "MPI_THREAD_MULTIPLE"
                                                     : "no MPI_THREAD_MULTIPLE (the checkpoint "
                                                       "writer and watchdog threads need it)"));
}

// The kernel's view (is NTP/chrony disciplining the clock?) and the spread of the ranks'
// wall clocks: logs, metrics timestamps and S3 request signatures need agreeing clocks.
DoctorCheck check_clock(Comm& world, double max_skew_s) {
  timex tx{};
  const int state = adjtimex(&tx);
  const bool synced = state != TIME_ERROR && !(tx.status & STA_UNSYNC);
  world.barrier();
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double newest = world.all_reduce_scalar(now, ReduceOp::max);
  const double oldest = -world.all_reduce_scalar(-now, ReduceOp::max);
  const double skew = newest - oldest;
  const std::string detail =
      fmt::format("{}; ranks' wall clocks within {:.3f} s (limit {} s)",
                  synced ? fmt::format("synchronised by NTP (max error {} ms)", tx.maxerror / 1000)
                         : "not synchronised by NTP/chrony",
                  skew, max_skew_s);
  if (skew > max_skew_s) return make_check("clock", Status::fail, detail);
  return make_check("clock", synced ? Status::ok : Status::warn, detail);
}

const char* status_word(Status s) {
  switch (s) {
    case Status::ok: return "ok";
    case Status::warn: return "warn";
    case Status::fail: return "FAIL";
    case Status::skip: return "skip";
  }
  return "?";
}

// A child's results travel to the parent through a pipe, one check a line:
// "STATUS\tFAULT\tNAME\tDETAIL" (the detail is one line; tabs in it become spaces).
std::string encode(const std::vector<DoctorCheck>& checks) {
  std::string out;
  for (const DoctorCheck& c : checks) {
    std::string detail = c.detail;
    std::replace(detail.begin(), detail.end(), '\t', ' ');
    std::replace(detail.begin(), detail.end(), '\n', ' ');
    out += fmt::format("{}\t{}\t{}\t{}\n", static_cast<int>(c.status), static_cast<int>(c.fault), c.name, detail);
  }
  return out;
}

std::vector<DoctorCheck> decode(const std::string& text) {
  std::vector<DoctorCheck> out;
  for (size_t start = 0; start < text.size();) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    const size_t a = line.find('\t'), b = line.find('\t', a + 1), c = line.find('\t', b + 1);
    if (c == std::string::npos) continue;  // a partial line: the child died writing it
    DoctorCheck check;
    check.status = static_cast<Status>(std::atoi(line.substr(0, a).c_str()));
    check.fault = static_cast<DoctorCheck::Fault>(std::atoi(line.substr(a + 1, b - a - 1).c_str()));
    check.name = line.substr(b + 1, c - b - 1);
    check.detail = line.substr(c + 1);
    out.push_back(std::move(check));
  }
  return out;
}

struct Child {
  pid_t pid = -1;
  int fd = -1;         // read end of its pipe; -1 once it hit end of file
  std::string output;
  bool reaped = false;
  int status = 0;      // waitpid's
};

std::vector<DoctorCheck> failed_all(const IsolatedCheck& check, const std::string& why) {
  std::vector<DoctorCheck> out;
  for (const std::string& name : check.names) out.push_back(make_check(name, Status::fail, why, check.fault));
  return out;
}

}  // namespace

std::vector<DoctorCheck> run_isolated_checks(const std::vector<IsolatedCheck>& checks, double timeout_s) {
  std::fflush(nullptr);  // nothing buffered is written twice (by a child too)
  std::vector<Child> children(checks.size());
  for (size_t i = 0; i < checks.size(); ++i) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
      // Its own process group: a timeout kills what it started too (dcgmi, a shell).
      setpgid(0, 0);
      close(fds[0]);
      // A crash ends the child by its signal, which the parent reports (not a handler's
      // backtrace of this process, inherited from the parent).
      for (const int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) signal(sig, SIG_DFL);
      std::string text;
      try {
        text = encode(checks[i].run());
      } catch (const std::exception& e) {
        text = encode(failed_all(checks[i], fmt::format("the check threw: {}", e.what())));
      }
      for (size_t done = 0; done < text.size();) {
        const ssize_t n = ::write(fds[1], text.data() + done, text.size() - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      _exit(0);  // no atexit handlers, no MPI finalisation in a child
    }
    setpgid(pid, pid);  // also here: no race with the child's own call
    close(fds[1]);
    children[i].pid = pid;
    children[i].fd = fds[0];
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    std::vector<pollfd> open;
    std::vector<size_t> which;
    for (size_t i = 0; i < children.size(); ++i)
      if (children[i].fd >= 0) open.push_back({children[i].fd, POLLIN, 0}), which.push_back(i);
    if (open.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (poll(open.data(), open.size(), static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (size_t k = 0; k < open.size(); ++k) {
      if (!(open[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Child& child = children[which[k]];
      char buffer[4096];
      const ssize_t n = ::read(child.fd, buffer, sizeof buffer);
      if (n > 0) {
        child.output.append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(child.fd);
        child.fd = -1;
      }
    }
  }
  std::vector<DoctorCheck> out;
  const std::string seconds = fmt::format("{:g}", timeout_s);
  for (size_t i = 0; i < children.size(); ++i) {
    Child& child = children[i];
    const IsolatedCheck& check = checks[i];
    if (child.fd >= 0) {
      // Still running at the deadline: a hang. Its group is killed; a process stuck in the
      // kernel (uninterruptible sleep in a driver) may outlive SIGKILL: not waited for long.
      kill(-child.pid, SIGKILL);
      close(child.fd);
      for (int tries = 0; tries < 20 && !child.reaped; ++tries) {
        child.reaped = waitpid(child.pid, &child.status, WNOHANG) == child.pid;
        if (!child.reaped) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      const auto hung = failed_all(
          check, fmt::format("hung after {} s in {} (killed{})", seconds, check.waits_on,
                             child.reaped ? "" : "; the process does not die: stuck in the kernel"));
      out.insert(out.end(), hung.begin(), hung.end());
      continue;
    }
    child.reaped = waitpid(child.pid, &child.status, 0) == child.pid;
    std::vector<DoctorCheck> got = decode(child.output);
    const bool complete = got.size() == check.names.size();
    if (!complete) {
      const std::string how = child.reaped && WIFSIGNALED(child.status)
                                  ? fmt::format("ended by signal {} ({})", WTERMSIG(child.status),
                                                strsignal(WTERMSIG(child.status)))
                              : child.reaped && WIFEXITED(child.status) && WEXITSTATUS(child.status) != 0
                                  ? fmt::format("exited {} without a result", WEXITSTATUS(child.status))
                                  : "ended without a result";
      got = failed_all(check, fmt::format("{} in {}", how, check.waits_on));
    }
    out.insert(out.end(), got.begin(), got.end());
  }
  return out;
}

std::string doctor_node_name() {
  const char* slurm = std::getenv("SLURMD_NODENAME");
  return slurm && *slurm ? std::string(slurm) : host_name();
}

std::vector<DoctorCheck> run_local_checks(const DoctorOptions& o) {
  using Fault = DoctorCheck::Fault;
  std::vector<DoctorCheck> out{doctor::check_node()};
  // Software faults (NCCL, its plugin, the directory) fail on every node alike; a hang in
  // the GPU driver, libfabric's providers or the storage of one node is that node's.
  const std::vector<IsolatedCheck> first = {
      {{"libfabric"}, Fault::node, "fi_getinfo (libfabric's providers: the EFA driver?)",
       [o] { return std::vector<DoctorCheck>{doctor::check_libfabric(o.expect_efa, o.instance_type)}; }},
      {{"gpu"}, Fault::node, "cuInit/cuDeviceGetCount (the GPU driver)",
       [o] { return std::vector<DoctorCheck>{doctor::check_gpus(o.expect_gpus)}; }},
      {{"nccl", "nccl-net"}, Fault::node, "loading libnccl.so.2 and its network plugin",
       [o] {
         doctor::NcclLibrary nccl;
         std::vector<DoctorCheck> r{doctor::check_nccl(o.expect_gpus > 0, nccl)};
         r.push_back(doctor::check_nccl_net(o.expect_efa, o.expect_gpus > 0, nccl));
         return r;
       }},
      {{"build"}, Fault::software, "this binary",
       [o] { return std::vector<DoctorCheck>{doctor::check_build(o.cuda_built, o.expect_gpus)}; }},
      // A directory that cannot be written is nearly always a path or permission mistake, the
      // same on every node; a write that hangs is this node's mount.
      {{"storage"}, Fault::node, fmt::format("writing to {}", o.dir.empty() ? "-" : o.dir),
       [o] {
         DoctorCheck c = doctor::check_storage(o.dir);
         c.fault = Fault::software;
         return std::vector<DoctorCheck>{c};
       }},
  };
  const std::vector<DoctorCheck> found = run_isolated_checks(first, o.check_timeout_s);
  out.insert(out.end(), found.begin(), found.end());
  // DCGM's diagnostic after the others: it exercises the GPUs the probe above touched.
  const std::vector<IsolatedCheck> second = {
      {{"dcgm"}, Fault::node, "dcgmi diag -r 1",
       [o] { return std::vector<DoctorCheck>{doctor::check_dcgm(o.expect_gpus)}; }}};
  const std::vector<DoctorCheck> dcgm = run_isolated_checks(second, o.check_timeout_s);
  out.insert(out.end(), dcgm.begin(), dcgm.end());
  return out;
}

std::vector<DoctorCheck> run_collective_checks(const DoctorOptions& o, Comm& world) {
  return {doctor::check_node(), check_mpi(world), check_clock(world, o.max_clock_skew_s)};
}

std::string format_check(const DoctorCheck& c) {
  return fmt::format("{:<5} {:<10} {}", status_word(c.status), c.name, c.detail);
}

std::string failed_node_line(const std::vector<DoctorCheck>& checks, const std::string& node) {
  std::string node_checks, software_checks;
  for (const DoctorCheck& c : checks) {
    if (c.status != Status::fail) continue;
    std::string& list = c.fault == DoctorCheck::Fault::node ? node_checks : software_checks;
    list += (list.empty() ? "" : ",") + c.name;
  }
  if (node_checks.empty() && software_checks.empty()) return "";
  return fmt::format("doctor: failed node={} node-checks={} software-checks={}", node,
                     node_checks.empty() ? "-" : node_checks,
                     software_checks.empty() ? "-" : software_checks);
}

std::string local_report(const std::vector<DoctorCheck>& checks, const std::string& node) {
  std::string text;
  for (const DoctorCheck& c : checks) text += format_check(c) + "\n";
  const std::string failed = failed_node_line(checks, node);
  return text + (failed.empty() ? fmt::format("doctor: passed node={}", node) : failed) + "\n";
}

void write_local_report(const std::string& dir, const std::string& node, const std::string& report) {
  const std::string path = fmt::format("{}/{}.txt", dir, node);
  const std::string partial = fmt::format("{}/.{}.txt.{}", dir, node, getpid());
  const int fd = ::open(partial.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  for (size_t done = 0; ok && done < report.size();) {
    const ssize_t n = ::write(fd, report.data() + done, report.size() - done);
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (ok && std::rename(partial.c_str(), path.c_str()) == 0) return;
  const int why = ok ? errno : error;
  std::remove(partial.c_str());
  throw UserError(fmt::format("--report-dir {}: cannot write {}: {}", dir, path, std::strerror(why)));
}

std::string gather_doctor_report(const std::vector<DoctorCheck>& mine, Comm& world, bool* failed) {
  std::string text;  // this rank's lines that rank 0 must see: its warnings and failures
  std::string host;
  for (const DoctorCheck& c : mine)
    if (c.name == "node") host = c.detail.substr(0, c.detail.find(':'));
  const std::string failed_line = failed_node_line(mine, doctor_node_name());
  const bool mine_failed = !failed_line.empty();
  for (const DoctorCheck& c : mine)
    if (c.status == Status::fail || c.status == Status::warn)
      text += fmt::format("{}: {}\n", host, format_check(c));
  const int failures = static_cast<int>(world.all_reduce_scalar(mine_failed ? 1 : 0, ReduceOp::sum));
  if (failed) *failed = failures > 0;
  // Only nodes with something to say send text: one-time, and small. The failed-node line
  // travels after a NUL so that rank 0 can print all of them last.
  std::string payload = text + '\0' + (mine_failed ? failed_line + "\n" : "");
  const std::vector<std::vector<char>> all = world.gather_bytes(
      world.rank() == 0 ? std::vector<char>{} : std::vector<char>(payload.begin(), payload.end()), 0);
  if (world.rank() != 0) return "";
  std::string report, failed_lines = mine_failed ? failed_line + "\n" : "";
  for (const DoctorCheck& c : mine) report += format_check(c) + "\n";
  for (size_t r = 1; r < all.size(); ++r) {
    const std::string part(all[r].begin(), all[r].end());
    const size_t nul = part.find('\0');
    report += part.substr(0, nul);
    if (nul != std::string::npos) failed_lines += part.substr(nul + 1);
  }
  report += fmt::format("doctor: {} rank{} checked, {} with a failed check\n", world.size(),
                        world.size() == 1 ? "" : "s", failures);
  return report + failed_lines;
}

}  // namespace jumbo
