# Sourced by test scripts after tests/support/harness.sh (its $tmp and fail). A user mistake
# must end in exit status 2 and one line on stderr, never a crash:
#   expect_error NAME REGEX COMMAND...   COMMAND's stderr line must match REGEX.
if [[ -z ${harness_loaded:-} ]]; then
  echo "expect_error.sh: source tests/support/harness.sh first" >&2
  exit 1
fi
expect_error() {
  local name=$1 want=$2
  shift 2
  local status=0
  "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" || status=$?
  [[ $status -eq 2 ]] || { fail "$name: exited $status, expected 2"; return 0; }
  [[ $(wc -l <"$tmp/$name.err") -eq 1 ]] || { fail "$name: stderr is not one line"; return 0; }
  local line
  line=$(cat "$tmp/$name.err")
  [[ $line =~ $want ]] || { fail "$name: error '$line' does not match '$want'"; return 0; }
  echo "$name: $line"
}
