"""api.py's checks of the features: /tokenize and /detokenize, the new /v1/completions
fields (penalties, logit_bias, best_of, echo, suffix, user, stream_options), CORS, API keys,
chat completions through a chat template, /metrics, the access log, and https.
"""
import json
import os
import re
import socket
import time
import uuid

from api_support import (A, IDS, auth_headers, body_of, completion, completion_text_of, connect,
                         detokenize, expect_error, fail, health, note, post, request, scrape,
                         short, stream, tokenize, total)


# ---- tokenize ----------------------------------------------------------------------------
def check_tokenize():
    firsts = set()
    for g in A.expect["greedy"]:
        p = g["prompt"]
        status, r = post("/tokenize", {"model": A.model, "prompt": p})
        if status != 200 or not isinstance(r.get("tokens"), list):
            fail(f"/tokenize {p!r}: {status} {short(r)}")
            continue
        toks = r["tokens"]
        if not all(isinstance(t, int) and 0 <= t < 500 for t in toks) or len(toks) < 2:
            fail(f"/tokenize {p!r}: tokens {toks}")
            continue
        if r.get("count") != len(toks) or r.get("max_model_len") != 512:
            fail(f"/tokenize {p!r}: count {r.get('count')} / max_model_len "
                 f"{r.get('max_model_len')}, expected {len(toks)} / 512")
        firsts.add(toks[0])
        for ids in (toks, toks[1:]):
            text = detokenize(ids)
            if text is not None and text != p:
                fail(f"/detokenize of /tokenize {p!r} ({ids}): {text!r}")
        c = completion({"model": A.model, "prompt": p, "max_tokens": 1}, f"usage of {p!r}")
        if c is not None and c["usage"]["prompt_tokens"] != len(toks):
            fail(f"{p!r}: usage.prompt_tokens {c['usage']['prompt_tokens']} != /tokenize's "
                 f"count {len(toks)} (the leading EOS included)")
    if len(firsts) != 1:
        fail(f"/tokenize: the prompts do not all start with the same token (EOS): {firsts}")
    status, r = post("/tokenize", {"model": "no-such-model", "prompt": "x"})
    expect_error("/tokenize unknown model", status, r, 404, param="model")
    status, r = post("/tokenize", {"model": A.model})
    expect_error("/tokenize without prompt", status, r, 400, param="prompt")
    status, r = post("/detokenize", {"model": A.model, "tokens": [1, 100000]})
    expect_error("/detokenize a token out of range", status, r, 400, param="tokens")
    status, r = post("/detokenize", {"model": A.model, "tokens": "abc"})
    expect_error("/detokenize tokens a string", status, r, 400, param="tokens")



# ---- the new /v1/completions fields ------------------------------------------------------
def check_fields():
    base = {"model": A.model, "prompt": "The jury said", "max_tokens": 4}
    for name, extra, param in [
            ("frequency_penalty 2.5", {"frequency_penalty": 2.5}, "frequency_penalty"),
            ("presence_penalty -2.5", {"presence_penalty": -2.5}, "presence_penalty"),
            ("frequency_penalty a string", {"frequency_penalty": "x"}, "frequency_penalty"),
            ("logit_bias a list", {"logit_bias": [1]}, "logit_bias"),
            ("logit_bias key not an id", {"logit_bias": {"abc": 1}}, "logit_bias"),
            ("logit_bias 101", {"logit_bias": {"5": 101}}, "logit_bias"),
            ("logit_bias id out of range", {"logit_bias": {"100000": 1}}, "logit_bias"),
            ("best_of < n", {"n": 3, "best_of": 2}, "best_of"),
            ("best_of 17", {"best_of": 17}, "best_of"),
            ("stream with best_of > n", {"stream": True, "best_of": 2}, "best_of"),
            ("suffix a string", {"suffix": "x"}, "suffix"),
            ("user a number", {"user": 5}, "user"),
            ("echo a string", {"echo": "yes"}, "echo"),
            ("max_tokens 5.5", {"max_tokens": 5.5}, "max_tokens")]:
        status, r = post("/v1/completions", dict(base, **extra))
        expect_error(name, status, r, 400, param=param)
    for name, extra in [("penalties -2 and 2", {"frequency_penalty": -2, "presence_penalty": 2}),
                        ("suffix null", {"suffix": None}), ("user", {"user": "someone"}),
                        ("best_of 1", {"best_of": 1}),
                        ("stream with best_of = n", {"stream": True, "n": 2, "best_of": 2})]:
        if extra.get("stream"):
            status, chunks, done, _ = stream("/v1/completions", dict(base, **extra))
            if status != 200 or not done:
                fail(f"{name}: {status} {short(chunks)}")
        else:
            completion(dict(base, **extra), name)
    r = completion(dict(base, max_tokens=5.0, temperature=0), "max_tokens 5.0")
    if r is not None and r["usage"]["completion_tokens"] != 5 and \
            r["choices"][0]["finish_reason"] == "length":
        fail(f"max_tokens 5.0: {r['usage']['completion_tokens']} tokens")

    pen = A.expect.get("penalized")
    if pen:
        r = completion(body_of(pen, frequency_penalty=pen["frequency_penalty"],
                               presence_penalty=pen["presence_penalty"]), "penalties")
        if r is not None and r["choices"][0]["text"] != pen["text"]:
            fail(f"penalties: text {r['choices'][0]['text']!r} != jumbo generate's "
                 f"{pen['text']!r}")
    else:
        fail("penalties: no jumbo generate expectation (--frequency-penalty)")

    # logit_bias: +100 makes a token the greedy choice every time; -100 bans the first token.
    ids = tokenize("The jury said")
    the = tokenize("the")
    g = A.expect["greedy"][0]
    if ids is not None and the is not None and g["tokens"]:
        x = the[-1]
        body = {"model": A.model, "prompt": "The jury said", "max_tokens": 5, "temperature": 0,
                "logit_bias": {str(x): 100}}
        r = completion(body, "logit_bias +100")
        want = completion_text_of(ids, [x] * 5)
        if r is not None and want is not None and r["choices"][0]["text"] != want:
            fail(f"logit_bias {{{x}: 100}}: text {r['choices'][0]['text']!r}, expected {want!r}")
        first = g["tokens"][0]
        r = completion(body_of(g, logit_bias={str(first): -100}, max_tokens=3), "logit_bias -100")
        banned = completion_text_of(ids, [first])
        if r is not None and banned and r["choices"][0]["text"].startswith(banned):
            fail(f"logit_bias {{{first}: -100}}: the text {r['choices'][0]['text']!r} still "
                 f"starts with that token {banned!r}")

    # best_of: one choice, the candidate (streams 0 .. best_of-1 of the seed) with the highest
    # mean token logprob, as OpenAI defines it.
    sampled = dict(base, max_tokens=8, temperature=1.0, seed=5)
    many = completion(dict(sampled, n=3, logprobs=0), "n 3 for best_of")
    best = completion(dict(sampled, best_of=3), "best_of 3")
    if many is not None and best is not None:
        texts = [c["text"] for c in many["choices"]]
        if len(best["choices"]) != 1:
            fail(f"best_of 3, n 1: {len(best['choices'])} choices")
        elif best["choices"][0]["text"] not in texts:
            fail(f"best_of 3: {best['choices'][0]['text']!r} is none of n=3's {texts}")
        else:
            means = [sum(c["logprobs"]["token_logprobs"]) / max(1, len(c["logprobs"]["token_logprobs"]))
                     for c in many["choices"]]
            want = texts[means.index(max(means))]
            if best["choices"][0]["text"] != want:
                fail(f"best_of 3: {best['choices'][0]['text']!r}, but the highest mean logprob "
                     f"({max(means):.4f} of {means}) is {want!r}")

    # echo with logprobs: the prompt's entries first, the first one's logprob null.
    g = A.expect["greedy"][0]
    plain = completion(body_of(g, max_tokens=4), "echo: without")
    r = completion(body_of(g, max_tokens=4, echo=True, logprobs=1), "echo with logprobs")
    if plain is not None and r is not None:
        c = r["choices"][0]
        lp = c.get("logprobs") or {}
        toks = lp.get("tokens") or []
        n_prompt, n_done = r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]
        if c["text"] != g["prompt"] + plain["choices"][0]["text"]:
            fail(f"echo: text {c['text']!r} != prompt + {plain['choices'][0]['text']!r}")
        if len(toks) not in (n_prompt + n_done, n_prompt - 1 + n_done):
            fail(f"echo: {len(toks)} logprobs entries for {n_prompt} prompt + {n_done} "
                 "completion tokens")
        if not lp.get("token_logprobs") or lp["token_logprobs"][0] is not None:
            fail(f"echo: the first token_logprobs is not null: {short(lp.get('token_logprobs'))}")
        elif any(not isinstance(v, float) for v in lp["token_logprobs"][1:]):
            fail(f"echo: token_logprobs past the first: {short(lp['token_logprobs'])}")
        if "".join(toks) != c["text"]:
            fail(f"echo: the tokens {toks} do not join into the text {c['text']!r}")

    # stream_options.include_usage: a last chunk with no choices and the usage.
    g = A.expect["greedy"][1]
    plain = completion(body_of(g), "include_usage: without")
    status, chunks, done, _ = stream("/v1/completions", body_of(
        g, stream=True, stream_options={"include_usage": True}))
    if status != 200 or not done or not chunks:
        fail(f"include_usage: {status}, [DONE] {done}, {short(chunks)}")
    elif plain is not None:
        last = chunks[-1]
        if last.get("choices") != [] or last.get("usage") != plain["usage"]:
            fail(f"include_usage: the last chunk {short(last)} is not choices [] with the usage "
                 f"{plain['usage']}")
        if any(c.get("usage") for c in chunks[:-1]):
            fail("include_usage: usage in a chunk before the last")
        text = "".join(c["choices"][0]["text"] for c in chunks[:-1])
        if text != plain["choices"][0]["text"]:
            fail(f"include_usage: stream text {text!r} != {plain['choices'][0]['text']!r}")
        if any(c.get("id") != chunks[0].get("id") for c in chunks):
            fail("stream: the chunks do not share one id")
        IDS.append(chunks[0].get("id"))


# ---- CORS --------------------------------------------------------------------------------
PREFLIGHT = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def check_no_cors():
    status, h, _ = request("OPTIONS", "/v1/completions", key=None,
                           headers=dict(PREFLIGHT, Origin="http://example.test"))
    if "access-control-allow-origin" in h:
        fail(f"no --cors-origin: a preflight got Access-Control-Allow-Origin "
             f"{h['access-control-allow-origin']!r}")
    status, h, _ = request("GET", "/v1/models", headers={"Origin": "http://example.test"})
    if status != 200 or "access-control-allow-origin" in h:
        fail(f"no --cors-origin: GET /v1/models with an Origin: {status}, "
             f"Access-Control-Allow-Origin {h.get('access-control-allow-origin')!r}")


def check_cors():
    for origin in ("http://example.test", "http://other.test"):
        status, h, _ = request("OPTIONS", "/v1/completions", key=None,
                               headers=dict(PREFLIGHT, Origin=origin))
        if status not in (200, 204) or h.get("access-control-allow-origin") not in (origin, "*"):
            fail(f"preflight from {origin}: {status}, Access-Control-Allow-Origin "
                 f"{h.get('access-control-allow-origin')!r}")
            continue
        if "POST" not in h.get("access-control-allow-methods", "").upper():
            fail(f"preflight from {origin}: Access-Control-Allow-Methods "
                 f"{h.get('access-control-allow-methods')!r} lacks POST")
        if "authorization" not in h.get("access-control-allow-headers", "").lower():
            fail(f"preflight from {origin}: Access-Control-Allow-Headers "
                 f"{h.get('access-control-allow-headers')!r} lacks Authorization")
        note(f"preflight from {origin}: {status} {h.get('access-control-allow-origin')}")
    status, h, _ = request("OPTIONS", "/v1/completions", key=None,
                           headers=dict(PREFLIGHT, Origin="http://evil.test"))
    if h.get("access-control-allow-origin") in ("http://evil.test", "*"):
        fail(f"preflight from an origin not allowed: Access-Control-Allow-Origin "
             f"{h['access-control-allow-origin']!r}")
    status, h, _ = request("GET", "/v1/models", headers={"Origin": "http://example.test"})
    if status != 200 or h.get("access-control-allow-origin") not in ("http://example.test", "*"):
        fail(f"GET /v1/models from http://example.test: {status}, Access-Control-Allow-Origin "
             f"{h.get('access-control-allow-origin')!r}")
    status, h, _ = request("POST", "/v1/completions", headers={"Origin": "http://other.test"},
                           body={"model": A.model, "prompt": "x", "max_tokens": 1})
    if status != 200 or h.get("access-control-allow-origin") not in ("http://other.test", "*"):
        fail(f"POST /v1/completions from http://other.test: {status}, "
             f"Access-Control-Allow-Origin {h.get('access-control-allow-origin')!r}")


# ---- auth --------------------------------------------------------------------------------
def check_auth():
    key1, key2 = os.environ["JUMBO_API_KEY"], os.environ["JUMBO_API_KEY2"]
    chat = {"model": A.model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
    routes = [("POST", "/v1/completions", {"model": A.model, "prompt": "x", "max_tokens": 1}),
              ("POST", "/v1/chat/completions", chat), ("GET", "/v1/models", None),
              ("GET", f"/v1/models/{A.model}", None),
              ("POST", "/tokenize", {"model": A.model, "prompt": "x"}),
              ("POST", "/detokenize", {"model": A.model, "tokens": [5]}), ("GET", "/metrics", None)]
    want = {"type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
    for method, path, body in routes:
        for how, headers in [("no key", {}), ("a wrong key", {"Authorization": "Bearer sk-wrong"}),
                             ("the key without Bearer", {"Authorization": key1}),
                             ("Basic", {"Authorization": "Basic c2s6c2s="})]:
            status, _, r = request(method, path, body, key=None, headers=headers)
            err = r.get("error") if isinstance(r, dict) else None
            if status != 401 or not isinstance(err, dict) or \
                    not isinstance(err.get("message"), str) or \
                    {k: err.get(k) for k in want} != want or set(err) != {"message", *want}:
                fail(f"{method} {path} with {how}: expected 401 invalid_api_key, got {status} "
                     f"{short(r)}")
            elif key1 in json.dumps(r) or key2 in json.dumps(r):
                fail(f"{method} {path} with {how}: the 401 shows a key")
        status, _, r = request(method, path, body, key=key1)
        if status != 200:
            fail(f"{method} {path} with the --api-key key: {status} {short(r)}")
    for key in (key1, key2):
        status, _, r = request("GET", "/v1/models", key=key)
        if status != 200:
            fail(f"GET /v1/models with {'the --api-key-file' if key == key2 else 'the --api-key'} "
                 f"key: {status} {short(r)}")
    status, _, r = request("GET", "/health", key=None)
    if status != 200 or r.get("status") != "ok":
        fail(f"/health without a key: {status} {short(r)}")
    status, _, r = request("GET", "/metrics", key=key2)
    if status != 200 or "unparsed" not in r or "jumbo_" not in r["unparsed"]:
        fail(f"/metrics with a key: {status} {short(r)}")


# ---- chat --------------------------------------------------------------------------------
def check_chat_refused():
    status, r = post("/v1/chat/completions",
                     {"model": A.model, "messages": [{"role": "user", "content": "Hi"}]})
    expect_error("chat without --chat-template", status, r, 400)


def check_chat():
    c = A.expect.get("chat")
    if not c:
        return fail("chat: no expectation (jumbo generate of the rendered prompt)")
    body = {"model": A.model, "messages": c["messages"], "max_tokens": c["max_tokens"],
            "temperature": c["temperature"], "seed": c["seed"]}
    status, r = post("/v1/chat/completions", body)
    if status != 200 or not isinstance(r.get("choices"), list) or len(r["choices"]) != 1:
        return fail(f"chat: {status} {short(r)}")
    IDS.append(r.get("id"))
    ch = r["choices"][0]
    if r.get("object") != "chat.completion" or r.get("model") != A.model or \
            not str(r.get("id")).startswith("chatcmpl-") or not isinstance(r.get("created"), int):
        fail(f"chat: bad head {short({k: v for k, v in r.items() if k != 'choices'})}")
    if ch.get("index") != 0 or ch.get("message") is None or \
            ch["message"].get("role") != "assistant":
        fail(f"chat: bad choice {short(ch)}")
    elif ch["message"].get("content") != c["content"]:
        fail(f"chat: content {ch['message'].get('content')!r} != jumbo generate's "
             f"{c['content']!r} (of the rendered prompt {c['rendered']!r}, cut at the "
             f"template's stop {c['stop']!r})")
    if ch.get("finish_reason") != c["finish_reason"] or ch.get("logprobs") is not None:
        fail(f"chat: finish_reason {ch.get('finish_reason')} (want {c['finish_reason']}), "
             f"logprobs {short(ch.get('logprobs'))}")
    ids = tokenize(c["rendered"])
    u = r.get("usage") or {}
    if ids is not None and u.get("prompt_tokens") != len(ids):
        fail(f"chat: usage.prompt_tokens {u.get('prompt_tokens')} != /tokenize of the rendered "
             f"prompt, {len(ids)}")
    if u.get("total_tokens") != u.get("prompt_tokens", 0) + u.get("completion_tokens", 0):
        fail(f"chat: usage does not add up: {u}")
    comp = completion({"model": A.model, "prompt": c["rendered"], "max_tokens": c["max_tokens"],
                       "temperature": c["temperature"], "seed": c["seed"], "stop": [c["stop"]]},
                      "chat: the rendered prompt as a completion")
    if comp is not None and comp["choices"][0]["text"] != ch["message"].get("content"):
        fail(f"chat: content {ch['message'].get('content')!r} != the completion of the rendered "
             f"prompt {comp['choices'][0]['text']!r}")

    # logprobs: one entry per token with bytes and top_logprobs.
    status, r = post("/v1/chat/completions", dict(body, logprobs=True, top_logprobs=2))
    if status != 200:
        fail(f"chat logprobs: {status} {short(r)}")
    else:
        IDS.append(r.get("id"))
        lp = r["choices"][0].get("logprobs") or {}
        content = lp.get("content")
        if not isinstance(content, list) or not content:
            fail(f"chat logprobs: no content entries: {short(lp)}")
        else:
            joined = b""
            for i, e in enumerate(content):
                ok = isinstance(e.get("token"), str) and isinstance(e.get("logprob"), float) and \
                    e["logprob"] <= 0 and isinstance(e.get("bytes"), list) and \
                    all(isinstance(b, int) and 0 <= b < 256 for b in e["bytes"]) and \
                    isinstance(e.get("top_logprobs"), list) and len(e["top_logprobs"]) == 2 and \
                    all(isinstance(t.get("token"), str) and isinstance(t.get("logprob"), float)
                        and isinstance(t.get("bytes"), list) for t in e["top_logprobs"])
                if not ok:
                    fail(f"chat logprobs: entry {i} malformed: {short(e)}")
                    break
                if "\ufffd" not in e["token"] and bytes(e["bytes"]) != e["token"].encode():
                    fail(f"chat logprobs: entry {i}: bytes {e['bytes']} are not {e['token']!r}")
                if e["logprob"] > max(t["logprob"] for t in e["top_logprobs"]) + 1e-5:
                    fail(f"chat logprobs: entry {i} is more likely than its top_logprobs: "
                         f"{short(e)}")
                joined += bytes(e["bytes"])
            if not joined.decode("utf-8", "replace").startswith(c["content"]):
                fail(f"chat logprobs: the tokens' bytes {joined!r} do not begin with the content "
                     f"{c['content']!r}")
    status, r = post("/v1/chat/completions", dict(body, logprobs=True, top_logprobs=21))
    expect_error("chat top_logprobs 21", status, r, 400, param="top_logprobs")

    # stream: chat.completion.chunk with deltas, the role first, the usage last.
    status, chunks, done, ctype = stream("/v1/chat/completions",
                                         dict(body, stream=True,
                                              stream_options={"include_usage": True}))
    if status != 200 or not done or len(chunks) < 2:
        fail(f"chat stream: {status}, [DONE] {done}: {short(chunks)}")
    else:
        if not ctype.startswith("text/event-stream"):
            fail(f"chat stream: content type {ctype}")
        if any(k.get("object") != "chat.completion.chunk" or k.get("id") != chunks[0].get("id")
               for k in chunks):
            fail(f"chat stream: chunks not chat.completion.chunk of one id: {short(chunks)}")
        IDS.append(chunks[0].get("id"))
        last = chunks[-1]
        if last.get("choices") != [] or not isinstance(last.get("usage"), dict):
            fail(f"chat stream: the last chunk is not the usage: {short(last)}")
        body_chunks = [k for k in chunks if k.get("choices")]
        deltas = [k["choices"][0].get("delta", {}) for k in body_chunks]
        if not deltas or deltas[0].get("role") != "assistant":
            fail(f"chat stream: the first delta has no role assistant: {short(deltas[:2])}")
        text = "".join(d.get("content") or "" for d in deltas)
        if text != c["content"]:
            fail(f"chat stream: content {text!r} != {c['content']!r}")
        finishes = [k["choices"][0].get("finish_reason") for k in body_chunks]
        if not finishes or finishes[-1] != c["finish_reason"] or any(finishes[:-1]):
            fail(f"chat stream: finish reasons {finishes}")

    # n = 2, sampled.
    status, r = post("/v1/chat/completions", dict(body, n=2, temperature=0.8, seed=3))
    if status != 200 or [x.get("index") for x in r.get("choices", [])] != [0, 1]:
        fail(f"chat n 2: {status} {short(r)}")
    else:
        IDS.append(r.get("id"))
    for name, extra, param in [("no messages", {"messages": None}, "messages"),
                               ("empty messages", {"messages": []}, "messages"),
                               ("a role wizard", {"messages": [{"role": "wizard",
                                                                "content": "x"}]}, "messages"),
                               ("content a number", {"messages": [{"role": "user",
                                                                   "content": 5}]}, "messages"),
                               ("messages a string", {"messages": "hi"}, "messages"),
                               ("max_tokens over the context", {"max_tokens": 100000},
                                "max_tokens")]:
        b = dict(body, **extra)
        if b["messages"] is None:
            del b["messages"]
        status, r = post("/v1/chat/completions", b)
        if expect_error(f"chat {name}", status, r, 400) and \
                not str(r["error"]["param"]).startswith(param):
            fail(f"chat {name}: param {r['error']['param']!r}, expected {param}...")
    status, r = post("/v1/chat/completions", dict(body, model="no-such-model"))
    expect_error("chat unknown model", status, r, 404, param="model", code="model_not_found")



# ---- metrics -----------------------------------------------------------------------------
def check_metrics():
    before, types = scrape()
    if before is None:
        return
    for fam, kind in [("jumbo_http_requests", "counter"), ("jumbo_prompt_tokens", "counter"),
                      ("jumbo_generation_tokens", "counter"),
                      ("jumbo_time_to_first_token_seconds", "histogram"),
                      ("jumbo_inter_token_latency_seconds", "histogram"),
                      ("jumbo_request_duration_seconds", "histogram"),
                      ("jumbo_queue_requests", "gauge"), ("jumbo_running_sequences", "gauge"),
                      ("jumbo_batch_occupancy_ratio", "gauge"),
                      ("jumbo_kv_cache_usage_ratio", "gauge")]:
        if types.get(fam) != kind:
            fail(f"/metrics: {fam} is {types.get(fam)!r}, expected a {kind}")
    bodies = [body_of(g) for g in A.expect["greedy"][:3]]
    usage = []
    for b in bodies:
        r = completion(b, "metrics: a completion")
        usage.append(r["usage"] if r else {"prompt_tokens": 0, "completion_tokens": 0})
    status, chunks, done, _ = stream("/v1/completions", dict(bodies[0], stream=True))
    if status != 200 or not done:
        fail(f"metrics: the stream: {status}")
    usage.append(usage[0])
    status, r = post("/v1/completions", {"model": A.model, "prompt": "x", "max_tokens": 0})
    expect_error("metrics: a 400", status, r, 400)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    # A request may be counted just after its last byte is sent: a few scrapes, 2 s at most.
    for _ in range(20):
        after, _ = scrape()
        if after is None:
            return
        if delta("jumbo_http_requests_total", route="/v1/completions") >= 5:
            break
        time.sleep(0.1)

    checks = [("jumbo_http_requests_total{route=/v1/completions,status=200}",
               delta("jumbo_http_requests_total", route="/v1/completions", status="200"), 4),
              ("jumbo_http_requests_total{route=/v1/completions,status=400}",
               delta("jumbo_http_requests_total", route="/v1/completions", status="400"), 1),
              ("jumbo_prompt_tokens_total", delta("jumbo_prompt_tokens_total"),
               sum(u["prompt_tokens"] for u in usage)),
              ("jumbo_generation_tokens_total", delta("jumbo_generation_tokens_total"),
               sum(u["completion_tokens"] for u in usage)),
              ("jumbo_time_to_first_token_seconds_count",
               delta("jumbo_time_to_first_token_seconds_count"), 4)]
    for name, got, want in checks:
        if got != want:
            fail(f"/metrics: {name} moved by {got}, expected {want}")
    dur = delta("jumbo_request_duration_seconds_count")
    if dur not in (4, 5):
        fail(f"/metrics: jumbo_request_duration_seconds_count moved by {dur}, expected 4 (or 5 "
             "with the 400)")
    tokens = sum(u["completion_tokens"] for u in usage)
    itl = delta("jumbo_inter_token_latency_seconds_count")
    if not tokens - 4 <= itl <= tokens:
        fail(f"/metrics: jumbo_inter_token_latency_seconds_count moved by {itl}, expected "
             f"{tokens - 4} .. {tokens} for {tokens} tokens in 4 requests")
    for h in ("jumbo_time_to_first_token_seconds", "jumbo_inter_token_latency_seconds",
              "jumbo_request_duration_seconds"):
        buckets = sorted(((float(dict(ls)["le"]), v) for (n, ls), v in after.items()
                          if n == h + "_bucket"), key=lambda b: b[0])
        counts = [v for _, v in buckets]
        if not buckets or buckets[-1][0] != float("inf") or counts != sorted(counts) or \
                counts[-1] != total(after, h + "_count") or total(after, h + "_sum") < 0:
            fail(f"/metrics: {h}: buckets {buckets} do not end in +Inf = the count")
    for g in ("jumbo_queue_requests", "jumbo_running_sequences"):
        if total(after, g) != 0:
            fail(f"/metrics: {g} is {total(after, g)} with nothing running")
    for g in ("jumbo_batch_occupancy_ratio", "jumbo_kv_cache_usage_ratio"):
        if not 0 <= total(after, g) <= 1:
            fail(f"/metrics: {g} is {total(after, g)}, not in [0, 1]")

    # During a long stream: a running sequence, a used batch and KV cache.
    conn = connect()
    conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json",
                                                     **auth_headers(True)},
                 body=json.dumps({"model": A.model, "prompt": "The jury said", "max_tokens": 400,
                                  "temperature": 0, "stream": True}))
    resp = conn.getresponse()
    # Three chunks: the gauges of the step that made the first token are out (they are
    # published after each step, and its sink may wake us first).
    events = 0
    for _ in range(1000):
        line = resp.readline()
        events += line.startswith(b"data: ")
        if not line or events == 3:
            break
    for _ in range(10):
        during, _ = scrape()
        if during is None or total(during, "jumbo_running_sequences") >= 1:
            break
        time.sleep(0.01)
    conn.sock.shutdown(socket.SHUT_RDWR)
    resp.close()
    conn.close()
    if during is not None:
        if total(during, "jumbo_running_sequences") < 1:
            fail(f"/metrics during a stream: jumbo_running_sequences "
                 f"{total(during, 'jumbo_running_sequences')}")
        for g in ("jumbo_batch_occupancy_ratio", "jumbo_kv_cache_usage_ratio"):
            if not 0 < total(during, g) <= 1:
                fail(f"/metrics during a stream: {g} is {total(during, g)}, not in (0, 1]")
    deadline = time.time() + 20
    while health().get("running", 0) and time.time() < deadline:
        time.sleep(0.1)


# ---- the access log ----------------------------------------------------------------------
def access_lines():
    try:
        with open(A.stderr, encoding="utf-8", errors="replace") as f:
            return [line for line in f if "access" in line]
    except OSError as e:
        fail(f"access log: cannot read {A.stderr}: {e}")
        return []


def settled_access_count():
    """The access lines once none has arrived for 0.3 s: a line is written after its response
    is sent, so the previous check's last request may still be logging when this one starts."""
    n, since = len(access_lines()), time.time()
    while time.time() - since < 0.3:
        time.sleep(0.05)
        m = len(access_lines())
        if m != n:
            n, since = m, time.time()
    return n


def check_access_log():
    marker = "zqxmarker" + uuid.uuid4().hex[:10]
    before = settled_access_count()
    request("GET", "/health", key=None)
    request("GET", "/v1/nothing")
    post("/v1/completions", {"model": A.model, "prompt": marker, "max_tokens": 0})
    completion({"model": A.model, "prompt": f"The {marker} said", "max_tokens": 2}, "access log")
    stream("/v1/completions", {"model": A.model, "prompt": [f"A {marker}"], "max_tokens": 2,
                               "stream": True})
    lines = []
    deadline = time.time() + 5
    while time.time() < deadline:
        lines = access_lines()[before:]
        if len(lines) >= 5:
            break
        time.sleep(0.1)
    if len(lines) != 5:
        fail(f"access log: {len(lines)} new lines for 5 requests: {short(''.join(lines))}")
    for line in lines:
        if "id=" not in line or "status=" not in line:
            fail(f"access log: a line without id= and status=: {line.strip()!r}")
    statuses = sorted(re.findall(r"status=(\d+)", "".join(lines)))
    if statuses != ["200", "200", "200", "400", "404"]:
        fail(f"access log: statuses {statuses}, expected 200 200 200 400 404")
    with open(A.stderr, encoding="utf-8", errors="replace") as f:
        err = f.read()
    if marker in err:
        fail(f"access log: the prompt text is in the server's stderr: "
             f"{short([l for l in err.splitlines() if marker in l][0])}")
    if len(err) > 1_000_000:
        fail(f"the server's stderr is {len(err)} bytes: a prompt in it?")


# ---- https -------------------------------------------------------------------------------
def check_tls():
    health()
    p = A.expect.get("plain")
    if not p:
        return fail("tls: no expectation")
    r = completion(body_of(p), "tls completion")
    if r is not None and r["choices"][0]["text"] != p["text"]:
        fail(f"tls: text {r['choices'][0]['text']!r} != jumbo generate's {p['text']!r}")
    status, chunks, done, _ = stream("/v1/completions", body_of(p, stream=True))
    text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    if status != 200 or not done or text != p["text"]:
        fail(f"tls stream: {status}, [DONE] {done}, text {text!r} != {p['text']!r}")


