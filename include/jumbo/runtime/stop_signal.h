#pragma once
// Graceful stop: Slurm signals a job before its time limit (sbatch --signal) and on
// preemption (SIGTERM). The handler only records the signal; the Trainer checks it after
// each step, agrees on it over all ranks, saves a checkpoint and returns, and `jumbo train`
// exits with kExitStoppedForRequeue so the batch script requeues the job.
namespace jumbo {

// EX_TEMPFAIL from sysexits.h: "try again later" - the job is requeued and resumes.
inline constexpr int kExitStoppedForRequeue = 75;

// Handles SIGUSR1, SIGTERM and SIGINT. A second SIGINT (Ctrl-C twice) kills as usual.
void install_stop_signal_handlers();
// The first stop signal received since installation (or clear), else 0.
int stop_signal_received();
void clear_stop_signal();
// "SIGUSR1", "SIGTERM", ...
const char* stop_signal_name(int signal);

}  // namespace jumbo
