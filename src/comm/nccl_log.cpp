// NCCL's INFO log, read for the network it chose. The lines and where NCCL and aws-ofi-nccl
// print them (NVIDIA/nccl at v2.18.3-1, v2.19.3-1, v2.21.5-1, v2.23.4-1 and v2.30.7-1;
// aws/aws-ofi-nccl at v1.7.4-aws, v1.11.0-aws, v1.14.0, v1.18.0 and master):
//
// - Every line: "host:pid:tid [cudaDev] NCCL INFO <message>", the hostname cut at its first
//   '.'; WARN lines "host:pid:tid [dev] file:line (func) NCCL WARN <message>" (2.18:
//   without "(func)"). Since 2.23 a timestamp "[%F %T] " may come first
//   (NCCL_DEBUG_TIMESTAMP_LEVELS; WARN lines by default). src/debug.cc, ncclDebugLog.
// - "Using network %s" with the ncclNet's name: every version, once per communicator,
//   src/init.cc, commAlloc (2.18 to 2.30), subsystem INIT only. The internal
//   transports are named "IB" (src/transport/net_ib.cc, later net_ib/common.cc) and
//   "Socket" (src/transport/net_socket.cc). This is the line that decides.
// - aws-ofi-nccl names itself "AWS Libfabric" up to v1.12 and "Libfabric" from v1.13, or
//   "OFI"/"AWS Libfabric" when NCCL_NET asks so (src/nccl_ofi_interface_nvidia.cpp,
//   nvidia_plugin_name_fixup). Its lines go through NCCL's logger with "NET/OFI " in front
//   (include/nccl_ofi_log.h, NCCL_OFI_INFO): "NET/OFI Initializing aws-ofi-nccl 1.14.0"
//   (src/nccl_ofi_net.c(pp), nccl_net_ofi_create_plugin; PACKAGE_STRING) and
//   "NET/OFI Selected Provider is efa (found 4 nics)" (<= v1.13) or "NET/OFI Selected
//   provider is efa, fabric is efa (found 4 nics)" (v1.14 on;
//   nccl_net_ofi_query_provider_capabilities). Only "efa" is EFA.
// - Why a plugin was not used, all at INFO (the job ran with NCCL_DEBUG=WARN and saw none):
//   2.18 src/net.cc ncclNetPluginInit: "NET/Plugin : Plugin load (%s) returned %d : %s",
//   "NET/Plugin : No plugin found, using internal implementation"; 2.19: "NET/Plugin :
//   dlerror=%s No plugin found (%s), using internal implementation", "NET/Plugin : Plugin load
//   returned %d : %s."; 2.21: "NET/Plugin: No plugin found (%s)", "NET/Plugin: Plugin load
//   returned %d : %s when loading %s"; 2.23: "NET/Plugin: Could not find: %s. Using internal
//   network plugin."; 2.30 src/plugin/plugin_open.cc openPluginLib: "NET/Plugin: %s: %s"
//   (library: dlerror) and "NET/Plugin: Could not find: %s", src/plugin/net.cc: "External
//   network plugin %s is unsupported", "Failed to initialize NET plugin %s"; every version:
//   "NET/Plugin: Failed to find ncclNetPlugin_v%d symbol." (NCCL tries its newest version
//   first, so this line is harmless when a "Loaded net plugin" follows) and the internal IB
//   transport's "NET/IB : No device found." (no verbs device: EFA is not one NCCL's IB uses).
#include "jumbo/comm/nccl_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace jumbo {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  return s;
}

// One NCCL line split into its prefix's host and pid, its level and message.
struct NcclLine {
  std::string_view host;
  int pid = 0;
  bool warn = false;
  std::string_view message;
};

bool split_line(std::string_view line, NcclLine& out) {
  size_t at = line.find(" NCCL INFO ");
  size_t skip = 11;
  out.warn = false;
  if (at == std::string_view::npos) {
    at = line.find(" NCCL WARN ");
    if (at == std::string_view::npos) return false;
    out.warn = true;
  }
  out.message = trim(line.substr(at + skip));
  std::string_view prefix = line.substr(0, at);
  if (starts_with(prefix, "[")) {  // "[2026-12-02 16:01:02] " (NCCL_DEBUG_TIMESTAMP_FORMAT)
    const size_t end = prefix.find("] ");
    if (end != std::string_view::npos) prefix.remove_prefix(end + 2);
  }
  prefix = trim(prefix);
  const size_t colon = prefix.find(':');
  if (colon == std::string_view::npos) return true;
  out.host = prefix.substr(0, colon);
  const std::string_view rest = prefix.substr(colon + 1);
  std::from_chars(rest.data(), rest.data() + rest.size(), out.pid);
  return true;
}

NetTransport transport_of(std::string_view network, std::string_view provider) {
  if (iequals(network, "Socket")) return NetTransport::socket;
  if (iequals(network, "IB")) return NetTransport::ib;
  if (contains(network, "Libfabric") || iequals(network, "OFI"))
    return provider == "efa" ? NetTransport::efa : NetTransport::ofi_other;
  return NetTransport::unknown;
}

// Lower is weaker: a rank whose communicators used two networks is as good as the worse.
int strength(NetTransport t) {
  switch (t) {
    case NetTransport::socket: return 0;
    case NetTransport::unknown: return 1;
    case NetTransport::ofi_other: return 2;
    case NetTransport::ib: return 3;
    case NetTransport::efa: return 4;
  }
  return 1;
}

// A line that says why NCCL did not use a net plugin (see the list at the top).
bool is_fallback_note(std::string_view m) {
  if (starts_with(m, "NET/Plugin")) {
    for (std::string_view normal : {"Loaded net plugin", "Loaded coll", "CollNet", "Plugin name set by env",
                                    "Closing", "NCCL_NET_PLUGIN"})
      if (contains(m, normal)) return false;
    return true;
  }
  return starts_with(m, "External network plugin") || starts_with(m, "Failed to initialize NET plugin") ||
         starts_with(m, "NET/IB : No device found");
}

}  // namespace

const char* to_string(NetTransport t) {
  switch (t) {
    case NetTransport::unknown: return "unknown";
    case NetTransport::socket: return "socket";
    case NetTransport::ib: return "ib";
    case NetTransport::efa: return "efa";
    case NetTransport::ofi_other: return "ofi-other";
  }
  return "unknown";
}

NcclNetReport parse_nccl_log(std::string_view text, int pid) {
  NcclNetReport r;
  bool plugin_loaded = false;
  std::vector<std::string> notes;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view raw = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    NcclLine line;
    if (!split_line(raw, line)) continue;
    if (pid > 0 && line.pid != 0 && line.pid != pid) continue;
    if (r.host.empty() && !line.host.empty()) r.host = std::string(line.host);
    const std::string_view m = line.message;
    if (line.warn) {
      if (r.warn_lines++ == 0) r.first_warn = std::string(m);
      continue;
    }
    ++r.info_lines;
    if (starts_with(m, "Using network ")) {
      const std::string name(trim(m.substr(14)));
      if (std::find(r.networks.begin(), r.networks.end(), name) == r.networks.end())
        r.networks.push_back(name);
    } else if (starts_with(m, "NET/OFI Initializing ")) {
      r.plugin = std::string(trim(m.substr(21)));
    } else if (starts_with(m, "NET/OFI Selected Provider is ") || starts_with(m, "NET/OFI Selected provider is ")) {
      std::string_view rest = m.substr(29);
      r.provider = std::string(rest.substr(0, rest.find_first_of(", ")));
      const size_t found = rest.find("(found ");
      if (found != std::string_view::npos) {
        rest.remove_prefix(found + 7);
        std::from_chars(rest.data(), rest.data() + rest.size(), r.nics);
      }
    } else if (starts_with(m, "NET/Plugin") && contains(m, "Loaded net plugin")) {
      plugin_loaded = true;
    } else if (is_fallback_note(m)) {
      notes.emplace_back(m);
    }
  }
  for (const std::string& note : notes) {
    // NCCL looks for its newest plugin interface first; a loaded older one is no failure.
    if (plugin_loaded && contains(note, "Failed to find ncclNetPlugin_v")) continue;
    if (r.notes.size() < NcclNetReport::kMaxNotes) r.notes.push_back(note);
  }
  for (size_t i = 0; i < r.networks.size(); ++i) {
    const NetTransport t = transport_of(r.networks[i], r.provider);
    if (i == 0 || strength(t) < strength(r.transport)) r.transport = t;
  }
  return r;
}

bool meets(NetTransport t, ExpectNetwork expected) {
  switch (expected) {
    case ExpectNetwork::any: return true;
    case ExpectNetwork::efa: return t == NetTransport::efa;
    case ExpectNetwork::ib: return t == NetTransport::ib;
    case ExpectNetwork::socket: return t == NetTransport::socket;
  }
  return false;
}

std::string describe(const NcclNetReport& r) {
  if (r.networks.empty()) {
    std::string out = fmt::format("unknown (no \"Using network\" line among {} NCCL INFO lines", r.info_lines);
    if (r.warn_lines > 0) out += fmt::format("; {} WARN lines, the first: {}", r.warn_lines, r.first_warn);
    return out + ")";
  }
  std::string out = fmt::format("{} (", to_string(r.transport));
  for (size_t i = 0; i < r.networks.size(); ++i) out += (i ? "/" : "") + r.networks[i];
  if (!r.provider.empty()) out += ", provider " + r.provider;
  if (r.nics >= 0) out += fmt::format(", {} nics", r.nics);
  if (!r.plugin.empty()) out += ", " + r.plugin;
  if (r.transport != NetTransport::efa && r.transport != NetTransport::ib) {
    for (const std::string& note : r.notes) out += "; " + note;
  }
  return out + ")";
}

std::string expand_nccl_debug_file(std::string_view pattern, std::string_view host, int pid) {
  std::string h(host.substr(0, host.find('.')));
  std::replace_if(h.begin(), h.end(), [](char c) { return c == '%' || c == '/'; }, '-');
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char c = pattern[++i];
    if (c == '%') out += '%';
    else if (c == 'h') out += h;
    else if (c == 'p') out += std::to_string(pid);
    else out += {'%', c};
  }
  return out;
}

}  // namespace jumbo
