#pragma once
// This machine's measured fp32 peak: a register-resident FMA loop on every OpenMP thread.
// MFU on CPU is reported against it (a measured ceiling, not a datasheet number).
namespace jumbo {
// GFLOP/s over all OpenMP threads; runs for about `seconds`.
double measure_fp32_peak_gflops(double seconds = 0.3);
// The instruction set the measurement used: "avx512", "avx2+fma" or "scalar" (compile-time
// choice; the widest the build targets, matching what OpenBLAS's kernels use on this host).
const char* fp32_peak_kernel();
}  // namespace jumbo
