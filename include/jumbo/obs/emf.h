#pragma once
// CloudWatch Embedded Metric Format (EMF): one JSON object per line that the CloudWatch agent
// turns into metrics, read from a file it tails (log.emf_file) or sent to its EMF endpoint
// (log.emf_address). Metric names, units and dimensions: docs/metrics.md, "EMF".
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "jumbo/config/config.h"
#include "jumbo/obs/metrics.h"

namespace jumbo {

// One EMF object (no trailing newline) in namespace `ns` with dimensions RunName and Layout.
// Non-finite values are left out of both the declaration and the values of this line.
std::string emf_line(const StepMetrics& m, const std::string& ns, const std::string& run_name,
                     const std::string& layout, int64_t timestamp_ms);

// The Layout dimension: "tp2-pp2-dp1".
std::string emf_layout(int64_t tp, int64_t pp, int64_t dp);
// The RunName dimension: log.run_name, else the config file's name without directory and
// extension ("inputs/runs/j1-jumbo.toml" -> "j1-jumbo"; the embedded demo -> "embedded-demo").
std::string emf_run_name(const RunConfig& cfg);

class EmfSocket;  // the connection to log.emf_address (emf.cpp)

// Writes emf_line() for each call of write() to log.emf_file and/or log.emf_address.
// The file is a user-facing output: an unopenable file is a UserError. The socket is
// best effort: an agent that is down, slow or gone never stops or stalls training; lines it
// cannot take are dropped and counted, with one warning line on stderr per outage.
class EmfLog {
 public:
  // Throws UserError for an unopenable log.emf_file or an unusable run name.
  EmfLog(const LogConfig& log, std::string run_name, std::string layout);
  ~EmfLog();
  EmfLog(const EmfLog&) = delete;
  EmfLog& operator=(const EmfLog&) = delete;

  // Timestamped now. Returns within about a second whatever the agent does.
  void write(const StepMetrics& m);
  // Lines log.emf_address did not take (unreachable agent, full socket buffer).
  int64_t dropped() const;

 private:
  std::string namespace_, run_name_, layout_, file_path_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<EmfSocket> socket_;
};

}  // namespace jumbo
