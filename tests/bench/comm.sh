#!/usr/bin/env bash
# `jumbo bench comm` on 4 MPI ranks as tp 2 x dp 2 (and 2 x pp 2): every group of more than one
# rank times all_reduce, reduce_scatter, all_gather and p2p at doubling sizes; each row's bus
# bandwidth is its algorithm bandwidth times nccl-tests' factor for its op and ranks, sizes
# are whole f32 blocks of the group, and a size that does not divide the world is refused in
# one line; --write-machine adds the host's group with both paths and writes a description
# with every intra-host cost. Usage: comm.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/expect_error.sh
export OMPI_MCA_rmaps_base_oversubscribe=1

run_bench() {
  local name=$1
  shift
  mpirun -np 4 "$jumbo" bench comm --min-bytes 8 --max-bytes 65536 --iters 3 --warmup 1 "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err" || { cat "$tmp/$name.err"; fail "bench comm $*"; return 1; }
}
run_bench tp2 --tp 2 && run_bench pp2 --tp 2 --pp 2 || finish
head -4 "$tmp/tp2.out"
python3 - "$tmp/tp2.out" "$tmp/pp2.out" <<'EOF' || fail "bench comm's rows"
import json, sys
ops = ["all_reduce", "reduce_scatter", "all_gather", "p2p"]
factor = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
          "all_gather": lambda n: (n - 1) / n, "p2p": lambda n: 1.0}
for path, groups in ((sys.argv[1], {"tp": 2, "dp": 2, "world": 4}),
                     (sys.argv[2], {"tp": 2, "pp": 2, "world": 4})):
    out = json.loads(open(path).read().strip().splitlines()[-1])
    rows = out["rows"]
    seen = {(r["group"], r["op"]) for r in rows}
    assert seen == {(g, o) for g in groups for o in ops}, (path, sorted(seen))
    for r in rows:
        n = groups[r["group"]]
        assert r["ranks"] == n, r
        assert r["bytes"] % (4 * n) == 0 and r["bytes"] >= 8, r
        assert r["seconds"] > 0 and 1 <= r["iters"] <= 3, r
        assert abs(r["algbw"] - r["bytes"] / r["seconds"]) <= 1e-9 * r["algbw"], r
        assert abs(r["busbw"] - r["algbw"] * factor[r["op"]](n)) <= 1e-9 * r["busbw"], r
    sizes = sorted({r["bytes"] for r in rows if r["group"] == "world" and r["op"] == "all_reduce"})
    assert sizes[0] == 16 and sizes[-1] == 65536 and len(sizes) == 13, sizes
    big = max((r for r in rows if r["group"] == "world" and r["op"] == "all_reduce"),
              key=lambda r: r["bytes"])
    print(f"{path}: {len(rows)} rows; world all_reduce of {big['bytes']} B: "
          f"{big['busbw'] / 1e9:.3f} GB/s bus bandwidth")
EOF
# --write-machine: a description jumbo plan --machine reads, its collectives on one host
# (intra), none across hosts, each step's terms printed. Its layout, tp 2 x pp 2, has no dp
# group, so the buckets' calls come from the host's group, timed with both paths.
mpirun -np 4 "$jumbo" bench comm --tp 2 --pp 2 --max-bytes 4096 --iters 2 --warmup 1 \
  --write-machine "$tmp/machine.toml" >"$tmp/machine.out" 2>&1 </dev/null ||
  fail "bench comm --write-machine: $(tail -3 "$tmp/machine.out")"
for key in 'device = "cpu"' 'ranks_per_host = 4' '[intra.all_reduce]' '[intra.reduce_scatter]' \
  '[intra.all_gather]' '[intra.p2p]' '[intra.bucket_all_reduce]' '[intra.bucket_reduce_scatter]' \
  '[intra.bucket_all_gather]' gemm_efficiency attention_efficiency memory_gbps; do
  grep -qF "$key" "$tmp/machine.toml" || fail "machine.toml has no $key"
done
grep -q '^\[inter' "$tmp/machine.toml" && fail "one host's machine.toml has inter costs"
python3 - "$tmp/machine.out" <<'PYEOF' || fail "bench comm --write-machine's host rows"
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("{")][-1]
rows = json.loads(line)["rows"]
host = {(r["op"], r["path"]) for r in rows if r["group"] == "host"}
want = {(o, "blocking") for o in ("all_reduce", "reduce_scatter", "all_gather", "p2p")} | \
       {(o, "bucketed") for o in ("all_reduce", "reduce_scatter", "all_gather")}
assert host == want, sorted(host)
assert all(r["ranks"] == 4 and r["one_host"] for r in rows if r["group"] == "host")
assert not any(r["group"] == "across" for r in rows), "one rank per host of one host: no group"
PYEOF
"$jumbo" plan --model inputs/models/tiny.toml --machine "$tmp/machine.toml" --nodes 1 \
  --global-batch 8 --precision fp32 >"$tmp/plan.out" 2>&1 || fail "plan --machine: $(cat "$tmp/plan.out")"
grep -qE '^  step [0-9.e-]+ s: compute .* elementwise .* tp .* dp .* exposed of .* optimizer' \
  "$tmp/plan.out" || fail "plan --machine printed no terms: $(cat "$tmp/plan.out")"
# Two such hosts have no numbers between them: a layout across them is refused by name.
expect_error no_inter "no inter.all_reduce costs" "$jumbo" plan --model inputs/models/tiny.toml \
  --machine "$tmp/machine.toml" --nodes 2 --global-batch 8 --precision fp32
expect_error bad_layout "bench comm: --tp 3 x --pp 1 does not divide the 1 ranks" \
  "$jumbo" bench comm --tp 3 --max-bytes 64
expect_error bad_sizes "bench comm: --min-bytes 64 --max-bytes 8: expected 4 <= min <= max" \
  "$jumbo" bench comm --min-bytes 64 --max-bytes 8
# Under mpirun the ranks agree: rank 0 says it once and its error ends the others.
status=0
mpirun -np 4 "$jumbo" bench comm --tp 3 --max-bytes 64 >"$tmp/bad4.out" 2>"$tmp/bad4.err" || status=$?
[[ $status -eq 2 ]] || fail "a layout that does not divide 4 ranks: exit $status, expected 2"
[[ $(grep -c "does not divide the 4 ranks" "$tmp/bad4.err") -eq 1 ]] ||
  fail "a layout that does not divide 4 ranks: $(cat "$tmp/bad4.err")"
finish
