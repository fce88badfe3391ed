# The opening and closing of every shell test (tests/<room>/*.sh). A test starts with
#   source "$(dirname "$0")/../support/harness.sh" "$@"
# and ends with `finish`. Sourcing it:
#   - sets strict mode: set -uo pipefail (not -e: tests check statuses themselves;
#     abort_on_error adds -e for the tests that rely on it);
#   - sets jumbo (the absolute path of $1: the binary under test as ctest passes it, the jumbo
#     binary for all but a few), repo ($2, else this checkout) and test_name (ROOM.NAME), and
#     changes to the repository root;
#   - makes tmp, a scratch directory removed at exit (kept, and named, with JUMBO_TEST_KEEP=1).
# Then:
#   on_exit CMD                 CMD (a string, evaluated at exit) joins the cleanup stack, run
#                               in reverse order at any exit: servers, background PIDs, daemons
#   on_failure CMD              CMD runs at exit if the test failed, before the cleanup (logs)
#   fail MSG...                 prints "FAIL: MSG" and counts a failure (subshells included);
#                               the test goes on, unless stop_at_first_failure was called
#   check MSG COMMAND...        COMMAND must succeed, else fail "MSG (exit N)"; returns N
#   stop_at_first_failure       from now on the first fail ends the test
#   abort_on_error              set -e: any unchecked failing command fails and ends the test
#   kill_tree PID               SIGKILL to PID's children and PID, quietly (empty PID: nothing)
#   skip MSG                    ends the test as skipped (exit 77, ctest's SKIP_RETURN_CODE)
#   finish [SUMMARY]            ends the test: exit 1 if anything failed, else 0
# At exit the closing line is always the last: "<test name>: N failures" or "<test name>: ok"
# (with ": SUMMARY" when finish was given one and nothing failed).
# An exit with a non-zero status and no failure counted (an `exit 1`, a set -e abort) counts
# as one failure.
[[ -z ${harness_loaded:-} ]] || return 0
harness_loaded=1
set -uo pipefail

harness_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
test_name=$(basename "$(dirname "$0")").$(basename "$0" .sh)
if [[ $# -lt 1 ]]; then
  echo "usage: $0 BINARY [REPO]  (as ctest runs it: see tests/CMakeLists.txt)" >&2
  exit 2
fi
jumbo=$(realpath "$1")
repo=$(realpath "${2:-$harness_dir/../..}")
cd "$repo" || exit 1

tmp=$(mktemp -d)
_harness_failed=$(mktemp)  # one line per failure: counted at exit, from subshells too
_harness_cleanups=()
_harness_failure_hooks=()
_harness_stop_at_first=0
_harness_summary=

on_exit() { _harness_cleanups+=("$1"); }
on_failure() { _harness_failure_hooks+=("$1"); }

fail() {
  echo "FAIL: $*"
  echo "$*" >>"$_harness_failed"
  ((_harness_stop_at_first == 0)) || exit 1
  return 0
}

check() {
  local message=$1 status=0
  shift
  "$@" || status=$?
  ((status == 0)) && return 0
  fail "$message (exit $status)"
  [[ $- != *e* ]] || exit "$status"  # under abort_on_error, as the bare command would
  return "$status"
}

stop_at_first_failure() { _harness_stop_at_first=1; }

abort_on_error() {
  # Not -E: an ERR trap inherited by command substitutions would count their expected misses.
  set -e
  trap 'fail "line $LINENO: \`$BASH_COMMAND\` exited $?"' ERR
}

kill_tree() {
  [[ -n ${1:-} ]] || return 0
  pkill -9 -P "$1" 2>/dev/null
  kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null  # a child of this shell: reaped without a "Killed" line
  return 0
}

skip() {
  echo "SKIP: $*"
  exit 77
}

finish() {
  [[ -s $_harness_failed ]] && exit 1
  _harness_summary=${1:-}
  exit 0
}

_harness_exit() {
  local status=$? i failures
  set +eu
  trap - ERR
  failures=$(wc -l <"$_harness_failed")
  ((status == 0 || status == 77 || failures > 0)) || {
    echo "FAIL: exited $status"
    failures=1
  }
  ((failures == 0 || status != 0)) || status=1
  if ((status != 0 && status != 77)); then
    for i in "${_harness_failure_hooks[@]}"; do eval "$i"; done
  fi
  for ((i = ${#_harness_cleanups[@]} - 1; i >= 0; i--)); do eval "${_harness_cleanups[i]}"; done
  rm -f "$_harness_failed"
  if [[ -n ${JUMBO_TEST_KEEP:-} ]]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
  if ((status == 77)); then
    echo "$test_name: skipped"
  elif ((failures > 0)); then
    echo "$test_name: $failures failures"
  else
    echo "$test_name: ok${_harness_summary:+: $_harness_summary}"
  fi
  exit "$status"
}
trap _harness_exit EXIT
trap 'exit 130' INT  # so that a test stopped by hand or by a timeout cleans up too
trap 'exit 143' TERM
