# Sourced by scripts/demo.sh and scripts/finetune-demo.sh, from the repository root, with
# build (the build directory) and demo (the demo's files) set:
#   demo_build   installs what is missing, builds jumbo, sets jumbo (the binary), the
#                environment the demo runs jumbo with and OPENBLAS_CORETYPE where needed;
#   demo_data    makes the demo tokenizer ($demo/brown-4k.model) and the tokenized Brown
#                splits ($demo/brown-{train,valid}) if missing or older than the tokenizer.

demo_build() {
  bash scripts/install-deps.sh
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" --target jumbo -j2

  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
  mkdir -p "$demo"
  jumbo="$build/jumbo"
  source scripts/openblas-core.sh
  openblas_core_for_this_cpu "$jumbo"
}

demo_data() {
  # 4096 unigram pieces, multi-word pieces allowed, trained on a seeded sample of 5000 of the
  # 14908 training paragraphs: ~15 s instead of ~80 s for 1% more tokens.
  if [[ ! -f $demo/brown-4k.model ]]; then
    echo "demo: training the tokenizer ($demo/brown-4k.model)"
    "$jumbo" data tokenizer --input inputs/data/brown-train.jsonl --output "$demo/brown-4k" \
      --vocab-size 4096 --input-sentence-size 5000 --threads 2
  fi

  local split
  for split in train valid; do
    if [[ ! -f $demo/brown-$split.parts || $demo/brown-4k.model -nt $demo/brown-$split.parts ]]; then
      echo "demo: tokenizing inputs/data/brown-$split.jsonl ($demo/brown-$split.parts)"
      "$jumbo" data prepare --input "inputs/data/brown-$split.jsonl" \
        --tokenizer "$demo/brown-4k.model" --output "$demo/brown-$split"
    fi
  done
}
