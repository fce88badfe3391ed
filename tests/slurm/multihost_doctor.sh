#!/usr/bin/env bash
# The doctor names the host whose node-local check hangs, with the other hosts healthy, on a
# Slurm cluster of three hosts started here (tests/support/slurm_multihost.sh). One
# `sbatch --nodes=3` of slurm/train_jumbo.sh (the doctor runs before training), with two faults
# injected through what the job inherits from its submitter:
#  - host2: libfabric's provider query hangs: FI_PROVIDER_PATH holds a libfabric provider (a
#    real DL provider, loaded by fi_getinfo) whose fi_prov_ini sleeps on host2 only: a hung
#    EFA driver, as fi_getinfo sees it;
#  - host3: cuInit hangs: LD_LIBRARY_PATH holds a libcuda.so.1 (the driver API the doctor
#    dlopen()s) whose cuInit sleeps on host3 only; elsewhere it reports 0 GPUs.
# Checked: the job log names host2 (libfabric) and host3 (gpu) in "doctor: failed node=" lines,
# each hung check "hung after 3 s", host1 passed and is named in no failed line, the drain (or
# the drain attempt) names host2,host3 and no other; the three per-host reports are in the
# run's doctor directory; the job ended FAILED without training. A second job: host2's doctor
# never reports (a stand-in binary sleeps there): named from the missing report once step 1's
# timeout ends it, drained alone. Before this test the
# doctor's first checks were collective: host2 or host3 hung the whole step, which timed out
# with no failed-node line.
# Usage: multihost_doctor.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
source tests/support/small_run.sh
source tests/support/slurm_multihost.sh
on_exit stop_multihost
multihost_possible || skip "no hosts can be made on this machine"
command -v cc >/dev/null || skip "no C compiler for the injected libraries"
# What a failure shows before the cleanup: the logs it needs.
failure_logs() {
  [[ -n ${log:-} && -f $log ]] && { echo "== $log"; tail -60 "$log"; }
  [[ -n ${id:-} ]] && scontrol show job "$id"
  multihost_logs
}
on_failure failure_logs
# The harness may run jobs as an unprivileged user (as_job_user) or as the caller.
declare -F as_job_user >/dev/null || as_job_user() { "$@"; }
t_start=$SECONDS
name=doctor

mkdir -p "$tmp/data" "$tmp/logs" "$tmp/fsx" "$tmp/fabric" "$tmp/cuda"
make_small_data "$jumbo" "$tmp/data" || fail "could not make the small dataset"
cat >"$tmp/run.toml" <<EOF
[model]
preset = "inputs/models/tiny.toml"
[parallel]
micro_batch = 1
[train]
steps = 2
global_batch = 3
[data]
train = "$tmp/data/data"
tokenizer = "$tmp/data/tok.model"
EOF
cat >"$tmp/hang_on.h" <<'EOF'
#include <string.h>
#include <unistd.h>
/* Sleeps (a hang, for the doctor's timeout to end) when this host's name is HOST. */
static void hang_on(const char* host) {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  if (strcmp(name, host) == 0) sleep(600);
}
EOF
cat >"$tmp/fabric.c" <<'EOF'
#include "hang_on.h"
struct fi_provider;
/* libfabric's entry point of a DL provider (rdma/providers/fi_prov.h); NULL: no provider. */
struct fi_provider* fi_prov_ini(void) {
  hang_on("host2");
  return 0;
}
EOF
cat >"$tmp/cuda.c" <<'EOF'
#include "hang_on.h"
int cuInit(unsigned flags) {
  (void)flags;
  hang_on("host3");
  return 0;
}
int cuDeviceGetCount(int* n) { *n = 0; return 0; }
int cuDriverGetVersion(int* v) { *v = 12040; return 0; }
EOF
cc -shared -fPIC -I"$tmp" -o "$tmp/fabric/libhang-fi.so" "$tmp/fabric.c" &&
  cc -shared -fPIC -I"$tmp" -o "$tmp/cuda/libcuda.so.1" "$tmp/cuda.c" || fail "cc -shared"

start_multihost "$tmp/slurm" mhdoc 3 2 || fail "could not start the three-host cluster"
chmod 755 "$tmp" && chmod 1777 "$tmp/fsx" "$tmp/logs" || fail "chmod"
unset JUMBO_HOME JUMBO_RUN_DIR JUMBO_CKPT_DIR JUMBO_LAUNCHER JUMBO_SRUN_ARGS JUMBO_INSTANCE_TYPE
export JUMBO=$jumbo JUMBO_CONFIG=$tmp/run.toml JUMBO_ROOT=$tmp/fsx JUMBO_EXPECT_EFA=0 \
  JUMBO_LAYOUT_FROM_PLAN=0 JUMBO_DOCTOR=1 JUMBO_RUN_NAME=$name JUMBO_DOCTOR_CHECK_TIMEOUT=3 \
  JUMBO_DOCTOR_LOCAL_TIMEOUT=40 JUMBO_DOCTOR_TIMEOUT=30 JUMBO_MAX_RESTARTS=0 JUMBO_MAX_FAILURES=0 \
  FI_PROVIDER_PATH=$tmp/fabric LD_LIBRARY_PATH=$tmp/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

id=$(as_job_user sbatch --parsable --nodes=3 --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-node=0 \
  --time=10 --output="$tmp/logs/%x-%j.out" slurm/train_jumbo.sh) || fail "sbatch"
log=$tmp/logs/j1-jumbo-$id.out
wait_job "$id" FAILED 90 || fail "job $id did not end FAILED"
[[ $(job_field "$id" ExitCode) == 1:0 ]] || fail "ExitCode $(job_field "$id" ExitCode), expected 1:0"

# expect_one PATTERN WHAT: exactly one line of the log matches (srun --label: "N: ").
expect_one() {
  local n
  n=$(grep -cE -- "$1" "$log")
  ((n == 1)) || fail "$2: expected one line matching '$1', got $n"
}
expect_one '^[0-9]+: doctor: failed node=host2 node-checks=libfabric software-checks=-$' "host2's failed line"
expect_one '^[0-9]+: doctor: failed node=host3 node-checks=gpu software-checks=-$' "host3's failed line"
expect_one '^[0-9]+: FAIL  libfabric  hung after 3 s in fi_getinfo' "host2's libfabric line"
expect_one '^[0-9]+: FAIL  gpu        hung after 3 s in cuInit' "host3's gpu line"
expect_one '^[0-9]+: doctor: passed node=host1$' "host1's passed line"
! grep -q "failed node=host1" "$log" || fail "host1 is named as failed"
expect_one 'jumbo-slurm: doctor: (drained|could not drain) host2,host3 ' "the drain (or its attempt) of host2,host3"
! grep -E 'jumbo-slurm: doctor: (drained|could not drain)' "$log" | grep -q host1 ||
  fail "the drain names host1"
if grep -q 'jumbo-slurm: doctor: drained host2,host3 ' "$log"; then
  for h in host2 host3; do
    [[ $(sinfo -h -n "$h" -o %t) == drain* ]] || fail "$h is $(sinfo -h -n "$h" -o %t), not drained"
  done
  [[ $(sinfo -h -n host1 -o %t) != drain* ]] || fail "host1 is drained"
fi
reports=$tmp/fsx/runs/$name/doctor/job-$id-run-0
for h in host1 host2 host3; do
  [[ -f $reports/$h.txt ]] || fail "no report $reports/$h.txt"
done
grep -q '^doctor: failed node=host2 node-checks=libfabric' "$reports/host2.txt" ||
  fail "host2's report: $(tail -1 "$reports/host2.txt")"
! grep -q "jumbo-slurm: launch:\|^step \|doctor --collective" "$log" ||
  fail "the job went on past the node-local checks"
grep "jumbo-slurm: \(doctor\|not requeued\)\|^[0-9]*: \(FAIL\|doctor:\)" "$log"
echo "ok: host2 (libfabric hung) and host3 (cuInit hung) named and drained, host1 passed;" \
  "job $id FAILED in the doctor in $((SECONDS - t_start)) s"

# A host whose doctor never reports at all (hung outside any check, or unreachable): a
# stand-in binary that sleeps for `doctor` on host2 and runs the real one else. Step 1 ends
# at JUMBO_DOCTOR_LOCAL_TIMEOUT and names host2 from the missing report.
scontrol update nodename=host2,host3 state=resume || fail "scontrol update state=resume"
mkdir -p "$tmp/bin"
# shellcheck disable=SC2016  # $1 and $(hostname) are the stand-in's own, not expanded here
printf '%s\n' '#!/usr/bin/env bash' \
  '[[ $1 == doctor && $(hostname) == host2 ]] && sleep 600' "exec $jumbo \"\$@\"" >"$tmp/bin/jumbo"
chmod 755 "$tmp/bin" "$tmp/bin/jumbo"
t0=$SECONDS
unset FI_PROVIDER_PATH
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH#"$tmp/cuda"}
id=$(JUMBO=$tmp/bin/jumbo JUMBO_DOCTOR_LOCAL_TIMEOUT=8 as_job_user sbatch --parsable --nodes=3 \
  --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-node=0 --time=10 \
  --output="$tmp/logs/%x-%j.out" slurm/train_jumbo.sh) || fail "sbatch"
log=$tmp/logs/j1-jumbo-$id.out
wait_job "$id" FAILED 60 || fail "job $id did not end FAILED"
expect_one 'jumbo-slurm: doctor: failed node=host2 node-checks=report software-checks=- \(hung or unreachable: no doctor report after 8 s\)$' \
  "host2 named from its missing report"
expect_one '^[0-9]+: doctor: passed node=host1$' "host1's passed line"
expect_one '^[0-9]+: doctor: passed node=host3$' "host3's passed line"
! grep -q "failed node=host[13]" "$log" || fail "a healthy host is named as failed"
expect_one 'jumbo-slurm: doctor: (drained|could not drain) host2 ' "the drain (or its attempt) of host2 alone"
grep "jumbo-slurm: \(doctor\|not requeued\)\|^[0-9]*: doctor:" "$log"
echo "ok: host2 without a report named and drained after the 8 s step timeout, host1 and host3" \
  "passed ($((SECONDS - t0)) s); all in $((SECONDS - t_start)) s"
finish
