#include "jumbo/obs/doctor.h"

#include <dlfcn.h>
#include <link.h>
#include <strings.h>
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

#include "jumbo/comm/grid.h"
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
  const char* slurm = std::getenv("SLURMD_NODENAME");
  return check("node", Status::ok,
               fmt::format("{}: {} CPUs, {} memory{}", host_name(), cpus, human_bytes(memory, 1),
                           slurm && *slurm ? fmt::format(", Slurm node {}", slurm) : ""));
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
    const char* provider = std::getenv("FI_PROVIDER");  // it restricts fi_getinfo's search
    return check("libfabric", expect_efa ? Status::fail : Status::warn,
                 fmt::format("{}: fi_getinfo found no provider ({}){}", version, fi_strerror(-rc),
                             provider ? fmt::format(" with FI_PROVIDER={}: no {} device", provider, provider)
                                      : ""));
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

// The directories dlopen searches for a bare file name, as this process sees them (NCCL's own
// dlopen also honours libnccl's RUNPATH, which its packages do not set).
std::string loader_search_path() {
  const char* env = std::getenv("LD_LIBRARY_PATH");
  return fmt::format("{}, then /etc/ld.so.cache, /lib, /usr/lib",
                     env && *env ? fmt::format("LD_LIBRARY_PATH={}", env) : std::string("LD_LIBRARY_PATH unset"));
}

// The file a handle was loaded from, as the loader found it (NCCL logs the same l_name), with
// its target when that is a symbolic link.
std::string loaded_file(void* handle) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map || !map->l_name) return "?";
  std::string path = map->l_name;
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(path, ec);
  if (!ec && real.string() != path) path += " -> " + real.string();
  return path;
}

struct Opened {
  void* handle = nullptr;
  bool missing = false;  // not found on the search path (not: found but failed to load)
  std::string error;
};

Opened open_library(const std::string& name) {
  Opened o;
  dlerror();
  o.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!o.handle) {
    const char* e = dlerror();
    o.error = e ? e : "unknown dlopen error";
    // NCCL tells the two apart the same way (src/plugin/plugin_open.cc, tryOpenLib).
    o.missing = o.error.find("No such file or directory") != std::string::npos;
  }
  return o;
}

// Where a library that is not on the search path often lies: says which directory to add.
std::string found_elsewhere(const std::string& file) {
  std::vector<std::string> dirs = {"/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64",
                                   "/opt/aws-ofi-nccl/lib", "/usr/local/cuda/lib64", "/opt/nccl/lib",
                                   "/usr/local/lib"};
  if (const char* root = std::getenv("JUMBO_ROOT"); root && *root)
    dirs.insert(dirs.begin(), fmt::format("{}/deps/nccl/lib", root));
  std::error_code ec;
  for (const std::string& d : dirs)
    if (std::filesystem::exists(d + "/" + file, ec))
      return fmt::format("; {}/{} exists: add {} to LD_LIBRARY_PATH", d, file, d);
  return "";
}

struct NcclLibrary {
  int version = 0;  // 22304 for 2.23.4; 0 when libnccl.so.2 does not load
  std::string text;
};

DoctorCheck check_nccl(bool expect_gpus, NcclLibrary& out) {
  const Opened lib = open_library("libnccl.so.2");
  if (!lib.handle) {
    DoctorCheck c = check("nccl", expect_gpus ? Status::fail : Status::skip,
                          lib.missing ? fmt::format("libnccl.so.2 not found: searched {}{}{}",
                                                    loader_search_path(), found_elsewhere("libnccl.so.2"),
                                                    expect_gpus ? "; GPUs are expected, NCCL is needed" : "")
                                      : fmt::format("libnccl.so.2 does not load: {}", lib.error));
    c.fault = DoctorCheck::Fault::software;
    return c;
  }
  using VersionFn = int (*)(int*);
  if (auto version = reinterpret_cast<VersionFn>(dlsym(lib.handle, "ncclGetVersion"))) version(&out.version);
  const std::string file = loaded_file(lib.handle);
  dlclose(lib.handle);
  // ncclGetVersion: major*10000 + minor*100 + patch since 2.9 (NCCL_VERSION_CODE in nccl.h).
  out.text = fmt::format("NCCL {}.{}.{}", out.version / 10000, out.version / 100 % 100, out.version % 100);
  DoctorCheck c = check("nccl", Status::ok, fmt::format("{} from {}", out.text, file));
  c.fault = DoctorCheck::Fault::software;
  return c;
}

// The file names NCCL tries for one NCCL_NET_PLUGIN entry, in order (NVIDIA/nccl):
// before 2.21 only libnccl-net-NAME.so (src/net.cc); from 2.21 NAME as given, then
// libnccl-net-NAME.so unless NAME is a path or a lib*.so file name (src/plugin/plugin_open.cc).
std::vector<std::string> plugin_file_names(const std::string& entry, int version) {
  const std::string suffixed = fmt::format("libnccl-net-{}.so", entry);
  if (version < 22100) return {suffixed};
  const bool file_name = entry.find('/') != std::string::npos ||
                         (entry.rfind("lib", 0) == 0 && entry.size() > 3 &&
                          entry.compare(entry.size() - 3, 3, ".so") == 0);
  if (file_name) return {entry};
  return {entry, suffixed};
}

// The network plugin NCCL would load on this node: NCCL_NET_PLUGIN unset -> libnccl-net.so;
// set -> the names above, per comma-separated entry from NCCL 2.27 on, where "none" turns
// external plugins off. Found via dlopen's search path, and only used if it exports an
// ncclNetPlugin_vN. Without one, NCCL silently uses its socket transport between nodes.
DoctorCheck check_nccl_net(bool expect_efa, bool expect_gpus, const NcclLibrary& nccl) {
  const Status missing_status = expect_efa ? Status::fail : expect_gpus ? Status::warn : Status::skip;
  const char* env = std::getenv("NCCL_NET_PLUGIN");
  const int version = nccl.version;
  // Without libnccl the version is unknown: the rule of NCCL < 2.21, whose names every later
  // version tries too.
  const std::string rule = version ? nccl.text : "any NCCL (libnccl.so.2 did not load)";
  const std::string setting = env ? fmt::format("NCCL_NET_PLUGIN={}", env) : "NCCL_NET_PLUGIN unset";
  std::vector<std::string> entries;
  if (!env || (!*env && version < 22700)) {
    entries.push_back("");  // the default name
  } else if (version >= 22700) {
    std::string list = env;
    for (size_t start = 0; start <= list.size();) {
      const size_t comma = std::min(list.find(',', start), list.size());
      if (comma > start) entries.push_back(list.substr(start, comma - start));
      start = comma + 1;
    }
    if (entries.size() == 1 && strcasecmp(entries[0].c_str(), "none") == 0) entries.clear();
  } else {
    entries.push_back(env);
  }
  DoctorCheck c = check("nccl-net", missing_status, "");
  c.fault = DoctorCheck::Fault::software;
  if (entries.empty()) {
    c.detail = fmt::format("{}: {} loads no external network plugin; NCCL would use its socket "
                           "transport between nodes", setting, rule);
    return c;
  }
  std::vector<std::string> tried, errors;
  for (const std::string& entry : entries) {
    const std::vector<std::string> names =
        entry.empty() ? std::vector<std::string>{"libnccl-net.so"} : plugin_file_names(entry, version);
    for (const std::string& name : names) {
      const Opened lib = open_library(name);
      if (!lib.handle) {
        tried.push_back(name);
        if (!lib.missing) errors.push_back(lib.error);
        continue;
      }
      int abi = 0;
      for (int v = 12; v >= 2 && !abi; --v)
        if (dlsym(lib.handle, fmt::format("ncclNetPlugin_v{}", v).c_str())) abi = v;
      const std::string file = loaded_file(lib.handle);
      dlclose(lib.handle);
      if (!abi) {
        tried.push_back(name);
        errors.push_back(fmt::format("{} exports no ncclNetPlugin_vN symbol, so NCCL ignores it", file));
        continue;
      }
      c.status = Status::ok;
      c.detail = fmt::format("{}: {} loads {} = {} (ncclNetPlugin_v{})", setting, rule, name, file, abi);
      return c;
    }
  }
  std::string names, why;
  for (const std::string& t : tried) names += (names.empty() ? "" : ", ") + t;
  for (const std::string& e : errors) why += "; " + e;
  std::string hint = found_elsewhere(tried.back());
  // aws-ofi-nccl 1.14 and older install only libnccl-net.so (its src/Makefile.am).
  if (env && *env && hint.empty()) {
    const Opened fallback = open_library("libnccl-net.so");
    if (fallback.handle) {
      hint = fmt::format("; libnccl-net.so loads ({}): unset NCCL_NET_PLUGIN to use it",
                         loaded_file(fallback.handle));
      dlclose(fallback.handle);
    }
  } else if (hint.empty() && tried.back() == "libnccl-net.so") {
    hint = found_elsewhere("libnccl-net-ofi.so");
  }
  c.detail = fmt::format("{}: {} looks for {}, not found: searched {}{}{}; NCCL would use its socket "
                         "transport between nodes",
                         setting, rule, names, loader_search_path(), why, hint);
  return c;
}

// A binary without the CUDA backend refuses train.device = "cuda" at start.
DoctorCheck check_build(bool cuda_built, int expect_gpus) {
  if (cuda_built) return check("build", Status::ok, "CUDA backend built in");
  DoctorCheck c = check("build", expect_gpus > 0 ? Status::fail : Status::ok,
                        expect_gpus > 0 ? "this jumbo was built without -DJUMBO_CUDA=ON: GPUs are "
                                          "expected, and train.device = \"cuda\" would be refused"
                                        : "CPU only (built without -DJUMBO_CUDA=ON)");
  c.fault = DoctorCheck::Fault::software;
  return c;
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
  const std::string path = fmt::format("{}/.jumbo-doctor-{}-{}", dir, host_name(), getpid());
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
  NcclLibrary nccl;
  out.push_back(check_nccl(o.expect_gpus > 0, nccl));
  out.push_back(check_nccl_net(o.expect_efa, o.expect_gpus > 0, nccl));
  out.push_back(check_build(o.cuda_built, o.expect_gpus));
  // A directory that cannot be written is nearly always a path or permission mistake, the
  // same on every node, not a broken node.
  out.push_back(check_storage(o.dir));
  out.back().fault = DoctorCheck::Fault::software;
  out.push_back(check_clock(world, o.max_clock_skew_s));
  return out;
}

std::string format_check(const DoctorCheck& c) {
  return fmt::format("{:<5} {:<10} {}", status_word(c.status), c.name, c.detail);
}

std::string gather_doctor_report(const std::vector<DoctorCheck>& mine, Comm& world, bool* failed) {
  std::string text;  // this rank's lines that rank 0 must see: its warnings and failures
  std::string host;
  std::string node_checks, software_checks;
  for (const DoctorCheck& c : mine) {
    if (c.name == "node") host = c.detail.substr(0, c.detail.find(':'));
    if (c.status != Status::fail) continue;
    std::string& list = c.fault == DoctorCheck::Fault::node ? node_checks : software_checks;
    list += (list.empty() ? "" : ",") + c.name;
  }
  const bool mine_failed = !node_checks.empty() || !software_checks.empty();
  for (const DoctorCheck& c : mine)
    if (c.status == Status::fail || c.status == Status::warn)
      text += fmt::format("{}: {}\n", host, format_check(c));
  // The name Slurm knows the node by (ParallelCluster's differ from host names): what a
  // script drains.
  const char* slurm = std::getenv("SLURMD_NODENAME");
  const std::string failed_line =
      mine_failed ? fmt::format("doctor: failed node={} node-checks={} software-checks={}\n",
                                slurm && *slurm ? slurm : host.c_str(),
                                node_checks.empty() ? "-" : node_checks,
                                software_checks.empty() ? "-" : software_checks)
                  : "";
  const int failures = static_cast<int>(world.all_reduce_scalar(mine_failed ? 1 : 0, ReduceOp::sum));
  if (failed) *failed = failures > 0;
  // Only nodes with something to say send text: one-time, and small. The failed-node line
  // travels after a NUL so that rank 0 can print all of them last.
  std::string payload = text + '\0' + failed_line;
  const std::vector<std::vector<char>> all = world.gather_bytes(
      world.rank() == 0 ? std::vector<char>{} : std::vector<char>(payload.begin(), payload.end()), 0);
  if (world.rank() != 0) return "";
  std::string report, failed_lines = failed_line;
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
