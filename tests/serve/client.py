#!/usr/bin/env python3
"""Checks of a running `jumbo serve` with the standard library only (threads + http.client).

  client.py PORT MODEL concurrent CASES.json   every case at once (a barrier): each text and
                                               finish_reason equal the case's expectation
  client.py PORT MODEL disconnect CASES.json   a stream closed after its first chunk is
                                               cancelled; then 4 cases are served right and
                                               /health shows nothing running
  client.py PORT MODEL errors                  bad requests: 400 naming the param; still up
  client.py PORT MODEL models                  /v1/models, /health, an unknown route
  client.py PORT MODEL queue_full              (--max-batch 1 --max-queue 1) some of 6
                                               concurrent requests get 429, the rest finish
A case: {"prompt", "seed", "temperature", "max_tokens", "stream", "stop"?, "text",
"finish_reason", "tokens"} (the expectation from `jumbo generate --json`). Prints one line
per failure and exits 1 if there was one.
"""
import http.client
import json
import socket
import sys
import threading
import time

PORT = int(sys.argv[1])
MODEL = sys.argv[2]
failures = []


def fail(message):
    failures.append(message)
    print("FAIL: " + message, flush=True)


def connect(timeout=120):
    return http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)


def request(method, path, body=None, raw=None):
    """(status, parsed JSON body) of one request on its own connection."""
    conn = connect()
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode("utf-8")
    conn.close()
    try:
        return resp.status, json.loads(text)
    except json.JSONDecodeError:
        return resp.status, {"unparsed": text}


def stream_events(resp):
    """Yields each SSE data payload ("[DONE]" included); comments are skipped."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.decode("utf-8").rstrip("\n")
        if line.startswith("data: "):
            yield line[len("data: "):]


def body_of(case, **extra):
    b = {"model": MODEL, "prompt": case["prompt"], "max_tokens": case["max_tokens"],
         "temperature": case["temperature"], "seed": case["seed"]}
    if case.get("stop"):
        b["stop"] = case["stop"]
    b.update(extra)
    return b


def run_case(case, name):
    """Sends one case (streaming or not) and compares it with its expectation."""
    if case["stream"]:
        conn = connect()
        conn.request("POST", "/v1/completions", body=json.dumps(body_of(case, stream=True)))
        resp = conn.getresponse()
        if resp.status != 200:
            return fail(f"{name}: stream status {resp.status}: {resp.read()!r}")
        if not resp.getheader("Content-Type", "").startswith("text/event-stream"):
            fail(f"{name}: stream content type {resp.getheader('Content-Type')}")
        text, finish, done = "", None, False
        for data in stream_events(resp):
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk["object"] != "text_completion" or len(chunk["choices"]) != 1:
                fail(f"{name}: bad chunk {data}")
            choice = chunk["choices"][0]
            if finish is not None:
                fail(f"{name}: a chunk after the finish_reason: {data}")
            text += choice["text"]
            finish = choice["finish_reason"]
        conn.close()
        if not done:
            fail(f"{name}: the stream did not end with [DONE]")
    else:
        status, r = request("POST", "/v1/completions", body_of(case))
        if status != 200:
            return fail(f"{name}: status {status}: {r}")
        choice = r["choices"][0]
        text, finish = choice["text"], choice["finish_reason"]
        usage = r["usage"]
        if usage["completion_tokens"] != len(case["tokens"]):
            fail(f"{name}: completion_tokens {usage['completion_tokens']}, generate made "
                 f"{len(case['tokens'])}")
        if usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
            fail(f"{name}: usage does not add up: {usage}")
        if not r["id"].startswith("cmpl-") or r["object"] != "text_completion" or r["model"] != MODEL:
            fail(f"{name}: bad response head {r}")
    if text != case["text"]:
        fail(f"{name}: text {text!r} != jumbo generate's {case['text']!r}")
    if finish != case["finish_reason"]:
        fail(f"{name}: finish_reason {finish} != jumbo generate's {case['finish_reason']}")


def run_all(cases, label):
    barrier = threading.Barrier(len(cases))

    def one(i, case):
        barrier.wait()
        try:
            run_case(case, f"{label} {i} ({'stream' if case['stream'] else 'plain'}, "
                           f"T {case['temperature']}, seed {case['seed']})")
        except Exception as e:  # one client's exception is one failure, not a hang
            fail(f"{label} {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, args=(i, c)) for i, c in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def health():
    status, h = request("GET", "/health")
    if status != 200 or h.get("status") != "ok":
        fail(f"/health: {status} {h}")
    return h


def check_concurrent(cases):
    run_all(cases, "concurrent")
    # The n and logprobs fields on one of the sampled cases: choice 0 of n is stream 0, the
    # same text; logprobs are one entry per completion token.
    case = next(c for c in cases if c["temperature"] > 0 and not c.get("stop"))
    status, r = request("POST", "/v1/completions", body_of(case, n=3, logprobs=2))
    if status != 200 or [c["index"] for c in r["choices"]] != [0, 1, 2]:
        return fail(f"n=3: {status} {r}")
    if r["choices"][0]["text"] != case["text"]:
        fail(f"n=3: choice 0 {r['choices'][0]['text']!r} != {case['text']!r}")
    lp = r["choices"][0]["logprobs"]
    count = len(case["tokens"])
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        if len(lp[key]) != count:
            fail(f"logprobs.{key}: {len(lp[key])} entries, {count} tokens")
    if any(len(top) != 2 for top in lp["top_logprobs"]):
        fail(f"logprobs.top_logprobs: not 2 alternatives each: {lp['top_logprobs']}")
    if lp["text_offset"] != sorted(lp["text_offset"]) or lp["text_offset"][0] != 0:
        fail(f"logprobs.text_offset not increasing from 0: {lp['text_offset']}")
    greedy = next((c for c in cases if c["temperature"] == 0 and not c.get("stop")), None)
    if greedy is None:
        return
    status, r = request("POST", "/v1/completions", body_of(greedy, logprobs=3))
    lp = r["choices"][0]["logprobs"]
    for i, (chosen, top) in enumerate(zip(lp["token_logprobs"], lp["top_logprobs"])):
        if abs(chosen - max(top.values())) > 1e-6 or lp["tokens"][i] not in top:
            fail(f"greedy logprobs {i}: the chosen token {lp['tokens'][i]!r} ({chosen}) is not "
                 f"the most likely of {top}")


def check_disconnect(cases):
    # A greedy stream as long as the context allows: it cannot finish before the server
    # notices the closed socket at its next writes.
    long = {"model": MODEL, "prompt": "The jury said", "max_tokens": 480, "temperature": 0,
            "stream": True}
    conn = connect()
    conn.request("POST", "/v1/completions", body=json.dumps(long))
    resp = conn.getresponse()
    first = next(stream_events(resp), None)
    if first is None or first == "[DONE]":
        fail(f"disconnect: no first chunk ({first})")
    conn.sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream
    resp.close()
    conn.close()
    run_all(cases[:4], "after disconnect")
    deadline = time.time() + 20
    while True:
        h = health()
        if h["running"] == 0 and h["waiting"] == 0 and h["queued"] == 0:
            break
        if time.time() > deadline:
            return fail(f"disconnect: /health still shows work after 20 s: {h}")
        time.sleep(0.1)
    if h["cancelled"] < 1:
        fail(f"disconnect: the closed stream was not cancelled: {h}")
    print(f"disconnect: /health {h}")


def check_errors(cases):
    base = {"model": MODEL, "prompt": "The jury"}
    bad = [  # (name, body or raw text, expected param)
        ("unknown field", dict(base, tools=[]), "tools"),
        ("frequency_penalty 3", dict(base, frequency_penalty=3), "frequency_penalty"),
        ("logit_bias not a token id", dict(base, logit_bias={"x": 1}), "logit_bias"),
        ("logit_bias over 100", dict(base, logit_bias={"3": 101}), "logit_bias"),
        ("best_of below n", dict(base, n=3, best_of=2), "best_of"),
        ("best_of streamed", dict(base, best_of=2, stream=True), "best_of"),
        ("suffix", dict(base, suffix="x"), "suffix"),
        ("stream_options without stream", dict(base, stream_options={"include_usage": True}),
         "stream_options"),
        ("65 prompts", dict(base, prompt=["a"] * 65), "prompt"),
        ("prompt longer than the context", dict(base, prompt="word " * 2000), "prompt"),
        ("max_tokens 0", dict(base, max_tokens=0), "max_tokens"),
        ("max_tokens too large", dict(base, max_tokens=100000), "max_tokens"),
        ("max_tokens a float", dict(base, max_tokens=4.5), "max_tokens"),
        ("invalid JSON", '{"model": "x", "prompt": ', None),
        ("not an object", "[1, 2]", None),
        ("no model", {"prompt": "x"}, "model"),
        ("no prompt", {"model": MODEL}, "prompt"),
        ("n 0", dict(base, n=0), "n"),
        ("n 17", dict(base, n=17), "n"),
        ("temperature 2.5", dict(base, temperature=2.5), "temperature"),
        ("top_p 0", dict(base, top_p=0), "top_p"),
        ("top_k -1", dict(base, top_k=-1), "top_k"),
        ("five stops", dict(base, stop=["a", "b", "c", "d", "e"]), "stop"),
        ("logprobs 6", dict(base, logprobs=6), "logprobs"),
        ("echo a string", dict(base, echo="yes"), "echo"),
        ("stream a string", dict(base, stream="yes"), "stream"),
        ("empty prompt list", dict(base, prompt=[]), "prompt"),
        ("mixed prompt list", dict(base, prompt=["a", 3]), "prompt"),
        ("token id out of range", dict(base, prompt=[1, 100000]), "prompt"),
    ]
    for name, body, param in bad:
        if isinstance(body, str):
            status, r = request("POST", "/v1/completions", raw=body)
        else:
            status, r = request("POST", "/v1/completions", body)
        err = r.get("error", {})
        if status != 400 or err.get("type") != "invalid_request_error" or err.get("param") != param:
            fail(f"{name}: expected 400 naming {param}, got {status} {r}")
        elif param is None and "body" not in err.get("message", ""):
            fail(f"{name}: the message does not name the body: {err}")
        elif param is not None and not err.get("message", "").startswith(param):
            fail(f"{name}: the message does not start with {param}: {err}")
        else:
            print(f"{name}: 400 {err['message']}")
    status, r = request("POST", "/v1/completions", dict(base, model="gpt-3.5-turbo-instruct"))
    err = r.get("error", {})
    if status != 404 or err.get("code") != "model_not_found" or err.get("param") != "model":
        fail(f"wrong model: expected 404 model_not_found naming model, got {status} {r}")
    else:
        print(f"wrong model: 404 {err['message']}")
    # A flat list of token ids is one prompt, however long (not "100 prompts").
    status, r = request("POST", "/v1/completions", dict(base, prompt=list(range(1, 101)), max_tokens=2))
    if status != 200 or len(r.get("choices", [])) != 1 or r["usage"]["prompt_tokens"] != 100:
        fail(f"100 token ids: expected one prompt of 100 tokens, got {status} {r}")
    health()
    run_case(cases[0], "after the errors")  # still serving, and right


def check_models():
    status, r = request("GET", "/v1/models")
    if status != 200 or r.get("object") != "list" or len(r.get("data", [])) != 1:
        return fail(f"/v1/models: {status} {r}")
    m = r["data"][0]
    if m["id"] != MODEL or m["object"] != "model" or m["owned_by"] != "jumbo" or \
            not isinstance(m["created"], int):
        fail(f"/v1/models: bad model entry {m}")
    h = health()
    for key in ("running", "waiting", "queued", "completed", "cancelled"):
        if not isinstance(h.get(key), int):
            fail(f"/health: no count {key}: {h}")
    status, r = request("GET", "/v1/chat/nothing")
    if status != 404 or "error" not in r:
        fail(f"unknown route: {status} {r}")


def check_queue_full():
    results = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)
    body = {"model": MODEL, "prompt": "The jury said", "max_tokens": 400, "temperature": 0}

    def one():
        barrier.wait()
        status, r = request("POST", "/v1/completions", body)
        with lock:
            results.append((status, r))

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(s for s, _ in results)
    print(f"queue_full: statuses {statuses}")
    if statuses.count(429) < 1 or statuses.count(200) < 2 or set(statuses) - {200, 429}:
        fail(f"queue_full: expected some 429 and at least 2 finished: {statuses}")
    for s, r in results:
        if s == 429 and "queue" not in r.get("error", {}).get("message", ""):
            fail(f"queue_full: 429 without a JSON error: {r}")
    health()


def main():
    what = sys.argv[3]
    cases = json.load(open(sys.argv[4])) if len(sys.argv) > 4 else []
    {"concurrent": lambda: check_concurrent(cases),
     "disconnect": lambda: check_disconnect(cases),
     "errors": lambda: check_errors(cases),
     "models": check_models,
     "queue_full": check_queue_full}[what]()
    print(f"{what}: {'FAILED ' + str(len(failures)) if failures else 'ok'}", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
