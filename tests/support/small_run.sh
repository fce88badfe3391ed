# Sourced by test scripts (run from the repository root): a small real training run.
#   make_small_data JUMBO DIR   a 500-piece tokenizer and a prepared dataset from the shipped
#                               Brown validation split, in seconds (DIR/tok.model, DIR/data.*)
#   train_small JUMBO NP DIR [--set ...]
#                               the tiny model on that data under mpirun with NP ranks; later
#                               --set arguments override the defaults here
#   losses METRICS.jsonl        "step loss" per line, the loss exactly as written
#   rank_pids JOB               the rank processes of an mpirun started in the background
make_small_data() {
  local jumbo=$1 dir=$2
  "$jumbo" data tokenizer --input inputs/data/brown-valid.jsonl --output "$dir/tok" \
    --vocab-size 500 --input-sentence-size 2000 --threads 1 >/dev/null || return 1
  "$jumbo" data prepare --input inputs/data/brown-valid.jsonl --tokenizer "$dir/tok.model" \
    --output "$dir/data" >/dev/null || return 1
}

train_small() {
  local jumbo=$1 np=$2 dir=$3
  shift 3
  OMP_NUM_THREADS=1 mpirun -np "$np" --oversubscribe "$jumbo" train \
    --set model.preset=inputs/models/tiny.toml --set parallel.micro_batch=1 \
    --set train.eval_every=0 --set "data.train=$dir/data" --set data.valid= \
    --set "data.tokenizer=$dir/tok.model" --set log.metrics_file= --set log.peak_tflops=1 "$@"
}

losses() {
  python3 -c 'import json,sys
for l in open(sys.argv[1]): d=json.loads(l); print(d["step"], repr(d["loss"]))' "$1"
}

# JOB is mpirun itself, or the subshell that runs a function calling it (`train_small ... &`):
# the ranks are mpirun's children either way.
rank_pids() {
  local launcher
  launcher=$(pgrep -x mpirun -P "$1" || echo "$1")
  pgrep -P "$launcher"
}
