#!/usr/bin/env bash
# `jumbo bench generate` and the same greedy KV-cache decode in PyTorch (torch_decode.py),
# in one run on the same threads, side by side, for each model preset given.
#   benchmarks/infer/bench_generate.sh [JUMBO] [PRESET...]
# Defaults: build/jumbo, the demo model (prompt 64: its context is 128) and gpt2-124m.
set -euo pipefail
cd "$(dirname "$0")/../.."
jumbo=${1:-build/jumbo}
shift || true
presets=("$@")
((${#presets[@]})) || presets=(inputs/models/demo-small.toml inputs/models/gpt2-124m.toml)
threads=${OMP_NUM_THREADS:-$(nproc)}
# Both sides use Debian's OpenBLAS: on a CPU it does not recognise it falls back to SSE3
# kernels for both, which hides what either does with AVX-512 (scripts/openblas-core.sh).
source scripts/openblas-core.sh
openblas_core_for_this_cpu "$jumbo"
for preset in "${presets[@]}"; do
  context=$(sed -n 's/^context *= *\([0-9]*\).*/\1/p' "$preset")
  prompt=$((context >= 256 ? 128 : context / 2))
  args=(--prompt "$prompt" --new-tokens 32 --repeats 3)
  ours=$(OMP_NUM_THREADS=$threads "$jumbo" bench generate -m "$preset" "${args[@]}" | tee /dev/stderr | tail -1)
  theirs=$(/usr/bin/python3 benchmarks/infer/torch_decode.py --model "$preset" "${args[@]}" --threads "$threads")
  python3 - "$ours" "$theirs" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{ours['model']}: jumbo vs PyTorch {theirs['torch']} ({theirs['threads']} threads), greedy, KV cache")
print(f"{'batch':>6} {'prefill tok/s':>24} {'decode tok/s':>26}")
print(f"{'':>6} {'jumbo':>8} {'torch':>8} {'ratio':>6} {'jumbo':>8} {'torch':>8} {'ratio':>8}")
for a, b in zip(ours["rows"], theirs["rows"]):
    print(f"{a['batch']:>6} {a['prefill_tokens_per_s']:>8.0f} {b['prefill_tokens_per_s']:>8.0f} "
          f"{a['prefill_tokens_per_s'] / b['prefill_tokens_per_s']:>5.2f}x "
          f"{a['decode_tokens_per_s']:>8.1f} {b['decode_tokens_per_s']:>8.1f} "
          f"{a['decode_tokens_per_s'] / b['decode_tokens_per_s']:>7.2f}x")
print(f"batch-1 decode: {100 * ours['batch1_bandwidth_fraction']:.0f}% of the measured copy bandwidth "
      f"({ours['copy_bytes_per_s'] / 1e9:.1f} GB/s)")
PY
done
