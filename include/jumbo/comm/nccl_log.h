#pragma once
// Which network NCCL chose, read from NCCL's own INFO log: NCCL has no API that says it (its
// ncclConfig_t.netName only asks for one), and a net plugin that fails to load is reported at
// INFO only, after which NCCL falls back to its IB or socket transport without a warning.
//
// make_nccl_comm asks NCCL for its INIT and NET lines in one file per rank (capture_nccl_log,
// before this process's first NCCL call); the trainer, once its communicators exist, parses
// each rank's file, counts the ranks per network on rank 0 and refuses to train when
// [comm] expect_network is not met (check_nccl_network). Everything here but the file NCCL
// writes runs without NCCL: the MPI tests hand each rank a log of real NCCL lines.
#include <string>
#include <string_view>
#include <vector>

#include "jumbo/config/config.h"

namespace jumbo {

class Comm;

// The transport behind NCCL's "Using network <name>": aws-ofi-nccl over the EFA provider,
// aws-ofi-nccl over another libfabric provider (tcp, or none named in the log), NCCL's
// internal IB verbs transport, its internal sockets; unknown when no line says.
enum class NetTransport { unknown, socket, ib, efa, ofi_other };
const char* to_string(NetTransport t);

// What one process's NCCL log says about its network.
struct NcclNetReport {
  std::string host;                   // from the lines' "host:pid:tid" prefix
  std::vector<std::string> networks;  // distinct "Using network" names, first seen first
  NetTransport transport = NetTransport::unknown;  // the weakest of `networks`
  std::string provider;               // aws-ofi-nccl "Selected provider is efa"
  int nics = -1;                      // "... (found 4 nics)"
  std::string plugin;                 // "aws-ofi-nccl 1.14.0" ("NET/OFI Initializing ...")
  std::vector<std::string> notes;     // why a plugin was not used (at most kMaxNotes)
  int info_lines = 0, warn_lines = 0;
  std::string first_warn;
  static constexpr size_t kMaxNotes = 3;
};

// Parses NCCL log text (NCCL_DEBUG_FILE or its stdout). `pid` > 0 keeps only that process's
// lines (a NCCL_DEBUG_FILE without %p is shared by every rank of a host).
NcclNetReport parse_nccl_log(std::string_view text, int pid = 0);
// transport meets what [comm] expect_network asks for.
bool meets(NetTransport t, ExpectNetwork expected);
// "efa (Libfabric, aws-ofi-nccl 1.14.0, 4 nics)", "socket (Socket; NET/Plugin: Could not ...)"
std::string describe(const NcclNetReport& r);

// NCCL_DEBUG_FILE's expansion as NCCL does it (src/debug.cc, ncclDebugInit): %h = the host
// name up to its first '.', with '%' and '/' made '-'; %p = the pid; %% = '%'; any other
// %x stays as it is.
std::string expand_nccl_debug_file(std::string_view pattern, std::string_view host, int pid);

// How this process's NCCL log was arranged: what jumbo set, what the user had set and was
// kept, and the file this process's NCCL writes.
struct NcclLogSetup {
  bool configured = false;  // capture_nccl_log ran
  std::string path;         // NCCL_DEBUG_FILE expanded for this process; "" = NCCL's stdout
  std::string kept;         // "NCCL_DEBUG=WARN (yours) ..." or ""
  bool can_prove = true;    // the settings let INIT lines with "Using network" through
};
// Before this process's first NCCL call: NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET and
// NCCL_DEBUG_FILE=<dir>/jumbo-nccl.rank<R>.%h.%p.log, each unless already set (then kept,
// and said). dir: JUMBO_NCCL_LOG_DIR, else the temporary directory (TMPDIR, else /tmp).
// NCCL reads them once per process: the first call arranges, later ones return its setup.
const NcclLogSetup& capture_nccl_log(int rank);
// What capture_nccl_log does on its first call, every time (for tests of the settings).
NcclLogSetup arrange_nccl_log(int rank);
const NcclLogSetup& nccl_log_setup();  // what capture_nccl_log did (configured = false: nothing)

// The network of every rank of `world`, read from each rank's NCCL log (the file
// capture_nccl_log arranged), counted on rank 0. Collective over `world`.
struct NcclNetCensus {
  std::vector<std::pair<NetTransport, int>> counts;  // ranks per transport, in enum order
  int ranks = 0;
  std::string line;     // rank 0: "NCCL network: 16 of 16 ranks efa (...)"; others: ""
  std::string refusal;  // every rank: "" or the one line that refuses to train
};
NcclNetCensus check_nccl_network(Comm& world, ExpectNetwork expected);
// The same for a report already parsed (what check_nccl_network does after reading the file).
NcclNetCensus check_nccl_network(Comm& world, ExpectNetwork expected, const NcclNetReport& mine,
                                 const std::string& log_path, const std::string& kept);

}  // namespace jumbo
