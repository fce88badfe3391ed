// The node-local checks of `jumbo doctor`: plain functions, no MPI. src/obs/doctor.cpp runs
// the ones that can hang in child processes under a timeout.
#include "doctor_checks.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <rdma/fabric.h>
#include <strings.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "jumbo/comm/grid.h"
#include "jumbo/obs/metrics.h"

namespace jumbo {

// NCCL's plugin loader, per release (NVIDIA/nccl, read at the tags named): it dlsym()s
// "ncclNetPlugin_vN" from the newest version it knows down to the oldest and uses the first
// it finds; a plugin exporting only other versions is ignored (NCCL INFO "NET/Plugin: Failed
// to find ncclNetPlugin_v6 symbol", and the socket transport is used).
//   2.13-2.18  v6..v4   src/net.cc (v2.13.4-1, v2.18.6-1)
//   2.19       v7..v5   src/net.cc (v2.19.3-1)
//   2.20-2.23  v8..v5   src/net.cc (v2.21.5-1, v2.23.4-1)
//   2.24-2.25  v9..v5   src/net.cc (v2.24.3-1)
//   2.26-2.27  v10..v6  src/plugin/net.cc + src/plugin/net/net_v*.cc (v2.26.2-1, v2.27.7-1)
//   2.28-2.29  v11..v6  src/plugin/net.cc, ncclNetVersion[] (v2.28.9-1)
//   2.30       v12..v6  src/plugin/net.cc, ncclNetVersion[] = {12, ..., 6} (v2.30.7-1)
NetPluginRange nccl_net_plugin_range(int v) {
  if (v == 0 || v >= 23000) return {6, 12};
  if (v >= 22800) return {6, 11};
  if (v >= 22600) return {6, 10};
  if (v >= 22400) return {5, 9};
  if (v >= 22000) return {5, 8};
  if (v >= 21900) return {5, 7};
  return {4, 6};
}

// EFA interfaces per instance type (AWS "Supported instance types" for EFA / the instance
// pages: p4d and p4de 4 x 100 Gbps, p5 and p5e 32 x 100 Gbps). Others: not known here.
int efa_devices_expected(std::string_view type) {
  if (type == "p4d.24xlarge" || type == "p4de.24xlarge") return 4;
  if (type == "p5.48xlarge" || type == "p5e.48xlarge") return 32;
  return 0;
}

// Each RDMA device is /sys/class/infiniband/NAME, its device/driver a link to the driver
// bound to it (the EFA kernel module registers as "efa": amzn-drivers kernel/linux/efa).
int count_efa_devices(const std::string& class_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(class_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path driver = fs::read_symlink(it->path() / "device" / "driver", ec);
    if (!ec && driver.filename() == "efa") ++n;
    ec.clear();
  }
  return n;
}

namespace doctor {
namespace {

using Status = DoctorCheck::Status;

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

// The instance type: given, else DMI's product name on EC2 (Nitro instances report their
// type there, and sys_vendor "Amazon EC2"); the metadata service is not asked: a doctor must
// not wait on the network.
std::string instance_type_of_node(const std::string& given, std::string* source) {
  if (!given.empty()) {
    *source = "--instance-type";
    return given;
  }
  *source = "/sys/devices/virtual/dmi/id/product_name";
  if (read_line("/sys/devices/virtual/dmi/id/sys_vendor") != "Amazon EC2") return "";
  return read_line(*source);
}

}  // namespace

DoctorCheck make_check(std::string name, Status status, std::string detail, DoctorCheck::Fault fault) {
  return {std::move(name), status, std::move(detail), fault};
}

DoctorCheck check_node() {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const double memory =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const char* slurm = std::getenv("SLURMD_NODENAME");
  return make_check("node", Status::ok,
                    fmt::format("{}: {} CPUs, {} memory{}", host_name(), cpus, human_bytes(memory, 1),
                                slurm && *slurm ? fmt::format(", Slurm node {}", slurm) : ""));
}

// Every provider fi_getinfo offers on this node; efa is the one NCCL must use on p4d/p5, over
// as many EFA devices as the instance type has (one missing: a quarter of p4d's bandwidth).
DoctorCheck check_libfabric(bool expect_efa, const std::string& given_type) {
  fi_info* info = nullptr;
  const int rc = fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, nullptr, &info);
  const uint32_t v = fi_version();
  const std::string version = fmt::format("libfabric {}.{}", FI_MAJOR(v), FI_MINOR(v));
  if (rc != 0 || !info) {
    if (info) fi_freeinfo(info);
    const char* provider = std::getenv("FI_PROVIDER");  // it restricts fi_getinfo's search
    return make_check("libfabric", expect_efa ? Status::fail : Status::warn,
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
  if (!efa) {
    return make_check("libfabric", expect_efa ? Status::fail : Status::ok,
                      fmt::format("{}: providers {}; no efa{}", version, list,
                                  expect_efa ? ": inter-node traffic would crawl over TCP; is the EFA "
                                               "driver loaded and the instance EFA-enabled?"
                                             : " (not expected)"));
  }
  std::string source;
  const std::string type = instance_type_of_node(given_type, &source);
  const int want = efa_devices_expected(type);
  const int have = count_efa_devices("/sys/class/infiniband");
  const std::string devices = fmt::format(
      "{} EFA device{} in /sys/class/infiniband{}", have, have == 1 ? "" : "s",
      type.empty() ? " (instance type unknown: pass --instance-type to require a count)"
      : want == 0  ? fmt::format(" ({}: no expected count known)", type)
                   : fmt::format(", {} has {} ({})", type, want, source));
  if (expect_efa && want > 0 && have < want) {
    return make_check("libfabric", Status::fail,
                      fmt::format("{}: providers {}; efa present but only {}: a device is missing "
                                  "or its driver is not bound",
                                  version, list, devices));
  }
  return make_check("libfabric", Status::ok,
                    fmt::format("{}: providers {}; efa present, {}", version, list, devices));
}

// The driver API through dlopen: no CUDA headers or libraries at build time.
DoctorCheck check_gpus(int expect) {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda) {
    return make_check("gpu", expect > 0 ? Status::fail : Status::skip,
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
    return make_check("gpu", expect > 0 ? Status::fail : Status::warn,
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
  return make_check("gpu", ok ? Status::ok : Status::fail,
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

DoctorCheck check_nccl(bool expect_gpus, NcclLibrary& out) {
  const Opened lib = open_library("libnccl.so.2");
  if (!lib.handle) {
    DoctorCheck c = make_check("nccl", expect_gpus ? Status::fail : Status::skip,
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
  DoctorCheck c = make_check("nccl", Status::ok, fmt::format("{} from {}", out.text, file));
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
  const NetPluginRange range = nccl_net_plugin_range(version);
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
  DoctorCheck c = make_check("nccl-net", missing_status, "");
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
      // NCCL tries its versions newest first and takes the first symbol it finds.
      int abi = 0, outside = 0;
      for (int v = range.newest; v >= range.oldest && !abi; --v)
        if (dlsym(lib.handle, fmt::format("ncclNetPlugin_v{}", v).c_str())) abi = v;
      for (int v = 20; v >= 1 && !abi && !outside; --v)
        if (dlsym(lib.handle, fmt::format("ncclNetPlugin_v{}", v).c_str())) outside = v;
      const std::string file = loaded_file(lib.handle);
      dlclose(lib.handle);
      if (!abi) {
        tried.push_back(name);
        errors.push_back(
            outside ? fmt::format("{} exports ncclNetPlugin_v{}, outside the v{} to v{} {} looks for, "
                                  "so NCCL ignores it", file, outside, range.oldest, range.newest, rule)
                    : fmt::format("{} exports no ncclNetPlugin_vN symbol, so NCCL ignores it", file));
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
  if (cuda_built) return make_check("build", Status::ok, "CUDA backend built in");
  DoctorCheck c = make_check("build", expect_gpus > 0 ? Status::fail : Status::ok,
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
  if (dir.empty()) return make_check("storage", Status::skip, "no --dir given");
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path = fmt::format("{}/.jumbo-doctor-{}-{}", dir, host_name(), getpid());
  std::vector<char> data(4 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) {
    return make_check("storage", Status::fail,
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
    return make_check("storage", Status::fail,
                 fmt::format("{}: writing 4 MiB failed: {}", dir, std::strerror(write_errno)));
  if (!read_ok)
    return make_check("storage", Status::fail, fmt::format("{}: 4 MiB read back differ", dir));
  const fs::space_info space = fs::space(dir, ec);
  return make_check("storage", Status::ok,
               fmt::format("{} ({}) writable: 4 MiB written and fsynced at {}/s, {} free", dir,
                           fs_type(dir), human_bytes(4.0 * (1 << 20) / std::max(seconds, 1e-6), 0),
                           human_bytes(static_cast<double>(space.available), 1)));
}


// DCGM's quick diagnostic (`dcgmi diag -r 1`: deployment and software checks of every GPU,
// seconds), where DCGM is installed; it talks to nv-hostengine, which must be running.
DoctorCheck check_dcgm(int expect_gpus) {
  namespace fs = std::filesystem;
  std::string dcgmi;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t start = 0; start <= dirs.size() && dcgmi.empty();) {
    const size_t colon = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, colon - start) + "/dcgmi";
    if (colon > start && access(candidate.c_str(), X_OK) == 0) dcgmi = candidate;
    start = colon + 1;
  }
  if (dcgmi.empty()) return make_check("dcgm", Status::skip, "dcgmi not installed: DCGM diagnostic skipped");
  if (expect_gpus == 0) return make_check("dcgm", Status::skip, fmt::format("{} present; no GPUs expected", dcgmi));
  const std::string command = fmt::format("'{}' diag -r 1 2>&1", dcgmi);
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return make_check("dcgm", Status::warn, fmt::format("cannot start {}: {}", command, std::strerror(errno)));
  std::string output, failed_line;
  std::array<char, 512> buffer{};
  while (fgets(buffer.data(), buffer.size(), pipe)) {
    std::string line = buffer.data();
    while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
    if (failed_line.empty() && (line.find("Fail") != std::string::npos || line.find("Error") != std::string::npos))
      failed_line = line;
    output += line + " ";
  }
  const int status = pclose(pipe);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 0) return make_check("dcgm", Status::ok, fmt::format("{} diag -r 1 passed", dcgmi));
  // "Unable to establish a connection": nv-hostengine is not running, a setting, not the GPUs.
  if (output.find("host engine") != std::string::npos || output.find("hostengine") != std::string::npos)
    return make_check("dcgm", Status::warn,
                      fmt::format("{} diag -r 1 could not reach nv-hostengine (exit {}): {}", dcgmi, code,
                                  output.substr(0, 200)));
  return make_check("dcgm", Status::fail,
                    fmt::format("{} diag -r 1 failed (exit {}): {}", dcgmi, code,
                                (failed_line.empty() ? output : failed_line).substr(0, 300)));
}

}  // namespace doctor
}  // namespace jumbo
