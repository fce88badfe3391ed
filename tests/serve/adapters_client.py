#!/usr/bin/env python3
"""Checks of a running `jumbo serve --adapter ...` (docs/serve.md "Adapters"), stdlib only.

  adapters_client.py PORT BASE models NAME...       /v1/models lists the base and exactly these
                                                    adapters, each with parent = the base
  adapters_client.py PORT BASE batch CASES.json     every case at once (a barrier), then each
                                                    alone: both give the case's text
  adapters_client.py PORT BASE one CASES.json MODEL the cases of MODEL, one after another
  adapters_client.py PORT BASE add NAME PATH        POST /v1/adapters: 200 and its model object
  adapters_client.py PORT BASE refused STATUS PATTERN NAME PATH
                                                    POST /v1/adapters answered STATUS, the error
                                                    message matching PATTERN; still up
  adapters_client.py PORT BASE remove_in_flight CASES.json MODEL
                                                    a stream of MODEL's longest case; after its
                                                    first chunk DELETE MODEL: the stream ends
                                                    with the case's text, then MODEL is 404
A case: {"model", "prompt", "seed", "temperature", "max_tokens", "text"} (the expectation from
`jumbo generate --json [--adapter]`). Prints one line per failure and exits 1 if any.
"""
import http.client
import json
import re
import sys
import threading

PORT, BASE, WHAT = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ARGS = sys.argv[4:]
failures = []


def fail(message):
    failures.append(message)
    print("FAIL: " + message, flush=True)


def request(method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode("utf-8")
    conn.close()
    return resp.status, json.loads(text)


def body_of(case, stream=False):
    return {"model": case["model"], "prompt": case["prompt"], "seed": case["seed"],
            "temperature": case["temperature"], "max_tokens": case["max_tokens"],
            "stream": stream}


def complete(case):
    status, body = request("POST", "/v1/completions", body_of(case))
    if status != 200:
        return f"status {status}: {body}"
    if body["model"] != case["model"]:
        return f"response model {body['model']!r}"
    return body["choices"][0]["text"]


def check(case, got, how):
    if got != case["text"]:
        fail(f"{how}: {case['model']} {case['prompt']!r} seed {case['seed']}: got {got!r}, "
             f"expected {case['text']!r}")


def models(names):
    status, body = request("GET", "/v1/models")
    ids = [m["id"] for m in body["data"]]
    if status != 200 or ids[0] != BASE or sorted(ids[1:]) != sorted(names):
        fail(f"/v1/models lists {ids}, expected {BASE} then {names}")
    for m in body["data"][1:]:
        if m.get("parent") != BASE or "lora" not in m:
            fail(f"/v1/models: {m}")
    for name in names:
        status, m = request("GET", f"/v1/models/{name}")
        if status != 200 or m["id"] != name:
            fail(f"/v1/models/{name}: {status} {m}")


def batch(cases):
    got = [None] * len(cases)
    barrier = threading.Barrier(len(cases))

    def run(i):
        barrier.wait()
        got[i] = complete(cases[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for case, text in zip(cases, got):
        check(case, text, "together")
    for case in cases:
        check(case, complete(case), "alone")
    print(f"{len(cases)} requests over {len({c['model'] for c in cases})} models: together = "
          f"alone = jumbo generate", flush=True)


def refused(status_expected, pattern, name, path):
    status, body = request("POST", "/v1/adapters", {"name": name, "path": path})
    message = body.get("error", {}).get("message", "")
    if status != int(status_expected) or not re.search(pattern, message):
        fail(f"POST /v1/adapters {name}: {status} {message!r}, expected {status_expected} "
             f"matching {pattern!r}")
    if request("GET", "/health")[0] != 200:
        fail("the server is not up after a refused adapter")
    print(f"refused {status}: {message}", flush=True)


def remove_in_flight(cases, model):
    case = max((c for c in cases if c["model"] == model), key=lambda c: c["max_tokens"])
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
    conn.request("POST", "/v1/completions", body=json.dumps(body_of(case, stream=True)),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    text, deleted = "", False
    while True:
        line = resp.readline().decode("utf-8")
        if not line:
            break
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):].strip()
        if data == "[DONE]":
            break
        text += json.loads(data)["choices"][0]["text"]
        if not deleted:
            status, body = request("DELETE", f"/v1/adapters/{model}")
            if status != 200 or body != {"id": model, "object": "model", "deleted": True}:
                fail(f"DELETE /v1/adapters/{model}: {status} {body}")
            status, _ = request("POST", "/v1/completions", body_of(case))
            if status != 404:
                fail(f"a new request for {model} after its DELETE: {status}, expected 404")
            deleted = True
    conn.close()
    check(case, text, "in flight across its adapter's DELETE")
    status, _ = request("DELETE", f"/v1/adapters/{model}")
    if status != 404:
        fail(f"a second DELETE of {model}: {status}, expected 404")


if WHAT == "models":
    models(ARGS)
elif WHAT == "batch":
    batch(json.load(open(ARGS[0])))
elif WHAT == "one":
    for case in json.load(open(ARGS[0])):
        if case["model"] == ARGS[1]:
            check(case, complete(case), "one after another")
elif WHAT == "add":
    status, body = request("POST", "/v1/adapters", {"name": ARGS[0], "path": ARGS[1]})
    if status != 200 or body.get("id") != ARGS[0] or body.get("parent") != BASE:
        fail(f"POST /v1/adapters {ARGS[0]}: {status} {body}")
elif WHAT == "refused":
    refused(*ARGS)
elif WHAT == "remove_in_flight":
    remove_in_flight(json.load(open(ARGS[0])), ARGS[1])
else:
    sys.exit(f"unknown check {WHAT}")
sys.exit(1 if failures else 0)
