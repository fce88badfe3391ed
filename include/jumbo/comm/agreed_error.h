#pragma once
// AgreedError: a user-facing failure that every rank of the world throws at the same point of
// the program, after the ranks agreed on it through a collective (first_error, rank 0's
// broadcast verdict, an all-reduced loss). Any other exception is one rank's own.
//
// The rule for every error that crosses ranks (docs/architecture.md, "Failures"): the ranks
// agree on the failure before any buffer a peer may touch is freed. Unwinding waits for this
// rank's non-blocking operations (GradSync's destructor drains its bucket reductions and
// weight gathers before the model's buffers go), and cli/main.cpp ends a job that failed with
// an AgreedError without MPI_Abort: every rank prints (or, `quiet`, leaves to the rank that
// found the failure) its one line, meets the others in a barrier the watchdog guards, and
// leaves through MPI_Finalize with exit 2. No rank is killed while a peer still reads from
// or writes into its memory. One rank's own exception still aborts the job (after its own
// unwinding has drained what it started).
#include <string>

#include "jumbo/config/config.h"

namespace jumbo {

struct AgreedError : UserError {
  // quiet: another rank prints the line (the same failure, said once).
  explicit AgreedError(const std::string& what, bool quiet = false)
      : UserError(what), quiet(quiet) {}
  bool quiet;
};

}  // namespace jumbo
