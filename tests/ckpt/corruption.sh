#!/usr/bin/env bash
# Corrupt checkpoints give one clear line naming the file, and exit 2 when named explicitly;
# with resume = "auto" the run falls back to the previous complete checkpoint and says so.
# Cases: truncated shard, missing shard, one flipped byte, a manifest of another model,
# a malformed manifest. Usage: corruption.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish

# 2 ranks, dp 2 with ZeRO-1: two shard files per checkpoint.
train() {
  train_small "$jumbo" 2 "$tmp" --set parallel.zero1=true --set train.global_batch=4 \
    --set log.every=100 "$@"
}
train --set train.steps=6 --set "checkpoint.dir=$tmp/good" --set checkpoint.every=3 \
  >"$tmp/save.log" 2>&1 || { cat "$tmp/save.log"; fail "saving run"; finish; }

# case NAME EXPECTED-MESSAGE-REGEX COMMAND...: corrupt a copy of the checkpoints with COMMAND
# (run inside the copy), then resume step 6 explicitly (must fail, naming the problem) and
# with auto (must fall back to step 3 and finish).
case_() {
  local name=$1 want=$2
  shift 2
  local ck=$tmp/$name
  cp -r "$tmp/good" "$ck"
  (cd "$ck/step_00000006" && eval "$@")
  train --set train.steps=7 --set "checkpoint.dir=$ck" --set checkpoint.resume=6 \
    >"$tmp/$name.explicit" 2>&1
  local status=$?
  local line
  line=$(grep -m1 "error:" "$tmp/$name.explicit")
  [[ $status -eq 2 ]] || fail "$name: explicit resume exited $status, expected 2"
  [[ $line =~ $want ]] || fail "$name: error line '$line' does not match '$want'"
  grep -q "internal error\|terminate called\|Segmentation" "$tmp/$name.explicit" &&
    fail "$name: crash output"
  echo "$name (explicit): $line"
  train --set train.steps=7 --set "checkpoint.dir=$ck" --set checkpoint.resume=auto \
    >"$tmp/$name.auto" 2>&1 || { cat "$tmp/$name.auto"; fail "$name: auto resume failed"; return; }
  grep -qE "checkpoint: skipping $ck/step_00000006: .*$want" "$tmp/$name.auto" ||
    fail "$name: auto did not report why step 6 was skipped"
  grep -q "resumed from $ck/step_00000003 (step 3" "$tmp/$name.auto" ||
    fail "$name: auto did not fall back to step 3"
  grep "checkpoint: skipping" "$tmp/$name.auto" | head -1
}

case_ truncated "tp0-pp0-dp1.h5: [0-9]+ bytes, the manifest says [0-9]+ \(truncated or replaced\)" \
  'truncate -s 1000 tp0-pp0-dp1.h5'
case_ missing "tp0-pp0-dp0.h5: shard file is missing" 'rm tp0-pp0-dp0.h5'
case_ flipped "tp0-pp0-dp1.h5: CRC-32 [0-9a-f]+, the manifest says [0-9a-f]+ \(the file is corrupt\)" \
  'python3 -c "f=open(\"tp0-pp0-dp1.h5\",\"r+b\"); f.seek(5000); b=f.read(1); f.seek(5000); f.write(bytes([b[0]^1]))"'
case_ malformed "manifest.json: malformed manifest" 'echo "{\"format\": " > manifest.json'
case_ other_model "manifest.json: model.d_model = 32 in the checkpoint, but .* says 64" \
  "sed -i 's/\"d_model\": 64/\"d_model\": 32/' manifest.json"

# A run of another model against good checkpoints: refused, nothing overwritten.
train --set train.steps=7 --set model.d_model=32 --set model.heads=4 \
  --set "checkpoint.dir=$tmp/good" --set checkpoint.resume=auto >"$tmp/mismatch.log" 2>&1
status=$?
[[ $status -eq 2 ]] || fail "another model with auto exited $status, expected 2"
grep -q "none of the 2 complete checkpoints under $tmp/good could be loaded" "$tmp/mismatch.log" ||
  fail "another model: no refusal line"
grep -m1 "error:" "$tmp/mismatch.log"
# A mistyped checkpoint path: refused, and not created.
train --set train.steps=7 --set "checkpoint.resume=$tmp/nope/step_00000006" >"$tmp/nope.log" 2>&1
status=$?
[[ $status -eq 2 ]] || fail "missing resume path exited $status, expected 2"
grep -q "checkpoint.resume = \"$tmp/nope/step_00000006\": no such checkpoint directory" \
  "$tmp/nope.log" || fail "missing resume path: no clear line"
[[ ! -e $tmp/nope ]] || fail "missing resume path: the directory was created"
finish "every corruption named its file; auto fell back to step 3"
