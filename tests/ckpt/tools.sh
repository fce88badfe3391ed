#!/usr/bin/env bash
# `jumbo ckpt inspect` and `jumbo ckpt export` on real checkpoints: the report (step, layout,
# tensors), --verify passing and then naming a corrupted file, and a safetensors export whose
# every tensor equals the master weights read straight from the shard files with h5py. The
# export is parsed by hand (struct + json + numpy), without the safetensors package.
# A tp 2 x pp 2 run with model.vocab = 500 (padded to 512) gives rectangles and padding rows;
# a dp 2 ZeRO-1 run gives pieces cut into element ranges. Usage: tools.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish

train() {
  local np=$1
  shift
  train_small "$jumbo" "$np" "$tmp" --set model.vocab=500 --set train.global_batch=4 \
    --set log.every=100 "$@"
}
train 4 --set parallel.tp=2 --set parallel.pp=2 --set train.steps=4 --set checkpoint.every=4 \
  --set "checkpoint.dir=$tmp/ck" >"$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; fail "training run"; finish; }
step=$tmp/ck/step_00000004

source tests/support/expect_error.sh

# ---- inspect ----------------------------------------------------------------------------
"$jumbo" ckpt inspect "$tmp/ck" >"$tmp/inspect.txt" 2>&1 ||
  { cat "$tmp/inspect.txt"; fail "inspect of the root"; }
cat "$tmp/inspect.txt"
expect_line() { grep -qE "$1" "$tmp/inspect.txt" || fail "inspect: no line matching '$1'"; }
expect_line "^checkpoint $step "
expect_line "^step 4: "
expect_line "^model tiny: 2 layers, d_model 64, 4 heads, ffn 256, vocab 500 "
expect_line "^saved with tp 2 x pp 2 x dp 1, ZeRO-1 off, virtual stages 1, stage layers \[1, 1\]"
expect_line "^files: 4, "
expect_line "^layers\.0\.attn\.qkv\.weight +\[192, 64\] +2 +12288$"
expect_line "^embedding\.word +\[512, 64\] +2 +32000  \(500 of 512 rows"
expect_line "^total parameters: [0-9]+ "
# The step directory itself, with a trailing slash, gives the same report.
"$jumbo" ckpt inspect "$step/" >"$tmp/inspect_dir.txt" 2>&1 || fail "inspect of the step dir"
cmp -s "$tmp/inspect.txt" "$tmp/inspect_dir.txt" || fail "step dir and root reports differ"

"$jumbo" ckpt inspect --verify "$tmp/ck" >"$tmp/verify.txt" 2>&1 ||
  { cat "$tmp/verify.txt"; fail "--verify of a good checkpoint"; }
grep -q "^verify: 4 of 4 files ok" "$tmp/verify.txt" || fail "--verify: no ok line"
grep "^verify:" "$tmp/verify.txt"

cp -r "$tmp/ck" "$tmp/bad"
python3 -c "f=open('$tmp/bad/step_00000004/tp1-pp0-dp0.h5','r+b'); f.seek(5000); b=f.read(1); \
f.seek(5000); f.write(bytes([b[0]^1]))"
expect_error verify_bad "error: $tmp/bad/step_00000004: 1 of 4 shard files failed verification: tp1-pp0-dp0.h5$" \
  "$jumbo" ckpt inspect --verify "$tmp/bad"
grep -qE "^BAD $tmp/bad/step_00000004/tp1-pp0-dp0.h5: CRC-32 [0-9a-f]{8}, the manifest says" \
  "$tmp/verify_bad.out" || fail "verify_bad: no BAD line for the file"
grep "^BAD" "$tmp/verify_bad.out"
expect_error missing_path "error: $tmp/nowhere: no such checkpoint directory" \
  "$jumbo" ckpt inspect "$tmp/nowhere"
[[ -e $tmp/nowhere ]] && fail "inspect created the directory it was given"
expect_error not_a_checkpoint "neither a checkpoint directory \(no manifest.json\) nor a checkpoint root" \
  "$jumbo" ckpt inspect "$tmp"

# ---- export -----------------------------------------------------------------------------
expect_error bad_format "--format onnx: the only format is safetensors" \
  "$jumbo" ckpt export "$tmp/ck" --format onnx -o "$tmp/x.onnx"
expect_error export_corrupt "tp1-pp0-dp0.h5: CRC-32 [0-9a-f]+, the manifest says" \
  "$jumbo" ckpt export "$tmp/bad" --format safetensors -o "$tmp/bad.safetensors"
ls "$tmp"/bad.safetensors* >/dev/null 2>&1 && fail "a failed export left a file behind"
"$jumbo" ckpt export "$tmp/ck" --format safetensors -o "$tmp/f32.safetensors" || fail "export f32"
"$jumbo" ckpt export "$step" --format safetensors -o "$tmp/bf16.safetensors" --dtype bf16 ||
  fail "export bf16"

# ZeRO-1 over dp 2: tensors cut into element ranges between the two files.
train 2 --set parallel.zero1=true --set train.steps=2 --set checkpoint.every=2 \
  --set "checkpoint.dir=$tmp/z1" >"$tmp/train_z1.log" 2>&1 ||
  { cat "$tmp/train_z1.log"; fail "ZeRO-1 training run"; finish; }
"$jumbo" ckpt export "$tmp/z1" --format safetensors -o "$tmp/z1.safetensors" || fail "export z1"

/usr/bin/python3 - "$step" "$tmp/f32.safetensors" "$tmp/bf16.safetensors" \
  "$tmp/z1/step_00000002" "$tmp/z1.safetensors" <<'EOF' || fail "safetensors check"
import glob, json, os, struct, sys
import h5py
import numpy as np

step, f32_path, bf16_path, z1_step, z1_path = sys.argv[1:6]
VOCAB, C, F, CTX = 500, 64, 256, 32

def load_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert (8 + n) % 8 == 0, "data section not 8-byte aligned"
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__")
    body = data[8 + n:]
    out, spans = {}, []
    for name, t in header.items():
        b, e = t["data_offsets"]
        dtype = {"F32": np.float32, "BF16": np.uint16}[t["dtype"]]
        arr = np.frombuffer(body[b:e], dtype=dtype)
        assert arr.size == int(np.prod(t["shape"])), name
        out[name] = arr.reshape(t["shape"])
        spans.append((b, e))
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == len(body), "data section not covered exactly"
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "tensors overlap or leave gaps"
    return meta, out

def expected_shapes(layers):
    s = {"embedding.word": [VOCAB, C], "embedding.position": [CTX, C],
         "final_norm.weight": [C], "final_norm.bias": [C]}
    for i in range(layers):
        p = f"layers.{i}."
        s.update({p + "ln1.weight": [C], p + "ln1.bias": [C], p + "ln2.weight": [C],
                  p + "ln2.bias": [C], p + "attn.qkv.weight": [3 * C, C],
                  p + "attn.qkv.bias": [3 * C], p + "attn.proj.weight": [C, C],
                  p + "attn.proj.bias": [C], p + "mlp.fc1.weight": [F, C],
                  p + "mlp.fc1.bias": [F], p + "mlp.fc2.weight": [C, F], p + "mlp.fc2.bias": [C]})
    return s

def assemble(step_dir):
    """Every master tensor, put together from the shard files' datasets and attributes."""
    full, seen, ranged = {}, {}, 0
    files = sorted(glob.glob(os.path.join(step_dir, "*.h5")))
    assert files, step_dir
    for path in files:
        with h5py.File(path, "r") as h:
            names = []
            h.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            for ds_name in names:
                ds = h[ds_name]
                a = {k: np.asarray(ds.attrs[k]) for k in ("global_shape", "offset", "shape",
                                                          "flat_range")}
                assert len(a["offset"]) == len(a["shape"]) == len(a["global_shape"]), ds_name
                assert len(a["flat_range"]) == 2, ds_name
                state, name = ds_name.split("/", 1)
                if state != "master":
                    continue
                name = name.split("@")[0]
                g, off, shp = (tuple(int(x) for x in a[k]) for k in ("global_shape", "offset", "shape"))
                b, e = (int(x) for x in a["flat_range"])
                ranged += (b, e) != (0, int(np.prod(shp)))
                if name not in full:
                    full[name] = np.full(g, np.nan, np.float32)
                    seen[name] = np.zeros(g, bool)
                rect = tuple(slice(o, o + s) for o, s in zip(off, shp))
                flat = full[name][rect].reshape(-1)
                mask = seen[name][rect].reshape(-1)
                vals = ds[()].reshape(-1)
                # Replicas (norms and biases on every tp rank) must agree where they overlap.
                old = flat[b:e]
                assert np.array_equal(old[mask[b:e]], vals[mask[b:e]]), name + ": replicas differ"
                flat[b:e] = vals
                mask[b:e] = True
                full[name][rect] = flat.reshape(shp)
                seen[name][rect] = mask.reshape(shp)
    return full, ranged

def check(step_dir, path, layers):
    meta, tensors = load_safetensors(path)
    assert meta["step"] == os.path.basename(step_dir).split("_")[1].lstrip("0"), meta
    assert meta["model.vocab"] == str(VOCAB) and meta["model.name"] == "tiny", meta
    want = expected_shapes(layers)
    assert sorted(tensors) == sorted(want), sorted(set(tensors) ^ set(want))
    full, ranged = assemble(step_dir)
    for name, shape in want.items():
        t = tensors[name]
        assert list(t.shape) == shape and t.dtype == np.float32, (name, t.shape, t.dtype)
        ref = full[name][:VOCAB] if name == "embedding.word" else full[name]
        assert not np.isnan(ref).any(), name + ": not every element found in the shards"
        assert np.array_equal(t, ref), name + ": exported values differ from the shards"
    return tensors, full, ranged

tensors, full, _ = check(step, f32_path, 2)
# The brief's explicit case: qkv of layer 0 from the two tp shards, by their offsets.
qkv = np.full((3 * C, C), np.nan, np.float32)
for t in (0, 1):
    with h5py.File(os.path.join(step, f"tp{t}-pp0-dp0.h5"), "r") as h:
        ds = h["master/layers.0.attn.qkv.weight"]
        r0, c0 = (int(x) for x in ds.attrs["offset"])
        rows, cols = ds.shape
        assert list(ds.attrs["shape"]) == [rows, cols] and cols == C and rows == 3 * C // 2
        qkv[r0:r0 + rows, c0:c0 + cols] = ds[()]
assert np.array_equal(tensors["layers.0.attn.qkv.weight"], qkv), "qkv differs"
assert full["embedding.word"].shape == (512, C)

# bf16: the f32 values rounded to nearest even.
_, b16 = load_safetensors(bf16_path)
for name, t in tensors.items():
    u = t.view(np.uint32).astype(np.uint64)
    want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    assert b16[name].dtype == np.uint16 and np.array_equal(b16[name], want), name + ": bf16"

_, _, ranged = check(z1_step, z1_path, 2)
assert ranged > 0, "the ZeRO-1 checkpoint has no element-range pieces"
print(f"ok: {len(tensors)} tensors equal the shards' master datasets (f32 and bf16); "
      f"ZeRO-1 export assembled from {ranged} element-range pieces")
EOF
# convert: the tp 2 x pp 2 checkpoint for tp 1 x pp 1 x dp 2 with ZeRO-1, on 2 processes;
# the result verifies, and exports the same tensors bit for bit.
OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe "$jumbo" ckpt convert "$tmp/ck" -o "$tmp/conv" \
  --dp 2 --zero1 --bucket-size 5000 >"$tmp/convert.log" 2>&1 ||
  { cat "$tmp/convert.log"; fail "convert"; }
"$jumbo" ckpt inspect "$tmp/conv" --verify >"$tmp/conv.inspect" 2>&1 || fail "converted: verify"
grep -q "saved with tp 1 x pp 1 x dp 2, ZeRO-1 on" "$tmp/conv.inspect" ||
  { cat "$tmp/conv.inspect"; fail "converted: layout"; }
"$jumbo" ckpt export "$tmp/conv" --format safetensors -o "$tmp/conv.safetensors" >/dev/null ||
  fail "converted: export"
/usr/bin/python3 - "$tmp/f32.safetensors" "$tmp/conv.safetensors" <<'EOF' || fail "converted export differs"
import json, struct, sys
def split(path):  # tensor entries and data; __metadata__ names the source path, so it differs
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__")
    return h, b[8 + n:]
assert split(sys.argv[1]) == split(sys.argv[2])
EOF
expect_error convert_bad_tp "--tp 3 does not divide model.heads" \
  "$jumbo" ckpt convert "$tmp/ck" -o "$tmp/conv3" --tp 3
finish "inspect, verify, safetensors export and convert"
