"""The shared part of api.py's checks of a running `jumbo serve`: the command line and the
expectations (A), the failures, HTTP over http.client (plain or TLS), raw sockets, the OpenAI
error shape, a few request helpers (completion, tokenize, detokenize) and the /metrics parser.
"""
import argparse
import http.client
import json
import select
import socket
import ssl

from prometheus_client.parser import text_string_to_metric_families

failures = []
# The command line; A.key: the Authorization key, or None; A.expect: EXPECT.json's contents;
# A.model: the model id the server serves.
A = argparse.Namespace()


def fail(message):
    failures.append(message)
    print("FAIL: " + message, flush=True)


def note(message):
    print(message, flush=True)


def short(x, n=300):
    s = x if isinstance(x, str) else json.dumps(x) if not isinstance(x, bytes) else repr(x)
    return s if len(s) <= n else s[:n] + f"... ({len(s)} chars)"


# ---- HTTP --------------------------------------------------------------------------------
def connect(timeout=120):
    if A.mode == "tls":
        context = ssl.create_default_context(cafile=A.cafile)
        return http.client.HTTPSConnection("127.0.0.1", A.port, timeout=timeout, context=context)
    return http.client.HTTPConnection("127.0.0.1", A.port, timeout=timeout)


def auth_headers(key):
    key = A.key if key is True else key
    return {"Authorization": f"Bearer {key}"} if key else {}


def request(method, path, body=None, raw=None, headers=None, key=True, timeout=120):
    """(status, headers (lower-case names), parsed JSON or {"unparsed": text}) of one request
    on its own connection. key=True sends the default key (if any), None none, else that key."""
    conn = connect(timeout)
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    h = {"Content-Type": "application/json"}
    h.update(auth_headers(key))
    h.update(headers or {})
    conn.request(method, path, body=data, headers=h)
    resp = conn.getresponse()
    payload = resp.read()
    hdrs = {k.lower(): v for k, v in resp.getheaders()}
    conn.close()
    try:
        return resp.status, hdrs, json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return resp.status, hdrs, {"unparsed": payload.decode("utf-8", "replace")}


def post(path, body, **kw):
    status, _, r = request("POST", path, body, **kw)
    return status, r


def stream(path, body, key=True, headers=None):
    """(status, [chunk dicts], saw [DONE], content type) of an SSE request."""
    conn = connect()
    h = {"Content-Type": "application/json"}
    h.update(auth_headers(key))
    h.update(headers or {})
    conn.request("POST", path, body=json.dumps(body), headers=h)
    resp = conn.getresponse()
    ctype = resp.getheader("Content-Type", "")
    if resp.status != 200:
        text = resp.read().decode("utf-8", "replace")
        conn.close()
        return resp.status, [{"unparsed": text}], False, ctype
    chunks, done = [], False
    for _ in range(100000):
        line = resp.readline()
        if not line:
            break
        line = line.decode("utf-8").rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            break
        chunks.append(json.loads(data))
    conn.close()
    return 200, chunks, done, ctype


def is_error(r, status=None):
    """The OpenAI error shape: {"error": {"message": str, "type": str, "param", "code"}}."""
    err = r.get("error") if isinstance(r, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and \
        isinstance(err.get("type"), str) and "param" in err and "code" in err


def expect_error(name, status, r, want_status, param="any", code="any", max_message=2000):
    if status != want_status or not is_error(r):
        return fail(f"{name}: expected {want_status} with an OpenAI error, got {status} {short(r)}")
    err = r["error"]
    if param != "any" and err["param"] != param:
        return fail(f"{name}: error param {err['param']!r}, expected {param!r}: {short(err)}")
    if code != "any" and err["code"] != code:
        return fail(f"{name}: error code {err['code']!r}, expected {code!r}: {short(err)}")
    if len(err["message"].encode()) >= max_message:
        return fail(f"{name}: a {len(err['message'].encode())}-byte message")
    note(f"{name}: {status} {short(err['message'], 160)}")
    return True


def health():
    status, _, h = request("GET", "/health", key=None)
    if status != 200 or not isinstance(h, dict) or h.get("status") != "ok":
        fail(f"/health: {status} {short(h)}")
        return {}
    return h


IDS = []


def completion(body, name, want_status=200):
    """A non-streamed /v1/completions; its id is kept. None unless it answered want_status."""
    status, r = post("/v1/completions", body)
    if status != want_status:
        fail(f"{name}: status {status}, expected {want_status}: {short(r)}")
        return None
    if status == 200:
        if not isinstance(r.get("choices"), list) or not r["choices"]:
            fail(f"{name}: no choices: {short(r)}")
            return None
        IDS.append(r.get("id"))
    return r


def tokenize(text):
    status, r = post("/tokenize", {"model": A.model, "prompt": text})
    if status != 200 or not isinstance(r.get("tokens"), list):
        fail(f"/tokenize {text!r}: {status} {short(r)}")
        return None
    return r["tokens"]


def detokenize(tokens):
    status, r = post("/detokenize", {"model": A.model, "tokens": tokens})
    if status != 200 or not isinstance(r.get("prompt"), str):
        fail(f"/detokenize {short(tokens, 80)}: {status} {short(r)}")
        return None
    return r["prompt"]


def body_of(case, **extra):
    b = {"model": A.model, "prompt": case["prompt"], "max_tokens": case["max_tokens"],
         "temperature": case["temperature"], "seed": case["seed"]}
    b.update(extra)
    return b


def completion_text_of(prompt_ids, completion_ids):
    """decode(prompt + completion) minus decode(prompt), through /detokenize."""
    base = detokenize(prompt_ids)
    whole = detokenize(prompt_ids + completion_ids)
    if base is None or whole is None:
        return None
    if not whole.startswith(base):
        fail(f"/detokenize: the prompt's text {base!r} does not begin the whole {whole!r}")
        return None
    return whole[len(base):]



# ---- raw sockets -------------------------------------------------------------------------
def raw_exchange(head, body=b"", wait_first=1.0):
    """Sends head (and body, stopping once the server answers) on a raw socket; returns
    (status, parsed JSON body or {"unparsed"})."""
    s = socket.create_connection(("127.0.0.1", A.port), timeout=30)
    try:
        s.sendall(head)
        if body and not select.select([s], [], [], wait_first)[0]:
            view = memoryview(body)
            sent = 0
            try:
                while sent < len(body):
                    sent += s.send(view[sent:sent + 65536])
                    if select.select([s], [], [], 0)[0]:
                        break
            except (BrokenPipeError, ConnectionResetError):
                pass
        resp = http.client.HTTPResponse(s)
        resp.begin()
        payload = resp.read()
        try:
            return resp.status, json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return resp.status, {"unparsed": payload.decode("utf-8", "replace")}
    finally:
        s.close()


def auth_line():
    return (f"Authorization: Bearer {A.key}\r\n" if A.key else "").encode()



# ---- metrics -----------------------------------------------------------------------------
def scrape():
    """{(sample name, sorted labels): value} and {family: type}, or None."""
    status, h, r = request("GET", "/metrics")
    text = r.get("unparsed") if isinstance(r, dict) else None
    if status != 200 or text is None:
        fail(f"/metrics: {status} {short(r)}")
        return None, None
    if not h.get("content-type", "").startswith("text/plain"):
        fail(f"/metrics: content type {h.get('content-type')!r}")
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser's own exceptions vary
        fail(f"/metrics does not parse: {type(e).__name__}: {e}")
        return None, None
    samples, types = {}, {}
    for fam in families:
        types[fam.name] = fam.type
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def total(samples, name, **labels):
    """The sum of `name`'s samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))

