#!/usr/bin/env bash
# The S3 checkpoint storage against s3rver (a local S3 API) behind the proxy that checks
# signatures (tests/support/s3rver.sh): starts both on free ports with the bucket
# jumbo-test, runs the S3* tests of the test_ckpt binary, stops them.
# Usage: s3.sh TEST_CKPT_BINARY
set -uo pipefail
test_ckpt=$1
source "$(dirname "$0")/../support/s3rver.sh"
tmp=$(mktemp -d)
trap 'stop_s3rver; rm -rf "$tmp"' EXIT
start_s3rver "$tmp" jumbo-test || exit 1
export JUMBO_TEST_S3_ENDPOINT=$S3_ENDPOINT
status=0
"$test_ckpt" --gtest_filter='S3*' || status=$?
if ((status != 0)); then
  echo "ckpt.s3: tests failed; the last lines of the s3rver and proxy logs:" >&2
  tail -n 30 "$tmp/s3rver.log" "$tmp/s3_proxy.log" >&2
fi
exit "$status"
