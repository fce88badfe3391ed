#!/usr/bin/env python3
"""Greedy decoding with a KV cache in PyTorch, for `benchmarks/infer/bench_generate.sh`:
the same shape as a jumbo model preset (GPT: pre-LayerNorm, learned positions, tanh GELU,
tied head; Llama family: RMSNorm, RoPE, SwiGLU, grouped-query attention whose cache holds the
kv heads, untied or tied head, q/k/v biases as the preset says), random weights, fp32, the
same prompt and generated lengths and batch sizes as
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
            if m.group(2):
                cfg[m.group(1)] = v
            elif v in ("true", "false"):
                cfg[m.group(1)] = v == "true"
            else:
                cfg[m.group(1)] = float(v) if any(ch in v for ch in ".e") else int(v)
    cfg.setdefault("ffn", 0)
    cfg["ffn"] = cfg["ffn"] or 4 * cfg["d_model"]
    cfg["kv_heads"] = cfg.get("kv_heads", 0) or cfg["heads"]
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


class Llama(torch.nn.Module):
    """The Llama block as Hugging Face's LlamaForCausalLM computes it (rotate_half RoPE)."""

    def __init__(self, c):
        super().__init__()
        d, f = c["d_model"], c["ffn"]
        self.h, self.g, self.hd = c["heads"], c["kv_heads"], d // c["heads"]
        self.eps = c.get("norm_eps", 1e-5)
        qkv_bias = c.get("qkv_bias", False)
        self.wte = torch.nn.Parameter(torch.randn(c["vocab"], d) * 0.02)
        self.head = self.wte if c.get("tied_embeddings", True) else torch.nn.Parameter(
            torch.randn(c["vocab"], d) * 0.02)
        self.blocks = torch.nn.ModuleList()
        for _ in range(c["layers"]):
            b = torch.nn.Module()
            b.n1, b.n2 = torch.nn.Parameter(torch.ones(d)), torch.nn.Parameter(torch.ones(d))
            b.q = torch.nn.Linear(d, self.h * self.hd, bias=qkv_bias)
            b.k = torch.nn.Linear(d, self.g * self.hd, bias=qkv_bias)
            b.v = torch.nn.Linear(d, self.g * self.hd, bias=qkv_bias)
            b.o = torch.nn.Linear(self.h * self.hd, d, bias=False)
            b.gate, b.up = torch.nn.Linear(d, f, bias=False), torch.nn.Linear(d, f, bias=False)
            b.down = torch.nn.Linear(f, d, bias=False)
            self.blocks.append(b)
        self.nf = torch.nn.Parameter(torch.ones(d))
        inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, self.hd, 2).float() / self.hd))
        angles = torch.outer(torch.arange(c["context"]).float(), inv)
        self.cos, self.sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x, start):
        t = x.shape[-2]
        cos, sin = self.cos[start:start + t], self.sin[start:start + t]
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return x * cos + torch.cat((-x2, x1), -1) * sin

    def step(self, tokens, start, kc, vc):
        bsz, t = tokens.shape
        x = self.wte[tokens]
        mask = None
        if t > 1:
            mask = torch.full((t, start + t), -math.inf).triu(start + 1)
        for i, b in enumerate(self.blocks):
            a = self.norm(x, b.n1)
            q = self.rope(b.q(a).view(bsz, t, self.h, self.hd).transpose(1, 2), start)
            k = self.rope(b.k(a).view(bsz, t, self.g, self.hd).transpose(1, 2), start)
            kc[i][:, :, start:start + t] = k
            vc[i][:, :, start:start + t] = b.v(a).view(bsz, t, self.g, self.hd).transpose(1, 2)
            # Each kv head serves its group's query heads: [B, G, R*T, D] against [B, G, P, D].
            r = self.h // self.g
            qg = q.reshape(bsz, self.g, r * t, self.hd)
            keys, values = kc[i][:, :, :start + t], vc[i][:, :, :start + t]
            att = (qg @ keys.transpose(-1, -2) / math.sqrt(self.hd)).view(bsz, self.g, r, t, -1)
            if mask is not None:
                att = att + mask
            y = (att.softmax(-1).view(bsz, self.g, r * t, -1) @ values).view(bsz, self.h, t, self.hd)
            x = x + b.o(y.transpose(1, 2).reshape(bsz, t, -1))
            m = self.norm(x, b.n2)
            x = x + b.down(F.silu(b.gate(m)) * b.up(m))
        return self.norm(x[:, -1], self.nf) @ self.head.t()


def run(model, c, batch, prompt, new_tokens):
    heads = getattr(model, "g", model.h)  # the cache holds the kv heads
    kc = [torch.empty(batch, heads, prompt + new_tokens, model.hd) for _ in model.blocks]
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
    model = (Llama(c) if c.get("position") == "rope" else Gpt(c)).eval()
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
