#!/usr/bin/env bash
# Builds jumbo (Release) in build/ and runs every test. Extra arguments go to ctest,
# e.g. `scripts/test.sh -L data` or `scripts/test.sh -R obs`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh

# Tests start MPI jobs, as root in containers, with more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2
source scripts/openblas-core.sh
openblas_core_for_this_cpu build/jumbo

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
  ctest --test-dir build-cuda --output-on-failure -j1 -L gpu || status=1
fi

# -j1: the tests use MPI ranks and 2 OpenMP threads each; running them in parallel on a
# small machine would make the timing-sensitive ones flaky.
ctest --test-dir build --output-on-failure -j1 "$@" || status=1
exit "$status"
