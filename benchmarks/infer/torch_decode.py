#!/usr/bin/env python3
"""Greedy decoding with a KV cache in PyTorch, for `benchmarks/infer/bench_generate.sh`:
the same GPT shape as a jumbo model preset (pre-LayerNorm, learned positions, tanh GELU,
tied head), random weights, fp32, the same prompt and generated lengths and batch sizes as
`jumbo bench generate`, timed the same way (prefill until every sequence has its first token,
then the decode steps). Caches are preallocated and written in place. Prints one JSON line.
Debian's python3-torch: run with /usr/bin/python3.
"""
import argparse
import json
import math
import re
import time

import torch
import torch.nn.functional as F


def preset(path):
    cfg = {}
    for line in open(path):
        m = re.match(r'\s*(\w+)\s*=\s*("?)([^"#]*)\2', line)
        if m:
            v = m.group(3).strip()
            cfg[m.group(1)] = v if m.group(2) else int(v)
    cfg.setdefault("ffn", 0)
    cfg["ffn"] = cfg["ffn"] or 4 * cfg["d_model"]
    return cfg


class Gpt(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["d_model"], c["ffn"]
        self.h, self.hd = c["heads"], d // c["heads"]
        self.wte = torch.nn.Parameter(torch.randn(c["vocab"], d) * 0.02)
        self.wpe = torch.nn.Parameter(torch.randn(c["context"], d) * 0.02)
        self.blocks = torch.nn.ModuleList()
        for _ in range(c["layers"]):
            b = torch.nn.Module()
            b.ln1, b.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            b.qkv, b.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            b.fc1, b.fc2 = torch.nn.Linear(d, f), torch.nn.Linear(f, d)
            self.blocks.append(b)
        self.lnf = torch.nn.LayerNorm(d)

    def step(self, tokens, start, kc, vc):
        """tokens [B, T] at positions start .. start + T - 1; returns the last logits [B, V]."""
        bsz, t = tokens.shape
        x = self.wte[tokens] + self.wpe[start:start + t]
        mask = None
        if t > 1:
            mask = torch.full((t, start + t), -math.inf).triu(start + 1)
        for i, b in enumerate(self.blocks):
            q, k, v = b.qkv(b.ln1(x)).view(bsz, t, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
            kc[i][:, :, start:start + t] = k
            vc[i][:, :, start:start + t] = v
            keys, values = kc[i][:, :, :start + t], vc[i][:, :, :start + t]
            att = q @ keys.transpose(-1, -2) / math.sqrt(self.hd)
            if mask is not None:
                att = att + mask
            y = (att.softmax(-1) @ values).transpose(1, 2).reshape(bsz, t, -1)
            x = x + b.proj(y)
            x = x + b.fc2(F.gelu(b.fc1(b.ln2(x)), approximate="tanh"))
        return self.lnf(x[:, -1]) @ self.wte.t()


def run(model, c, batch, prompt, new_tokens):
    kc = [torch.empty(batch, model.h, prompt + new_tokens, model.hd) for _ in model.blocks]
    vc = [torch.empty_like(k) for k in kc]
    tokens = torch.randint(0, c["vocab"], (batch, prompt))
    t0 = time.perf_counter()
    nxt = model.step(tokens, 0, kc, vc).argmax(-1, keepdim=True)
    t1 = time.perf_counter()
    for i in range(new_tokens - 1):
        nxt = model.step(nxt, prompt + i, kc, vc).argmax(-1, keepdim=True)
    t2 = time.perf_counter()
    return batch * prompt / (t1 - t0), (t2 - t1) / (new_tokens - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c = preset(a.model)
    model = Gpt(c).eval()
    rows = []
    with torch.inference_mode():
        for batch in a.batch:
            results = [run(model, c, batch, a.prompt, a.new_tokens) for _ in range(a.repeats + 1)][1:]
            prefill = sorted(r[0] for r in results)[len(results) // 2]
            step = sorted(r[1] for r in results)[len(results) // 2]
            rows.append({"batch": batch, "prefill_tokens_per_s": prefill,
                         "decode_tokens_per_s": batch / step})
    print(json.dumps({"model": c["name"], "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "rows": rows}))


if __name__ == "__main__":
    main()
