#!/usr/bin/env bash
# The one-shot GPU check: a measurement on a lent GPU machine, with the bundle that
# benchmarks/gpu/prepare.sh made here carried along (.gpu-bundle.tar.xz). At most 7 minutes:
# the steps' timeouts add up to 405 s.
#   1. the gpu tests, each suite in its own process (an illegal address poisons the CUDA
#      context of its process only, so the next suite still runs): every kernel against the
#      CPU backend, determinism, three training steps;
#   2. bench_gpu_kernels: each kernel's GB/s or TFLOP/s against the ceilings measured in the
#      same run (a device copy; a bf16 GEMM on random data);
#   3. GPT-1.3B training at T = 2048, bf16, one GPU: the loss before and after (NaN, or a
#      loss that does not fall, fails the step), tokens/s, MFU;
#   4. `jumbo bench comm --device cuda` on one rank: NCCL comes up and runs;
# then a table: per kernel, the largest error against the CPU backend (max |gpu - cpu| over
# max |cpu|, f32 and bf16) and the fraction of the measured ceiling it achieved.
# Each step's whole output is written to $OUT (else /tmp/jumbo-gpu-check) before anything
# is shortened for the screen: tests.log, kernels.log, train.log, comm.log, table.txt, and
# gpu-check.log (all that this prints). Exit 0: every step passed; 1: a step failed; 2: no
# GPU here (one line) or no bundle.
# Needs only the driver, CUDA 13 (the toolkit, or pip wheels: nvidia/*/lib and CUDA 13's
# nvidia/cu13/lib) and NCCL. The bundle finds its own libraries through its RUNPATH; the CUDA
# folders go on LD_LIBRARY_PATH for the bundled binaries only, never for other commands.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
logs=${OUT:-/tmp/jumbo-gpu-check}
mkdir -p "$logs" || exit 2

# Limits in seconds: unpack 15 + nvidia-smi 2 x 5 + pip's folders 5 + ldd 2 x 5 (the second
# only with GCC's libraries) + tests 130 + kernels 90 + train 120 + comm 25 = 405.
t_unpack=15 t_smi=5 t_python=5 t_ldd=5 t_tests=130 t_kernels=90 t_train=120 t_comm=25

gpu_count() {
  if command -v nvidia-smi >/dev/null; then
    timeout -k 2 "$t_smi" nvidia-smi -L 2>/dev/null | grep -c '^GPU '
  else
    find /dev -maxdepth 1 -name 'nvidia[0-9]*' 2>/dev/null | wc -l
  fi
}

# The CUDA runtime, cuBLASLt and NCCL of this machine: the toolkit's, then pip's wheels.
cuda_dirs() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
    /usr/local/nvidia/lib64; do
    [[ -d $d ]] && echo "$d"
  done
  command -v python3 >/dev/null || return 0
  timeout -k 2 "$t_python" python3 - <<'PY' 2>/dev/null
import glob, os, sys
seen = set()
for root in sys.path:
    for pattern in ("nvidia/cu13/lib", "nvidia/*/lib"):
        for d in sorted(glob.glob(os.path.join(root or ".", pattern))):
            if d not in seen and glob.glob(os.path.join(d, "lib*.so*")):
                seen.add(d)
                print(d)
PY
  return 0
}

# A bundled binary with the CUDA folders (and, where needed, GCC's libraries) to load from.
run_bundled() { LD_LIBRARY_PATH="$lib_path" "$@"; }

# "passed", or why not, from a step's exit status.
status_of() {
  case $1 in
    0) echo passed ;;
    124 | 137) echo "FAILED (timed out after $2 s)" ;;
    *) if (($1 > 128)); then echo "FAILED (killed by signal $(($1 - 128)))"; else echo "FAILED (exit $1)"; fi ;;
  esac
}

# 1. Each suite of test_gpu alone; the whole output to tests.log, a line each to the screen.
gpu_tests() {
  local start=$SECONDS suites suite left limit rc counts one=$bundle/suite.log
  : >"$logs/tests.log"
  suites=$(run_bundled timeout -k 2 20 "$bin/test_gpu" --gtest_list_tests 2>>"$logs/tests.log" |
    awk '/^[A-Za-z_][A-Za-z0-9_\/]*\./ {sub(/\..*/, ""); print}')  # not gtest_main's "Running main()"
  if [[ -z $suites ]]; then
    echo "  test_gpu lists no suites (see tests.log)"
    return 1
  fi
  local failed=0
  for suite in $suites; do
    left=$((t_tests - (SECONDS - start)))
    if ((left < 5)); then
      echo "  $suite: FAILED (not run: the step's $t_tests s are spent)"
      failed=1
      continue
    fi
    limit=$((left < 75 ? left : 75))
    run_bundled timeout -k 3 "$limit" "$bin/test_gpu" --gtest_filter="$suite.*" --gtest_color=no \
      >"$one" 2>&1
    rc=$?
    { echo "==== $suite (exit $rc)"; cat "$one"; } >>"$logs/tests.log"
    counts=$(awk '/^\[ RUN      \]/ {r++} /^\[       OK \]/ {p++}
                  /^\[  FAILED  \] [^ ]+\.[^ ]+ \(/ {f++} /^\[  SKIPPED \] [^ ]+\.[^ ]+ \(/ {s++}
                  END {printf "%d run: %d passed, %d failed, %d skipped", r, p, f, s}' "$one")
    if ((rc == 0)) && ! grep -q '^\[  SKIPPED \]' "$one"; then
      echo "  $suite: passed ($counts)"
      continue
    fi
    failed=1
    if ((rc == 0)); then
      echo "  $suite: FAILED (tests skipped on a GPU machine: $counts)"
      grep -m1 -A1 ': Skipped$' "$one" | tail -n 1 | sed 's/^/    /'  # the first reason
      continue
    fi
    echo "  $suite: $(status_of "$rc" "$limit") ($counts)"
    # The first failure is the informative one (an illegal address fails all after it).
    grep -m1 -A8 -E 'Failure|what\(\)|error|illegal|terminate' "$one" | sed 's/^/    /'
  done
  return "$failed"
}

# The closing table from the tests' GPUCMP lines and the bench's KERNEL and CEILING lines.
table() {
  awk -v kfile="$logs/kernels.log" '
    function remember(k) { if (!(k in seen)) { seen[k] = 1; order[++n] = k } }
    FILENAME == kfile && $1 == "CEILING" { ceiling[$2] = $3 " " $4 }
    FILENAME == kfile && $1 == "KERNEL" {
      k = $2; f = $3 + 0; remember(k)
      if (!(k in lo) || f < lo[k]) lo[k] = f
      if (!(k in hi) || f > hi[k]) hi[k] = f
      shapes[k]++
    }
    FILENAME != kfile && $1 == "GPUCMP" && ($3 == "f32" || $3 == "bf16") {
      k = $2; remember(k); key = k " " $3
      if ($4 == "nan") err[key] = "NaN"
      else if (err[key] != "NaN" && (!(key in err) || $4 + 0 > err[key] + 0)) err[key] = $4
    }
    function show(key) { return key in err ? err[key] : "-" }
    END {
      if (n == 0) { print "no GPUCMP or KERNEL lines: nothing to tabulate"; exit }
      printf "ceilings: device copy %s, bf16 GEMM 8192^3 (random data) %s\n",
             ("copy" in ceiling) ? ceiling["copy"] : "-", ("gemm" in ceiling) ? ceiling["gemm"] : "-"
      printf "%-24s %14s %14s   %s\n", "kernel", "max err f32", "max err bf16", "of ceiling"
      for (i = 1; i <= n; i++) {
        k = order[i]
        if (!(k in shapes)) frac = "-"
        else if (shapes[k] == 1) frac = sprintf("%.0f%%", 100 * lo[k])
        else frac = sprintf("%.0f-%.0f%% (%d shapes)", 100 * lo[k], 100 * hi[k], shapes[k])
        printf "%-24s %14s %14s   %s\n", k, show(k " f32"), show(k " bf16"), frac
      }
    }' "$logs/kernels.log" "$logs/tests.log"
}

main() {
  local n
  n=$(gpu_count)
  if ((n == 0)); then
    echo "check: no GPU on this machine: nothing measured (run it where one is, with .gpu-bundle.tar.xz carried)"
    exit 2
  fi
  [[ -f .gpu-bundle.tar.xz ]] || { echo "check: no .gpu-bundle.tar.xz: run benchmarks/gpu/prepare.sh and carry it"; exit 2; }
  bundle=$(mktemp -d)
  trap 'rm -rf "$bundle"' EXIT
  # tar needs xz for -J; Python's lzma where a bare machine has no xz.
  if command -v xz >/dev/null; then
    timeout -k 2 "$t_unpack" tar -C "$bundle" -xJf .gpu-bundle.tar.xz
  else
    timeout -k 2 "$t_unpack" python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      .gpu-bundle.tar.xz "$bundle"
  fi || { echo "check: cannot unpack the bundle"; exit 1; }
  bin=$bundle/bin
  lib_path=$(cuda_dirs | paste -sd: -)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}  # the tests' CPU references
  echo "check: bundle of commit $(cat "$bundle/commit") for sm_$(cat "$bundle/arch"); logs in $logs"
  timeout -k 2 "$t_smi" nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version \
    --format=csv,noheader 2>/dev/null | sed 's/^/check: GPU /'
  echo "check: CUDA libraries from ${lib_path:-the default folders only}"
  # GCC's libraries of the bundle only where this machine's are too old for its binaries.
  local linked
  linked=$(run_bundled timeout -k 2 "$t_ldd" ldd "$bin"/* 2>&1)
  if grep -Eq "(libstdc\+\+|libgcc_s)[^ ]* => not found|(GLIBCXX|CXXABI|GCC)_[0-9.]+' not found" <<<"$linked"; then
    lib_path=$bundle/lib/fallback${lib_path:+:$lib_path}
    echo "check: this machine's libstdc++ is older than the bundle's binaries need: theirs from the bundle"
    linked=$(run_bundled timeout -k 2 "$t_ldd" ldd "$bin"/* 2>&1)
  fi
  if grep -q "not found" <<<"$linked"; then
    echo "check: libraries not found:"
    grep "not found" <<<"$linked" | sort -u | sed 's/^/  /'
    exit 1
  fi

  local summary=() failed=0 rc
  echo "== 1. gpu tests, one process per suite (whole output: $logs/tests.log)"
  gpu_tests
  rc=$?
  summary+=("1. gpu tests: $( ((rc == 0)) && echo passed || echo FAILED)")
  ((rc == 0)) || failed=1

  echo "== 2. kernels against the measured ceilings (whole output: $logs/kernels.log)"
  run_bundled timeout -k 3 "$t_kernels" "$bin/bench_gpu_kernels" >"$logs/kernels.log" 2>&1
  rc=$?
  grep -vE '^(KERNEL|CEILING) ' "$logs/kernels.log" | tail -n 60
  if ((rc == 0)) && ! grep -q '^KERNEL ' "$logs/kernels.log"; then rc=1; fi
  summary+=("2. kernels: $(status_of "$rc" "$t_kernels")")
  ((rc == 0)) || failed=1

  echo "== 3. GPT-1.3B training, T = 2048, bf16 (whole output: $logs/train.log)"
  run_bundled timeout -k 3 "$t_train" "$bin/jumbo" bench train --device cuda \
    --model inputs/models/gpt-1.3b.toml --precision bf16 --seq 2048 --micro-batch 4 \
    --micro-steps 4 --warmup 2 --steps 5 >"$logs/train.log" 2>&1
  rc=$?
  tail -n 20 "$logs/train.log"
  local losses verdict
  losses=$(sed -n 's/.*loss \([^ ]*\) -> \([^ ]*\).*/\1 \2/p' "$logs/train.log" | tail -1)
  # Finite numbers, and the last below the first; awk reads "nan" as text, not a number.
  verdict=$(awk -v l="$losses" 'BEGIN {
    split(l, x, " "); num = "^-?[0-9]+(\\.[0-9]*)?([eE][-+]?[0-9]+)?$"
    if (l == "") print "no loss line"
    else if (x[1] !~ num || x[2] !~ num) print "loss " x[1] " -> " x[2] " is not finite"
    else if (x[2] + 0 >= x[1] + 0) print "loss " x[1] " -> " x[2] " does not fall"
    else print "ok" }')
  local mfu
  mfu=$(grep -o 'MFU [0-9.]*%' "$logs/train.log" | tail -1)
  if ((rc != 0)); then
    summary+=("3. train: $(status_of "$rc" "$t_train")")
    failed=1
  elif [[ $verdict != ok ]]; then
    summary+=("3. train: FAILED ($verdict)")
    failed=1
  else
    summary+=("3. train: passed (loss ${losses/ / -> }, ${mfu:-no MFU line})")
  fi

  echo "== 4. jumbo bench comm --device cuda, one rank (whole output: $logs/comm.log)"
  run_bundled timeout -k 3 "$t_comm" "$bin/jumbo" bench comm --device cuda \
    --max-bytes 268435456 >"$logs/comm.log" 2>&1
  rc=$?
  tail -n 25 "$logs/comm.log"
  summary+=("4. bench comm: $(status_of "$rc" "$t_comm")")
  ((rc == 0)) || failed=1

  echo "== table: per kernel, max |gpu - cpu| / max |cpu| and the fraction of the ceiling"
  table | tee "$logs/table.txt"
  printf '%s\n' "${summary[@]}"
  if ((failed)); then echo "check: FAILED"; else echo "check: passed"; fi
  return "$failed"
}

main 2>&1 | tee "$logs/gpu-check.log"
exit "${PIPESTATUS[0]}"
