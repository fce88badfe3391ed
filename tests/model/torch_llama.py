#!/usr/bin/python3
"""A small Llama in torch, float64, that trains as jumbo trains: the independent replica behind
tests/model/llama_replica.sh, which checks jumbo's per-step losses and gradient norms.

Written from the published and documented conventions, not from jumbo's C++:
  - the block (Llama, Touvron et al. 2023; transformers' LlamaForCausalLM): pre-norm,
    x += o(attention(rope(q), rope(k), v)) of RMSNorm(x), x += down(silu(gate h) * up h) of
    h = RMSNorm(x), a final RMSNorm, an untied head, no biases;
  - RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight;
  - RoPE in Hugging Face's rotate_half form: each head's halves x1 = [0, D/2), x2 = [D/2, D)
    become x1 cos - x2 sin and x2 cos + x1 sin at angle p f_i, f_i = theta^(-2i/D), p the
    position in the sequence. The angles are computed in fp32 as transformers computes them
    (inv_freq and the position product in float32); cos, sin and all that follows in float64;
  - grouped-query attention (Ainslie et al. 2023): G = kv_heads key/value heads, each shared
    by R = H / G consecutive query heads (query head h = g R + r reads group g), causal
    softmax scaled by 1 / sqrt(D);
  - jumbo's stored layout (include/jumbo/backend/backend.h, include/jumbo/model/spec.h):
    linear weights [out, in] (y = x W^T); attn.qkv.weight's rows are the G kv groups, each
    its R query heads' rows, then its key head's, then its value head's, D rows apiece;
    attn.proj [C, H D]; mlp.gate, mlp.up [F, C]; mlp.fc2 [C, F] (the down map); head.weight
    and embedding.word [padded vocab, C], rows >= model.vocab padding (never a logit);
  - checkpoint shards read with h5py as docs/checkpoint-format.md describes them;
  - the samples of docs/data-format.md's GptSampler (a keyed Feistel permutation of each
    epoch, cycle walking, splitmix64; one dataset of weight 1 samples with seed train.seed),
    step s training on samples [(s - 1) B, s B) of that order;
  - the loss: the mean cross-entropy over every token of the global batch (docs/metrics.md);
    grad_norm: the global L2 norm before clipping; clipping: the gradient times
    grad_clip / norm when the norm exceeds grad_clip; the learning rate (docs/config.md):
    linear warm-up over warmup_tokens, then a cosine to min_lr at the run's last token,
    evaluated at the tokens consumed once the step is done; AdamW (Loshchilov & Hutter 2019)
    as torch.optim.AdamW computes it (bias-corrected moments, decoupled weight decay
    lr x weight_decay x w), decaying matrices and embeddings only, never the norms' weights.

Subcommand:
  train INIT_STEP_DIR --preset TOML --data PREFIX --steps N --batch B [hyperparameters]
        --run LABEL=METRICS.jsonl[,CKPT_ROOT] ... [--controls]
      Trains N steps from the checkpoint's master weights (weights no update has touched) on
      the batches jumbo's sampler draws, and compares with each run:
        - free-running: every step's loss, gradient norm and learning rate against the run's
          metrics (relative differences: loss <= --loss-tol, grad norm <= --grad-norm-tol,
          lr <= 1e-12);
        - with CKPT_ROOT (a checkpoint every step): per step, the replica's loss and gradient
          norm at the run's own weights before that step (the same tolerances; the
          free-running trajectory's float32-against-float64 drift taken out), and jumbo's
          AdamW update: the weights after the step from those before it and the saved
          moments, each element within 2 x (1 float32 ulp + 1e-6 of its update);
        - with --controls, the replica trained with one convention misread at a time must miss
          the first run's losses or gradient norms by at least 10 times the tolerance (the
          comparison's teeth).
Exits 1 with one FAIL line per problem.
"""
import argparse
import glob
import json
import math
import os
import sys
import tomllib

import h5py
import numpy as np
import torch

failures = []
F64 = torch.float64


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


# ---- the model's keys ----------------------------------------------------------------------

def model_keys(preset):
    """The preset's keys over jumbo's defaults (include/jumbo/config/config.h, ModelConfig)."""
    raw = tomllib.load(open(preset, "rb"))
    raw = raw.get("model", raw)
    m = {"norm": "layernorm", "norm_eps": 1e-5, "position": "learned", "rope_theta": 10000.0,
         "rope_scaling": "none", "mlp": "gelu", "kv_heads": 0, "tied_embeddings": True,
         "linear_bias": True, "qkv_bias": False, "qk_norm": False, "ffn": 0}
    m.update(raw)
    m["kv_heads"] = m["kv_heads"] or m["heads"]
    m["ffn"] = m["ffn"] or 4 * m["d_model"]
    want = {"norm": "rmsnorm", "position": "rope", "mlp": "swiglu", "rope_scaling": "none",
            "tied_embeddings": False, "linear_bias": False, "qkv_bias": False, "qk_norm": False}
    for key, value in want.items():
        if m[key] != value:
            sys.exit(f"{preset}: {key} = {m[key]!r}; this replica models {key} = {value!r} only")
    return m


def param_shapes(m):
    """Every tensor's shape; None for the two of the padded vocabulary."""
    c, f, d = m["d_model"], m["ffn"], m["d_model"] // m["heads"]
    h, g = m["heads"], m["kv_heads"]
    s = {"embedding.word": None, "head.weight": None, "final_norm.weight": [c]}
    for i in range(m["layers"]):
        p = f"layers.{i}."
        s.update({p + "ln1.weight": [c], p + "attn.qkv.weight": [(h + 2 * g) * d, c],
                  p + "attn.proj.weight": [c, h * d], p + "ln2.weight": [c],
                  p + "mlp.gate.weight": [f, c], p + "mlp.up.weight": [f, c],
                  p + "mlp.fc2.weight": [c, f]})
    return s


# ---- checkpoint and data -------------------------------------------------------------------

def read_checkpoint(step_dir, m, states=("master",)):
    """{state: {name: float32 array}} from a step directory's shard files (any layout; pieces
    placed as docs/checkpoint-format.md says); the vocabulary's padding rows dropped."""
    out = {state: {} for state in states}
    for path in sorted(glob.glob(os.path.join(step_dir, "*.h5"))):
        with h5py.File(path, "r") as f:
            for state in states:
                for key, ds in f[state].items():
                    name = key.split("@")[0]
                    shape = tuple(int(s) for s in ds.attrs["shape"])
                    begin, end = (int(x) for x in ds.attrs["flat_range"])
                    if name not in out[state]:
                        out[state][name] = np.full(tuple(int(s) for s in ds.attrs["global_shape"]),
                                                   np.nan, np.float32)
                    rect = tuple(slice(int(o), int(o) + s) for o, s in zip(ds.attrs["offset"], shape))
                    flat = out[state][name][rect].reshape(-1)
                    flat[begin:end] = ds[()].reshape(-1)
                    out[state][name][rect] = flat.reshape(shape)
    for state in states:
        got = out[state]
        for name, shape in param_shapes(m).items():
            if name not in got:
                sys.exit(f"{step_dir}: no tensor {state}/{name}")
            if shape is None:
                if got[name].shape[0] < m["vocab"] or got[name].shape[1] != m["d_model"]:
                    sys.exit(f"{step_dir}: {name} {list(got[name].shape)}, expected "
                             f"[>= {m['vocab']}, {m['d_model']}]")
                got[name] = got[name][:m["vocab"]]
            elif list(got[name].shape) != shape:
                sys.exit(f"{step_dir}: {name} {list(got[name].shape)}, expected {shape}")
            if np.isnan(got[name]).any():
                sys.exit(f"{step_dir}: {state}/{name} has elements no shard holds")
        extra = sorted(set(got) - set(param_shapes(m)))
        if extra:
            sys.exit(f"{step_dir}: tensors this replica does not model: {extra}")
    return out


def as_f64(arrays):
    return {k: torch.from_numpy(v.astype(np.float64)) for k, v in arrays.items()}


def read_tokens(prefix):
    """The dataset's tokens as one stream: PREFIX.parts' parts in order, or PREFIX.idx/.bin
    (docs/data-format.md: the idx header's byte 12 is the token width, 1 = uint16)."""
    if os.path.exists(prefix + ".parts"):
        index = json.load(open(prefix + ".parts"))
        base = os.path.dirname(prefix + ".parts")
        prefixes = [os.path.join(base, p["name"]) for p in index["parts"]]
    else:
        prefixes = [prefix]
    streams = []
    for p in prefixes:
        head = open(p + ".idx", "rb").read(16)
        assert head[:8] == b"JUMBOIDX", p
        streams.append(np.fromfile(p + ".bin", dtype={1: "<u2", 2: "<u4"}[head[12]]))
    return np.concatenate(streams).astype(np.int64)


MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def sample_index(i, n, seed):
    """Which sample index i of the endless order reads: epoch i // n's permutation of [0, n)."""
    e, q = divmod(i, n)
    if n <= 1:
        return q
    k = splitmix64(seed ^ splitmix64(e ^ 0x6A756D626F5F6570))
    h = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << h) - 1
    x = q
    while True:  # cycle walking: the Feistel network again until the result is below n
        left, right = x >> h, x & mask
        for r in range(6):
            f = splitmix64(k ^ splitmix64((right + (r << 56)) & MASK64)) & mask
            left, right = right, left ^ f
        x = (left << h) | right
        if x < n:
            return x


def batches(tokens, context, seed, batch, steps):
    """Per step a [batch, context + 1] tensor of windows: inputs [:, :-1], targets [:, 1:]."""
    n = (len(tokens) - 1) // context
    out = []
    for s in range(steps):
        starts = [sample_index(i, n, seed) * context for i in range(s * batch, (s + 1) * batch)]
        out.append(torch.from_numpy(np.stack([tokens[p:p + context + 1] for p in starts])))
    return out


# ---- the model -----------------------------------------------------------------------------

def rope_cos_sin(m, positions, pairs=False):
    """cos, sin [T, D] in float64 of the angles transformers computes in fp32."""
    d = m["d_model"] // m["heads"]
    inv_freq = 1.0 / (m["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    angles = (torch.arange(positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :])
    angles = angles.to(F64)
    angles = angles.repeat_interleave(2, dim=-1) if pairs else torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rotate_pairs(x):  # control: the original RoPE's adjacent pairs (x0, x1) -> (-x1, x0)
    return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


class Llama:
    """The forward of the Llama model on a dict of float64 weights; `control` names one
    convention to misread (the test's controls), None for the right reading."""

    def __init__(self, m, control=None):
        self.m, self.control = m, control
        self.cos, self.sin = rope_cos_sin(m, m["context"], pairs=control == "rope_pairs")

    def split_qkv(self, qkv):
        """q [B, H, T, D], k and v [B, G, T, D] from the grouped rows' outputs [B, T, ...]."""
        m = self.m
        h, g, d = m["heads"], m["kv_heads"], m["d_model"] // m["heads"]
        b, t, _ = qkv.shape
        if self.control == "qkv_blocks":  # control: every q row, then every k, then every v
            q, k, v = qkv.split([h * d, g * d, g * d], dim=-1)
            return (q.view(b, t, h, d).transpose(1, 2), k.view(b, t, g, d).transpose(1, 2),
                    v.view(b, t, g, d).transpose(1, 2))
        x = qkv.view(b, t, g, h // g + 2, d)
        q = x[:, :, :, :h // g].reshape(b, t, h, d).transpose(1, 2)  # head g R + r
        return q, x[:, :, :, h // g].transpose(1, 2), x[:, :, :, h // g + 1].transpose(1, 2)

    def attention(self, x, w, p):
        m = self.m
        b, t, _ = x.shape
        h, g, d = m["heads"], m["kv_heads"], m["d_model"] // m["heads"]
        q, k, v = self.split_qkv(x @ w[p + "attn.qkv.weight"].T)
        cos, sin = self.cos[:t], self.sin[:t]
        rot = rotate_pairs if self.control == "rope_pairs" else rotate_half
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        if self.control == "kv_tiled":  # control: query head h reads kv head h mod G
            k, v = k.repeat(1, h // g, 1, 1), v.repeat(1, h // g, 1, 1)
        else:
            k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        y = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
        return y.transpose(1, 2).reshape(b, t, h * d) @ w[p + "attn.proj.weight"].T

    def mlp(self, x, w, p):
        gate, up = x @ w[p + "mlp.gate.weight"].T, x @ w[p + "mlp.up.weight"].T
        if self.control == "gate_up_swapped":  # control: silu on the up map's output
            gate, up = up, gate
        return (gate * torch.sigmoid(gate) * up) @ w[p + "mlp.fc2.weight"].T

    def logits(self, w, ids):
        m, eps = self.m, self.m["norm_eps"]
        x = w["embedding.word"][ids]
        for i in range(m["layers"]):
            p = f"layers.{i}."
            x = x + self.attention(rms_norm(x, w[p + "ln1.weight"], eps), w, p)
            x = x + self.mlp(rms_norm(x, w[p + "ln2.weight"], eps), w, p)
        return rms_norm(x, w["final_norm.weight"], eps) @ w["head.weight"].T

    def loss(self, w, window):
        """The mean cross-entropy over every token of a batch of windows [B, T + 1]."""
        logits = self.logits(w, window[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 window[:, 1:].reshape(-1))


def loss_and_grads(model, weights, window):
    w = {k: v.detach().clone().requires_grad_(True) for k, v in weights.items()}
    loss = model.loss(w, window)
    loss.backward()
    grads = {k: v.grad for k, v in w.items()}
    return float(loss), math.sqrt(sum(float((g ** 2).sum()) for g in grads.values())), grads


# ---- training ------------------------------------------------------------------------------

def lr_at(a, tokens, total_tokens):
    if a.warmup_tokens > 0 and tokens <= a.warmup_tokens:
        return a.lr * tokens / a.warmup_tokens
    if tokens >= total_tokens:
        return a.min_lr
    progress = (tokens - a.warmup_tokens) / (total_tokens - a.warmup_tokens)
    return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def step_lr(a, m, step):
    tokens = a.batch * m["context"]
    return lr_at(a, step * tokens, a.steps * tokens)


def decays(name, weight, control=None):
    """Matrices and embeddings decay, norms' weights do not."""
    return weight.dim() == 2 or control == "decay_norms"


def train(a, m, init, data, control=None):
    """Per step (loss, grad norm, lr) of the replica's own trajectory."""
    model = Llama(m, control)
    w = {k: v.clone() for k, v in init.items()}
    exp_avg = {k: torch.zeros_like(v) for k, v in w.items()}
    exp_avg_sq = {k: torch.zeros_like(v) for k, v in w.items()}
    rows = []
    for step in range(1, a.steps + 1):
        loss, norm, grads = loss_and_grads(model, w, data[step - 1])
        clip = a.grad_clip > 0 and norm > a.grad_clip and control != "no_clip"
        scale = a.grad_clip / norm if clip else 1.0
        lr = step_lr(a, m, step)
        bc1, bc2 = 1 - a.beta1 ** step, 1 - a.beta2 ** step
        for name, p in w.items():
            g = grads[name] * scale
            exp_avg[name].mul_(a.beta1).add_(g, alpha=1 - a.beta1)
            exp_avg_sq[name].mul_(a.beta2).addcmul_(g, g, value=1 - a.beta2)
            if decays(name, p, control):
                p.mul_(1 - lr * a.weight_decay)
            p.addcdiv_(exp_avg[name], (exp_avg_sq[name] / bc2).sqrt() + a.eps, value=-lr / bc1)
        rows.append((loss, norm, lr))
    return rows


def rel(x, y):
    return abs(x - y) / abs(y) if x is not None else math.inf


def compare_run(label, replica, metrics, a):
    """Free-running: the replica's trajectory against the run's metrics, step by step."""
    tol = {"loss": a.loss_tol, "grad_norm": a.grad_norm_tol, "lr": 1e-12}
    worst = {key: (0.0, 0) for key in tol}
    for (loss, norm, lr), r in zip(replica, metrics):
        for key, mine in (("loss", loss), ("grad_norm", norm), ("lr", lr)):
            d = rel(r[key], mine)
            worst[key] = max(worst[key], (d, r["step"]))
            if d > tol[key]:
                fail(f"{label} step {r['step']}: {key} {r[key]!r} from jumbo, {mine!r} from the "
                     f"replica: relative difference {d:.2e} > {tol[key]:g}")
        print(f"{label} step {r['step']:3d}: loss {r['loss']:.12f} jumbo, {loss:.12f} replica "
              f"({rel(r['loss'], loss):.1e}); grad norm {r['grad_norm']:.9f} jumbo, {norm:.9f} "
              f"replica ({rel(r['grad_norm'], norm):.1e})")
    print(f"{label}: free-running over {len(metrics)} steps, largest relative differences: loss "
          f"{worst['loss'][0]:.2e} (step {worst['loss'][1]}), grad norm "
          f"{worst['grad_norm'][0]:.2e} (step {worst['grad_norm'][1]}), lr {worst['lr'][0]:.1e}")


def compare_steps(label, root, metrics, init, data, a, m):
    """Per step at the run's own weights: the replica's loss and grad norm, and jumbo's AdamW
    update (its weights after the step from those before and its saved moments)."""
    model = Llama(m)
    before = init
    worst = {"loss": (0.0, 0), "grad_norm": (0.0, 0), "update": (0.0, 0, "")}
    for r in metrics:
        step = r["step"]
        after = read_checkpoint(os.path.join(root, f"step_{step:08d}"), m,
                                ("master", "exp_avg", "exp_avg_sq"))
        loss, norm, _ = loss_and_grads(model, as_f64(before), data[step - 1])
        for key, mine, tol in (("loss", loss, a.loss_tol), ("grad_norm", norm, a.grad_norm_tol)):
            d = rel(r[key], mine)
            worst[key] = max(worst[key], (d, step))
            if d > tol:
                fail(f"{label} step {step} at jumbo's weights: {key} {r[key]!r} from jumbo, "
                     f"{mine!r} from the replica: relative difference {d:.2e} > {tol:g}")
        lr = step_lr(a, m, step)
        bc1, bc2 = 1 - a.beta1 ** step, 1 - a.beta2 ** step
        for name, p in before.items():
            p64, m64 = p.astype(np.float64), after["exp_avg"][name].astype(np.float64)
            v64 = after["exp_avg_sq"][name].astype(np.float64)
            decay = lr * a.weight_decay if p.ndim == 2 else 0.0
            update = lr / bc1 * m64 / (np.sqrt(v64 / bc2) + a.eps)
            want = p64 - decay * p64 - update
            got = after["master"][name]
            # jumbo rounds the result to float32 (an ulp of the larger of the weights before and
            # after) and computes the update with a few float32 operations (each within 2^-24)
            ulps = np.spacing(np.maximum(np.abs(p), np.abs(got))).astype(np.float64)
            err = np.abs(got - want) / (ulps + 1e-6 * np.abs(update))
            worst["update"] = max(worst["update"], (float(err.max()), step, name))
        before = after["master"]
    print(f"{label}: at jumbo's weights before each step, largest relative differences: loss "
          f"{worst['loss'][0]:.2e} (step {worst['loss'][1]}), grad norm "
          f"{worst['grad_norm'][0]:.2e} (step {worst['grad_norm'][1]}); AdamW's update within "
          f"{worst['update'][0]:.2f} x (1 float32 ulp + 1e-6 of the update) (step "
          f"{worst['update'][1]}, {worst['update'][2]})")
    if worst["update"][0] > 2:
        fail(f"{label} step {worst['update'][1]}: {worst['update'][2]} after the update is "
             f"{worst['update'][0]:.1f} x (1 ulp + 1e-6 of the update) from AdamW's rule applied "
             f"to jumbo's own weights and moments")


def read_metrics(path, steps):
    rows = [json.loads(x) for x in open(path) if x.strip()]
    if [r["step"] for r in rows] != list(range(1, steps + 1)):
        fail(f"{path}: steps {[r['step'] for r in rows]}, expected 1 .. {steps}")
        return None
    return rows


CONTROLS = ("qkv_blocks", "kv_tiled", "rope_pairs", "gate_up_swapped", "no_clip", "decay_norms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("init", help="a step directory holding weights no update has changed")
    t.add_argument("--preset", required=True)
    t.add_argument("--data", required=True, help="the prepared dataset's prefix")
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--batch", type=int, required=True, help="train.global_batch")
    t.add_argument("--seed", type=int, required=True)
    for flag in ("--lr", "--min-lr", "--weight-decay", "--beta1", "--beta2", "--eps",
                 "--grad-clip"):
        t.add_argument(flag, type=float, required=True)
    t.add_argument("--warmup-tokens", type=int, required=True)
    t.add_argument("--run", action="append", required=True,
                   metavar="LABEL=METRICS.jsonl[,CKPT_ROOT]")
    t.add_argument("--loss-tol", type=float, default=1e-6)
    t.add_argument("--grad-norm-tol", type=float, default=1e-5)
    t.add_argument("--controls", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)

    m = model_keys(a.preset)
    saved = json.load(open(os.path.join(a.init, "manifest.json")))["model"]
    for key in ("layers", "d_model", "heads", "ffn", "vocab", "context"):
        if saved[key] != m[key]:
            sys.exit(f"{a.init}: model.{key} = {saved[key]}, but {a.preset} says {m[key]}")
    init = read_checkpoint(a.init, m)["master"]
    data = batches(read_tokens(a.data), m["context"], a.seed, a.batch, a.steps)
    replica = train(a, m, as_f64(init), data)
    clipped = sum(1 for _, norm, _ in replica if norm > a.grad_clip > 0)
    print(f"replica: {a.steps} steps of {a.batch} x {m['context']} tokens, loss "
          f"{replica[0][0]:.6f} -> {replica[-1][0]:.6f}, {clipped} of {a.steps} steps clipped "
          f"(grad_clip {a.grad_clip:g})")
    if not 0 < clipped < a.steps:
        fail(f"{clipped} of {a.steps} steps clipped: choose a grad_clip that some steps exceed "
             f"and some do not")
    first = None
    for spec in a.run:
        label, rest = spec.split("=", 1)
        path, _, root = rest.partition(",")
        metrics = read_metrics(path, a.steps)
        if metrics is None:
            continue
        first = first or metrics
        compare_run(label, replica, metrics, a)
        if root:
            compare_steps(label, root, metrics, init, data, a, m)
    if a.controls and first:
        for control in CONTROLS:
            rows = train(a, m, as_f64(init), data, control)
            loss = max(rel(r["loss"], x[0]) for r, x in zip(first, rows))
            norm = max(rel(r["grad_norm"], x[1]) for r, x in zip(first, rows))
            times = max(loss / a.loss_tol, norm / a.grad_norm_tol)
            print(f"control {control}: the replica misread so would miss jumbo by up to "
                  f"{loss:.1e} in loss, {norm:.1e} in grad norm ({times:.0f} x the tolerance)")
            if times < 10:
                fail(f"control {control}: misread, the replica still comes within "
                     f"{times:.1f} x the tolerance of jumbo: the check cannot tell it apart")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
