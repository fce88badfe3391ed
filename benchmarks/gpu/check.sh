#!/usr/bin/env bash
# The one-shot GPU check, run on a lent GPU machine (one run, well under 8 minutes) with the
# bundle benchmarks/gpu/prepare.sh made here carried along (.gpu-bundle.tar.xz):
#   1. the gpu tests: every CUDA kernel against the CPU backend, determinism;
#   2. every kernel's achieved bandwidth or FLOP/s against this GPU's measured ceilings;
#   3. training MFU of GPT-1.3B (inputs/models/gpt-1.3b.toml) at T = 2048, bf16, one GPU.
# It prints one table at the end; the whole log goes to $OUT/gpu-check.log when OUT is set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
log=${OUT:-/tmp}/gpu-check.log
exec > >(tee "$log") 2>&1

[[ -f .gpu-bundle.tar.xz ]] || { echo "check: no .gpu-bundle.tar.xz: run benchmarks/gpu/prepare.sh and carry it"; exit 2; }
bundle=$(mktemp -d)
tar -C "$bundle" -xJf .gpu-bundle.tar.xz
# The CUDA runtime, cuBLASLt and NCCL of this machine: the toolkit's, else pip's nvidia-*.
cuda_libs=()
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $dir ]] && cuda_libs+=("$dir")
done
while read -r dir; do cuda_libs+=("$dir"); done < <(python3 - <<'PY' 2>/dev/null
import importlib, os
for name in ("nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime"):
    try:
        m = importlib.import_module(name)
        for p in m.__path__:
            if os.path.isdir(os.path.join(p, "lib")): print(os.path.join(p, "lib"))
    except Exception:
        pass
PY
)
export LD_LIBRARY_PATH="$bundle/lib:$(IFS=:; echo "${cuda_libs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
bin=$bundle/bin
echo "check: bundle of commit $(cat "$bundle/commit") for sm_$(cat "$bundle/arch")"
nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader || true
missing=$(ldd "$bin/jumbo" "$bin/test_gpu" "$bin/bench_gpu_kernels" | grep "not found" | sort -u)
if [[ -n $missing ]]; then
  echo "check: libraries not found: $missing"
  exit 2
fi

summary=()
echo "== 1. gpu tests"
timeout 240 "$bin/test_gpu" --gtest_brief=1 2>&1 | tail -40
tests_rc=${PIPESTATUS[0]}
summary+=("gpu tests: $([[ $tests_rc -eq 0 ]] && echo passed || echo "FAILED (exit $tests_rc)")")

echo "== 2. kernels against the measured ceilings"
timeout 180 "$bin/bench_gpu_kernels" | tee "$bundle/kernels.txt"
summary+=("kernels: exit ${PIPESTATUS[0]}")

echo "== 3. GPT-1.3B training MFU, T = 2048, bf16"
timeout 180 "$bin/jumbo" bench train --device cuda --model inputs/models/gpt-1.3b.toml \
  --precision bf16 --seq 2048 --micro-batch 4 --micro-steps 4 --warmup 2 --steps 5 \
  | tee "$bundle/train.txt"
summary+=("train: $(grep -o 'MFU [0-9.]*%' "$bundle/train.txt" | tail -1 || echo 'no MFU line')")

echo "== table"
grep -E "^(ceilings|linear|flash|layernorm|gelu|add|ce_|adamw|sum_squares)" "$bundle/kernels.txt"
grep -E "tokens/s|MFU" "$bundle/train.txt"
printf '%s\n' "${summary[@]}"
rm -rf "$bundle"
[[ $tests_rc -eq 0 ]]
