# Sourced by scripts that run jumbo on this machine (test.sh, demo.sh). OpenBLAS picks its
# kernels from the CPU model at load time; on virtual CPUs that report a generic model
# ("Intel(R) Xeon(R) Processor") it falls back to Prescott's SSE3 kernels, measured 4.4x slower
# for the demo's training step than its AVX-512 ones. When that happens, and
# OPENBLAS_CORETYPE is not set, this sets it from the CPU's flags.
openblas_core_for_this_cpu() {
  local jumbo=$1 chosen
  [[ -n ${OPENBLAS_CORETYPE:-} || ! -x $jumbo ]] && return 0
  chosen=$(OPENBLAS_VERBOSE=2 "$jumbo" --help 2>&1 | sed -n 's/^Core: //p' | head -1)
  [[ $chosen == Prescott || $chosen == Core2 || $chosen == Nehalem ]] || return 0
  local flag
  if grep -qw avx512f /proc/cpuinfo; then
    flag=avx512f OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then
    flag=avx2 OPENBLAS_CORETYPE=Haswell
  else
    return 0
  fi
  export OPENBLAS_CORETYPE
  echo "OpenBLAS chose its $chosen kernels on a CPU with $flag: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE" >&2
}
