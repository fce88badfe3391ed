#!/usr/bin/env bash
# A run restarts from its S3 copies on a new cluster, the way parallelcluster/README.md
# ("Restarting from S3 on a new cluster") says: the old cluster's checkpoints are in S3, copied
# there the way the `checkpoints` data repository association of parallelcluster/cluster.yaml
# exports them (the key is the path under its FileSystemPath, below its DataRepositoryPath),
# the newest of them cut short (the cluster went away while it was being exported); the new
# cluster's checkpoint directory is empty (a new FSx); the README's own commands, taken from
# the README, copy the two newest checkpoints down, and `jumbo train` with resume = "auto"
# reports the cut-short one, resumes from the one before and repeats the uninterrupted run's
# steps bit for bit. S3 is s3rver behind the signature-checking proxy
# (tests/support/s3rver.sh); `aws` is the AWS CLI when installed, else botocore.
#   Usage: s3_restart.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
source tests/support/small_run.sh
source tests/support/s3rver.sh
on_exit stop_s3rver
check "making the small data set" make_small_data "$jumbo" "$tmp"
check "starting s3rver" start_s3rver "$tmp/s3" jumbo-ckpt
S3_BUCKET="jumbo-ckpt"
bucket=s3://$S3_BUCKET

# The association the run's checkpoint directory lies under (cluster.yaml): where on the file
# system, and where in the bucket.
read -r dra_path dra_prefix < <(python3 -c '
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
for s in c["SharedStorage"]:
    for d in s.get("FsxLustreSettings", {}).get("DataRepositoryAssociations", []):
        if d["Name"] == "checkpoints":
            print(d["FileSystemPath"], d["DataRepositoryPath"].split("}/", 1)[1])' parallelcluster/cluster.yaml)
[[ -n ${dra_prefix:-} ]] || fail "parallelcluster/cluster.yaml: no data repository association named checkpoints"

# aws s3 ARGS...: the AWS CLI against the test server; without the CLI, the forms used here
# (cp --recursive DIR URL, sync URL DIR, rm URL, ls URL/) through botocore.
aws_cli=$(command -v aws || true)
[[ -n $aws_cli ]] && ! "$aws_cli" --version >/dev/null 2>&1 && aws_cli=""
aws() {
  [[ $1 == s3 ]] || fail "aws $1: only aws s3 is handled here"
  shift
  if [[ -n $aws_cli ]]; then
    "$aws_cli" --endpoint-url "$S3_ENDPOINT" --region us-east-1 s3 "$@"
    return
  fi
  python3 - "$S3_ENDPOINT" "$@" <<'EOF'
import os, sys
import botocore.session
endpoint, verb, *args = sys.argv[1:]
args = [a for a in args if a not in ("--recursive", "--only-show-errors")]
s3 = botocore.session.get_session().create_client("s3", endpoint_url=endpoint, region_name="us-east-1")
def split(url):
    bucket, _, key = url[len("s3://"):].partition("/")
    return bucket, key
if verb == "cp":
    src, (bucket, prefix) = args[0], split(args[1])
    for root, _, files in os.walk(src):
        for f in files:
            path = os.path.join(root, f)
            with open(path, "rb") as body:
                s3.put_object(Bucket=bucket, Key=prefix.rstrip("/") + "/" + os.path.relpath(path, src), Body=body)
elif verb == "rm":
    bucket, key = split(args[0])
    s3.delete_object(Bucket=bucket, Key=key)
elif verb == "ls":
    bucket, prefix = split(args[0])
    for p in s3.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/").get("CommonPrefixes", []):
        print("                           PRE " + p["Prefix"][len(prefix):])
elif verb == "sync":
    (bucket, prefix), dst = split(args[0]), args[1]
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        for o in page.get("Contents", []):
            path = os.path.join(dst, o["Key"][len(prefix.rstrip("/")) + 1:])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as out:
                out.write(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
else:
    sys.exit(f"s3: {verb}: not handled without the AWS CLI")
EOF
}

train() {
  train_small "$jumbo" 2 "$tmp" --set train.global_batch=4 --set train.decay_tokens=8192 \
    --set log.every=1 "$@"
}
train --set train.steps=8 --set "log.metrics_file=$tmp/full.jsonl" >"$tmp/full.log" 2>&1 ||
  { cat "$tmp/full.log"; fail "the uninterrupted run"; }

# The old cluster: checkpoints at steps 2, 4 and 6 on its FSx (/fsx = $tmp/old), in the run's
# directory under the association (checkpoint.dir = /fsx/jumbo/checkpoints/<run>).
run=run
old=$tmp/old$dra_path/$run
train --set train.steps=6 --set "checkpoint.dir=$old" --set checkpoint.every=2 \
  --set checkpoint.keep_last=3 >"$tmp/old.log" 2>&1 || { cat "$tmp/old.log"; fail "the old cluster's run"; }
[[ -f $old/step_00000006/manifest.json ]] || fail "the old run saved no step_00000006 under $old"

# What the association exports: every file under its FileSystemPath, as the key under its
# DataRepositoryPath. The cluster went away while step 6 was being exported: one of its shard
# files never reached S3 (export is asynchronous and per file; the manifest may be there before
# the shards). Then the old file system is gone.
aws s3 cp --recursive --only-show-errors "$tmp/old$dra_path" "$bucket/$dra_prefix" ||
  fail "copying the checkpoints into $bucket/$dra_prefix"
shard=""
for file in "$old"/step_00000006/*; do
  [[ ${file##*/} == manifest.json ]] || { shard=${file##*/}; break; }
done
[[ -n $shard ]] || fail "no shard file in $old/step_00000006"
aws s3 rm --only-show-errors "$bucket/$dra_prefix/$run/step_00000006/$shard" || fail "removing $shard from S3"
rm -rf "$tmp/old"

# The new cluster: an empty FSx (/fsx = $tmp/new). The README's commands, taken from its
# "Restarting from S3" section: from `src=` to the `done` of the copy loop, /fsx/ read as the
# new file system.
new=$tmp/new$dra_path/$run
mkdir -p "$new"
snippet=$(awk '/^## Restarting from S3/ { on = 1 } on && /^ *src=s3:/ { copy = 1 }
  copy { print } copy && /^ *done *$/ { exit }' parallelcluster/README.md | sed "s|/fsx/|$tmp/new/|g")
grep -q "aws s3 sync" <<<"$snippet" ||
  fail "parallelcluster/README.md: no 'src=s3:...' to 'done' block with aws s3 sync under '## Restarting from S3'"
echo "the README's commands:"
sed 's/^ */  /' <<<"$snippet"
eval "$snippet" >"$tmp/sync.log" 2>&1 || { cat "$tmp/sync.log"; fail "the README's commands failed"; }
got_dirs=$(ls "$new" 2>/dev/null | tr '\n' ' ')
[[ $got_dirs == "step_00000004 step_00000006 " ]] ||
  fail "expected the two newest checkpoints (step_00000004 step_00000006) in the new directory, got: $got_dirs"

train --set train.steps=8 --set "checkpoint.dir=$new" --set checkpoint.resume=auto \
  --set checkpoint.every=0 --set "log.metrics_file=$tmp/resumed.jsonl" >"$tmp/resumed.log" 2>&1 ||
  { cat "$tmp/resumed.log"; fail "resuming on the new cluster"; }
grep -q "step_00000006" "$tmp/resumed.log" ||
  { cat "$tmp/resumed.log"; fail "the cut-short step_00000006 was not reported"; }
grep -q "resumed from $new/step_00000004 (step 4" "$tmp/resumed.log" ||
  { cat "$tmp/resumed.log"; fail "did not resume from $new/step_00000004"; }
grep "checkpoint:\|step_00000006" "$tmp/resumed.log" | head -n 3
want=$(losses "$tmp/full.jsonl" | tail -n 4)
got=$(losses "$tmp/resumed.jsonl")
[[ $want == "$got" ]] || { paste <(echo "$want") <(echo "$got"); fail "steps 5-8 differ from the uninterrupted run"; }
finish "restarted on an empty directory from the S3 copies; the cut-short step 6 reported, step 4 resumed, steps 5-8 identical"
