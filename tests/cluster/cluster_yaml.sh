#!/usr/bin/env bash
# The ParallelCluster files (parallelcluster/): renders cluster.yaml with dummy values, sized by
# the real `JUMBO_BINARY plan --storage` of inputs/runs/j1-jumbo.toml, for every capacity
# variant on p4d.24xlarge and two on p5.48xlarge, and checks its keys (check_cluster_yaml.py:
# ParallelCluster's schema, the FSx arithmetic worked out again, the checkpoint association);
# that render.sh refuses a missing variable, a run the file system cannot hold and a plan without
# the corpus's size in one line each; that the scripts parse (bash -n, and shellcheck where
# installed), that the install script plans no package that would shadow the EFA installer's
# Open MPI, and cloudwatch-agent.json.
#
#   bash tests/cluster/cluster_yaml.sh JUMBO_BINARY SOURCE_DIR
#
# One line per failed check; exit 1 if any failed, else a summary and exit 0.
if (($# != 2)); then
  echo "usage: cluster_yaml.sh JUMBO_BINARY SOURCE_DIR" >&2
  exit 2
fi
source "$(dirname "$0")/../support/harness.sh" "$@"
source_dir=$repo
pc=$source_dir/parallelcluster
python=/usr/bin/python3

passed=0
pass() { passed=$((passed + 1)); }

if ! "$python" -c 'import yaml' 2>/dev/null; then
  fail "$python has no PyYAML (Debian: apt-get install python3-yaml)"
  finish
fi

# Dummy values, in the forms AWS uses. The key name has a space: render.sh must keep it whole.
values=(
  AWS_REGION=us-east-1
  HEAD_SUBNET_ID=subnet-0123456789abcdef0
  COMPUTE_SUBNET_ID=subnet-0fedcba9876543210
  "SSH_KEY_NAME=jumbo test key"
  S3_BUCKET=jumbo-test-bucket
)

reserved=(CAPACITY_RESERVATION_ID=cr-0123456789abcdef0 RESERVED_NODES=16)

# The run the cluster is sized for: J1-Jumbo on 128 p4d nodes for 300B tokens (the issue's
# example). Its corpus is not on this machine, so its size is given: ~1.2 TB, 300B tokens of 4
# bytes (docs/data-format.md).
run=(--run "$source_dir/inputs/runs/j1-jumbo.toml" --nodes 128 --tokens 300e9 --jumbo "$jumbo")
corpus_bytes=1200000000000
# The plan itself, for the checker to redo the arithmetic from (gpu: p4d's A100 40GB).
plan_args=()
if plan_out=$(cd "$source_dir" && "$jumbo" plan --config "$source_dir/inputs/runs/j1-jumbo.toml" --gpu a100-40gb \
  --nodes 128 --tokens 300e9 --data-bytes "$corpus_bytes" --storage 2>&1); then
  pass
  while IFS= read -r line; do plan_args+=("plan.$line"); done <<<"$plan_out"
  echo "jumbo plan --storage: $(tr '\n' ' ' <<<"$plan_out")"
else
  fail "jumbo plan --config inputs/runs/j1-jumbo.toml --gpu a100-40gb --nodes 128 --tokens 300e9 --storage: $plan_out"
fi

# check_variant CAPACITY INSTANCE VALUE...: render.sh --capacity CAPACITY --instance INSTANCE,
# then every key checked (the rules of the variant, ParallelCluster's schema, the sizing; the
# sizing against the plan above for p4d, whose GPU it was made for).
check_variant() {
  local capacity=$1 instance=$2 name=$1-$2 checker_out checker_rc counts
  shift 2
  if ! env -i PATH="$PATH" "$@" bash "$pc/render.sh" --capacity "$capacity" --instance "$instance" \
    "${run[@]}" --data-bytes "$corpus_bytes" "$tmp/$name.yaml" >"$tmp/render.out" 2>&1; then
    fail "render.sh --capacity $capacity --instance $instance with all variables set: expected exit 0, got: $(tr '\n' ' ' <"$tmp/render.out")"
    return
  fi
  pass
  local plan_for=()
  [[ $instance == p4d.24xlarge ]] && plan_for=("${plan_args[@]}")
  checker_out=$("$python" "$source_dir/tests/cluster/check_cluster_yaml.py" "$source_dir" \
    "$tmp/$name.yaml" "$capacity" "$instance" "$@" "${plan_for[@]}" 2>&1)
  checker_rc=$?
  # The checker's own failure lines, each a failure here, then its count checked against them.
  local line lines=0 checker_failed=0
  while IFS= read -r line; do
    fail "[$name] $line"
    lines=$((lines + 1))
  done < <(grep -v '^check_cluster_yaml: ' <<<"$checker_out" | grep .)
  counts=$(grep '^check_cluster_yaml: ' <<<"$checker_out")
  if [[ $counts =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    checker_failed=${BASH_REMATCH[2]}
    ((checker_failed <= lines)) ||
      fail "[$name] check_cluster_yaml.py: $checker_failed failed, $lines of them named"
  else
    fail "check_cluster_yaml.py: no summary line (exit $checker_rc): $checker_out"
  fi
  ((checker_rc == 0 || checker_failed > 0)) || fail "check_cluster_yaml.py exited $checker_rc"
}
check_variant ondemand p4d.24xlarge "${values[@]}"
check_variant odcr p4d.24xlarge "${values[@]}" "${reserved[@]}"
check_variant block p4d.24xlarge "${values[@]}" "${reserved[@]}"
check_variant ondemand p5.48xlarge "${values[@]}"
check_variant block p5.48xlarge "${values[@]}" "${reserved[@]}"
# The default variant is ondemand on p4d.24xlarge.
if env -i PATH="$PATH" "${values[@]}" bash "$pc/render.sh" "${run[@]}" --data-bytes "$corpus_bytes" \
  "$tmp/default.yaml" >/dev/null 2>&1 && cmp -s "$tmp/default.yaml" "$tmp/ondemand-p4d.24xlarge.yaml"; then
  pass
else
  fail "render.sh without --capacity and --instance: expected the ondemand variant on p4d.24xlarge"
fi

# -- render.sh refuses, in one line and without writing anything: no --run; a plan without the
# corpus's size; a run larger than the file system may be.
refused() {  # refused WHAT PATTERN ARGS...: render.sh ARGS exits non-zero, one line matching PATTERN
  local what=$1 pattern=$2 rc
  shift 2
  rm -f "$tmp/refused.yaml"
  env -i PATH="$PATH" "${values[@]}" bash "$pc/render.sh" "$@" "$tmp/refused.yaml" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if ((rc != 0)) && (($(grep -c . "$tmp/err") == 1)) && grep -q -- "$pattern" "$tmp/err" &&
    [[ ! -e $tmp/refused.yaml ]]; then
    pass
  else
    fail "render.sh $what: expected a non-zero exit, one line matching '$pattern' and no file, got $rc: $(tr '\n' '|' <"$tmp/err")"
  fi
}
refused "without --run" "--run CONFIG is needed" --jumbo "$jumbo"
refused "without --data-bytes" "data_bytes=0.*--data-bytes" "${run[@]}"
refused "with --max-capacity 2400" "more than --max-capacity 2400 GiB" "${run[@]}" \
  --data-bytes "$corpus_bytes" --max-capacity 2400
refused "with --instance p3.16xlarge" "'p3.16xlarge'" "${run[@]}" --instance p3.16xlarge

# -- the schema check finds a key ParallelCluster does not know, naming it.
if [[ -f $tmp/block-p4d.24xlarge.yaml ]]; then
  sed 's/^\( *\)JobExclusiveAllocation: true.*/&\n\1JobExclusive: true/' "$tmp/block-p4d.24xlarge.yaml" >"$tmp/bogus.yaml"
  out=$("$python" "$source_dir/tests/cluster/check_cluster_yaml.py" "$source_dir" "$tmp/bogus.yaml" block \
    p4d.24xlarge "${values[@]}" "${reserved[@]}" 2>&1)
  if grep -q "^Scheduling.SlurmQueues\[0\].JobExclusive: expected a key of ParallelCluster's SlurmQueueSchema" <<<"$out"; then
    pass
  else
    fail "check_cluster_yaml.py on an unknown key JobExclusive: expected a line naming it, got: $(head -n 3 <<<"$out" | tr '\n' '|')"
  fi
fi

# -- render.sh refuses a bad variant and a reserved variant's missing values, one line each.
for args in "--capacity spot" "--capacity block"; do
  # shellcheck disable=SC2086 # two words on purpose
  env -i PATH="$PATH" "${values[@]}" bash "$pc/render.sh" $args "${run[@]}" --data-bytes "$corpus_bytes" \
    "$tmp/bad.yaml" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  want=$([[ $args == *spot ]] && echo 1 || echo 2)
  if ((rc != 0)) && (($(grep -c . "$tmp/err") == want)) && [[ ! -e $tmp/bad.yaml ]] &&
    { [[ $args == *spot ]] && grep -q "'spot'" "$tmp/err" || grep -q CAPACITY_RESERVATION_ID "$tmp/err"; }; then
    pass
  else
    fail "render.sh $args: expected exit 2 and $want line(s) naming the problem, got $rc: $(tr '\n' '|' <"$tmp/err")"
  fi
done
if env -i PATH="$PATH" "${values[@]}" CAPACITY_RESERVATION_ID=cr-1 RESERVED_NODES=0 bash "$pc/render.sh" \
  --capacity odcr "${run[@]}" --data-bytes "$corpus_bytes" "$tmp/zero.yaml" >/dev/null 2>"$tmp/err"; then
  fail "render.sh --capacity odcr with RESERVED_NODES=0: expected a refusal"
elif grep -q RESERVED_NODES "$tmp/err"; then pass; else fail "render.sh RESERVED_NODES=0: $(cat "$tmp/err")"; fi

# -- render.sh with one variable missing (each in turn): non-zero, one line naming it, no file.
for entry in "${values[@]}"; do
  name=${entry%%=*}
  others=()
  for other in "${values[@]}"; do [[ ${other%%=*} == "$name" ]] || others+=("$other"); done
  rm -f "$tmp/missing.yaml"
  env -i PATH="$PATH" "${others[@]}" bash "$pc/render.sh" "${run[@]}" --data-bytes "$corpus_bytes" \
    "$tmp/missing.yaml" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  lines=$(grep -c . "$tmp/err")
  if ((rc == 0)); then
    fail "render.sh without $name: expected a non-zero exit, got 0"
  elif ((lines != 1)) || ! grep -q "$name" "$tmp/err"; then
    fail "render.sh without $name: expected one line on stderr naming $name, got $lines: $(tr '\n' '|' <"$tmp/err")"
  elif [[ -e $tmp/missing.yaml ]]; then
    fail "render.sh without $name: expected no output file, but it wrote one"
  else
    pass
  fi
done

# -- a value that would break the YAML is refused as well.
if env -i PATH="$PATH" "${values[@]}" 'SSH_KEY_NAME=a"b' bash "$pc/render.sh" "${run[@]}" \
  --data-bytes "$corpus_bytes" "$tmp/quote.yaml" >/dev/null 2>&1; then
  fail "render.sh with a double quote in SSH_KEY_NAME: expected a non-zero exit, got 0"
else
  pass
fi

# -- the scripts parse; shellcheck where the machine has it (Debian: shellcheck).
for script in "$pc/on-node-configured.sh" "$pc/render.sh"; do
  if out=$(bash -n "$script" 2>&1); then pass; else fail "bash -n ${script#"$source_dir"/}: $(tr '\n' ' ' <<<"$out")"; fi
  if command -v shellcheck >/dev/null; then
    if out=$(shellcheck -S warning "$script" 2>&1); then
      pass
    else
      fail "shellcheck ${script#"$source_dir"/}: expected no warnings: $(head -n 5 <<<"$out" | tr '\n' ' ')"
    fi
  fi
done

# -- the install script's plan (dry run): apt for jumbo's libraries, EFA's Open MPI kept.
if plan=$(bash "$pc/on-node-configured.sh" --dry-run --role head --artifacts s3://jumbo-test-bucket/jumbo \
  --arch cascadelake 2>&1); then
  pass
  install_line=$(grep -- '+ apt-get .* install ' <<<"$plan" || true)
  for package in libopenblas-openmp-dev libsentencepiece-dev libcurl4-openssl-dev g++-12; do
    if grep -qw -- "$package" <<<"$install_line"; then pass; else fail "on-node-configured.sh: expected apt to install $package"; fi
  done
  for package in openmpi-bin libopenmpi-dev libhdf5-openmpi-dev libfabric-dev slurmd slurmctld munge; do
    if grep -qw -- "$package" <<<"$install_line"; then
      fail "on-node-configured.sh: installs $package, which shadows the EFA installer's or ParallelCluster's own"
    else
      pass
    fi
  done
  for expected in "-DMPI_C_COMPILER=/opt/amazon/openmpi/bin/mpicc" "-march=cascadelake" \
    "lock /fsx/jumbo/.build.lock" "amazon-cloudwatch-agent-ctl -a append-config"; do
    if grep -qF -- "$expected" <<<"$plan"; then pass; else fail "on-node-configured.sh --dry-run: expected '$expected' in the plan"; fi
  done
else
  fail "on-node-configured.sh --dry-run: expected exit 0, got: $(tail -n 3 <<<"$plan" | tr '\n' ' ')"
fi
if bash "$pc/on-node-configured.sh" --dry-run --role nonsense --artifacts s3://b/p >/dev/null 2>&1; then
  fail "on-node-configured.sh --role nonsense: expected a non-zero exit, got 0"
else
  pass
fi

echo "cluster_yaml: $passed passed"
finish "parallelcluster/cluster.yaml, render.sh, on-node-configured.sh, cloudwatch-agent.json"
