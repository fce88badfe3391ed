#!/usr/bin/env python3
"""Proves that tests/support/s3_verify_proxy.py verifies: requests signed by botocore pass
(with a real payload hash and with UNSIGNED-PAYLOAD, over one keep-alive connection and
from several threads at once), and the same requests changed after signing are refused
with S3's error codes, without reaching s3rver.
Usage: s3_proxy_check.py ENDPOINT BUCKET (the AWS_* variables hold the right credentials)."""
import http.client
import os
import sys
import threading
import time
import types
import urllib.parse

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

endpoint, bucket = sys.argv[1], sys.argv[2]
host = urllib.parse.urlsplit(endpoint).netloc
region = os.environ["AWS_REGION"]
good = Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
failures = []
UNSIGNED = types.SimpleNamespace(s3={"payload_signing_enabled": False})


def signed(method, path, body=b"", headers=None, creds=good, unsigned_payload=False):
    """method, path, headers and body of a request botocore signed."""
    req = AWSRequest(method=method, url=endpoint + path, data=body, headers=headers or {})
    if unsigned_payload:
        req.context["client_config"] = UNSIGNED
    S3SigV4Auth(creds, "s3", region).add_auth(req)
    return [method, path, dict(req.headers.items()), body]


def send(method, path, headers, body, conn=None):
    conn = conn or http.client.HTTPConnection(host, timeout=30)
    conn.request(method, path, body=body or None, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read().decode(errors="replace")


def expect(what, request, status, code=None, conn=None):
    got, body = send(*request, conn=conn)
    if got != status or (code and f"<Code>{code}</Code>" not in body):
        failures.append(f"{what}: HTTP {got}, expected {status} {code or ''}: {body[:200]}")
    else:
        print(f"ok: {what}: {got}{' ' + code if code else ''}")
    return body


key = f"/{bucket}/proxy-check/a%20b%2Bc.bin"  # a space and a plus, encoded
data = b"0123456789" * 100
expect("PUT with its body's sha256", signed("PUT", key, data), 200)
expect("GET with UNSIGNED-PAYLOAD", signed("GET", key, unsigned_payload=True), 200)
body = expect("ranged GET", signed("GET", key, headers={"Range": "bytes=10-14"}), 206)
if body != "01234":
    failures.append(f"ranged GET: body {body!r}, expected '01234'")
listing = f"/{bucket}?prefix=proxy-check%2F&list-type=2"  # not in canonical order
body = expect("ListObjectsV2, parameters unsorted", signed("GET", listing), 200)
if "<Key>proxy-check/a b+c.bin</Key>" not in body:
    failures.append(f"ListObjectsV2 does not list the key: {body[:300]}")

# Keep-alive: several signed requests over one connection; then several threads at once.
conn = http.client.HTTPConnection(host, timeout=30)
for i in range(3):
    expect(f"keep-alive request {i + 1}", signed("HEAD", key), 200, conn=conn)
statuses = []
threads = [threading.Thread(target=lambda i=i: statuses.append(send(*signed(
    "PUT", f"/{bucket}/proxy-check/t{i}", b"x" * i, unsigned_payload=True))[0]))
    for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if statuses != [200] * 8:
    failures.append(f"8 concurrent PUTs: statuses {statuses}")
else:
    print("ok: 8 concurrent PUTs: 200")

# Each of these is changed after signing (or signed wrongly) and must be refused.
r = signed("PUT", key, b"other bytes")
r[3] = b"tampered!!!"  # the body no longer has the signed hash
expect("PUT with a tampered body", r, 400, "XAmzContentSHA256Mismatch")
r = signed("PUT", key, b"other bytes", unsigned_payload=True)
r[1] = f"/{bucket}/proxy-check/elsewhere"
expect("PUT to a tampered path", r, 403, "SignatureDoesNotMatch")
r = signed("GET", listing)
r[1] = listing.replace("proxy-check", "other")
expect("GET with a tampered query", r, 403, "SignatureDoesNotMatch")
r = signed("GET", key, headers={"Range": "bytes=0-1"})
r[2]["Range"] = "bytes=0-999"
expect("GET with a tampered signed header", r, 403, "SignatureDoesNotMatch")
r = signed("GET", key)
r[0] = "DELETE"
expect("DELETE signed as a GET", r, 403, "SignatureDoesNotMatch")
expect("PUT signed with a wrong secret", signed("PUT", key, b"x", creds=Credentials(
    good.access_key, "wrong-secret")), 403, "SignatureDoesNotMatch")
expect("GET signed with an unknown access key", signed("GET", key, creds=Credentials(
    "NOT-A-KEY", good.secret_key)), 403, "InvalidAccessKeyId")
r = signed("PUT", key, b"x", unsigned_payload=True)
r[2]["x-amz-meta-added"] = "after signing"
expect("PUT with an unsigned x-amz- header", r, 403, "AccessDenied")
r = signed("PUT", key, b"x", unsigned_payload=True)
del r[2]["Authorization"]
expect("PUT without Authorization", r, 403, "AccessDenied")
r = signed("GET", key)  # five minutes earlier: within S3's 15-minute skew, but not signed
r[2]["X-Amz-Date"] = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - 300))
expect("GET with a date changed after signing", r, 403, "SignatureDoesNotMatch")

# None of the refused writes reached s3rver: the object is still the first PUT's bytes.
status, body = send(*signed("GET", key))
if (status, body.encode()) != (200, data):
    failures.append(f"after the refused requests GET gives {status} {body[:60]!r}, not the "
                    "first PUT's bytes")
else:
    print("ok: the refused requests changed nothing")
expect("DELETE", signed("DELETE", key), 204)
expect("GET after DELETE", signed("GET", key), 404, "NoSuchKey")

for f in failures:
    print("FAIL: " + f)
sys.exit(1 if failures else 0)
