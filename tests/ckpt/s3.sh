#!/usr/bin/env bash
# The S3 checkpoint storage against s3rver (a local S3 API) behind the proxy that checks
# signatures (tests/support/s3rver.sh): starts both on free ports with the bucket
# jumbo-test, runs the S3ServerTest cases of the test_ckpt binary (registered only here, see
# tests/CMakeLists.txt), stops them. Usage: s3.sh TEST_CKPT_BINARY
source "$(dirname "$0")/../support/harness.sh" "$@"
test_ckpt=$jumbo  # $1: the gtest binary
source tests/support/s3rver.sh
on_exit stop_s3rver
check "starting s3rver" start_s3rver "$tmp" jumbo-test || finish
on_failure 'echo "the last lines of the s3rver and proxy logs:"; tail -n 30 "$tmp/s3rver.log" "$tmp/s3_proxy.log"'
export JUMBO_TEST_S3_ENDPOINT=$S3_ENDPOINT
check "the S3ServerTest cases" "$test_ckpt" --gtest_filter='S3ServerTest.*'
finish
