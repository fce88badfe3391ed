#!/usr/bin/env bash
# Import and export stream: a synthetic Llama directory of more than 2 GiB (F32, four shards,
# written by tests/infer/hf_llama_dirs.py) imports, and exports again, with a peak resident set
# under 1 GiB each (VmHWM read from /proc/PID/status while the command runs), and the export
# holds the same bytes tensor for tensor.
# Usage: hf_llama_streaming.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
export OMP_NUM_THREADS=1
py=/usr/bin/python3
dirs=tests/infer/hf_llama_dirs.py
limit_mib=1024

"$jumbo" data tokenizer --input inputs/data/brown-valid.jsonl --output "$tmp/tokenizer" \
  --vocab-size 500 --input-sentence-size 2000 --threads 1 >/dev/null || { fail "tokenizer"; finish; }
# 11 layers of d_model 2048 (16 heads, 4 kv), ffn 5632, vocab 16000, untied: 2.09 GiB of F32.
"$py" "$dirs" write "$tmp/big" --arch llama --layers 11 --d-model 2048 --heads 16 --kv-heads 4 \
  --ffn 5632 --vocab 16000 --context 256 --dtype F32 --shards 4 \
  --tokenizer "$tmp/tokenizer.model" || { fail "writing the directory"; finish; }
bytes=$(du -cb "$tmp"/big/*.safetensors | tail -1 | cut -f1)
echo "source: $bytes bytes of safetensors"
((bytes >= 2 * 1024 * 1024 * 1024)) || fail "the synthetic checkpoint is under 2 GiB ($bytes bytes)"

peak() {  # peak NAME CMD...: runs CMD under the /proc poller; prints and checks its peak
  local out
  out=$("$py" "$dirs" rss -- "$@" 2>&1) || { echo "$out"; fail "$1 failed"; return 0; }
  echo "$out" | tail -2
  local mib
  mib=$(echo "$out" | sed -n 's/^peak_rss_mib //p')
  [[ -n $mib ]] && ((mib < limit_mib)) || fail "peak resident set ${mib:-?} MiB, expected under $limit_mib MiB: $*"
}
peak "$jumbo" ckpt import --format hf "$tmp/big" -o "$tmp/ck"
peak "$jumbo" ckpt export "$tmp/ck" --format hf -o "$tmp/out"
"$py" "$dirs" same "$tmp/big" "$tmp/out" || fail "import then export changed a tensor"

finish "all checks passed"
