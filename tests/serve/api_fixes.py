"""api.py's checks of the bug fixes, the limits and the error shapes: a completion keeps its
first token's leading space, a stop string equal to the first token, deep JSON nesting,
413/414/431 that name their limit, 404/405 and model_not_found, the prompt limits, and ids
that are random and unique (across restarts too).
"""
import http.client
import json
import re
import time

from api_support import (A, IDS, auth_line, body_of, completion, completion_text_of,
                         expect_error, fail, health, is_error, note, post, raw_exchange, request,
                         short, stream, tokenize)


# ---- the bug fixes -----------------------------------------------------------------------
def check_leading_space():
    """(1) The text keeps its first token's leading space: it is decode(prompt + completion)
    minus decode(prompt); logprobs' tokens join into it; echo gives the prompt and it."""
    spaced = 0
    for g in A.expect["greedy"] + A.expect["sampled"]:
        name = f"leading space {g['prompt']!r}"
        r = completion(body_of(g, logprobs=1), name)
        if r is None:
            continue
        text = r["choices"][0]["text"]
        spaced += text.startswith(" ")
        if text != g["text"]:
            fail(f"{name}: text {text!r} != jumbo generate's {g['text']!r}")
        ids = tokenize(g["prompt"])
        if ids is not None:
            want = completion_text_of(ids, g["tokens"])
            if want is not None and text != want:
                fail(f"{name}: text {text!r} != decode(prompt + completion) - decode(prompt) "
                     f"= {want!r}")
        lp = r["choices"][0].get("logprobs") or {}
        tokens = lp.get("tokens")
        if not isinstance(tokens, list) or not tokens:
            fail(f"{name}: no logprobs.tokens: {short(lp)}")
        else:
            if "".join(tokens) != text:
                fail(f"{name}: logprobs tokens {tokens} do not join into the text {text!r}")
            want_offsets = [len("".join(tokens[:i])) for i in range(len(tokens))]
            if lp.get("text_offset") != want_offsets:
                fail(f"{name}: text_offset {lp.get('text_offset')} != {want_offsets}")
            if tokens[0].startswith(" ") and not text.startswith(" "):
                fail(f"{name}: the first token {tokens[0]!r} has a leading space, the text "
                     f"{text!r} has not")
        e = completion(body_of(g, echo=True), name + " echo")
        if e is not None and e["choices"][0]["text"] != g["prompt"] + text:
            fail(f"{name}: echo text {e['choices'][0]['text']!r} != prompt + text "
                 f"{g['prompt'] + text!r}")
    if spaced == 0:
        fail("leading space: no completion begins with a space, the check proves nothing "
             f"(texts {[g['text'] for g in A.expect['greedy'] + A.expect['sampled']]})")


def check_stop_first_token():
    """(2) A stop string equal to the first token's text: "" and finish_reason stop."""
    tried = 0
    for g in A.expect["greedy"] + A.expect["sampled"]:
        # The first token's text, from a first request (its logprobs).
        r = completion(body_of(g, logprobs=0, max_tokens=1), f"first token of {g['prompt']!r}")
        tokens = ((r or {}).get("choices", [{}])[0].get("logprobs") or {}).get("tokens")
        if not tokens:
            fail(f"first token of {g['prompt']!r}: no logprobs.tokens: {short(r)}")
            continue
        first = tokens[0]
        if not first.strip() or "\ufffd" in first:
            continue
        tried += 1
        name = f"stop = the first token {first!r} ({g['prompt']!r})"
        r = completion(body_of(g, stop=[first]), name)
        if r is not None:
            c = r["choices"][0]
            if c["text"] != "" or c["finish_reason"] != "stop":
                fail(f"{name}: text {c['text']!r}, finish {c['finish_reason']}; expected '' stop")
            elif r["usage"]["completion_tokens"] != 1:
                fail(f"{name}: completion_tokens {r['usage']['completion_tokens']}, expected 1")
        status, chunks, done, _ = stream("/v1/completions", body_of(g, stop=[first], stream=True))
        if status != 200 or not done:
            fail(f"{name} (stream): {status}, [DONE] {done}: {short(chunks)}")
            continue
        text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
        if text != "" or not finish or finish[-1] != "stop":
            fail(f"{name} (stream): text {text!r}, finishes {finish}")
    if tried == 0:
        fail("stop = the first token: no prompt's first token has text")


def check_deep_nesting():
    """(3) 100000-deep JSON: a short 400, the server lives."""
    deep = "[" * 100000 + "]" * 100000
    cases = [("deep model", '{"model": ' + deep + ', "prompt": "x"}'),
             ("deep max_tokens",
              '{"model": "%s", "prompt": "x", "max_tokens": %s}' % (A.model, deep)),
             ("deep objects", '{"model": "%s", "prompt": "x", "user": %s1%s}'
              % (A.model, '{"a": ' * 100000, "}" * 100000))]
    for name, raw in cases:
        try:
            status, _, r = request("POST", "/v1/completions", raw=raw)
        except (OSError, http.client.HTTPException) as e:
            fail(f"{name}: no response ({type(e).__name__}: {e})")
            continue
        expect_error(name, status, r, 400, max_message=1000)
        if len(json.dumps(r)) >= 2000:
            fail(f"{name}: a {len(json.dumps(r))}-byte body")
        health()


def check_limits():
    """(4) 413, 414 and 431 whose JSON messages name the limit, not a missing route."""
    size = 17 << 20
    prefix = ('{"model": "%s", "prompt": "' % A.model).encode()
    body = prefix + b"a" * (size - len(prefix) - 2) + b'"}'
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{A.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n").encode()
    checks = [
        ("a 17 MB body", 413, head + auth_line() + b"\r\n", body),
        ("a 20 KB URL", 414, (f"GET /v1/models?pad={'a' * 20000} HTTP/1.1\r\n"
                              f"Host: 127.0.0.1:{A.port}\r\n").encode() + auth_line() + b"\r\n", b""),
        ("a 20 KB header", 431, (f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{A.port}\r\n"
                                 f"X-Pad: {'a' * 20000}\r\n").encode() + auth_line() + b"\r\n", b""),
    ]
    for name, want, h, b in checks:
        try:
            status, r = raw_exchange(h, b)
        except (OSError, http.client.HTTPException) as e:
            fail(f"{name}: no response ({type(e).__name__}: {e})")
            health()
            continue
        if status != want or not is_error(r):
            fail(f"{name}: expected {want} with a JSON error, got {status} {short(r)}")
        else:
            m = r["error"]["message"]
            if "no route" in m.lower() or not re.search(r"limit|too (large|long|big)|bytes|MiB|KiB|size|length", m, re.I):
                fail(f"{name}: the message does not name the limit: {m!r}")
            else:
                note(f"{name}: {status} {m}")
        health()


# ---- routes, prompt limits, ids ----------------------------------------------------------
def check_routes():
    status, r = post("/v1/completions", {"model": "no-such-model", "prompt": "x"})
    expect_error("unknown model", status, r, 404, param="model", code="model_not_found")
    status, _, r = request("GET", f"/v1/models/{A.model}")
    if status != 200 or r.get("id") != A.model or r.get("object") != "model" or \
            r.get("owned_by") != "jumbo" or not isinstance(r.get("created"), int):
        fail(f"GET /v1/models/{A.model}: {status} {short(r)}")
    status, _, r = request("GET", "/v1/models/no-such-model")
    expect_error("GET /v1/models/no-such-model", status, r, 404)
    status, _, r = request("GET", "/v1/models")
    if status != 200 or [m.get("id") for m in r.get("data", [])] != [A.model]:
        fail(f"GET /v1/models: {status} {short(r)}")
    for method, path in [("GET", "/v1/completions"), ("GET", "/v1/chat/completions"),
                         ("POST", "/v1/models"), ("DELETE", f"/v1/models/{A.model}"),
                         ("POST", "/health"), ("GET", "/tokenize"), ("PUT", "/detokenize"),
                         ("POST", "/metrics")]:
        status, _, r = request(method, path, raw="{}" if method != "GET" else None)
        expect_error(f"{method} {path}", status, r, 405)
    for method, path in [("GET", "/v1/nothing"), ("POST", "/v1/nothing"), ("GET", "/")]:
        status, _, r = request(method, path, raw="{}" if method != "GET" else None)
        expect_error(f"{method} {path}", status, r, 404)


def check_prompt_limits():
    status, r = post("/v1/completions", {"model": A.model, "prompt": ["x"] * 65, "max_tokens": 1})
    expect_error("65 prompts", status, r, 400, param="prompt")
    r = completion({"model": A.model, "prompt": ["x"] * 64, "max_tokens": 1}, "64 prompts")
    if r is not None and len(r["choices"]) != 64:
        fail(f"64 prompts: {len(r['choices'])} choices")
    start = time.time()
    status, r = post("/v1/completions", {"model": A.model, "prompt": "a" * 10_000_000,
                                         "max_tokens": 1})
    took = time.time() - start
    if expect_error("a 10 MB prompt", status, r, 400, param="prompt") and took > 5.0:
        fail(f"a 10 MB prompt: {took:.1f} s for its 400: it was tokenized first?")
    status, r = post("/v1/completions", {"model": A.model, "prompt": "word " * 600,
                                         "max_tokens": 4})
    expect_error("a prompt over the context", status, r, 400, param="prompt")
    health()



def check_ids():
    ids = [i for i in IDS if i is not None]
    if len(ids) < 5:
        return fail(f"ids: only {len(ids)} responses with an id")
    if len(set(ids)) != len(ids):
        fail(f"ids: not unique: {sorted(i for i in set(ids) if ids.count(i) > 1)[:5]}")
    for i in ids:
        prefix = "chatcmpl-" if i.startswith("chatcmpl-") else "cmpl-"
        rest = i[len(prefix):] if i.startswith(prefix) else ""
        if len(rest) < 8 or not re.fullmatch(r"[A-Za-z0-9_-]+", rest):
            return fail(f"ids: {i!r} is not {prefix!r} + 8 or more random characters")
    if A.ids:
        with open(A.ids, "w") as f:
            f.write("\n".join(ids) + "\n")
    if A.other_ids:
        try:
            other = set(open(A.other_ids).read().split())
        except OSError:
            other = set()
        if not other:
            note(f"ids: no ids from the other server in {A.other_ids} to compare")
        elif other & set(ids):
            fail(f"ids: the restarted server repeats ids: {sorted(other & set(ids))[:5]}")
        else:
            note(f"ids: {len(ids)} ids, none of the other server's {len(other)}")

