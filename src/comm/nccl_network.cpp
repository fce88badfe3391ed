// NCCL's network on every rank: the per-rank log arranged before NCCL starts, and the count
// and the decision after the communicators exist (comm/nccl_log.h).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "jumbo/comm/comm.h"
#include "jumbo/comm/nccl_log.h"

namespace jumbo {
namespace {

NcclLogSetup& setup_state() {
  static NcclLogSetup s;
  return s;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// The host as NCCL names it in its lines and in %h (src/misc/utils.cc, getHostName with
// delimiter '.'): up to the first '.'.
std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  const std::string full = buf;
  return full.substr(0, full.find('.'));
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// NCCL_DEBUG_SUBSYS lets INIT through ("Using network" is INIT only, src/init.cc): a list
// naming INIT or ALL, or a list after '^' (all but those) that does not name INIT.
bool subsys_has_init(const std::string& value) {
  std::string v = upper(value);
  const bool inverted = !v.empty() && v[0] == '^';
  if (inverted) v.erase(0, 1);
  bool named = false;
  std::stringstream list(v);
  for (std::string item; std::getline(list, item, ',');) {
    if (item == "INIT" || (!inverted && item == "ALL")) named = true;
  }
  return inverted ? !named : named;
}

// One rank's record for rank 0: fields split by the unit separator.
constexpr char kSep = '\x1f';

std::vector<char> encode(int rank, NetTransport t, const std::string& host, const std::string& what,
                         const std::string& path) {
  const std::string s = fmt::format("{}{}{}{}{}{}{}{}{}", rank, kSep, static_cast<int>(t), kSep, host, kSep,
                                    what, kSep, path);
  return {s.begin(), s.end()};
}

struct RankRecord {
  int rank = 0;
  NetTransport transport = NetTransport::unknown;
  std::string host, what, path;
};

RankRecord decode(const std::vector<char>& bytes) {
  std::vector<std::string> f(1);
  for (char c : bytes) {
    if (c == kSep) f.emplace_back();
    else f.back() += c;
  }
  f.resize(5);
  RankRecord r;
  r.rank = std::atoi(f[0].c_str());
  r.transport = static_cast<NetTransport>(std::atoi(f[1].c_str()));
  r.host = f[2];
  r.what = f[3];
  r.path = f[4];
  return r;
}

// At most this many hosts are named in a line; 1024 ranks must not make a page of it.
constexpr size_t kMaxHostsNamed = 8;

// "p4d-st-3 (ranks 40..47: socket (Socket; ...); log p4d-st-3:/tmp/...)", a host per entry.
std::string hosts_text(const std::vector<RankRecord>& off) {
  struct Host {
    const RankRecord* first = nullptr;
    int ranks = 0;
  };
  std::vector<std::string> order;
  std::map<std::string, Host> hosts;
  for (const RankRecord& r : off) {
    Host& h = hosts[r.host];
    if (!h.first) {
      h.first = &r;
      order.push_back(r.host);
    }
    ++h.ranks;
  }
  std::string out;
  for (size_t i = 0; i < order.size() && i < kMaxHostsNamed; ++i) {
    const Host& h = hosts[order[i]];
    out += fmt::format("{}{} (rank {}{}: {}; NCCL's log {}:{})", i ? ", " : "", order[i], h.first->rank,
                       h.ranks > 1 ? fmt::format(" and {} more", h.ranks - 1) : "", h.first->what, order[i],
                       h.first->path.empty() ? "(its stdout)" : h.first->path);
  }
  if (order.size() > kMaxHostsNamed) out += fmt::format(" and {} more hosts", order.size() - kMaxHostsNamed);
  return out;
}

}  // namespace

const NcclLogSetup& nccl_log_setup() { return setup_state(); }

const NcclLogSetup& capture_nccl_log(int rank) {
  NcclLogSetup& s = setup_state();
  if (!s.configured) s = arrange_nccl_log(rank);
  return s;
}

NcclLogSetup arrange_nccl_log(int rank) {
  NcclLogSetup s;
  s.configured = true;
  std::vector<std::string> kept;
  const std::string debug = env_or_empty("NCCL_DEBUG");
  if (debug.empty()) {
    setenv("NCCL_DEBUG", "INFO", 1);
  } else {
    const std::string level = upper(debug);
    const bool info = level == "INFO" || level == "TRACE";
    if (!info) s.can_prove = false;
    kept.push_back(fmt::format("NCCL_DEBUG={}{}", debug, info ? "" : " (it hides the INFO lines that name the network)"));
  }
  const std::string subsys = env_or_empty("NCCL_DEBUG_SUBSYS");
  if (subsys.empty()) {
    setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
  } else {
    const bool init = subsys_has_init(subsys);
    if (!init) s.can_prove = false;
    kept.push_back(fmt::format("NCCL_DEBUG_SUBSYS={}{}", subsys, init ? "" : " (it leaves out INIT, which names the network)"));
  }
  std::string file = env_or_empty("NCCL_DEBUG_FILE");
  if (file.empty()) {
    std::string dir = env_or_empty("JUMBO_NCCL_LOG_DIR");
    std::error_code ec;
    if (dir.empty()) dir = std::filesystem::temp_directory_path(ec).string();
    if (dir.empty()) dir = "/tmp";
    std::filesystem::create_directories(dir, ec);  // NCCL logs to stdout if it cannot open the file
    file = (std::filesystem::path(dir) / fmt::format("jumbo-nccl.rank{}.%h.%p.log", rank)).string();
    setenv("NCCL_DEBUG_FILE", file.c_str(), 1);
  } else {
    kept.push_back(fmt::format("NCCL_DEBUG_FILE={}", file));
  }
  s.path = expand_nccl_debug_file(file, host_name(), static_cast<int>(getpid()));
  for (size_t i = 0; i < kept.size(); ++i) s.kept += (i ? ", " : "") + kept[i];
  if (!s.kept.empty()) s.kept += " (set before jumbo started: kept)";
  return s;
}

NcclNetCensus check_nccl_network(Comm& world, ExpectNetwork expected) {
  const NcclLogSetup& s = nccl_log_setup();
  NcclNetReport mine;
  std::ifstream in(s.path);
  if (s.path.empty() || !in) {
    mine.notes.push_back(s.path.empty() ? "capture_nccl_log did not run" : "no NCCL log at " + s.path);
  } else {
    std::stringstream text;
    text << in.rdbuf();
    mine = parse_nccl_log(text.str(), static_cast<int>(getpid()));
  }
  std::string kept = s.kept;
  if (!s.can_prove) kept += "; so NCCL's network cannot be proven: unset them";
  return check_nccl_network(world, expected, mine, s.path, kept);
}

NcclNetCensus check_nccl_network(Comm& world, ExpectNetwork expected, const NcclNetReport& mine,
                                 const std::string& log_path, const std::string& kept) {
  const std::string host = mine.host.empty() ? host_name() : mine.host;
  std::string what = describe(mine);
  if (mine.networks.empty() && !mine.notes.empty()) what += "; " + mine.notes.front();
  const auto gathered = world.gather_bytes(encode(world.rank(), mine.transport, host, what, log_path), 0);
  NcclNetCensus census;
  census.ranks = world.size();
  std::vector<char> refusal;
  if (world.rank() == 0) {
    std::vector<RankRecord> ranks;
    for (const auto& bytes : gathered) ranks.push_back(decode(bytes));
    std::map<NetTransport, int> counts;
    for (const RankRecord& r : ranks) ++counts[r.transport];
    census.counts.assign(counts.begin(), counts.end());
    // With expect_network = any the hosts that differ are those off the most common network.
    NetTransport usual = ranks.front().transport;
    for (const auto& [t, n] : counts)
      if (n > counts[usual]) usual = t;
    std::vector<RankRecord> off;
    for (const RankRecord& r : ranks) {
      const bool ok = expected == ExpectNetwork::any ? r.transport == usual : meets(r.transport, expected);
      if (!ok) off.push_back(r);
    }
    std::string tally;
    for (const auto& [t, n] : census.counts)
      tally += fmt::format("{}{} {}", tally.empty() ? "" : ", ", n, to_string(t));
    const RankRecord& shown = ranks.front();
    census.line = fmt::format("NCCL network on {} ranks: {}; rank 0: {}; its NCCL log {}:{}", ranks.size(), tally,
                              shown.what, shown.host, shown.path.empty() ? "(its stdout)" : shown.path);
    if (!off.empty()) {
      census.line += fmt::format("; not {}: {}", expected == ExpectNetwork::any ? to_string(usual) : to_string(expected),
                                 hosts_text(off));
    }
    if (!kept.empty()) census.line += "; " + kept;
    census.line += fmt::format(" (comm.expect_network = {})", to_string(expected));
    if (expected != ExpectNetwork::any && !off.empty()) {
      std::string chose;
      std::map<NetTransport, int> off_counts;
      for (const RankRecord& r : off) ++off_counts[r.transport];
      for (const auto& [t, n] : off_counts) {
        chose += fmt::format("{}{} on {}", chose.empty() ? "" : ", ",
                             t == NetTransport::unknown ? "a network its log does not name" : to_string(t), n);
      }
      const std::string line = fmt::format(
          "comm.expect_network = {}, but NCCL chose {} of {} ranks: {}{}", to_string(expected), chose, ranks.size(),
          hosts_text(off), kept.empty() ? "" : "; " + kept);
      refusal.assign(line.begin(), line.end());
    }
  }
  world.broadcast_bytes(refusal, 0);
  census.refusal.assign(refusal.begin(), refusal.end());
  return census;
}

}  // namespace jumbo
