#!/usr/bin/env bash
# The time model across two hosts joined by a shaped link (issue 25): the multi-host harness
# (tests/support/slurm_multihost.sh) makes host1 and host2, limits each one's link to RATE
# (default 1gbit) with tc, runs `jumbo bench comm` with one rank per host (the inter level)
# and then benchmarks/plan/check_time_model.sh with its ranks spread over the two hosts.
# Needs root. Usage: benchmarks/plan/shaped_hosts.sh [JUMBO] [RATE] [OUT_DIR]
set -uo pipefail
jumbo=$(realpath "${1:-build/jumbo}")
rate=${2:-1gbit}
out=${3:-$(mktemp -d)}
cd "$(dirname "$0")/../.."
# shellcheck source=tests/support/slurm_multihost.sh
source tests/support/slurm_multihost.sh
multihost_possible || exit 1
mkdir -p "$out"
trap stop_multihost EXIT
start_multihost "$out/cluster" shape 2 2 || { multihost_logs; exit 1; }
for h in host1 host2; do multihost_shape "$h" "$rate" || { echo "tc failed on $h"; exit 1; }; done
echo "host1 <-> host2 shaped to $rate each way (tc tbf); ranks on one host use shared memory"
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 \
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The table across the shaped link: 2 ranks, one per host.
mpirun --host host1:1,host2:1 -np 2 "$jumbo" bench comm --max-bytes $((16 << 20)) \
  --seconds-per-size 0.3 | sed '$d' | tee "$out/bench_comm_shaped.txt"
CHECK_HOSTS=host1:1,host2:1 bash benchmarks/plan/check_time_model.sh "$jumbo" "$out/check"
