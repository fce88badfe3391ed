#!/usr/bin/env bash
# Records the bits a refactoring must not change: every per-step loss (and validation loss)
# of the layouts the layout tests run, the demo's first 50 steps, and checkpoint resumes
# (same layout and another), plus a hash of the exported weights after each resume.
#   scripts/record-losses.sh OUT.txt [BUILD_DIR]
# Run it before and after a change on the same machine and `diff` the two files: the losses
# are written exactly (Python's repr of the JSON double). Bits depend on the CPU and the
# libraries, so the files are not comparable between machines. Takes ~10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$(realpath -m "$1")
build=${2:-build}
jumbo=$(realpath "$build/jumbo")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The tokenizers and datasets are made once and kept, so that two recordings read the same.
data=$(realpath -m "$build/record-data")
source tests/support/small_run.sh
if [[ ! -f $data/data.parts ]]; then
  mkdir -p "$data"
  make_small_data "$jumbo" "$data"
fi
: >"$out"

# name, then the metrics file: "name step loss [val_loss]" per step.
record() {
  python3 -c 'import json,sys
for l in open(sys.argv[2]):
    d = json.loads(l)
    print(sys.argv[1], d["step"], repr(d["loss"]), repr(d.get("val_loss")))' "$1" "$2" >>"$out"
}

# The layout tests' model and schedule, on the small data, with an evaluation every 5 steps.
layout_run() {
  local name=$1 np=$2
  shift 2
  rm -f "$work/m.jsonl"  # the metrics log appends (a resumed run continues it)
  OMP_NUM_THREADS=1 mpirun -np "$np" --oversubscribe "$jumbo" train \
    --set model.preset=inputs/models/tiny.toml --set model.layers=8 --set model.d_model=64 \
    --set model.heads=8 --set model.ffn=128 --set model.vocab=1024 --set model.context=16 \
    --set parallel.micro_batch=1 --set parallel.bucket_size=5000 --set train.steps=10 \
    --set train.global_batch=24 --set train.lr=1e-3 --set train.min_lr=1e-4 \
    --set train.warmup_tokens=200 --set train.eval_every=5 --set train.eval_batches=8 \
    --set "data.train=$data/data" --set "data.valid=$data/data" \
    --set "data.tokenizer=$data/tok.model" --set log.peak_tflops=1 \
    --set "log.metrics_file=$work/m.jsonl" "$@" >"$work/log" 2>&1 ||
    { cat "$work/log"; echo "record-losses: $name failed" >&2; exit 1; }
  record "$name" "$work/m.jsonl"
}

for tp_pp in 1,1 2,1 4,1 8,1 1,8 2,2 2,4 1,2 4,2; do
  tp=${tp_pp%,*} pp=${tp_pp#*,}
  sel=none sp=false
  ((pp > 1)) && sel=selective
  layout_run "layout-$tp-$pp-plain" 8 --set parallel.tp=$tp --set parallel.pp=$pp \
    --set parallel.recompute=$sel
  full=none
  ((tp > 1)) && full=full sp=true
  layout_run "layout-$tp-$pp-zero1" 8 --set parallel.tp=$tp --set parallel.pp=$pp \
    --set parallel.zero1=true --set parallel.recompute=$full --set parallel.sequence_parallel=$sp
  if ((tp > 1)); then
    layout_run "layout-$tp-$pp-sp" 8 --set parallel.tp=$tp --set parallel.pp=$pp \
      --set parallel.recompute=selective --set parallel.sequence_parallel=true
  fi
done
for tp_pp in 1,3 2,3 1,1 2,1 1,2; do
  tp=${tp_pp%,*} pp=${tp_pp#*,}
  layout_run "layout6-$tp-$pp" 6 --set parallel.tp=$tp --set parallel.pp=$pp \
    --set train.eval_batches=6
done
layout_run "layout6-uneven" 6 --set parallel.pp=3 --set 'parallel.stage_layers=[2,5,1]' \
  --set train.eval_batches=6
for tp_pp in 1,2 2,2 1,4; do
  tp=${tp_pp%,*} pp=${tp_pp#*,}
  zero1=false
  ((tp > 1)) && zero1=true
  layout_run "interleaved-$tp-$pp" 8 --set parallel.tp=$tp --set parallel.pp=$pp \
    --set parallel.virtual_stages=2 --set parallel.zero1=$zero1 \
    --set parallel.sequence_parallel=$zero1
done
layout_run "bf16-2-2-2" 8 --set parallel.tp=2 --set parallel.pp=2 --set parallel.zero1=true \
  --set parallel.sequence_parallel=true --set train.precision=bf16
layout_run "ramp-2-2-2" 8 --set parallel.tp=2 --set parallel.pp=2 --set parallel.zero1=true \
  --set train.rampup_start_batch=8 --set train.rampup_tokens=2000
layout_run "one-rank" 1

# Checkpoint resumes: saved at step 5 of a 10-step schedule, resumed to step 10.
resume_case() {
  local name=$1 np_save=$2 save_layout=$3 np_resume=$4 resume_layout=$5
  local dir=$work/ckpt-$name decay=$((10 * 24 * 16))
  # shellcheck disable=SC2086
  layout_run "$name-save" "$np_save" $save_layout --set train.steps=5 \
    --set train.decay_tokens=$decay --set "checkpoint.dir=$dir" --set checkpoint.every=5 \
    --set checkpoint.async=true
  # shellcheck disable=SC2086
  layout_run "$name-resume" "$np_resume" $resume_layout --set train.decay_tokens=$decay \
    --set "checkpoint.dir=$dir" --set checkpoint.every=5 --set checkpoint.resume=auto
  "$jumbo" ckpt export "$dir" --format safetensors -o "$work/w.safetensors" >/dev/null
  # The tensor bytes only: the header's metadata names the (temporary) source directory.
  python3 -c 'import hashlib,struct,sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; f.seek(8 + n)
print(sys.argv[2], "weights", hashlib.sha256(f.read()).hexdigest()[:16])' \
    "$work/w.safetensors" "$name" >>"$out"
}
resume_case resume-1 1 "" 1 ""
resume_case resume-222 8 "--set parallel.tp=2 --set parallel.pp=2 --set parallel.zero1=true" \
  8 "--set parallel.tp=2 --set parallel.pp=2 --set parallel.zero1=true"
resume_case resume-222-to-142 8 "--set parallel.tp=2 --set parallel.pp=2 --set parallel.zero1=true" \
  8 "--set parallel.pp=4"

# The demo's first 50 steps (its own tokenizer and data under build/demo).
rm -f "$data/demo/metrics.jsonl"
JUMBO_BUILD_DIR=$build JUMBO_DEMO_DIR=$data/demo bash scripts/demo.sh --set train.steps=50 \
  >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
record demo-50 "$data/demo/metrics.jsonl"
echo "record-losses: $(wc -l <"$out") lines in $out"
