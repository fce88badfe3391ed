#!/usr/bin/env bash
# `jumbo plan`'s storage (docs/plan.md "Storage"): the human lines with --config and with
# --model (defaults, said so), the --storage interface parallelcluster/render.sh reads (exactly
# five integer key=value lines, in order), data bytes from the run's files, --fs-capacity, and
# one-line errors with exit 2.
# Usage: storage_lines.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure

# A run of J1-Jumbo as inputs/runs/j1-jumbo.toml retains checkpoints, on data of known size.
head -c 1000 /dev/zero >"$tmp/corpus.bin"
head -c 24 /dev/zero >"$tmp/corpus.idx"
cat >"$tmp/run.toml" <<EOF
[model]
preset = "$repo/inputs/models/j1-jumbo.toml"
[train]
steps = 95367
global_batch = 1536
[data]
train = "$tmp/corpus"
tokenizer = "$tmp/tok.model"
[checkpoint]
dir = "$tmp/ck"
every = 250
keep_last = 3
keep_every = 5000
EOF

"$jumbo" plan --config "$tmp/run.toml" --gpu a100-40gb --nodes 128 --tokens 300e9 --storage \
  >"$tmp/keys.txt" 2>&1 || { cat "$tmp/keys.txt"; fail "--storage"; }
[[ $(cut -d= -f1 "$tmp/keys.txt" | tr '\n' ' ') == \
   "checkpoint_bytes checkpoints_at_peak data_bytes peak_bytes save_bytes_per_s " ]] ||
  { cat "$tmp/keys.txt"; fail "--storage keys"; }
grep -qvE '^[a-z_]+=[0-9]+$' "$tmp/keys.txt" && { cat "$tmp/keys.txt"; fail "a non-integer value"; }
source "$tmp/keys.txt"
# 382 saves of 250 steps: the newest 3, 18 older multiples of 5000, the one being written.
[[ $checkpoints_at_peak -eq 22 && $data_bytes -eq 1024 ]] ||
  { cat "$tmp/keys.txt"; fail "checkpoints_at_peak 22 and data_bytes 1024"; }
(( checkpoint_bytes > 2000000000000 && checkpoint_bytes < 2200000000000 )) ||
  fail "checkpoint_bytes $checkpoint_bytes: expected ~12 bytes x 178B parameters (1.94 TiB)"
(( peak_bytes == 22 * checkpoint_bytes + 1024 )) || fail "peak_bytes $peak_bytes"
(( save_bytes_per_s == (checkpoint_bytes + 599) / 600 )) || fail "save_bytes_per_s $save_bytes_per_s"
echo "ok   --storage: $(tr '\n' ' ' <"$tmp/keys.txt")"

"$jumbo" plan --config "$tmp/run.toml" --gpu a100-40gb --nodes 128 --tokens 300e9 \
  --fs-capacity 7200GiB >"$tmp/human.txt" 2>&1 || { cat "$tmp/human.txt"; fail "human lines"; }
for want in "^storage: one checkpoint of tp .*($checkpoint_bytes bytes)" \
            "^storage: 382 saves over 95368 steps; at the peak, during the last save, 22 checkpoints" \
            "checkpoint settings from $tmp/run.toml (every = 250, keep_last = 3, keep_every = 5000)" \
            "^storage: data 1.00 KiB" "^storage: peak .*($peak_bytes bytes)" \
            "^storage: a save within 600 s" "^storage: --fs-capacity 7.03 TiB: does NOT fit"; do
  grep -q -- "$want" "$tmp/human.txt" || { grep storage "$tmp/human.txt"; fail "no line: $want"; }
done
echo "ok   --config: the storage lines; 7200 GiB does not hold the run"

"$jumbo" plan --model inputs/models/j1-jumbo.toml --gpu a100-40gb --nodes 128 --tokens 300e9 \
  >"$tmp/model.txt" 2>&1 || { cat "$tmp/model.txt"; fail "--model"; }
grep -q "^storage: 2 checkpoints coexist .*checkpoint settings: the defaults" "$tmp/model.txt" &&
  grep -q "^storage: data unknown (--model names no data; pass --data-bytes)" "$tmp/model.txt" ||
  { grep storage "$tmp/model.txt"; fail "--model: the defaults and unknown data, said so"; }
echo "ok   --model: the storage lines from the defaults, said so"

# bad_flag FLAG VALUE: exit 2, one line naming the flag and its value.
bad_flag() {
  "$jumbo" plan --model inputs/models/j1-jumbo.toml --nodes 128 "$1" "$2" >"$tmp/err.txt" 2>&1
  local status=$?
  [[ $status -eq 2 && $(wc -l <"$tmp/err.txt") -eq 1 ]] && grep -q -- "jumbo plan: $1 $2: expected" "$tmp/err.txt" ||
    { cat "$tmp/err.txt"; fail "$1 $2: status $status"; }
}
bad_flag --fs-capacity 7x
bad_flag --data-bytes -5
bad_flag --save-target-seconds 0
"$jumbo" plan --model inputs/models/j1-jumbo.toml --nodes 1 --storage >"$tmp/err.txt" 2>&1
[[ $? -eq 2 ]] && grep -q "no layout of j1-jumbo fits 1 nodes.*no storage to size" "$tmp/err.txt" ||
  { cat "$tmp/err.txt"; fail "--storage with no layout"; }
echo "ok   errors: one line, exit 2"
finish
