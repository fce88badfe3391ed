#!/usr/bin/python3
"""A seeded, bounded fuzz of a running `jumbo serve`'s request bodies.

  fuzz.py PORT MODEL [--count N] [--seed S] [--chat] [--budget SECONDS] [--adapter-path CKPT]

Sends N requests (default 1000), one connection each, to POST /v1/completions (and, with
--chat, to POST /v1/chat/completions half the time): valid bodies with small max_tokens, and
mutations of them: each field given a wrong type or an odd value (huge, negative, float,
NaN and Infinity literals, deep nesting, long strings), unknown and missing fields, invalid
UTF-8, truncated JSON, random bytes, duplicate keys, empty bodies, odd Content-Types, wrong
keys. Every answer must be 200 with JSON (or an SSE stream ending in [DONE]), or a 4xx whose
body is {"error": {"message": <under 2000 bytes>, ...}}: never a 5xx, never a dropped
connection. /health must answer 200 at the end. $JUMBO_API_KEY, when set, is sent as the
bearer key. Prints one FAIL line per kind of failure (with its count and first example) and
exits 1 if there was one; the same seed sends the same requests. With --adapter-path, 30% of
the requests add (valid and odd names, paths and bodies) and delete adapters, and completions
name adapters that may or may not be served at that moment.
"""
import argparse
import http.client
import json
import os
import random
import time

ap = argparse.ArgumentParser()
ap.add_argument("port", type=int)
ap.add_argument("model")
ap.add_argument("--count", type=int, default=1000)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--chat", action="store_true")
ap.add_argument("--budget", type=float, default=120.0, help="seconds before giving up")
ap.add_argument("--adapter-path", help="a LoRA checkpoint of the base: also fuzz POST "
                "/v1/adapters and DELETE /v1/adapters/NAME, and completions naming adapters")
A = ap.parse_args()
KEY = os.environ.get("JUMBO_API_KEY")
rng = random.Random(A.seed)

COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n",
                     "stop", "seed", "logprobs", "stream", "echo", "user", "suffix", "best_of",
                     "frequency_penalty", "presence_penalty", "logit_bias", "stream_options"]
CHAT_FIELDS = ["model", "messages", "max_tokens", "temperature", "top_p", "n", "stop", "seed",
               "logprobs", "top_logprobs", "stream", "user", "frequency_penalty",
               "presence_penalty", "logit_bias", "stream_options"]

ODD = [None, True, False, 0, -1, 1, 2, 5, 17, 65, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1,
       2**63, 2**64, -2**63, -2**64 - 1, 1.5, -0.0, 0.1, -2.5, 1e308, -1e308, 5e-324, 3.0,
       "", "a", "1", "0", "true", "null", "x" * 10000, "\u0000", "\ud800", "\U0001f600",
       "The jury said", [], [None], [1, "a"], [[]], [[[1]]], [1.5], [-1], [2**40], ["a"] * 5,
       ["a"] * 65, [""], {}, {"a": 1}, {"1": "x"}, {"1": 1e300}, {"-1": 0}, {"": 1},
       {"include_usage": "yes"}, {"include_usage": True}, {"role": "user"},
       list(range(600)), [499] * 600, "word " * 700]
RAW_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400",
               "123456789012345678901234567890", "-123456789012345678901234567890", "0x10",
               "01", "1.", ".5", "+1", "-0", "1e", "--1", "1_000", "١"]
BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80",
            b"\xe2\x82", b"\xf0\x9f\x98", b"\x00", b"\\ud800", b"\\udc00\\ud800", b"\\u00",
            b"\\x41", b"\\"]


# The adapter names the fuzz adds and removes (and completions name), and odd ones.
ADAPTER_NAMES = ["fz0", "fz1", "fz2"]
ODD_NAMES = ["", "a/b", "a b", "x" * 300, "%00", "..", "\u00e9", "fz0\n"]


def valid_completion():
    adapter = A.adapter_path and rng.random() < 0.4
    b = {"model": rng.choice(ADAPTER_NAMES) if adapter else A.model,
         "prompt": rng.choice(["The jury said", "In the", "It", ["He was", "a"], [5, 6, 7],
                               [[5, 6], [7]], "A " * 20]),
         "max_tokens": rng.randint(1, 4)}
    for field, values in [("temperature", [0, 0.7, 1.0]), ("seed", [1, 7, 12345]),
                          ("n", [1, 2]), ("stop", ["e", ["\n", " the"]]), ("logprobs", [0, 1, 2]),
                          ("stream", [False, True]), ("echo", [False, True]),
                          ("top_p", [0.9, 1.0]), ("top_k", [0, 5]), ("user", ["u"]),
                          ("suffix", [None]), ("frequency_penalty", [0.5, -1.0]),
                          ("presence_penalty", [0.5, 2.0]), ("logit_bias", [{"5": 3}, {}])]:
        if rng.random() < 0.25:
            b[field] = rng.choice(values)
    if b.get("n") and rng.random() < 0.5:
        b["best_of"] = b["n"] + (0 if b.get("stream") else rng.randint(0, 1))
    if b.get("stream") and rng.random() < 0.5:
        b["stream_options"] = {"include_usage": True}
    return b


def valid_chat():
    messages = [{"role": "user", "content": rng.choice(["Hello", "Tell me a story.", ""])}]
    if rng.random() < 0.5:
        messages.insert(0, {"role": "system", "content": "You are terse."})
    if rng.random() < 0.3:
        messages += [{"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Go on"}]
    b = {"model": A.model, "messages": messages, "max_tokens": rng.randint(1, 4)}
    for field, values in [("temperature", [0, 0.8]), ("seed", [1, 99]), ("n", [1, 2]),
                          ("stop", ["e", ["\n"]]), ("stream", [False, True]),
                          ("frequency_penalty", [1.0]), ("presence_penalty", [-1.0]),
                          ("logit_bias", [{"7": -5}]), ("user", ["u"]), ("top_p", [0.5])]:
        if rng.random() < 0.25:
            b[field] = rng.choice(values)
    if rng.random() < 0.25:
        b["logprobs"] = True
        b["top_logprobs"] = rng.randint(0, 3)
    if b.get("stream") and rng.random() < 0.5:
        b["stream_options"] = {"include_usage": True}
    return b


def deep(depth, leaf="1"):
    kind = rng.choice(["list", "object"])
    if kind == "list":
        return "[" * depth + leaf + "]" * depth
    return '{"a": ' * depth + leaf + "}" * depth


def dumps(b):
    return json.dumps(b).encode()


def set_raw(b, field, raw):
    """The body's JSON with `field`'s value replaced by the raw text `raw`."""
    b = dict(b)
    b[field] = "@@RAW@@"
    return dumps(b).replace(b'"@@RAW@@"', raw if isinstance(raw, bytes) else raw.encode())


def mutate(chat):
    """(kind, body bytes, headers, whether it changed the key)."""
    b = valid_chat() if chat else valid_completion()
    fields = CHAT_FIELDS if chat else COMPLETION_FIELDS
    headers = {"Content-Type": "application/json"}
    r = rng.random()
    if r < 0.10:
        return "valid", dumps(b), headers
    if r < 0.40:
        f = rng.choice(fields)
        b[f] = rng.choice(ODD)
        return f"odd {f}", dumps(b), headers
    if r < 0.46:
        b[rng.choice(["frobnicate", "Model", "prompt ", "", "functions", "tools", "max_tokens\u0000",
                      "response_format", "logprobs.top"])] = rng.choice(ODD[:12])
        return "unknown field", dumps(b), headers
    if r < 0.50:
        del b[rng.choice(["model", "messages" if chat else "prompt"])]
        return "missing field", dumps(b), headers
    if r < 0.58:
        # inside the prompt list / the messages
        if chat:
            m = dict(b["messages"][-1])
            key = rng.choice(["role", "content", "name", "extra"])
            m[key] = rng.choice(ODD)
            b["messages"] = b["messages"][:-1] + [m] + ([m] * 300 if rng.random() < 0.1 else [])
            return f"odd message {key}", dumps(b), headers
        b["prompt"] = [rng.choice(ODD)] if rng.random() < 0.5 else \
            ["ok", rng.choice(ODD)] if rng.random() < 0.5 else [5, rng.choice(ODD)]
        return "odd prompt element", dumps(b), headers
    if r < 0.63:
        f = rng.choice(fields)
        return f"raw number {f}", set_raw(b, f, rng.choice(RAW_NUMBERS)), headers
    if r < 0.67:
        f = rng.choice(fields)
        return f"deep {f}", set_raw(b, f, deep(rng.choice([100, 5000, 100000]))), headers
    if r < 0.73:
        text = dumps(b)
        bad = rng.choice(BAD_UTF8)
        where = rng.choice(["value", "key", "anywhere"])
        if where == "value":
            target = b'"The jury said"' if b'"The jury said"' in text else b'"model": "'
            i = text.find(target) + len(target) - 1
        elif where == "key":
            i = text.find(b'"model"') + 2
        else:
            i = rng.randrange(len(text) + 1)
        return f"bad utf-8 in {where}", text[:i] + bad + text[i:], headers
    if r < 0.80:
        text = dumps(b)
        return "truncated", text[:rng.randrange(len(text))], headers
    if r < 0.83:
        text = bytearray(dumps(b))
        for _ in range(rng.randint(1, 5)):
            text[rng.randrange(len(text))] = rng.randrange(256)
        return "flipped bytes", bytes(text), headers
    if r < 0.86:
        return "random bytes", bytes(rng.randrange(256) for _ in range(rng.randint(1, 3000))), headers
    if r < 0.89:
        text = dumps(b)
        f = rng.choice(["model", "max_tokens", "stream", "messages" if chat else "prompt"])
        extra = json.dumps({f: rng.choice(ODD[:30])})[1:-1].encode()
        return f"duplicate {f}", text[:-1] + b", " + extra + b"}", headers
    if r < 0.92:
        return "literal", rng.choice([b"", b" ", b"\n", b"null", b"[]", b"123", b'"str"', b"{}",
                                      b"true", b"{", b"}", b"[{}]", b"\xef\xbb\xbf{}",
                                      b"{" * 10000, b'{"model":}']), headers
    if r < 0.95:
        h = rng.choice([{}, {"Content-Type": "text/plain"}, {"Content-Type": "application/xml"},
                        {"Content-Type": "application/json; charset=latin-1"},
                        {"Content-Type": "multipart/form-data; boundary=x"}])
        return f"content type {h.get('Content-Type')}", dumps(b), h
    if r < 0.97:
        b["prompt" if not chat else "messages"] = ("word " * 3000) if not chat else \
            [{"role": "user", "content": "word " * 3000}]
        return "over the context", dumps(b), headers
    auth = rng.choice(["Bearer", "Bearer ", "Bearer wrong", "Basic xyz", "bearer " + (KEY or "k"),
                       "Bearer " + (KEY or "k") + "x", "\u00e9"])
    headers["Authorization"] = auth.encode("utf-8").decode("latin-1")
    return "odd authorization", dumps(b), headers


def adapter_request():
    """(kind, method, path, body bytes, headers) of the adapter routes."""
    headers = {"Content-Type": "application/json"}
    name = rng.choice(ADAPTER_NAMES + [A.model])
    r = rng.random()
    if r < 0.3:
        return "add", "POST", "/v1/adapters", dumps({"name": name, "path": A.adapter_path}), headers
    if r < 0.45:
        body = {"name": rng.choice(ODD + ODD_NAMES), "path": A.adapter_path}
        return "add odd name", "POST", "/v1/adapters", dumps(body), headers
    if r < 0.6:
        path = rng.choice(ODD + ["/etc/passwd", "/nonexistent/ckpt", "../../..", "/", "."])
        return "add odd path", "POST", "/v1/adapters", dumps({"name": name, "path": path}), headers
    if r < 0.66:
        body = rng.choice([{"name": name}, {"path": A.adapter_path}, {},
                           {"name": name, "path": A.adapter_path, "rank": 4}])
        return "add missing or unknown field", "POST", "/v1/adapters", dumps(body), headers
    if r < 0.72:
        raw = rng.choice([b"", b"{", b"[]", b"null", deep(5000).encode(),
                          bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))])
        return "add raw body", "POST", "/v1/adapters", raw, headers
    target = rng.choice(ADAPTER_NAMES + ["%00", "a%2Fb", "x" * 300, "%ff", "..", A.model])
    return "delete", "DELETE", f"/v1/adapters/{target}", None, headers


def check_body(status, ctype, payload, route="/v1/completions"):
    """None when the answer is well formed, else what is wrong."""
    if status == 200 and route.startswith("/v1/adapters"):
        try:
            r = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return f"a 200 that is not JSON: {payload[:200]!r}"
        if not isinstance(r, dict) or not isinstance(r.get("id"), str):
            return f"a 200 without a model id: {payload[:200]!r}"
        return None
    if status == 200:
        if ctype.startswith("text/event-stream"):
            events = [line[6:] for line in payload.decode("utf-8", "replace").split("\n")
                      if line.startswith("data: ")]
            if not events or events[-1] != "[DONE]":
                return "a stream that does not end with [DONE]"
            for e in events[:-1]:
                try:
                    chunk = json.loads(e)
                except json.JSONDecodeError:
                    return f"a stream event that is not JSON: {e[:200]!r}"
                if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
                    return f"a stream event without choices: {e[:200]!r}"
            return None
        try:
            r = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return f"a 200 that is not JSON: {payload[:200]!r}"
        if not isinstance(r, dict) or not isinstance(r.get("choices"), list) or not r["choices"]:
            return f"a 200 without choices: {payload[:200]!r}"
        return None
    if 400 <= status < 500:
        try:
            r = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return f"a {status} that is not JSON: {payload[:200]!r}"
        err = r.get("error") if isinstance(r, dict) else None
        if not isinstance(err, dict) or not isinstance(err.get("message"), str):
            return f"a {status} without error.message: {payload[:200]!r}"
        if len(err["message"].encode()) >= 2000:
            return f"a {status} with a {len(err['message'].encode())}-byte message"
        return None
    return f"status {status}: {payload[:200]!r}"


def send(path, data, headers, timeout=60, method="POST"):
    conn = http.client.HTTPConnection("127.0.0.1", A.port, timeout=timeout)
    try:
        h = dict(headers)
        if KEY and "Authorization" not in h:
            h["Authorization"] = f"Bearer {KEY}"
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        payload = resp.read()
        return resp.status, resp.getheader("Content-Type", ""), payload
    finally:
        conn.close()


def health():
    try:
        conn = http.client.HTTPConnection("127.0.0.1", A.port, timeout=10)
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status
    except (OSError, http.client.HTTPException) as e:
        return f"{type(e).__name__}: {e}"


def main():
    problems = {}  # (kind, problem class) -> [count, first example]
    statuses = {}
    start = time.time()
    sent = 0
    for i in range(A.count):
        if time.time() - start > A.budget:
            problems[("budget", "slow")] = [1, f"only {i} of {A.count} requests in {A.budget} s"]
            break
        chat = A.chat and rng.random() < 0.5
        path = "/v1/chat/completions" if chat else "/v1/completions"
        method = "POST"
        if A.adapter_path and rng.random() < 0.3:
            kind, method, path, data, headers = adapter_request()
        else:
            kind, data, headers = mutate(chat)
        sent += 1
        try:
            status, ctype, payload = send(path, data, headers, method=method)
        except (OSError, http.client.HTTPException) as e:
            problem = f"dropped connection ({type(e).__name__}: {e})"
            status = None
        else:
            problem = check_body(status, ctype, payload, path)
            statuses[status] = statuses.get(status, 0) + 1
        if problem is not None:
            key = (f"{path} {kind}", problem.split(":")[0])
            if key not in problems:
                problems[key] = [0, f"request {i}: {problem}; body {data[:160]!r}"]
            problems[key][0] += 1
            if status is None or status >= 500:
                h = health()
                if h != 200:
                    problems[("server", "down")] = [1, f"/health after request {i}: {h}"]
                    break
    h = health()
    if h != 200 and ("server", "down") not in problems:
        problems[("server", "down")] = [1, f"/health at the end: {h}"]
    took = time.time() - start
    print(f"fuzz (seed {A.seed}{', chat' if A.chat else ''}): {sent} requests in {took:.1f} s, "
          f"statuses {dict(sorted(statuses.items()))}", flush=True)
    if statuses.get(200, 0) < sent // 20:
        problems[("fuzz", "few 200s")] = [1, f"only {statuses.get(200, 0)} of {sent} requests "
                                             "got 200: the valid bodies are refused"]
    for (kind, _), (count, example) in list(problems.items())[:40]:
        print(f"FAIL: fuzz {kind}: {count}x, first {example}", flush=True)
    if len(problems) > 40:
        print(f"FAIL: fuzz: {len(problems) - 40} more kinds of failure", flush=True)
    raise SystemExit(1 if problems else 0)


if __name__ == "__main__":
    main()
