#!/usr/bin/env bash
# slurm/preflight.sh's parts that need no cluster (its whole job runs in tests/slurm/multihost.sh):
#  1. jumbo_nccl_tests_parse on real all_reduce_perf output, copied from public reports:
#     - nccl-tests >= 2.10 rows (a root column), the largest 8 GiB, and the "# Avg bus bandwidth"
#       line: NVIDIA/nccl-tests issue 252 (comment of 2024-09-24, NCCL_ALGO=RING);
#     - older rows without the root column, with "error" numbers for #wrong, and an NCCL INFO
#       line between the header and the rows: aws/aws-ofi-nccl issue 33 (2020-05, 2 x
#       p3dn.24xlarge) and issue 64 (the INFO line);
#     - mpirun --tag-output's "[1,0]<stdout>:" prefix on every line: aws/aws-k8s-tester pull
#       request 503 (2024-11-05, p5.48xlarge);
#     - srun --label's "0: " prefix; and output with no result row (status 1);
#  2. the floors per instance type (p4d, p5; none for an unknown type);
#  3. the table at the end of the job: a failed stage named, a stage not reached "skipped";
#  4. `jumbo bench train --config` of a tiny run on 2 MPI ranks (tp 2): the machine-readable
#     line with the layout, "plan=na ratio=na" on the CPU without a machine description; the
#     comm stage's `jumbo bench comm --write-machine` on those ranks, its summary, and the
#     estimate on that machine (plan= and ratio=); JUMBO_MACHINE of another ranks-per-host
#     refused by jumbo_choose_layout; and a bad --nodes refused in one line.
# Usage: preflight.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
# shellcheck source=slurm/preflight.sh
source slurm/preflight.sh || fail "slurm/preflight.sh cannot be sourced"
t0=$SECONDS

expect_parse() {  # NAME FILE WANT
  local got
  got=$(jumbo_nccl_tests_parse "$2") || fail "$1: the parser found no row"
  [[ $got == "$3" ]] || fail "$1: got '$got', want '$3'"
  echo "ok: $1: $got"
}

cat >"$tmp/new.txt" <<'EOF'
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
   536870912     134217728     float     sum      -1    10052   53.41   93.46      0   9676.9   55.48   97.09      0
  1073741824     268435456     float     sum      -1    20079   53.48   93.58      0    19265   55.74   97.54      0
  2147483648     536870912     float     sum      -1    39871   53.86   94.26      0    39357   54.56   95.49      0
  4294967296    1073741824     float     sum      -1    77194   55.64   97.37      0    79688   53.90   94.32      0
  8589934592    2147483648     float     sum      -1   158070   54.34   95.10      0   158561   54.17   94.80      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 95.3009
EOF
expect_parse "nccl-tests >= 2.10 rows" "$tmp/new.txt" \
  "avg=95.3009 size=8589934592 busbw=95.10 busbw_inplace=94.80 rows=5"

cat >"$tmp/old.txt" <<'EOF'
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
ip-172-31-13-103:9738:9738 [0] NCCL INFO Launch mode Parallel
     1048576        262144   float     sum   1035.3    1.01    1.90  5e-07    643.4    1.63    3.06  5e-07
     2097152        524288   float     sum    671.4    3.12    5.86  5e-07    671.8    3.12    5.85  5e-07
     4194304       1048576   float     sum   1140.5    3.68    6.90  5e-07   1144.3    3.67    6.87  5e-07
EOF
expect_parse "rows without root" "$tmp/old.txt" \
  "avg=na size=4194304 busbw=6.90 busbw_inplace=6.87 rows=3"

cat >"$tmp/tagged.txt" <<'EOF'
[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw  #wrong
[1,0]<stdout>:           8             2     float     sum      -1    12.90    0.00    0.00      0    12.87    0.00    0.00      0
[1,0]<stdout>:          16             4     float     sum      -1    12.88    0.00    0.00      0    12.83    0.00    0.00      0
[1,0]<stdout>:          32             8     float     sum      -1    22.25    0.00    0.00      0    13.34    0.00    0.00      0
[1,0]<stdout>:# Out of bounds values : 0 OK
[1,0]<stdout>:# Avg bus bandwidth    : 92.3405 
EOF
expect_parse "mpirun --tag-output" "$tmp/tagged.txt" \
  "avg=92.3405 size=32 busbw=0.00 busbw_inplace=0.00 rows=3"

sed 's/^/0: /' "$tmp/new.txt" >"$tmp/label.txt"
expect_parse "srun --label" "$tmp/label.txt" \
  "avg=95.3009 size=8589934592 busbw=95.10 busbw_inplace=94.80 rows=5"

printf '# nThread 1 nGpus 1 minBytes 8\nall_reduce_perf: Test NCCL failure common.cu:1279\n' >"$tmp/none.txt"
jumbo_nccl_tests_parse "$tmp/none.txt" >/dev/null && fail "output without a result row parsed"
echo "ok: no result row: status 1"

[[ $(jumbo_busbw_floor p4d.24xlarge) == "28.6 "* ]] || fail "p4d floor: $(jumbo_busbw_floor p4d.24xlarge)"
[[ $(jumbo_busbw_floor p5.48xlarge) == "62.5 "* ]] || fail "p5 floor: $(jumbo_busbw_floor p5.48xlarge)"
[[ -z $(jumbo_busbw_floor m5.large) ]] || fail "a floor for m5.large"
echo "ok: floors p4d $(jumbo_busbw_floor p4d.24xlarge); p5 $(jumbo_busbw_floor p5.48xlarge)"

# 3. The table (slurm/common.sh's jumbo_exit calls it as jumbo_final_hook) after the doctor
# passed and nccl-tests failed: the bench never ran.
# shellcheck source=slurm/common.sh
source slurm/common.sh || fail "slurm/common.sh cannot be sourced"
JUMBO_RC=1
pf_set doctor pass "every node passed (2 nodes, host[1-2])" >/dev/null
pf_set nccl-tests fail "avg=3.1 size=8589934592 busbw=3.20 busbw_inplace=3.19 rows=31 gpus=16" \
  "instance=p4d.24xlarge: busbw 3.20 GB/s is below the floor 28.6 GB/s" >/dev/null
table=$(jumbo_final_hook)
for want in '^preflight: stage +result +numbers$' \
  '^preflight: doctor +pass +every node passed \(2 nodes, host\[1-2\]\)$' \
  '^preflight: nccl-tests +fail +avg=3.1 size=8589934592 busbw=3.20 .* below the floor 28.6 GB/s$' \
  '^preflight: comm +skipped +not run: the job ended before it \(above\)$' \
  '^preflight: bench +skipped +not run: the job ended before it \(above\)$' \
  '^preflight: FAILED: nccl-tests \(exit 1\)$'; do
  grep -qE "$want" <<<"$table" || fail "the table has no line matching '$want': $table"
done
[[ $(wc -l <<<"$table") == 6 ]] || fail "the table is not 6 lines: $table"
echo "ok: the table names the failed stage"

# 4. The bench of a run config across MPI ranks (synthetic tokens: no data files exist).
cat >"$tmp/run.toml" <<EOF
[model]
preset = "inputs/models/tiny.toml"
[parallel]
micro_batch = 1
[train]
steps = 8
global_batch = 4
[data]
train = "$tmp/no-such-data"
tokenizer = "$tmp/no-such-tok.model"
EOF
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_rmaps_base_oversubscribe=1
out=$(timeout 60 mpirun -np 2 "$jumbo" bench train --config "$tmp/run.toml" --set parallel.tp=2 \
  --steps 2 --warmup 1 --nodes 1 2>&1) || fail "bench train --config on 2 ranks: $out"
grep -qE '^preflight: step measured=[0-9.]+s plan=na ratio=na layout=tp2,pp1,dp1,mb1,vs1,recompute=none,zero1=0,sp=0 device=cpu ranks=2 \(' <<<"$out" ||
  fail "no machine-readable preflight line: $out"
echo "ok: $(grep '^preflight:' <<<"$out")"
# The comm stage's command on the same 2 ranks: the machine description it writes, its summary
# (the world's all_reduce at the largest size), and the bench's estimate on that machine.
timeout 60 mpirun -np 2 "$jumbo" bench comm --max-bytes 65536 --seconds-per-size 0.05 \
  --write-machine "$tmp/machine.toml" >"$tmp/comm.txt" 2>&1 || fail "bench comm: $(cat "$tmp/comm.txt")"
got=$(pf_comm_summary "$tmp/comm.txt")
[[ $got =~ ^world\ all_reduce\ 65536\ B\ busbw=[0-9]+\.[0-9]{2}\ GB/s\ $ ]] ||
  fail "pf_comm_summary: '$got'"
echo "ok: pf_comm_summary: $got"
printf 'bench comm: no rows\n{"rows": []}\n' >"$tmp/empty.txt"
[[ -z $(pf_comm_summary "$tmp/empty.txt") && -z $(pf_comm_summary /dev/null) ]] ||
  fail "pf_comm_summary of no rows is not empty"
out=$(timeout 60 mpirun -np 2 "$jumbo" bench train --config "$tmp/run.toml" --set parallel.tp=2 \
  --steps 2 --warmup 1 --nodes 1 --machine "$tmp/machine.toml" 2>&1) ||
  fail "bench train --machine on 2 ranks: $out"
grep -qE "^preflight: step measured=[0-9.]+s plan=[0-9.]+s ratio=[0-9.]+ layout=tp2,.* device=cpu gpu=$tmp/machine.toml ranks=2$" <<<"$out" ||
  fail "no estimate on the measured machine: $out"
echo "ok: $(grep '^preflight:' <<<"$out")"
# JUMBO_MACHINE measured with 2 ranks per host, a job of 4 per node: refused in one line, exit 2.
out=$(JUMBO=$jumbo JUMBO_CONFIG=$tmp/run.toml JUMBO_MACHINE=$tmp/machine.toml JUMBO_LAYOUT_FROM_PLAN=1 \
  SLURM_NNODES=2 SLURM_NTASKS_PER_NODE=4 bash -c 'source slurm/common.sh
    JUMBO_JOB_SETS=() JUMBO_USER_SETS=()
    jumbo_choose_layout' 2>&1)
rc=$?
((rc == 2)) && grep -q "not requeued because JUMBO_MACHINE=$tmp/machine.toml was measured with 2 ranks per host (ranks_per_host), but this job runs 4 per node" <<<"$out" ||
  fail "JUMBO_MACHINE of another shape: exit $rc: $out"
echo "ok: JUMBO_MACHINE of 2 ranks per host for 4 per node refused (exit 2)"
out=$(timeout 60 mpirun -np 2 "$jumbo" bench train --config "$tmp/run.toml" --nodes 3 2>&1)
rc=$?
((rc == 2)) && grep -q "bench train: --nodes 3 x --gpus-per-node 0 is not the 2 ranks of this launch" <<<"$out" ||
  fail "--nodes 3 on 2 ranks: exit $rc: $out"
echo "ok: --nodes 3 on 2 ranks refused (exit 2)"
echo "ok: all in $((SECONDS - t0)) s"
finish
