# slurm/deadline.sh: sourced by slurm/common.sh. The deadline stop: at job start the batch
# shell works out when its nodes go away, from what it can read, and signals itself early
# enough for jumbo to finish a step and save a checkpoint (the SIGUSR1 path of common.sh).
#
# Where a deadline comes from (the earliest counts):
#   job       the job's own end time (squeue %e): its time limit. --signal=B:USR1@600 of the
#             train scripts stops it too; this stop uses the measured save time instead.
#   reservation  SLURM_JOB_RESERVATION's EndTime (scontrol show reservation): the job runs in
#             a reservation (a maintenance window, an admin's booking).
#   capacity-block  JUMBO_CAPACITY_BLOCK_END, the Capacity Block's EndDate (`aws ec2
#             describe-capacity-reservations`): EC2 warns 40 minutes before the end that its
#             instances begin to terminate 10 minutes later (EC2 User Guide, "Monitor Capacity
#             Blocks using EventBridge"), so the nodes go at EndDate - 30 minutes. Slurm cannot
#             tell: ParallelCluster holds a Capacity Block's nodes in a Slurm reservation only
#             until the block starts (ParallelCluster User Guide, "AWS ParallelCluster
#             processes", clustermgtd), so an active block has no end in Slurm.
#   end-time  JUMBO_END_TIME: any time the user knows the nodes go.
# Times: ISO 8601 as `date -d` reads it (2026-12-02T18:00:00Z, 2026-12-02 18:00 +02:00);
# without a zone, the batch host's local time (as Slurm prints its own).
#
# The lead time: the last save's measured seconds (<checkpoint dir>/last_save.json,
# {"step":N,"bytes":B,"seconds":S}, written by jumbo train; 600 s when absent, e.g. before the
# first save or for an s3:// checkpoint directory) + one step (the last step_time_s in the
# run's metrics.jsonl) + JUMBO_DEADLINE_MARGIN_S (default 60). A stop for the job's own end
# requeues like a time limit; a stop for any other deadline does not (the capacity is gone:
# a requeued job would find the deadline past): the job ends with exit 75, and a job
# submitted again where there is capacity resumes from the checkpoint.

JUMBO_DEADLINE_DEFAULT_SAVE_S=600

# jumbo_epoch TIME: seconds since the epoch, empty when TIME is not a time date can read.
jumbo_epoch() {
  [[ -n $1 && $1 != N/A && $1 != Unknown && $1 != None ]] || return 0
  date -d "$1" +%s 2>/dev/null
  return 0
}

# jumbo_check_deadline_inputs: the user's deadline settings, one line each when wrong (exit 2).
jumbo_check_deadline_inputs() {
  local v
  for v in JUMBO_END_TIME JUMBO_CAPACITY_BLOCK_END; do
    [[ -z ${!v} || -n $(jumbo_epoch "${!v}") ]] ||
      jumbo_fail_input "$v=${!v}: expected an ISO 8601 time such as 2026-12-02T18:00:00Z"
  done
  [[ $JUMBO_DEADLINE_MARGIN_S =~ ^[0-9]+$ ]] ||
    jumbo_fail_input "JUMBO_DEADLINE_MARGIN_S=$JUMBO_DEADLINE_MARGIN_S: expected a whole number of seconds"
}

# jumbo_json_number FILE KEY: a number from a one-object JSON file (jq, else python3;
# /dev/stdin for a pipe); empty when the file or key is missing or not a number.
jumbo_json_number() {
  [[ -r $1 ]] || return 0
  if command -v jq >/dev/null; then
    jq -er --arg k "$2" '.[$k] | numbers' "$1" 2>/dev/null
  else
    python3 -c 'import json, sys
v = json.load(open(sys.argv[1])).get(sys.argv[2])
if isinstance(v, (int, float)) and not isinstance(v, bool): print(v)' "$1" "$2" 2>/dev/null
  fi
  return 0
}

# jumbo_deadline: "EPOCH KIND SOURCE" of the earliest deadline (KIND: job, reservation,
# capacity-block, end-time; SOURCE: words for the log), nothing when there is none.
jumbo_deadline() {
  local best= kind= source= t
  consider() {
    [[ -n $1 ]] && { [[ -z $best ]] || (($1 < best)); } && best=$1 kind=$2 source=$3
    return 0
  }
  if [[ -n ${SLURM_JOB_ID:-} ]]; then
    consider "$(jumbo_epoch "$(squeue -h -j "$SLURM_JOB_ID" -o %e 2>/dev/null | head -1)")" \
      job "the job's time limit"
  fi
  if [[ -n ${SLURM_JOB_RESERVATION:-} ]]; then
    t=$(scontrol show reservation "$SLURM_JOB_RESERVATION" 2>/dev/null |
      tr ' ' '\n' | sed -n 's/^EndTime=//p' | head -1)
    consider "$(jumbo_epoch "$t")" reservation "reservation $SLURM_JOB_RESERVATION"
  fi
  if [[ -n $JUMBO_CAPACITY_BLOCK_END ]]; then
    t=$(jumbo_epoch "$JUMBO_CAPACITY_BLOCK_END")
    consider "$((t - 1800))" capacity-block \
      "the Capacity Block (JUMBO_CAPACITY_BLOCK_END=$JUMBO_CAPACITY_BLOCK_END - 30 min)"
  fi
  [[ -n $JUMBO_END_TIME ]] &&
    consider "$(jumbo_epoch "$JUMBO_END_TIME")" end-time "JUMBO_END_TIME=$JUMBO_END_TIME"
  unset -f consider
  [[ -n $best ]] && echo "$best $kind $source"
  return 0
}

# jumbo_schedule_deadline_stop: the stop timer. Prints one line: the deadline, its source,
# the lead time and when the stop comes. The timer is a background sleep that sends SIGUSR2
# to this shell (USR2, so the decision can tell it from a time limit or a user's USR1);
# jumbo_on_stop then forwards SIGUSR1 to the launcher as for any stop. Killed at exit.
jumbo_schedule_deadline_stop() {
  JUMBO_DEADLINE_SOURCE= JUMBO_DEADLINE_KIND=
  local deadline kind source save step lead now stop_at
  read -r deadline kind source <<<"$(jumbo_deadline)"
  if [[ -z $deadline ]]; then
    jumbo_log "deadline: none (no job end time, reservation, JUMBO_CAPACITY_BLOCK_END or JUMBO_END_TIME)"
    return
  fi
  [[ $JUMBO_CKPT_DIR != s3://* ]] && save=$(jumbo_json_number "$JUMBO_CKPT_DIR/last_save.json" seconds)
  [[ -s $JUMBO_RUN_DIR/metrics.jsonl ]] &&
    step=$(tail -1 "$JUMBO_RUN_DIR/metrics.jsonl" | jumbo_json_number /dev/stdin step_time_s)
  save=${save:+$(printf '%.0f' "$save")}
  step=${step:+$(printf '%.0f' "$step")}
  local save_note="last save ${save:-unknown, assumed $JUMBO_DEADLINE_DEFAULT_SAVE_S} s"
  : "${save:=$JUMBO_DEADLINE_DEFAULT_SAVE_S}" "${step:=0}"
  lead=$((save + step + JUMBO_DEADLINE_MARGIN_S))
  now=$(date +%s)
  stop_at=$((deadline - lead))
  ((stop_at < now)) && stop_at=$now
  JUMBO_DEADLINE_SOURCE=$source JUMBO_DEADLINE_KIND=$kind
  jumbo_log "deadline: $(date -d "@$deadline" '+%F %T %Z') from $source; graceful stop at" \
    "$(date -d "@$stop_at" '+%F %T %Z') (in $((stop_at - now)) s), $lead s before it:" \
    "$save_note + step $step s + margin $JUMBO_DEADLINE_MARGIN_S s"
  # The subshell waits on its sleep; TERM (at exit) ends both.
  (
    trap 'kill "$s" 2>/dev/null; exit 0' TERM
    sleep "$((stop_at - now))" & s=$!
    wait "$s" && kill -USR2 $$
  ) &
  JUMBO_DEADLINE_TIMER_PID=$!
}

jumbo_cancel_deadline_stop() {
  [[ -n ${JUMBO_DEADLINE_TIMER_PID:-} ]] && kill "$JUMBO_DEADLINE_TIMER_PID" 2>/dev/null
  JUMBO_DEADLINE_TIMER_PID=
}
