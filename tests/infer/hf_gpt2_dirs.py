#!/usr/bin/python3
"""Hugging Face GPT-2 directories for tests/infer/hf_gpt2_import.sh, made and compared without
transformers or the safetensors package (the format by hand: an 8-byte little-endian header
length, a JSON header padded to 8 bytes, the raw little-endian data).

Subcommands (each exits 1 with one FAIL line per problem):
  gpt2-style SRC DST [--dtypes f32|mixed]
      SRC (a `jumbo ckpt export --format hf-gpt2` directory) rewritten as GPT-2's own
      checkpoint (openai-community/gpt2) is laid out: names without "transformer.", the
      attention buffers h.N.attn.bias (the causal mask) and h.N.attn.masked_bias, lm_head.weight
      (= wte), the hub's config.json keys, vocab.json and merges.txt, and no tokenizer.model.
      --dtypes mixed stores the weights as F16, wpe as BF16 (exactly representable: each value
      is rounded to F16 / BF16 first), so their import is exact too.
  break DIR WHAT
      one defect: drop-tensor, wrong-shape, untied-head, extra-tensor (a layer config.json does
      not have), or config KEY=JSON (a config.json value).
  same-values A B
      A's and B's GPT-2 tensors (names with or without "transformer.", buffers and lm_head left
      out), widened to float32, are equal bit for bit.
  same-weights A.safetensors B.safetensors
      two `jumbo ckpt export --format safetensors` files hold the same tensors: names, dtypes,
      shapes, data bytes; their metadata differ only where the checkpoints' own facts do.
  imported CKPT --like ORIGINAL_MANIFEST --tokenizer TOK.model
      CKPT's manifest and shard: step 0, tp 1 x pp 1 x dp 1, ORIGINAL's model (name aside), its
      data.tokenizer a copy of TOK.model beside the checkpoint, zero Adam moments and zero
      padding rows of embedding.word.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


NUMPY = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def read_safetensors(path):
    """(metadata, {name: (dtype, shape, raw numpy array)}, data bytes)."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        arr = np.frombuffer(body[b:e], dtype=NUMPY[t["dtype"]]).reshape(t["shape"])
        out[name] = (t["dtype"], list(t["shape"]), arr)
    return meta, out, body


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype, numpy array of that dtype's storage)}, in file order."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for c in chunks:
            f.write(c)


def as_f32(dtype, arr):
    if dtype == "BF16":  # bf16 is the top half of an f32
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def to_bf16(f32):
    """Round to nearest even, as the export does."""
    bits = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def short_name(name):
    return name[len("transformer."):] if name.startswith("transformer.") else name


def is_buffer(name):
    return name.endswith(".attn.bias") or name.endswith(".attn.masked_bias")


def gpt2_style(a):
    _, src, _ = read_safetensors(os.path.join(a.src, "model.safetensors"))
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    os.makedirs(a.dst, exist_ok=True)
    p = cfg["n_positions"]
    out = {}
    for name, (dtype, _, arr) in src.items():
        assert dtype == "F32", f"{name}: expected an f32 export"
        short = short_name(name)
        if a.dtypes == "mixed" and short == "wpe.weight":
            out[short] = ("BF16", to_bf16(arr))
        elif a.dtypes == "mixed":
            out[short] = ("F16", arr.astype(np.float16))
        else:
            out[short] = ("F32", arr)
        if short.endswith(".ln_1.bias"):  # after each layer's first tensors, as torch saves
            layer = short[:-len(".ln_1.bias")]
            out[layer + ".attn.bias"] = ("F32", np.tril(np.ones((p, p), np.float32))[None, None])
            out[layer + ".attn.masked_bias"] = ("F32", np.array(-1e4, np.float32))
    out["lm_head.weight"] = out["wte.weight"]
    write_safetensors(os.path.join(a.dst, "model.safetensors"), out, {"format": "pt"})
    hub = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
           "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
           "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
           "n_ctx": p, "n_embd": cfg["n_embd"], "n_head": cfg["n_head"], "n_layer": cfg["n_layer"],
           "n_positions": p, "resid_pdrop": 0.1, "summary_activation": None,
           "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
           "summary_type": "cls_index", "summary_use_proj": True,
           "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
           "vocab_size": cfg["vocab_size"]}
    if cfg.get("n_inner") is not None:
        hub["n_inner"] = cfg["n_inner"]
    json.dump(hub, open(os.path.join(a.dst, "config.json"), "w"), indent=2)
    # GPT-2's byte-level BPE files: one entry per id, as the hub's vocab.json.
    vocab = {f"tok{i}": i for i in range(cfg["vocab_size"])}
    json.dump(vocab, open(os.path.join(a.dst, "vocab.json"), "w"))
    open(os.path.join(a.dst, "merges.txt"), "w").write("#version: 0.2\nt o\nto k\n")
    print(f"gpt2-style: {a.dst}: {len(out)} tensors ({a.dtypes})")


def break_dir(a):
    st = os.path.join(a.dir, "model.safetensors")
    meta, t, _ = read_safetensors(st)
    tensors = {name: (d, arr) for name, (d, _, arr) in t.items()}
    what = a.what
    if what == "drop-tensor":
        del tensors["h.1.mlp.c_fc.bias"]
    elif what == "wrong-shape":
        d, arr = tensors["h.0.mlp.c_fc.weight"]
        tensors["h.0.mlp.c_fc.weight"] = (d, np.ascontiguousarray(arr.T))
    elif what == "untied-head":
        d, arr = tensors["lm_head.weight"]
        bits = arr.copy().view(np.uint32 if d == "F32" else np.uint16)
        bits.flat[7] ^= 1  # one element one ulp off
        tensors["lm_head.weight"] = (d, bits.view(arr.dtype))
    elif what == "extra-tensor":
        tensors["h.9.ln_1.weight"] = tensors["h.0.ln_1.weight"]
    elif what.startswith("config "):
        key, value = what[len("config "):].split("=", 1)
        cfg = json.load(open(os.path.join(a.dir, "config.json")))
        cfg[key] = json.loads(value)
        json.dump(cfg, open(os.path.join(a.dir, "config.json"), "w"), indent=2)
        return
    else:
        sys.exit(f"break: unknown defect {what}")
    write_safetensors(st, tensors, meta)


def same_values(a):
    def weights(d):
        _, t, _ = read_safetensors(os.path.join(d, "model.safetensors"))
        return {short_name(n): as_f32(dt, arr) for n, (dt, _, arr) in t.items()
                if not is_buffer(short_name(n)) and n != "lm_head.weight"}
    x, y = weights(a.a), weights(a.b)
    if sorted(x) != sorted(y):
        fail(f"{a.a} and {a.b} hold different tensors: {sorted(set(x) ^ set(y))}")
    for name in x:
        if name in y and (x[name].shape != y[name].shape or
                          x[name].view(np.uint32).tobytes() != y[name].view(np.uint32).tobytes()):
            fail(f"{name}: differs between {a.a} and {a.b}")
    print(f"same-values: {len(x)} tensors equal as float32, bit for bit")


def same_weights(a):
    ma, ta, ba = read_safetensors(a.a)
    mb, tb, bb = read_safetensors(a.b)
    layout = lambda t: [(n, d, s) for n, (d, s, _) in t.items()]  # noqa: E731
    if sorted(layout(ta)) != sorted(layout(tb)):
        fail(f"{a.a} and {a.b}: different tensor names, dtypes or shapes")
    for name in ta:
        if name in tb and ta[name][2].tobytes() != tb[name][2].tobytes():
            fail(f"{name}: its bytes differ between {a.a} and {a.b}")
    own = {"source", "step", "consumed_samples", "consumed_tokens", "model.name"}
    for k in sorted(set(ma) | set(mb)):
        if k not in own and ma.get(k) != mb.get(k):
            fail(f"metadata {k}: {ma.get(k)!r} vs {mb.get(k)!r}")
    print(f"same-weights: {len(ta)} tensors, {len(ba)} data bytes, identical")


def imported(a):
    import h5py
    step = open(os.path.join(a.ckpt, "latest")).read().strip()
    m = json.load(open(os.path.join(a.ckpt, step, "manifest.json")))
    like = json.load(open(a.like))
    if step != "step_00000000" or m["step"] != 0 or m["consumed_samples"] != 0:
        fail(f"{step}: expected step 0 with nothing consumed")
    lay = m["layout"]
    if (lay["tp"], lay["pp"], lay["dp"], lay["zero1"], lay["precision"]) != (1, 1, 1, False,
                                                                             "fp32"):
        fail(f"layout {lay}: expected tp 1 x pp 1 x dp 1, fp32")
    mine = {k: v for k, v in m["model"].items() if k != "name"}
    theirs = {k: v for k, v in like["model"].items() if k != "name"}
    if mine != theirs:
        fail(f"model {mine} differs from the original's {theirs}")
    tok = m["data"]["tokenizer"]
    if tok != os.path.join(os.path.abspath(a.ckpt), "tokenizer.model"):
        fail(f"data.tokenizer = {tok}: expected the copy beside the checkpoint")
    elif open(tok, "rb").read() != open(a.tokenizer, "rb").read():
        fail(f"{tok}: not a copy of {a.tokenizer}")
    if sorted(m["tensors"]) != sorted(like["tensors"]):
        fail("the imported checkpoint holds other tensors than the original")
    shard = h5py.File(os.path.join(a.ckpt, step, m["files"][0]["name"]), "r")
    for name in m["tensors"]:
        for moment in ("exp_avg", "exp_avg_sq"):
            if np.any(shard[moment][name][...] != 0):
                fail(f"{moment}/{name}: not zero")
    word = shard["master"]["embedding.word"][...]
    vocab = m["model"]["vocab"]
    if word.shape[0] <= vocab or np.any(word[vocab:] != 0):
        fail(f"embedding.word {word.shape}: expected zero padding rows beyond {vocab}")
    print(f"imported: {step}, {len(m['tensors'])} tensors, zero moments and padding")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gpt2-style")
    g.add_argument("src")
    g.add_argument("dst")
    g.add_argument("--dtypes", choices=["f32", "mixed"], default="f32")
    b = sub.add_parser("break")
    b.add_argument("dir")
    b.add_argument("what")
    for name in ("same-values", "same-weights"):
        s = sub.add_parser(name)
        s.add_argument("a")
        s.add_argument("b")
    i = sub.add_parser("imported")
    i.add_argument("ckpt")
    i.add_argument("--like", required=True)
    i.add_argument("--tokenizer", required=True)
    a = ap.parse_args()
    {"gpt2-style": gpt2_style, "break": break_dir, "same-values": same_values,
     "same-weights": same_weights, "imported": imported}[a.cmd](a)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
