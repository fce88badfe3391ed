#!/usr/bin/env bash
# The S3 checkpoint storage against s3rver (a local S3 API): starts it on a free port with
# the bucket jumbo-test, runs the S3* tests of the test_ckpt binary, stops it.
# Usage: s3.sh TEST_CKPT_BINARY
set -euo pipefail
test_ckpt=$1

s3rver=${JUMBO_S3RVER:-}
if [[ -z $s3rver && -x $HOME/.cache/jumbo/npm/node_modules/.bin/s3rver ]]; then
  s3rver=$HOME/.cache/jumbo/npm/node_modules/.bin/s3rver
fi
if [[ -z $s3rver ]]; then
  s3rver=$(command -v s3rver || true)
fi
if [[ -z $s3rver || ! -x $s3rver ]]; then
  echo "ckpt.s3: s3rver not found (JUMBO_S3RVER, ~/.cache/jumbo/npm, PATH):" \
    "run scripts/install-deps.sh" >&2
  exit 1
fi

tmp=$(mktemp -d)
pid=
cleanup() {
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# s3rver makes ListObjectsV2 continuation tokens with DES, which OpenSSL 3 keeps in its
# legacy provider: without it any truncated listing is a 500.
if node --openssl-legacy-provider -e 0 2>/dev/null; then
  export NODE_OPTIONS="--openssl-legacy-provider${NODE_OPTIONS:+ $NODE_OPTIONS}"
fi

# A port nothing listens on now (the kernel's pick); s3rver binds it a moment later.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
"$s3rver" -d "$tmp/data" -p "$port" -a 127.0.0.1 --configure-bucket jumbo-test \
  >"$tmp/s3rver.log" 2>&1 &
pid=$!

up=
for _ in $(seq 150); do  # 15 s
  if ! kill -0 "$pid" 2>/dev/null; then break; fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then up=1; break; fi
  sleep 0.1
done
if [[ -z $up ]]; then
  echo "ckpt.s3: s3rver did not answer on 127.0.0.1:$port within 15 s; its log:" >&2
  cat "$tmp/s3rver.log" >&2
  exit 1
fi

export JUMBO_TEST_S3_ENDPOINT=http://127.0.0.1:$port
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true
unset AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_DEFAULT_REGION
status=0
"$test_ckpt" --gtest_filter='S3*' || status=$?
if ((status != 0)); then
  echo "ckpt.s3: tests failed; the last lines of the s3rver log:" >&2
  tail -n 30 "$tmp/s3rver.log" >&2
fi
exit "$status"
