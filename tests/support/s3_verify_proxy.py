#!/usr/bin/env python3
"""A loopback HTTP proxy in front of s3rver that checks every request's AWS Signature V4.

s3rver accepts any signature, so a wrong SigV4 in jumbo's S3 client would pass every test.
This proxy recomputes each request's signature with botocore's own signer (S3SigV4Auth),
refuses what real S3 would refuse (403 SignatureDoesNotMatch and friends, S3's XML error
body, one line on stderr) and forwards the rest to s3rver unchanged, relaying its answer.

Usage: s3_verify_proxy.py --upstream http://127.0.0.1:PORT --port-file FILE
         --access-key ID --secret-key KEY [--region R] [--bucket NAME]...
It listens on a free loopback port (the kernel's pick) and writes that port to FILE once it
accepts connections. tests/support/s3rver.sh starts it.
"""
import argparse
import datetime
import hashlib
import hmac
import http.client
import http.server
import os
import re
import sys
import urllib.parse
import uuid
from xml.sax.saxutils import escape

try:
    from botocore.auth import SIGV4_TIMESTAMP, UNSIGNED_PAYLOAD, S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.compat import HTTPHeaders
    from botocore.credentials import Credentials
except ImportError as e:
    sys.exit(f"s3_verify_proxy: error: botocore is needed ({e}): pip install botocore "
             "or apt-get install python3-botocore")

# Not forwarded either way: they describe one connection, not the request.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
              "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "expect"}
MAX_SKEW = datetime.timedelta(minutes=15)  # S3's limit on the X-Amz-Date clock difference
HEX64 = re.compile(r"[0-9a-f]{64}")


class Refusal(Exception):
    """An S3 error answer: status, Code, Message, a one-line detail for the log, and extra
    elements for the XML body (S3 puts the StringToSign and CanonicalRequest there)."""

    def __init__(self, status, code, message, detail="", **extra):
        super().__init__(code)
        self.status, self.code, self.message, self.detail, self.extra = (
            status, code, message, detail, extra)

    def xml(self):
        parts = [f"<Code>{self.code}</Code>", f"<Message>{escape(self.message)}</Message>"]
        parts += [f"<{k}>{escape(str(v))}</{k}>" for k, v in self.extra.items()]
        parts.append(f"<RequestId>{uuid.uuid4().hex[:16].upper()}</RequestId>")
        return ('<?xml version="1.0" encoding="UTF-8"?>\n<Error>' + "".join(parts) +
                "</Error>").encode()


def malformed(detail):
    return Refusal(400, "AuthorizationHeaderMalformed", "The authorization header is "
                   "malformed; " + detail, detail)


class ClientSignedHeaders(S3SigV4Auth):
    """botocore's S3 signer, canonicalising exactly the headers the client listed.

    botocore picks the headers itself (all but a deny list) because it signs requests it
    builds; a verifier has to take the client's SignedHeaders instead."""

    def __init__(self, credentials, region, signed):
        super().__init__(credentials, "s3", region)
        self._signed = signed

    def headers_to_sign(self, request):
        out = HTTPHeaders()
        for name in self._signed:
            for value in request.headers.get_all(name, []):
                out[name] = value
        return out


class Verifier:
    def __init__(self, access_key, secret_key, region, buckets, token=None):
        self.credentials = Credentials(access_key, secret_key, token)
        self.region = region
        self.buckets = set(buckets)

    def verify(self, method, target, headers, body):
        """Returns nothing for a request S3 would accept; raises Refusal otherwise."""
        path, _, query = target.partition("?")
        bucket = urllib.parse.unquote(path.lstrip("/").split("/", 1)[0])
        if self.buckets and bucket and bucket not in self.buckets:
            # S3 looks the bucket up before the signature; s3rver has only these buckets.
            raise Refusal(404, "NoSuchBucket", "The specified bucket does not exist",
                          f"bucket {bucket!r}", BucketName=bucket)
        auth = headers.get("Authorization")
        if not auth:
            raise Refusal(403, "AccessDenied", "Access Denied", "no Authorization header")
        scheme, _, rest = auth.partition(" ")
        if scheme != "AWS4-HMAC-SHA256":
            raise Refusal(400, "InvalidArgument", "Unsupported Authorization Type",
                          f"scheme {scheme!r}, not AWS4-HMAC-SHA256")
        fields = {}
        for item in rest.split(","):
            name, eq, value = item.strip().partition("=")
            if eq:
                fields[name] = value
        missing = [f for f in ("Credential", "SignedHeaders", "Signature") if f not in fields]
        if missing:
            raise malformed("it lacks " + ", ".join(missing))
        scope = fields["Credential"].split("/")
        if len(scope) != 5:
            raise malformed(f"Credential {fields['Credential']!r} is not "
                            "KEY/DATE/REGION/SERVICE/aws4_request")
        key_id, date, region, service, terminator = scope
        if key_id != self.credentials.access_key:
            raise Refusal(403, "InvalidAccessKeyId", "The AWS Access Key Id you provided "
                          "does not exist in our records.", f"access key {key_id!r}",
                          AWSAccessKeyId=key_id)
        if region != self.region:
            raise malformed(f"the region '{region}' is wrong; expecting '{self.region}'")
        if service != "s3" or terminator != "aws4_request":
            raise malformed(f"the scope ends {service}/{terminator}, not s3/aws4_request")
        amz_date = headers.get("X-Amz-Date", "")
        try:
            when = datetime.datetime.strptime(amz_date, SIGV4_TIMESTAMP).replace(
                tzinfo=datetime.timezone.utc)
        except ValueError:
            raise Refusal(403, "AccessDenied", "AWS authentication requires a valid Date or "
                          "x-amz-date header", f"X-Amz-Date {amz_date!r}") from None
        if date != amz_date[:8]:
            raise malformed("Invalid credential date. Date is not the same as X-Amz-Date.")
        if abs(datetime.datetime.now(datetime.timezone.utc) - when) > MAX_SKEW:
            raise Refusal(403, "RequestTimeTooSkewed", "The difference between the request "
                          "time and the current time is too large.", f"X-Amz-Date {amz_date}")
        token = headers.get("X-Amz-Security-Token")
        if token is not None and token != self.credentials.token:
            raise Refusal(403, "InvalidToken", "The provided token is malformed or otherwise "
                          "invalid.", "an unknown X-Amz-Security-Token")
        signed = fields["SignedHeaders"].split(";")
        present = {name.lower() for name in headers.keys()}
        # S3 wants the host and every x-amz-* header the request carries signed.
        unsigned = sorted(n for n in present if n == "host" or n.startswith("x-amz-"))
        unsigned = [n for n in unsigned if n not in signed]
        if unsigned:
            raise Refusal(403, "AccessDenied", "There were headers present in the request "
                          "which were not signed", "unsigned: " + ", ".join(unsigned),
                          HeadersNotSigned=", ".join(unsigned))
        absent = [n for n in signed if n.lower() not in present]
        payload = headers.get("X-Amz-Content-SHA256")
        if payload is None:
            raise Refusal(400, "InvalidRequest", "Missing required header for this request: "
                          "x-amz-content-sha256", "no x-amz-content-sha256")
        if payload != UNSIGNED_PAYLOAD:
            if not HEX64.fullmatch(payload):
                raise Refusal(400, "InvalidArgument", "x-amz-content-sha256 must be "
                              "UNSIGNED-PAYLOAD or a SHA-256 hex digest", f"{payload!r} "
                              "(chunk-signed streaming uploads are not supported here)")
            actual = hashlib.sha256(body).hexdigest()
            if actual != payload:
                raise Refusal(400, "XAmzContentSHA256Mismatch", "The provided "
                              "'x-amz-content-sha256' header does not match what was "
                              "computed.", f"body sha256 {actual}, header {payload}",
                              ClientComputedContentSHA256=payload,
                              S3ComputedContentSHA256=actual)

        # S3 signs the decoded path and query re-encoded once (RFC 3986), the query sorted;
        # botocore's S3 signer does the rest (no path normalisation, canonical headers).
        canonical_path = urllib.parse.quote(urllib.parse.unquote(path), safe="/~") or "/"
        params = []
        for pair in filter(None, query.split("&")):
            name, _, value = pair.partition("=")
            params.append((urllib.parse.unquote(name), urllib.parse.unquote(value)))
        request = AWSRequest(method=method, url="http://verifier" + canonical_path,
                             params=params)
        for name, value in headers.items():
            request.headers[name] = value
        request.context["timestamp"] = amz_date
        signer = ClientSignedHeaders(self.credentials, self.region, signed)
        canonical = signer.canonical_request(request)
        string_to_sign = signer.string_to_sign(request, canonical)
        expected = signer.signature(string_to_sign, request)
        if not hmac.compare_digest(expected, fields["Signature"]):
            detail = (f"signed headers {fields['SignedHeaders']}, expected signature "
                      f"{expected[:16]}..., got {fields['Signature'][:16]}...")
            if absent:
                detail += "; signed but absent: " + ", ".join(absent)
            raise Refusal(403, "SignatureDoesNotMatch", "The request signature we calculated "
                          "does not match the signature you provided. Check your key and "
                          "signing method.", detail, AWSAccessKeyId=key_id,
                          StringToSign=string_to_sign, SignatureProvided=fields["Signature"],
                          CanonicalRequest=canonical)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client reuses its connections
    timeout = 300  # an idle client connection's thread ends after this

    def setup(self):
        super().setup()
        self.upstream = None  # one s3rver connection per client connection

    def finish(self):
        if self.upstream:
            self.upstream.close()
        super().finish()

    def log_message(self, format, *args):  # only refusals are logged, in refuse()
        pass

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def handle_any(self):
        try:
            body = self.read_body()
        except ValueError:
            self.refuse(Refusal(400, "BadRequest", "An error occurred when parsing the HTTP "
                                "request.", "a bad Content-Length or chunk size"))
            self.close_connection = True
            return
        try:
            self.server.verifier.verify(self.command, self.path, self.headers, body)
        except Refusal as r:
            self.refuse(r)
            return
        self.forward(body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_any

    def refuse(self, r):
        detail = " ".join(r.detail.split())  # one log line whatever went into it
        print(f"s3_verify_proxy: refused {self.command} {self.path}: {r.status} {r.code}"
              f"{': ' + detail if detail else ''}", file=sys.stderr, flush=True)
        body = r.xml()
        self.send_response(r.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def exchange(self, body):
        host, port = self.server.upstream
        if self.upstream is None:
            self.upstream = http.client.HTTPConnection(host, port, timeout=120)
        conn = self.upstream
        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", f"{host}:{port}")
        for name, value in self.headers.items():
            if name.lower() not in HOP_BY_HOP | {"host", "content-length"}:
                conn.putheader(name, value)
        if body or self.command in ("PUT", "POST"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return resp, resp.read()

    def forward(self, body):
        try:
            try:
                resp, data = self.exchange(body)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # s3rver closed an idle keep-alive connection: resend once on a new one.
                self.upstream.close()
                self.upstream = None
                resp, data = self.exchange(body)
        except (OSError, http.client.HTTPException) as e:
            if self.upstream:
                self.upstream.close()
                self.upstream = None
            self.refuse(Refusal(502, "BadGateway", f"s3rver did not answer: {e}", str(e)))
            return
        if resp.will_close:
            self.upstream.close()
            self.upstream = None
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.getheaders():
            if name.lower() not in HOP_BY_HOP | {"content-length"}:
                self.send_header(name, value)
        if self.command == "HEAD":  # no body, but the length of the one a GET would get
            if resp.getheader("Content-Length") is not None:
                self.send_header("Content-Length", resp.getheader("Content-Length"))
        elif resp.status not in (204, 304):
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many ranks may connect at once


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--upstream", required=True, help="s3rver's URL, http://HOST:PORT")
    p.add_argument("--port-file", required=True, help="where to write the port listened on")
    p.add_argument("--access-key", required=True)
    p.add_argument("--secret-key", required=True)
    p.add_argument("--session-token", default=None)
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--bucket", action="append", default=[],
                   help="a bucket s3rver has (repeat); others are NoSuchBucket")
    args = p.parse_args()
    up = urllib.parse.urlsplit(args.upstream)
    if up.scheme != "http" or not up.hostname or not up.port:
        sys.exit(f"s3_verify_proxy: error: --upstream {args.upstream}: expected "
                 "http://HOST:PORT")
    server = Server(("127.0.0.1", 0), Handler)
    server.upstream = (up.hostname, up.port)
    server.verifier = Verifier(args.access_key, args.secret_key, args.region, args.bucket,
                               args.session_token)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:  # renamed into place: a reader never sees half a number
        f.write(f"{server.server_address[1]}\n")
    os.replace(tmp, args.port_file)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
