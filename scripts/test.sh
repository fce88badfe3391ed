#!/usr/bin/env bash
# Builds jumbo (Release) in build/ and runs every test. Extra arguments go to ctest,
# e.g. `scripts/test.sh -L data` or `scripts/test.sh -R obs`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Where the minutes go, said once before the CPU suite (whose own summary must stay the last
# lines: CI counts what ran from them).
phase_start=$SECONDS
phases=()
phase_done() {
  phases+=("$1 $((SECONDS - phase_start)) s")
  phase_start=$SECONDS
}

bash scripts/install-deps.sh
phase_done install-deps

# Tests start MPI jobs, as root in containers, with more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2
source scripts/openblas-core.sh
openblas_core_for_this_cpu build/jumbo
phase_done build

# The CUDA build (backend, NCCL, gpu tests, GPU benchmark) is compiled wherever the CUDA
# toolkit is, and its gpu tests run; without a GPU each skips with one line.
# With ctest arguments (one part's tests) it is left out; JUMBO_TEST_CUDA=0 skips it, =1
# requires it. It runs before the CPU suite: CI counts what ran from the closing summary,
# which must be the CPU suite's (tests that really run here), not the gpu label's skips.
status=0
cuda=${JUMBO_TEST_CUDA:-auto}
if [[ $cuda == 1 || ($cuda == auto && $# -eq 0 && -x /usr/local/cuda/bin/nvcc) ]]; then
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DJUMBO_CUDA=ON
  cmake --build build-cuda -j2 --target jumbo test_gpu bench_gpu_kernels || status=1
  phase_done build-cuda
  ctest --test-dir build-cuda --output-on-failure -j1 -L gpu || status=1
  phase_done gpu-tests
fi
if command -v ccache >/dev/null; then
  echo "test.sh: ccache $(ccache --print-stats 2>/dev/null | awk -F'\t' '$1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" {h += $2} $1 == "cache_miss" {m = $2} END {printf "%d hits, %d misses (all time)", h, m}')"
fi
echo "test.sh: before the CPU suite: $(IFS=,; echo "${phases[*]}" | sed 's/,/, /g')"

# -j1: the tests use MPI ranks and 2 OpenMP threads each; running them in parallel on a
# small machine would make the timing-sensitive ones flaky.
ctest --test-dir build --output-on-failure -j1 "$@" || status=1
exit "$status"
