#!/usr/bin/env bash
# `jumbo data prepare` over ranks: 1, 2 and 4 ranks write byte-identical datasets; only rank 0
# prints progress; a bad line stops the job naming rank, file and line and leaves no index; a
# killed job leaves no index and a rerun keeps its finished parts and completes the same
# dataset. Usage: prepare_ranks.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
abort_on_error
stop_at_first_failure
job=
on_exit 'kill_tree "$job"'
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1

"$jumbo" data tokenizer -i "$repo/inputs/data/brown-valid.jsonl" -o "$tmp/tok" --vocab-size 500 \
  >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "tokenizer training"; }

# ~12 MB in 7 files: the Brown corpus twice, the training split cut into three files each.
mkdir "$tmp/in"
cp "$repo/inputs/data/brown-valid.jsonl" "$tmp/in/"
split -n l/3 -d --additional-suffix=.jsonl "$repo/inputs/data/brown-train.jsonl" "$tmp/in/train-"
split -n l/3 -d --additional-suffix=.jsonl "$repo/inputs/data/brown-train.jsonl" "$tmp/in/again-"
lines=$(cat "$tmp/in"/*.jsonl | wc -l)

prepare() {  # prepare RANKS OUTDIR [flags...]
  local n=$1 out=$2
  shift 2
  mpirun -np "$n" --tag-output "$jumbo" data prepare -i "$tmp/in/*.jsonl" -t "$tmp/tok.model" \
    -o "$out/d" --part-mb 1 --threads 1 "$@"
}

# 1, 2 and 4 ranks: the same files, byte for byte.
for n in 1 2 4; do
  prepare "$n" "$tmp/np$n" --progress-every 0.01 >"$tmp/log$n" 2>&1 ||
    { cat "$tmp/log$n"; fail "prepare on $n ranks"; }
  grep -q "wrote $tmp/np$n/d.parts: 13 parts (0 kept from an earlier run), $lines documents" \
    "$tmp/log$n" || { cat "$tmp/log$n"; fail "no summary of 13 parts and $lines documents on $n ranks"; }
done
for n in 2 4; do
  diff -r "$tmp/np1" "$tmp/np$n" >"$tmp/diff" 2>&1 ||
    { cat "$tmp/diff"; fail "1 and $n ranks wrote different datasets"; }
done
[[ $(ls "$tmp/np1" | grep -c '\.part-.*\.idx$') -eq 13 ]] || { ls "$tmp/np1"; fail "not 13 parts"; }
echo "ok: 1, 2 and 4 ranks wrote identical datasets ($(ls "$tmp/np1" | wc -l) files, $lines documents)"

# Progress: rank 0 alone prints it, with rates and the time left.
for n in 2 4; do
  progress=$(grep -c '^\[1,0\]<stdout>:prepare: .* docs/s .* tokens/s .* left' "$tmp/log$n" || true)
  [[ $progress -ge 1 ]] || { cat "$tmp/log$n"; fail "no progress line from rank 0 on $n ranks"; }
  others=$(grep -v '^\[1,0\]' "$tmp/log$n" | grep -c 'prepare:' || true)
  [[ $others -eq 0 ]] || { cat "$tmp/log$n"; fail "ranks other than 0 print progress on $n ranks"; }
done
echo "ok: rank 0 alone prints progress: $(grep -m1 'prepare:' "$tmp/log4" | sed 's/^\[[0-9,]*\]<stdout>://')"

# A bad line deep in a file, in a part rank 1 encodes: non-zero, one line naming rank, file
# and line; no index that looks complete.
mkdir "$tmp/bad"
cp "$tmp/in"/*.jsonl "$tmp/bad/"
sed -i '30i {"text": "unterminated' "$tmp/bad/train-01.jsonl"
status=0
mpirun -np 2 "$jumbo" data prepare -i "$tmp/bad/*.jsonl" -t "$tmp/tok.model" -o "$tmp/badout/d" \
  --part-mb 1 --threads 1 >"$tmp/out" 2>"$tmp/err" || status=$?
[[ $status -ne 0 ]] || { cat "$tmp/out" "$tmp/err"; fail "a bad line exits 0"; }
grep -qE "^jumbo: rank 1: error: $tmp/bad/train-01.jsonl:30: not valid JSON" "$tmp/err" ||
  { cat "$tmp/err"; fail "no 'jumbo: rank 1: error: FILE:30: not valid JSON' line"; }
[[ ! -e $tmp/badout/d.parts ]] || fail "a failed preparation left $tmp/badout/d.parts"
echo "ok: exit $status, $(grep -m1 '^jumbo: rank' "$tmp/err")"

# Killed partway (every rank SIGKILLed once a part is done): no index; a rerun keeps the
# finished parts and writes the same dataset as a clean run.
mpirun -np 2 "$jumbo" data prepare -i "$tmp/in/*.jsonl" -t "$tmp/tok.model" -o "$tmp/killed/d" \
  --part-mb 1 --threads 1 --progress-every 0 >"$tmp/log" 2>&1 &
job=$!  # mpirun itself: its children are the ranks
for _ in $(seq 1 600); do  # up to 30 s for the first part
  compgen -G "$tmp/killed/d.part-*.idx" >/dev/null && break
  sleep 0.05
done
[[ ! -e $tmp/killed/d.parts ]] || fail "the job finished before it could be killed"
compgen -G "$tmp/killed/d.part-*.idx" >/dev/null || { cat "$tmp/log"; fail "no part within 30 s"; }
pkill -9 -P "$job" || true
status=0
wait "$job" || status=$?
job=
[[ $status -ne 0 ]] || fail "the killed job exited 0"
[[ ! -e $tmp/killed/d.parts ]] || fail "a killed preparation left $tmp/killed/d.parts"
done_parts=$(ls "$tmp/killed" | grep -c '\.idx$' || true)
[[ $done_parts -lt 13 ]] || fail "all 13 parts finished before the kill"
prepare 2 "$tmp/killed" --progress-every 0 >"$tmp/log" 2>&1 || { cat "$tmp/log"; fail "the rerun"; }
kept=$(sed -n 's/.*13 parts (\([0-9]*\) kept from an earlier run).*/\1/p' "$tmp/log")
[[ -n $kept && $kept -ge 1 && $kept -eq $done_parts ]] ||
  { cat "$tmp/log"; fail "the rerun kept '${kept}' parts, expected the $done_parts finished ones"; }
diff -r "$tmp/np1" "$tmp/killed" >"$tmp/diff" 2>&1 ||
  { cat "$tmp/diff"; fail "the finished rerun differs from a clean run"; }
finish "killed with $done_parts of 13 parts done, no index; the rerun kept $kept and equals a clean run"
