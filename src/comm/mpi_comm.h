#pragma once
// MpiComm's point-to-point rules, for NcclRulesComm (comm.emulate = nccl).
#include <memory>

#include "jumbo/comm/comm.h"

namespace jumbo {

// mpi: MPI's own (buffered sends, matching by tag). nccl: NCCL's, where stricter: a send
// completes only once the peer posted its receive, tags are ignored (messages between two
// ranks match in posting order), and a receive must get exactly the bytes it posted.
enum class P2pRules { mpi, nccl };

// A duplicate of the MPI communicator `mpi` (an MpiComm; collective over its ranks) with
// NCCL's point-to-point rules: the "device" side of an emulated NCCL communicator.
std::shared_ptr<Comm> duplicate_with_nccl_p2p(Comm& mpi);

}  // namespace jumbo
