#pragma once
// MPI's names for jumbo's dtypes and reductions, shared by MpiComm and its rings (bf16 has
// no MPI type: it travels as 16-bit words and is summed by a user op that adds in fp32).
#include <mpi.h>

#include "jumbo/backend/tensor.h"
#include "jumbo/comm/comm.h"

namespace jumbo {

MPI_Datatype mpi_type(DType t);
MPI_Op mpi_op(DType t, ReduceOp op);

}  // namespace jumbo
