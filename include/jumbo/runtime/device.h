#pragma once
// Which backend and communicators a run uses (train.device): the CPU backend with MPI, or
// the CUDA backend on this rank's GPU with NCCL communicators bootstrapped over MPI.
#include <memory>
#include <string>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/model/stage.h"

namespace jumbo {

// This process's index among the ranks on its node, from the launcher:
// OMPI_COMM_WORLD_LOCAL_RANK (mpirun), SLURM_LOCALID (srun), MPI_LOCALRANKID, else 0.
int local_rank_from_launcher();
// The CPU backend, or the CUDA backend on the local rank's GPU (one rank per GPU). Throws
// UserError naming train.device when the build or the machine cannot provide it.
std::unique_ptr<Backend> make_backend(Device device);
// Refuses, with one line naming train.device and the model's keys, a run whose stage (its
// options from the stage plan) the kernels of `device` cannot run: an unsupported attention
// head size on the GPU, a CUDA run in a CPU-only build. Needs no device: `jumbo train` asks
// before it opens one.
void check_device_supports(const RunConfig& cfg, const StageOptions& stage, Device device);
// The world communicator for `backend`: MPI on the CPU (held to NCCL's rules with
// comm.emulate = nccl, on more than one rank); on a GPU, NCCL over MPI's world, whose splits
// (the grid's tp, pp, dp groups) are NCCL communicators as well. Emulation with the CUDA
// backend is a UserError.
std::shared_ptr<Comm> make_world_comm(Backend& backend, CommEmulation emulate);
// Collective, once at start: the network NCCL chose on every rank, from its log
// (comm/nccl_log.h). Returns the one line rank 0 prints ("" on the CPU backend); where
// comm.expect_network is not met, rank 0 throws UserError naming the hosts (its error ends
// every rank: cli/main.cpp) and the others wait for that. `jumbo train` and `bench train`.
std::string require_nccl_network(const RunConfig& cfg, Backend& backend, Comm& world);

}  // namespace jumbo
