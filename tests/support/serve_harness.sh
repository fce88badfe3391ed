# Sourced after tests/support/harness.sh (or by a script that sets $tmp and a fail()): a
# `jumbo serve` in the background, found by its listening line and stopped by PID.
#   start_server NAME COMMAND...   starts it (stdout/stderr in $tmp/NAME.out/.err); sets
#                                  server_pid and port from "listening on http(s)://HOST:PORT"
#   stop_server NAME [SIGNAL]      SIGTERM (or SIGNAL); it must exit 0 having said it stopped.
#                                  mpirun forwards SIGUSR1 to the ranks; a SIGTERM to mpirun
#                                  reaches them too, but mpirun then exits 1 whatever they do
#   stop_server_now                for on_exit: stops whatever runs, no checks
if [[ -z ${tmp:-} ]] || ! declare -F fail >/dev/null; then
  echo "serve_harness.sh: needs \$tmp and fail(): source tests/support/harness.sh first" >&2
  exit 1
fi
stop_server_now() {
  if [[ -n ${server_pid:-} ]]; then
    kill -TERM "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    server_pid=
  fi
}

start_server() {
  local name=$1
  shift
  "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  server_pid=$!
  port=
  for _ in $(seq 600); do
    port=$(grep -oE 'listening on https?://127\.0\.0\.1:[0-9]+' "$tmp/$name.out" | grep -oE '[0-9]+$')
    [[ -n $port ]] && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$tmp/$name.out" "$tmp/$name.err"
  fail "$name: no listening line (command: $*)"
  stop_server_now
  return 1
}

stop_server() {
  kill "-${2:-TERM}" "$server_pid"
  wait "$server_pid"
  local status=$?
  server_pid=
  [[ $status -eq 0 ]] || { tail -20 "$tmp/$1.err"; fail "$1: exited $status after SIG${2:-TERM}, expected 0"; }
  grep -q "^jumbo serve: stopped after" "$tmp/$1.out" || fail "$1: no 'stopped' line"
}
