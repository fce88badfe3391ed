# Sourced by test scripts: a 500-piece tokenizer and a prepared dataset from the shipped Brown
# validation split, in seconds. Usage: make_small_data JUMBO DIR (writes DIR/tok.model,
# DIR/data.bin/.idx). Run from the repository root.
make_small_data() {
  local jumbo=$1 dir=$2
  "$jumbo" data tokenizer --input inputs/data/brown-valid.jsonl --output "$dir/tok" \
    --vocab-size 500 --input-sentence-size 2000 --threads 1 >/dev/null || return 1
  "$jumbo" data prepare --input inputs/data/brown-valid.jsonl --tokenizer "$dir/tok.model" \
    --output "$dir/data" >/dev/null || return 1
}
