#!/usr/bin/python3
"""Hugging Face Llama-family directories for the import/export tests, written and read here
without jumbo: the tensor names, shapes and config.json keys of transformers'
LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM, the safetensors format (8-byte
little-endian header length, a JSON header, the data), and save_pretrained's sharding (an
index, model.safetensors.index.json, naming each tensor's file).

Subcommands:
  write DIR --arch llama|mistral|qwen2 --layers L --d-model C --heads H --kv-heads G --ffn F
        --vocab V --context P [--tied] [--dtype F32|BF16|F16] [--shards N] [--seed S]
        [--tokenizer FILE ...] [--rope-theta T] [--llama3-scaling]
      Random weights (normal, std 0.02; norms around 1) in N files (1: model.safetensors).
  break DIR DEFECT
      One defect: "config KEY=JSON" (null removes nothing: sets null), "drop-file" (the last
      shard the index names), "wrong-shape" (model.norm.weight one element longer).
  same DIR_A DIR_B
      Every tensor of A is in B with the same dtype, shape and bytes, and B has no other.
  logprobs DIR --tokens JSON_LIST
      A float64 forward pass of the model in DIR (read from its safetensors, in HF's names and
      conventions: rotate_half RoPE, repeat_kv grouped attention, RMSNorm, SwiGLU) printing
      the log-probability of each next token as a JSON list.
  per-item DIR --per-item OUT.jsonl [--tol T]
      Each continuation's log-likelihood of `jumbo eval --per-item` (its context_tokens and
      tokens) recomputed by the float64 forward: the largest absolute difference must be <= T
      (1e-4).
  greedy DIR --per-item OUT.jsonl --generated GEN.jsonl
      The tokens `jumbo generate --json --temperature 0` chose after each item's context are
      the argmax of the float64 forward after the same prefix (its KV cache checked against a
      reading that shares no code with it).
  peft BASE_DIR ADAPTER_DIR MERGED_DIR
      PEFT's reading of an adapter directory (adapter_config.json: r, lora_alpha,
      target_modules; adapter_model.safetensors: base_model.model.<module>.lora_A/lora_B
      .weight) applied to the base in float64, W + lora_alpha / r B A, against a merged
      directory's tensors (within 1e-6 + 1e-6 |W|); every target module of every layer adapted.
  rss -- CMD ...
      Runs CMD, polling /proc/PID/status's VmHWM (peak resident set) until it exits; prints
      "peak_rss_mib N" and exits with CMD's status.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import time

import torch

DT = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def table(cfg):
    """(name, shape) in transformers' state-dict order."""
    c, h, g = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, f, v = c // h, cfg["intermediate_size"], cfg["vocab_size"]
    qwen = cfg["model_type"] == "qwen2"
    bias = cfg.get("attention_bias", False)
    out = [("model.embed_tokens.weight", [v, c])]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, rows in (("q_proj", h * d), ("k_proj", g * d), ("v_proj", g * d)):
            out.append((f"{p}self_attn.{name}.weight", [rows, c]))
            if qwen or bias:
                out.append((f"{p}self_attn.{name}.bias", [rows]))
        out.append((f"{p}self_attn.o_proj.weight", [c, h * d]))
        if bias:
            out.append((f"{p}self_attn.o_proj.bias", [c]))
        for name, shape in (("gate_proj", [f, c]), ("up_proj", [f, c]), ("down_proj", [c, f])):
            out.append((f"{p}mlp.{name}.weight", shape))
            if bias:
                out.append((f"{p}mlp.{name}.bias", [shape[0]]))
        out.append((f"{p}input_layernorm.weight", [c]))
        out.append((f"{p}post_attention_layernorm.weight", [c]))
    out.append(("model.norm.weight", [c]))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", [v, c]))
    return out


def write_safetensors(path, tensors):
    """tensors: list of (name, torch tensor)."""
    header, offset = {}, 0
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    for name, t in tensors:
        n = t.numel() * t.element_size()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, t in tensors:
            f.write(t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.float32
                    else t.contiguous().numpy().tobytes())


def cmd_write(a):
    os.makedirs(a.dir, exist_ok=True)
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}[a.arch]
    cfg = {"architectures": [arch], "model_type": a.arch, "hidden_size": a.d_model,
           "intermediate_size": a.ffn, "num_hidden_layers": a.layers,
           "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
           "hidden_act": "silu", "max_position_embeddings": a.context, "rms_norm_eps": 1e-5,
           "rope_theta": a.rope_theta, "tie_word_embeddings": a.tied, "vocab_size": a.vocab,
           "torch_dtype": {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[a.dtype],
           "transformers_version": "4.46.0", "use_cache": True, "initializer_range": 0.02,
           "bos_token_id": 1, "eos_token_id": 2, "attention_dropout": 0.0}
    if a.arch == "llama":
        cfg.update({"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
                    "head_dim": a.d_model // a.heads})
        cfg["rope_scaling"] = ({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 64, "rope_type": "llama3"}
                               if a.llama3_scaling else None)
    elif a.arch == "mistral":
        cfg["sliding_window"] = None
    else:
        cfg.update({"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": a.layers})
    gen = torch.Generator().manual_seed(a.seed)
    names = table(cfg)
    per_file = -(-len(names) // a.shards)
    groups = [names[i:i + per_file] for i in range(0, len(names), per_file)]
    weight_map = {}
    for k, group in enumerate(groups):
        fname = "model.safetensors" if len(groups) == 1 else f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = []
        for name, shape in group:
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
            else:
                t = a.std * torch.randn(shape, generator=gen)
            tensors.append((name, t.to(DT[a.dtype])))
            weight_map[name] = fname
        write_safetensors(os.path.join(a.dir, fname), tensors)
        del tensors
    if len(groups) > 1:
        total = sum(torch.tensor([], dtype=DT[a.dtype]).element_size() * torch.Size(s).numel() for _, s in names)
        with open(os.path.join(a.dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for path in a.tokenizer or []:
        with open(path, "rb") as src, open(os.path.join(a.dir, os.path.basename(path)), "wb") as dst:
            dst.write(src.read())


def cmd_break(a):
    if a.defect.startswith("config "):
        key, value = a.defect[len("config "):].split("=", 1)
        path = os.path.join(a.dir, "config.json")
        cfg = json.load(open(path))
        cfg[key] = json.loads(value)
        json.dump(cfg, open(path, "w"), indent=2)
    elif a.defect == "drop-file":
        index = json.load(open(os.path.join(a.dir, "model.safetensors.index.json")))
        os.remove(os.path.join(a.dir, sorted(set(index["weight_map"].values()))[-1]))
    elif a.defect == "wrong-shape":
        tensors = read_dir(a.dir)
        index = os.path.join(a.dir, "model.safetensors.index.json")
        fname = json.load(open(index))["weight_map"]["model.norm.weight"] if os.path.exists(index) else "model.safetensors"
        names = [n for n, f in (json.load(open(index))["weight_map"].items() if os.path.exists(index) else [(n, fname) for n in tensors]) if f == fname]
        out = []
        for n in names:
            t = as_f64(tensors[n]).to({"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[tensors[n][0]])
            if n == "model.norm.weight":
                t = torch.cat([t, t[:1]])
            out.append((n, t))
        write_safetensors(os.path.join(a.dir, fname), out)
    else:
        sys.exit(f"unknown defect {a.defect}")


def index_dir(d):
    """name -> (path, dtype, shape, start, end) over the directory's safetensors files."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for fname in files:
        path = os.path.join(d, fname)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for name, e in header.items():
            if name != "__metadata__":
                out[name] = (path, e["dtype"], e["shape"], 8 + n + e["data_offsets"][0], 8 + n + e["data_offsets"][1])
    return out


def read_entry(e):
    path, dtype, shape, start, end = e
    with open(path, "rb") as f:
        f.seek(start)
        return dtype, shape, f.read(end - start)


def read_dir(d):
    """name -> (dtype, shape, bytes) over the directory's safetensors files."""
    return {name: read_entry(e) for name, e in index_dir(d).items()}


def cmd_same(a):
    """One tensor of each at a time: a 2 GiB directory is compared in the memory of two tensors."""
    x, y = index_dir(a.a), index_dir(a.b)
    bad = [n for n in x if n not in y] + [n for n in y if n not in x]
    for n in x:
        if n in y and read_entry(x[n]) != read_entry(y[n]):
            bad.append(n)
    for n in bad[:5]:
        print(f"FAIL: tensor {n} differs or is missing: {x.get(n, ('', 'missing'))[1:3]} vs {y.get(n, ('', 'missing'))[1:3]}")
    if bad:
        sys.exit(1)
    print(f"same: {len(x)} tensors byte for byte")


def as_f64(entry):
    dtype, shape, raw = entry
    t = torch.frombuffer(bytearray(raw), dtype={"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[dtype])
    return t.to(torch.float64).reshape(shape)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def inv_freq(cfg, d):
    f = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.get("rope_scaling")
    if s and s.get("rope_type", s.get("type")) == "llama3":  # transformers' _compute_llama3_parameters
        import math
        factor, lo, hi, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wl = 2 * math.pi / f
        scaled = torch.where(wl > low_wl, f / factor, f)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wl < high_wl) * ~(wl > low_wl)
        f = torch.where(medium, smoothed, scaled)
    return f


class Model:
    def __init__(self, d):
        self.cfg = json.load(open(os.path.join(d, "config.json")))
        self.w = {n: as_f64(e) for n, e in read_dir(d).items()}

    def logp(self, tokens):
        """log-softmax of the next-token logits at every position, [n, vocab]."""
        return forward(self.cfg, self.w, tokens)


def cmd_logprobs(a):
    m = Model(a.dir)
    tokens = json.loads(a.tokens)
    logp = m.logp(tokens)
    print(json.dumps([float(logp[t, tokens[t + 1]]) for t in range(len(tokens) - 1)]))


def cmd_per_item(a):
    m = Model(a.dir)
    worst, compared = 0.0, 0
    for line in open(a.per_item):
        item = json.loads(line)
        for cont in item["continuations"]:
            ctx, toks = cont["context_tokens"], cont["tokens"]
            logp = m.logp(ctx + toks)
            mine = sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(toks))
            worst = max(worst, abs(mine - cont["loglikelihood"]))
            compared += 1
    print(f"per-item: {compared} log-likelihoods against the float64 reader: largest "
          f"difference {worst:.2e}")
    if compared == 0 or worst > a.tol:
        print(f"FAIL: largest difference {worst:.2e} > {a.tol}")
        sys.exit(1)


def cmd_greedy(a):
    m = Model(a.dir)
    items = [json.loads(x) for x in open(a.per_item)]
    gens = [json.loads(x) for x in open(a.generated)]
    checked = 0
    for item, gen in zip(items, gens):
        ctx = item["context_tokens"]
        logp = m.logp(ctx + gen["tokens"])
        for i, t in enumerate(gen["tokens"]):
            row = logp[len(ctx) - 1 + i]
            best = int(torch.argmax(row))
            if best != t and float(row[best] - row[t]) > 1e-9:
                print(f"FAIL: item {item['index']} token {i}: generate chose {t}, the reader's argmax is {best} (by {float(row[best] - row[t]):.3g})")
                sys.exit(1)
            checked += 1
    print(f"greedy: {checked} generated tokens are the float64 reader's argmax")
    if checked == 0:
        sys.exit(1)


def forward(cfg, w, tokens):
    c, h, g = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, eps, n = c // h, cfg["rms_norm_eps"], len(tokens)
    pos = torch.arange(n, dtype=torch.float32)
    ang = torch.outer(pos, inv_freq(cfg, d))  # float32, as transformers
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().to(torch.float64), emb.sin().to(torch.float64)

    def norm(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    mask = torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        y = norm(x, w[p + "input_layernorm.weight"])
        q = lin(y, p + "self_attn.q_proj").reshape(n, h, d).transpose(0, 1)
        k = lin(y, p + "self_attn.k_proj").reshape(n, g, d).transpose(0, 1)
        v = lin(y, p + "self_attn.v_proj").reshape(n, g, d).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(h // g, dim=0), v.repeat_interleave(h // g, dim=0)  # repeat_kv
        att = torch.softmax(q @ k.transpose(1, 2) / d ** 0.5 + mask, dim=-1)
        x = x + lin((att @ v).transpose(0, 1).reshape(n, h * d), p + "self_attn.o_proj")
        y = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = lin(y, p + "mlp.gate_proj"), lin(y, p + "mlp.up_proj")
        x = x + lin(torch.nn.functional.silu(gate) * up, p + "mlp.down_proj")
    x = norm(x, w["model.norm.weight"])
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return torch.log_softmax(x @ head.T, dim=-1)


def read_file(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, e in header.items():
            if name != "__metadata__":
                f.seek(base + e["data_offsets"][0])
                out[name] = (e["dtype"], e["shape"], f.read(e["data_offsets"][1] - e["data_offsets"][0]))
    return out


def cmd_peft(a):
    cfg = json.load(open(os.path.join(a.adapter, "adapter_config.json")))
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM", cfg
    scale = cfg["lora_alpha"] / cfg["r"]
    lora = read_file(os.path.join(a.adapter, "adapter_model.safetensors"))
    base = {n: as_f64(e) for n, e in read_dir(a.base).items()}
    merged = {n: as_f64(e) for n, e in read_dir(a.merged).items()}
    layers = json.load(open(os.path.join(a.base, "config.json")))["num_hidden_layers"]
    adapted, worst = set(), 0.0
    for name in lora:
        assert name.startswith("base_model.model.") and name.endswith(".lora_A.weight") or name.endswith(".lora_B.weight"), name
        if not name.endswith(".lora_A.weight"):
            continue
        module = name[len("base_model.model."):-len(".lora_A.weight")]
        A = as_f64(lora[name])
        B = as_f64(lora[name.replace("lora_A", "lora_B")])
        assert A.shape[0] == cfg["r"] and B.shape[1] == cfg["r"], (name, A.shape, B.shape)
        want = base[module + ".weight"] + scale * (B @ A)
        got = merged[module + ".weight"]
        err = float(((got - want).abs() - 1e-6 * want.abs()).max())
        worst = max(worst, err)
        adapted.add(module)
    expected = {f"model.layers.{i}.{'self_attn' if m in ('q_proj', 'k_proj', 'v_proj', 'o_proj') else 'mlp'}.{m}"
                for i in range(layers) for m in cfg["target_modules"]}
    if adapted != expected:
        print(f"FAIL: adapted modules {sorted(adapted ^ expected)[:4]} differ from target_modules x layers")
        sys.exit(1)
    for n in merged:  # the rest of the merged model is the base
        if n[:-len(".weight")] not in adapted and not torch.equal(merged[n], base[n]):
            print(f"FAIL: {n} is not adapted but differs from the base")
            sys.exit(1)
    print(f"peft: {len(adapted)} modules, merged = base + {scale} B A within 1e-6 (worst excess {worst:.2e})")
    if worst > 1e-6:
        print("FAIL: merged differs from PEFT's reading")
        sys.exit(1)


def cmd_rss(a):
    proc = subprocess.Popen(a.cmd)
    peak = 0
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.02)
    print(f"peak_rss_mib {peak / 1024:.0f}")
    sys.exit(proc.returncode)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd_name", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("--arch", default="llama", choices=["llama", "mistral", "qwen2"])
    for k, v in (("layers", 2), ("d-model", 64), ("heads", 4), ("kv-heads", 2), ("ffn", 160),
                 ("vocab", 500), ("context", 64), ("shards", 1), ("seed", 1)):
        w.add_argument("--" + k, type=int, default=v)
    w.add_argument("--std", type=float, default=0.02)
    w.add_argument("--rope-theta", type=float, default=500000.0)
    w.add_argument("--llama3-scaling", action="store_true")
    w.add_argument("--tied", action="store_true")
    w.add_argument("--dtype", default="BF16", choices=list(DT))
    w.add_argument("--tokenizer", nargs="*")
    b = sub.add_parser("break")
    b.add_argument("dir")
    b.add_argument("defect")
    s = sub.add_parser("same")
    s.add_argument("a")
    s.add_argument("b")
    lp = sub.add_parser("logprobs")
    lp.add_argument("dir")
    lp.add_argument("--tokens", required=True)
    pi = sub.add_parser("per-item")
    pi.add_argument("dir")
    pi.add_argument("--per-item", required=True)
    pi.add_argument("--tol", type=float, default=1e-4)
    g = sub.add_parser("greedy")
    g.add_argument("dir")
    g.add_argument("--per-item", required=True)
    g.add_argument("--generated", required=True)
    pe = sub.add_parser("peft")
    pe.add_argument("base")
    pe.add_argument("adapter")
    pe.add_argument("merged")
    r = sub.add_parser("rss")
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.cmd_name == "rss" and a.cmd and a.cmd[0] == "--":
        a.cmd = a.cmd[1:]
    {"write": cmd_write, "break": cmd_break, "same": cmd_same, "logprobs": cmd_logprobs, "per-item": cmd_per_item,
     "greedy": cmd_greedy, "peft": cmd_peft, "rss": cmd_rss}[a.cmd_name](a)


if __name__ == "__main__":
    main()
