#include "jumbo/obs/doctor.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <rdma/fabric.h>
#include <sys/statfs.h>
#include <sys/timex.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "jumbo/obs/metrics.h"

namespace jumbo {
namespace {

using Status = DoctorCheck::Status;

DoctorCheck check(std::string name, Status status, std::string detail) {
  return {std::move(name), status, std::move(detail)};
}

DoctorCheck check_node() {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const double memory =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return check("node", Status::ok,
               fmt::format("{}: {} CPUs, {} memory", host, cpus, human_bytes(memory, 1)));
}

DoctorCheck check_mpi(Comm& world) {
  const MpiInfo info = mpi_info();
  if (!info.started) {
    return check("mpi", Status::ok,
                 fmt::format("{}, not started: no launcher (mpirun/srun), one process", info.library));
  }
  return check("mpi", info.thread_multiple ? Status::ok : Status::warn,
               fmt::format("{}, {} rank{}, {}", info.library, world.size(), world.size() == 1 ? "" : "s",
                           info.thread_multiple ? "MPI_THREAD_MULTIPLE"
                                                : "no MPI_THREAD_MULTIPLE (the checkpoint "
                                                  "writer and watchdog threads need it)"));
}

// Every provider fi_getinfo offers on this node; efa is the one NCCL must use on p4d/p5.
DoctorCheck check_libfabric(bool expect_efa) {
  fi_info* info = nullptr;
  const int rc = fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, nullptr, &info);
  const uint32_t v = fi_version();
  const std::string version = fmt::format("libfabric {}.{}", FI_MAJOR(v), FI_MINOR(v));
  if (rc != 0 || !info) {
    if (info) fi_freeinfo(info);
    return check("libfabric", expect_efa ? Status::fail : Status::warn,
                 fmt::format("{}: fi_getinfo found no provider ({})", version, fi_strerror(-rc)));
  }
  std::set<std::string> providers;
  for (fi_info* i = info; i; i = i->next)
    if (i->fabric_attr && i->fabric_attr->prov_name) providers.insert(i->fabric_attr->prov_name);
  fi_freeinfo(info);
  std::string list;
  for (const std::string& p : providers) list += (list.empty() ? "" : ", ") + p;
  const bool efa = providers.count("efa") > 0;
  if (efa) return check("libfabric", Status::ok, fmt::format("{}: providers {}; efa present", version, list));
  return check("libfabric", expect_efa ? Status::fail : Status::ok,
               fmt::format("{}: providers {}; no efa{}", version, list,
                           expect_efa ? ": inter-node traffic would crawl over TCP; is the EFA "
                                        "driver loaded and the instance EFA-enabled?"
                                      : " (not expected)"));
}

// The driver API through dlopen: no CUDA headers or libraries at build time.
DoctorCheck check_gpus(int expect) {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda) {
    return check("gpu", expect > 0 ? Status::fail : Status::skip,
                 fmt::format("no NVIDIA driver (libcuda.so.1 not found){}",
                             expect > 0 ? fmt::format("; expected {} GPUs", expect) : ""));
  }
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  using GetFn = int (*)(int*, int);
  using NameFn = int (*)(char*, int, int);
  using MemFn = int (*)(size_t*, int);
  using VersionFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(dlsym(cuda, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(cuda, "cuDeviceGetCount"));
  auto get = reinterpret_cast<GetFn>(dlsym(cuda, "cuDeviceGet"));
  auto name = reinterpret_cast<NameFn>(dlsym(cuda, "cuDeviceGetName"));
  auto mem = reinterpret_cast<MemFn>(dlsym(cuda, "cuDeviceTotalMem_v2"));
  auto driver = reinterpret_cast<VersionFn>(dlsym(cuda, "cuDriverGetVersion"));
  int n = 0, version = 0;
  if (!init || !count || init(0) != 0 || count(&n) != 0) {
    dlclose(cuda);
    return check("gpu", expect > 0 ? Status::fail : Status::warn,
                 "libcuda.so.1 loads but cuInit failed: driver and kernel module disagree?");
  }
  if (driver) driver(&version);
  std::string first;
  size_t bytes = 0;
  int device = 0;
  if (n > 0 && get && get(&device, 0) == 0) {
    char label[128] = {};
    if (name) name(label, sizeof label - 1, device);
    if (mem) mem(&bytes, device);
    first = fmt::format(", {} {}", label, human_bytes(static_cast<double>(bytes), 0));
  }
  dlclose(cuda);
  const bool ok = expect == 0 || n >= expect;
  return check("gpu", ok ? Status::ok : Status::fail,
               fmt::format("{} GPU{}{} (driver API {}.{}){}", n, n == 1 ? "" : "s", first,
                           version / 1000, version % 1000 / 10,
                           ok ? "" : fmt::format("; expected {}", expect)));
}

DoctorCheck check_nccl(bool expect_efa, bool expect_gpus) {
  void* nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!nccl) {
    return check("nccl", expect_gpus ? Status::fail : Status::skip,
                 "libnccl.so.2 not found on the library path");
  }
  using VersionFn = int (*)(int*);
  int code = 0;
  if (auto version = reinterpret_cast<VersionFn>(dlsym(nccl, "ncclGetVersion"))) version(&code);
  dlclose(nccl);
  const std::string v = fmt::format("NCCL {}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  // NCCL looks for libnccl-net-<NCCL_NET_PLUGIN>.so (aws-ofi-nccl >= 1.15 installs
  // libnccl-net-ofi.so), then libnccl-net.so.
  const char* wanted = std::getenv("NCCL_NET_PLUGIN");
  std::vector<std::string> names;
  if (wanted && *wanted) names.push_back(fmt::format("libnccl-net-{}.so", wanted));
  names.push_back("libnccl-net-ofi.so");
  names.push_back("libnccl-net.so");
  for (const std::string& lib : names) {
    if (void* plugin = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      dlclose(plugin);
      return check("nccl", Status::ok, fmt::format("{}, network plugin {}", v, lib));
    }
  }
  return check("nccl", expect_efa ? Status::fail : Status::warn,
               fmt::format("{}, no network plugin (libnccl-net-ofi.so / libnccl-net.so): NCCL "
                           "would use TCP sockets between nodes",
                           v));
}

std::string fs_type(const std::string& dir) {
  struct statfs s {};
  if (statfs(dir.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0x0BD00BD0: return "lustre";
    case 0x6969: return "nfs";
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x01021994: return "tmpfs";
    case 0x794c7630: return "overlayfs";
    default: return fmt::format("type {:#x}", static_cast<unsigned long>(s.f_type));
  }
}

// Writes, fsyncs, reads back and removes a 4 MiB file: a full or read-only shared file
// system fails here instead of at the first checkpoint hours later.
DoctorCheck check_storage(const std::string& dir) {
  if (dir.empty()) return check("storage", Status::skip, "no --dir given");
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string path = fmt::format("{}/.jumbo-doctor-{}-{}", dir, host, getpid());
  std::vector<char> data(4 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) {
    return check("storage", Status::fail,
                 fmt::format("{}: cannot create a file: {}", dir, std::strerror(errno)));
  }
  const bool written = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) &&
                       ::fsync(fd) == 0;
  const int write_errno = errno;
  ::close(fd);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<char> back(data.size());
  const int rfd = written ? ::open(path.c_str(), O_RDONLY) : -1;
  const bool read_ok = rfd >= 0 && ::read(rfd, back.data(), back.size()) ==
                                       static_cast<ssize_t>(back.size()) && back == data;
  if (rfd >= 0) ::close(rfd);
  fs::remove(path, ec);
  if (!written)
    return check("storage", Status::fail,
                 fmt::format("{}: writing 4 MiB failed: {}", dir, std::strerror(write_errno)));
  if (!read_ok)
    return check("storage", Status::fail, fmt::format("{}: 4 MiB read back differ", dir));
  const fs::space_info space = fs::space(dir, ec);
  return check("storage", Status::ok,
               fmt::format("{} ({}) writable: 4 MiB written and fsynced at {}/s, {} free", dir,
                           fs_type(dir), human_bytes(4.0 * (1 << 20) / std::max(seconds, 1e-6), 0),
                           human_bytes(static_cast<double>(space.available), 1)));
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
  if (skew > max_skew_s) return check("clock", Status::fail, detail);
  return check("clock", synced ? Status::ok : Status::warn, detail);
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

}  // namespace

std::vector<DoctorCheck> run_node_checks(const DoctorOptions& o, Comm& world) {
  std::vector<DoctorCheck> out;
  out.push_back(check_node());
  out.push_back(check_mpi(world));
  out.push_back(check_libfabric(o.expect_efa));
  out.push_back(check_gpus(o.expect_gpus));
  out.push_back(check_nccl(o.expect_efa, o.expect_gpus > 0));
  out.push_back(check_storage(o.dir));
  out.push_back(check_clock(world, o.max_clock_skew_s));
  return out;
}

std::string format_check(const DoctorCheck& c) {
  return fmt::format("{:<5} {:<10} {}", status_word(c.status), c.name, c.detail);
}

std::string gather_doctor_report(const std::vector<DoctorCheck>& mine, Comm& world, bool* failed) {
  bool mine_failed = false;
  std::string text;  // this rank's lines that rank 0 must see: its warnings and failures
  std::string host;
  for (const DoctorCheck& c : mine) {
    if (c.name == "node") host = c.detail.substr(0, c.detail.find(':'));
    mine_failed = mine_failed || c.status == Status::fail;
  }
  for (const DoctorCheck& c : mine)
    if (c.status == Status::fail || c.status == Status::warn)
      text += fmt::format("{}: {}\n", host, format_check(c));
  const int failures = static_cast<int>(world.all_reduce_scalar(mine_failed ? 1 : 0, ReduceOp::sum));
  if (failed) *failed = failures > 0;
  // Only nodes with something to say send text: one-time, and small.
  const std::vector<std::vector<char>> all =
      world.gather_bytes(world.rank() == 0 ? std::vector<char>{} : std::vector<char>(text.begin(), text.end()), 0);
  if (world.rank() != 0) return "";
  std::string report;
  for (const DoctorCheck& c : mine) report += format_check(c) + "\n";
  for (size_t r = 1; r < all.size(); ++r) report.append(all[r].begin(), all[r].end());
  report += fmt::format("doctor: {} rank{} checked, {} with a failed check\n", world.size(),
                        world.size() == 1 ? "" : "s", failures);
  return report;
}

}  // namespace jumbo
