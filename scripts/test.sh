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

# -j1: the tests use MPI ranks and 2 OpenMP threads each; running them in parallel on a
# small machine would make the timing-sensitive ones flaky.
status=0
ctest --test-dir build --output-on-failure -j1 "$@" || status=$?
exit "$status"
