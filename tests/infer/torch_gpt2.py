#!/usr/bin/python3
"""A small GPT-2 in torch, written from GPT-2's published layout, that reads a Hugging Face
GPT-2 directory and checks it: the second, independent reading behind
tests/infer/hf_gpt2_export.sh (`jumbo ckpt export --format hf-gpt2`).

Written from GPT-2's conventions (OpenAI's gpt-2 model.py; transformers' GPT2LMHeadModel),
not from jumbo's code, so a wrong transpose or q/k/v order in the export shows up as a wrong
log-likelihood rather than being mirrored here:
  - Conv1D layers: y = x @ W + b, W stored [in, out];
  - c_attn's output [3C] splits along the last dimension into q, k, v, each [C], and each of
    those into n_head heads of C / n_head consecutive columns;
  - causal softmax attention scaled by 1 / sqrt(head size);
  - pre-LayerNorm blocks (ln_1 before attention, ln_2 before the MLP), final ln_f;
  - gelu_new: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)));
  - learned positions (wpe) added to the token embedding (wte); the head is wte, tied.
It parses model.safetensors by hand (8-byte little-endian header length, JSON header, raw
little-endian data), so it needs neither transformers nor safetensors, and computes in
float64: the reference, whatever the exported dtype.

Subcommands (each exits 1 with one FAIL line per problem):
  layout DIR --vocab V --eos E --tokenizer TOK.model [--dtype f32|bf16]
      config.json's fields, the tensors' names, dtypes and shapes, and the tokenizer files.
  bf16 DIR_F32 DIR_BF16
      the bf16 export is the f32 one rounded to nearest even, tensor by tensor.
  same DIR_A DIR_B
      the two exports hold the same tensors, bit for bit (one checkpoint in two layouts).
  loss DIR --bin PREFIX.bin --windows N --expect X
      the mean next-token loss over the dataset's first N windows of n_positions + 1 tokens
      (jumbo's validation windows in stored order) equals X (jumbo's val_loss), and is far
      below ln(vocab).
  per-item DIR --per-item OUT.jsonl --items N
      each continuation's log-likelihood and each item's prediction, recomputed
      from the directory, against `jumbo eval --per-item`.
  examples DIR --parts PREFIX.parts --expect X
      the masked loss of a prompt-completion dataset read from its files as
      docs/data-format.md describes them (idx version 2: offsets, then each example's loss
      start): every example as one sequence behind EOS, the loss over its tokens from the
      loss start on, the mean over all of them equals X (a fine-tune's first-step loss when
      its one batch is the whole dataset).
  greedy DIR --per-item OUT.jsonl --generated GEN.jsonl
      the tokens `jumbo generate --json` chose greedily (its KV-cache decoder) for each item's
      context, against the argmax of this full forward after the same prefix: cached
      decoding checked against a reading that shares no code with it.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def read_safetensors(path):
    """(metadata, {name: (dtype string, shape, numpy array of the raw values)})."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    out, spans = {}, []
    for name, t in header.items():
        b, e = t["data_offsets"]
        raw = {"F32": "<f4", "BF16": "<u2"}[t["dtype"]]
        arr = np.frombuffer(body[b:e], dtype=raw).reshape(t["shape"])
        out[name] = (t["dtype"], list(t["shape"]), arr)
        spans.append((b, e))
    spans.sort()
    if spans[0][0] != 0 or spans[-1][1] != len(body) or any(
            a[1] != b[0] for a, b in zip(spans, spans[1:])):
        fail(f"{path}: tensors do not cover the data section exactly")
    return meta, out


def to_f64(dtype, arr):
    if dtype == "BF16":  # bf16 is the top half of an f32
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64))


def gpt2_shapes(cfg):
    """GPT-2's tensors and their shapes for a config (Conv1D weights [in, out])."""
    c, v, p = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    f = cfg["n_inner"] or 4 * c
    s = {"transformer.wte.weight": [v, c], "transformer.wpe.weight": [p, c],
         "transformer.ln_f.weight": [c], "transformer.ln_f.bias": [c]}
    for i in range(cfg["n_layer"]):
        h = f"transformer.h.{i}."
        s.update({h + "ln_1.weight": [c], h + "ln_1.bias": [c],
                  h + "attn.c_attn.weight": [c, 3 * c], h + "attn.c_attn.bias": [3 * c],
                  h + "attn.c_proj.weight": [c, c], h + "attn.c_proj.bias": [c],
                  h + "ln_2.weight": [c], h + "ln_2.bias": [c],
                  h + "mlp.c_fc.weight": [c, f], h + "mlp.c_fc.bias": [f],
                  h + "mlp.c_proj.weight": [f, c], h + "mlp.c_proj.bias": [c]})
    return s


class GPT2:
    def __init__(self, directory, misread_qkv=False):
        self.cfg = json.load(open(os.path.join(directory, "config.json")))
        _, raw = read_safetensors(os.path.join(directory, "model.safetensors"))
        self.w = {name: to_f64(d, a) for name, (d, _, a) in raw.items()}
        self.eps = self.cfg["layer_norm_epsilon"]
        if misread_qkv:  # the test's own control: c_attn read as per-head q|k|v (jumbo's rows)
            c, nh = self.cfg["n_embd"], self.cfg["n_head"]
            d = c // nh
            cols = [j * c + h * d + i for h in range(nh) for j in range(3) for i in range(d)]
            for name in list(self.w):
                if ".attn.c_attn." in name:
                    w = self.w[name]
                    inverse = torch.empty(3 * c, dtype=torch.long)
                    inverse[torch.tensor(cols)] = torch.arange(3 * c)
                    self.w[name] = w[..., inverse]

    def ln(self, x, prefix):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.w[prefix + ".weight"],
                                              self.w[prefix + ".bias"], self.eps)

    def conv1d(self, x, prefix):
        return x @ self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    def logits(self, ids):
        """[T, vocab] logits of one sequence of token ids."""
        cfg, w = self.cfg, self.w
        t, c, nh = len(ids), cfg["n_embd"], cfg["n_head"]
        d = c // nh
        assert t <= cfg["n_positions"], f"{t} tokens, more than n_positions"
        x = w["transformer.wte.weight"][torch.tensor(ids)] + w["transformer.wpe.weight"][:t]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        for i in range(cfg["n_layer"]):
            h = f"transformer.h.{i}."
            q, k, v = self.conv1d(self.ln(x, h + "ln_1"), h + "attn.c_attn").split(c, dim=-1)
            q, k, v = (z.view(t, nh, d).transpose(0, 1) for z in (q, k, v))  # [heads, T, D]
            att = (q @ k.transpose(-1, -2)) / math.sqrt(d)
            att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(0, 1).reshape(t, c)
            x = x + self.conv1d(y, h + "attn.c_proj")
            u = self.conv1d(self.ln(x, h + "ln_2"), h + "mlp.c_fc")
            gelu = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
            x = x + self.conv1d(gelu, h + "mlp.c_proj")
        return self.ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].T  # tied head


def check_layout(a):
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "vocab_size": a.vocab, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
            "attn_pdrop": 0.0, "tie_word_embeddings": True, "bos_token_id": a.eos,
            "eos_token_id": a.eos, "n_layer": a.layers, "n_embd": a.d_model,
            "n_head": a.heads, "n_positions": a.context, "n_ctx": a.context,
            "n_inner": None if a.ffn == 4 * a.d_model else a.ffn,
            "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[a.dtype]}
    for key, value in want.items():
        if cfg.get(key, "<missing>") != value:
            fail(f"config.json: {key} = {cfg.get(key, '<missing>')!r}, expected {value!r}")
    meta, tensors = read_safetensors(os.path.join(a.dir, "model.safetensors"))
    if meta.get("format") != "pt":
        fail(f"model.safetensors: __metadata__.format = {meta.get('format')!r}, expected 'pt'")
    shapes = gpt2_shapes(cfg)
    if sorted(shapes) != sorted(tensors):
        fail(f"model.safetensors: tensor names differ from GPT-2's: "
             f"{sorted(set(shapes) ^ set(tensors))}")
    dtype = {"f32": "F32", "bf16": "BF16"}[a.dtype]
    for name, shape in shapes.items():
        if name in tensors and tensors[name][:2] != (dtype, shape):
            fail(f"{name}: {tensors[name][:2]}, expected {(dtype, shape)}")
    tok = open(os.path.join(a.dir, "tokenizer.model"), "rb").read()
    if tok != open(a.tokenizer, "rb").read():
        fail(f"tokenizer.model differs from {a.tokenizer}")
    tc = json.load(open(os.path.join(a.dir, "tokenizer_config.json")))
    sm = json.load(open(os.path.join(a.dir, "special_tokens_map.json")))
    for key, value in {"tokenizer_class": "LlamaTokenizer", "add_bos_token": False,
                       "add_eos_token": False, "legacy": True}.items():
        if tc.get(key) != value:
            fail(f"tokenizer_config.json: {key} = {tc.get(key)!r}, expected {value!r}")
    for key, value in {"bos_token": a.eos_piece, "eos_token": a.eos_piece,
                       "unk_token": a.unk_piece}.items():
        if tc.get(key) != value or sm.get(key) != value:
            fail(f"{key}: {tc.get(key)!r} / {sm.get(key)!r}, expected {value!r}")
    print(f"layout: config.json, {len(tensors)} tensors ({dtype}), tokenizer files checked")


def check_bf16(a):
    _, f32 = read_safetensors(os.path.join(a.dir, "model.safetensors"))
    _, bf16 = read_safetensors(os.path.join(a.dir_bf16, "model.safetensors"))
    for name, (_, shape, x) in f32.items():
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # RNE
        if name not in bf16 or bf16[name][1] != shape or not np.array_equal(bf16[name][2],
                                                                            rounded):
            fail(f"{name}: the bf16 export is not the f32 export rounded to nearest even")
    print(f"bf16: {len(f32)} tensors are the f32 ones rounded to nearest even")


def mean_loss(model, tokens, windows):
    p = model.cfg["n_positions"]
    losses = []
    for i in range(windows):  # jumbo's stored-order sample i: tokens [i P, i P + P + 1)
        window = tokens[i * p:i * p + p + 1].astype(np.int64).tolist()
        logp = model.logits(window[:-1]).log_softmax(dim=-1)
        losses.append(-logp[torch.arange(p), torch.tensor(window[1:])].mean().item())
    return float(np.mean(losses))


def check_same(a):
    _, x = read_safetensors(os.path.join(a.dir, "model.safetensors"))
    _, y = read_safetensors(os.path.join(a.dir_other, "model.safetensors"))
    if sorted(x) != sorted(y):
        fail(f"{a.dir} and {a.dir_other} hold different tensors")
    for name in x:
        if name in y and (x[name][:2] != y[name][:2] or not np.array_equal(x[name][2],
                                                                          y[name][2])):
            fail(f"{name}: differs between {a.dir} and {a.dir_other}")
    print(f"same: {len(x)} tensors equal, bit for bit")


def check_loss(a):
    model = GPT2(a.dir)
    p = model.cfg["n_positions"]
    tokens = np.fromfile(a.bin, dtype="<u2" if a.token_bytes == 2 else "<u4")
    loss = mean_loss(model, tokens, a.windows)
    misread = mean_loss(GPT2(a.dir, misread_qkv=True), tokens, a.windows)
    print(f"control: with c_attn misread as per-head q|k|v the loss would be {misread:.6f}")
    chance = math.log(model.cfg["vocab_size"])
    print(f"loss: {loss:.6f} over {a.windows} windows of {p + 1} tokens; jumbo's val_loss "
          f"{a.expect:.6f} (difference {loss - a.expect:.1e}); ln(vocab) = {chance:.3f}")
    if abs(loss - a.expect) > 1e-4 * max(1.0, abs(a.expect)):
        fail(f"loss {loss!r} differs from jumbo's val_loss {a.expect!r}")
    if loss > chance - 1.0:
        fail(f"loss {loss:.4f} is not far below ln(vocab) = {chance:.4f}: did it train?")
    # The check has teeth only if attention matters: the misread order must be far off.
    if abs(misread - a.expect) < 1e-2 * max(1.0, abs(a.expect)):
        fail(f"the misread q/k/v order gives {misread:.6f}, too close to {a.expect:.6f}: the "
             f"model is too little trained for this check to tell the orders apart")


def read_examples(parts_path):
    """(tokens, loss_start) of every example of a prompt-completion dataset of parts."""
    index = json.load(open(parts_path))
    base = os.path.dirname(parts_path)
    examples = []
    for part in index["parts"]:
        prefix = os.path.join(base, part["name"])
        idx = open(prefix + ".idx", "rb").read()
        if idx[:8] != b"JUMBOIDX" or struct.unpack_from("<I", idx, 8)[0] != 2:
            fail(f"{prefix}.idx: not a version-2 (prompt-completion) jumbo index")
            return []
        width = {1: 2, 2: 4}[idx[12]]
        docs = struct.unpack_from("<Q", idx, 32)[0]
        offsets = struct.unpack_from(f"<{docs + 1}Q", idx, 64)
        starts = struct.unpack_from(f"<{docs}Q", idx, 64 + 8 * (docs + 1))
        tokens = np.fromfile(prefix + ".bin", dtype="<u2" if width == 2 else "<u4")
        for d in range(docs):
            examples.append((tokens[offsets[d]:offsets[d + 1]].astype(np.int64).tolist(), starts[d]))
    return examples


def check_examples(a):
    model = GPT2(a.dir)
    examples = read_examples(a.parts)
    total, counted, every, tokens = 0.0, 0, 0.0, 0
    for doc, start in examples:
        inputs = [doc[-1]] + doc[:-1]  # behind EOS (every document ends with it)
        logp = model.logits(inputs).log_softmax(dim=-1)
        for j in range(len(doc)):
            every -= logp[j, doc[j]].item()
            tokens += 1
            if j >= start:
                total -= logp[j, doc[j]].item()
                counted += 1
    loss, unmasked = total / counted, every / tokens
    print(f"examples: {len(examples)} examples, {counted} of {tokens} tokens in the loss, masked "
          f"loss {loss:.6f}; jumbo's {a.expect:.6f} (difference {loss - a.expect:.1e}); "
          f"control: every token counted {unmasked:.6f}")
    if abs(loss - a.expect) > 1e-4 * max(1.0, abs(a.expect)):
        fail(f"masked loss {loss!r} differs from jumbo's {a.expect!r}")
    if abs(unmasked - a.expect) < 1e-2 * abs(a.expect):
        fail(f"the loss over every token, {unmasked:.6f}, is too close to {a.expect:.6f} for "
             f"the check to tell a mask from none: train the base longer")


def loglikelihood(model, ctx, toks):
    """Sum of log p(token) over the continuation, each given all the tokens before it; the
    per-position log-probabilities too."""
    logp = model.logits(ctx + toks).log_softmax(dim=-1)[len(ctx) - 1:-1]  # predicts toks
    return logp[torch.arange(len(toks)), torch.tensor(toks)].sum().item(), logp


def check_per_item(a):
    model = GPT2(a.dir)
    control = GPT2(a.dir, misread_qkv=True)
    control_misses = 0
    eos = model.cfg["eos_token_id"]
    lines = [json.loads(x) for x in open(a.per_item) if x.strip()]
    if len(lines) != a.items or [d["index"] for d in lines] != list(range(a.items)):
        fail(f"{a.per_item}: {len(lines)} lines, expected items 0 .. {a.items - 1} in order")
    worst, compared, margins = 0.0, 0, []
    for item in lines:
        ctx = item["context_tokens"]
        if not ctx or ctx[0] != eos:
            fail(f"item {item['index']}: context_tokens do not begin with EOS {eos}")
        lls = []
        for j, cont in enumerate(item["continuations"]):
            ctx = cont["context_tokens"]  # each pair is split after its own context tokens
            toks = cont["tokens"]
            if len(ctx) + len(toks) > model.cfg["n_positions"]:
                fail(f"item {item['index']}: {len(ctx)} + {len(toks)} tokens do not fit "
                     f"n_positions = {model.cfg['n_positions']}; shorten the task")
                continue
            ll, logp = loglikelihood(model, ctx, toks)
            lls.append(ll)
            x = cont["loglikelihood"]
            worst = max(worst, abs(ll - x) / max(1.0, abs(x)))
            compared += 1
            control_misses += abs(loglikelihood(control, ctx, toks)[0] - x) > 1e-3 * max(1.0, abs(x))
            if abs(ll - x) > 1e-3 * max(1.0, abs(x)):
                fail(f"item {item['index']} continuation {j}: log-likelihood {ll:.6f} from "
                     f"the GPT-2 directory, {x:.6f} from jumbo eval")
        best = int(np.argmax(lls))
        gap = sorted(lls)[-1] - sorted(lls)[-2] if len(lls) > 1 else math.inf
        margins.append(gap)
        if best != item["predicted"] and gap > 1e-3:
            fail(f"item {item['index']}: predicted {best}, jumbo eval says {item['predicted']}")
    print(f"per-item: {compared} log-likelihoods over {len(lines)} items compared with jumbo "
          f"eval: largest relative difference {worst:.2e}; smallest winning margin "
          f"{min(margins) if margins else 0:.3g}; with c_attn misread, {control_misses} of "
          f"{compared} would differ")
    if compared == 0 or control_misses < compared / 2:
        fail("the comparison cannot tell the q/k/v orders apart (too little trained?)")

def check_greedy(a):
    model = GPT2(a.dir)
    items = [json.loads(x) for x in open(a.per_item) if x.strip()]
    generated = [json.loads(x) for x in open(a.generated) if x.strip()]
    if len(generated) != len(items):
        fail(f"{a.generated}: {len(generated)} lines, expected one per item ({len(items)})")
        return
    compared, ties = 0, 0
    for item, gen in zip(items, generated):
        ids = list(item["context_tokens"])  # EOS + the context: what generate's prompt encodes
        for k, chosen in enumerate(gen["tokens"]):
            if len(ids) >= model.cfg["n_positions"]:
                break
            logp = model.logits(ids).log_softmax(dim=-1)[-1]
            best = int(torch.argmax(logp))
            if chosen != best:
                # float32 against float64: a near tie may go either way, and the texts part there.
                if logp[best] - logp[chosen] < 1e-4:
                    ties += 1
                    break
                fail(f"item {item['index']} new token {k}: jumbo generate chose {chosen} "
                     f"(log p {logp[chosen]:.4f}), the full forward's argmax is {best} "
                     f"(log p {logp[best]:.4f})")
                break
            ids.append(chosen)
            compared += 1
    print(f"greedy: {compared} tokens of jumbo generate's cached decoding equal the full "
          f"forward's argmax over {len(items)} prompts ({ties} near ties ended a comparison)")
    if compared < 2 * len(items):
        fail("too few tokens compared to check the decoder")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lay = sub.add_parser("layout")
    lay.add_argument("dir")
    for flag in ("--vocab", "--eos", "--layers", "--d-model", "--heads", "--ffn", "--context"):
        lay.add_argument(flag, type=int, required=True)
    for flag in ("--tokenizer", "--eos-piece", "--unk-piece"):
        lay.add_argument(flag, required=True)
    lay.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    bf = sub.add_parser("bf16")
    bf.add_argument("dir")
    bf.add_argument("dir_bf16")
    same = sub.add_parser("same")
    same.add_argument("dir")
    same.add_argument("dir_other")
    lo = sub.add_parser("loss")
    lo.add_argument("dir")
    lo.add_argument("--bin", required=True)
    lo.add_argument("--token-bytes", type=int, default=2, choices=[2, 4])
    lo.add_argument("--windows", type=int, required=True)
    lo.add_argument("--expect", type=float, required=True)
    pi = sub.add_parser("per-item")
    pi.add_argument("dir")
    pi.add_argument("--per-item", required=True)
    pi.add_argument("--items", type=int, required=True)
    ex = sub.add_parser("examples")
    ex.add_argument("dir")
    ex.add_argument("--parts", required=True)
    ex.add_argument("--expect", type=float, required=True)
    gr = sub.add_parser("greedy")
    gr.add_argument("dir")
    gr.add_argument("--per-item", required=True)
    gr.add_argument("--generated", required=True)
    a = ap.parse_args()
    torch.set_num_threads(2)
    {"layout": check_layout, "bf16": check_bf16, "same": check_same, "loss": check_loss,
     "per-item": check_per_item, "greedy": check_greedy, "examples": check_examples}[a.cmd](a)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
