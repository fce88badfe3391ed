#!/usr/bin/env bash
# S3 signatures are checked (tests/support/s3_verify_proxy.py in front of s3rver): requests
# signed by botocore pass and the same requests tampered with are refused
# (s3_proxy_check.py); jumbo with a wrong AWS_SECRET_ACCESS_KEY fails with exit 2 and one
# `jumbo: error:` line naming the s3:// URL and SignatureDoesNotMatch, no stack trace, no
# secret; with the right key the same command gets past the signature.
# Usage: s3_wrong_key.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
source tests/support/s3rver.sh
on_exit stop_s3rver
check "starting s3rver" start_s3rver "$tmp/s3" jumbo-ckpt || finish
on_failure 'echo "the proxy log:"; cat "$tmp/s3/s3_proxy.log"'

python3 tests/ckpt/s3_proxy_check.py "$S3_ENDPOINT" jumbo-ckpt || fail "s3_proxy_check.py"

secret=wrong-secret-Q7x
url=s3://jumbo-ckpt/runs/a
sig_error="^jumbo: (rank 0: )?error: S3 [A-Z]+ $url/[^ ]*: HTTP 403 SignatureDoesNotMatch: "
sig_error+="The request signature we calculated does not match"
# check_refusal NAME STATUS: the exit status and the stderr of a command run with $secret.
check_refusal() {
  local name=$1 status=$2 err=$tmp/$1.err
  [[ $status -eq 2 ]] || fail "$name: exited $status, expected 2"
  grep -qE "$sig_error" "$err" || fail "$name: no line matching '$sig_error'"
  [[ $(grep -c '^jumbo:' "$err") -eq 1 ]] || fail "$name: not exactly one jumbo: line"
  grep -qE 'terminate called|what\(\)|Aborted|Segmentation|backtrace|^ *#[0-9]+ ' "$err" &&
    fail "$name: a crash or stack trace"
  grep -q -- "$secret" "$tmp/$name.out" "$err" && fail "$name: the secret was printed"
  grep '^jumbo:' "$err"
}

# `jumbo ckpt inspect` runs in one process: its stderr is the one line.
AWS_ENDPOINT_URL_S3=$S3_ENDPOINT AWS_SECRET_ACCESS_KEY=$secret "$jumbo" ckpt inspect "$url" \
  >"$tmp/inspect.out" 2>"$tmp/inspect.err"
check_refusal inspect $?
[[ $(wc -l <"$tmp/inspect.err") -eq 1 ]] ||
  { cat "$tmp/inspect.err"; fail "inspect: stderr is not one line"; }
grep -q "refused GET /jumbo-ckpt/runs/a/.*403 SignatureDoesNotMatch" "$tmp/s3/s3_proxy.log" ||
  fail "the proxy did not log the refused request"
# The right key gets past the signature: the bucket is just empty there.
AWS_ENDPOINT_URL_S3=$S3_ENDPOINT "$jumbo" ckpt inspect "$url" >/dev/null 2>"$tmp/right.err"
grep -q "neither a checkpoint directory" "$tmp/right.err" ||
  fail "inspect with the right key: $(cat "$tmp/right.err")"

# A 2-rank training run resuming from S3: one jumbo line (mpirun adds its MPI_ABORT notice).
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
AWS_SECRET_ACCESS_KEY=$secret train_small "$jumbo" 2 "$tmp" --set train.steps=2 \
  --set train.global_batch=4 --set log.every=1 --set checkpoint.every=2 \
  --set "checkpoint.dir=$url" --set checkpoint.resume=auto --set "checkpoint.s3_endpoint=$S3_ENDPOINT" \
  >"$tmp/train.out" 2>"$tmp/train.err"
check_refusal train $?
grep -q "^step " "$tmp/train.out" && fail "train: trained without its checkpoint storage"

finish "tampered requests and a wrong secret key are refused, each in one clear line"
