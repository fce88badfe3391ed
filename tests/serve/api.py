#!/usr/bin/python3
"""Checks of a running `jumbo serve`'s OpenAI API with the standard library (http.client,
socket, ssl) and prometheus_client's parser.

  api.py plain PORT EXPECT.json --stderr ERR --ids IDS
      a server without flags: the bug fixes (the first token's leading space, a stop equal
      to the first token, deep nesting, 413/414/431), 404/405, unique random ids (written to
      IDS), prompt limits, /tokenize and /detokenize, the new /v1/completions fields, no CORS
      header, chat refused without a template, /metrics, the access log in ERR
  api.py full PORT EXPECT.json --stderr ERR --ids IDS --other-ids IDS0
      a server with --api-key $JUMBO_API_KEY, --api-key-file (holding $JUMBO_API_KEY2),
      --chat-template and --cors-origin http://example.test / http://other.test: auth, CORS,
      chat, ids unlike the other server's, /metrics behind the key
  api.py tls PORT EXPECT.json --cafile CERT
      a server with --tls-cert/--tls-key: /health, a completion and a stream over https
EXPECT.json is what serve_api.sh builds from `jumbo generate --json`. Prints one FAIL line per
failure and exits 1 if there was one.

The checks live beside this file: api_support.py (HTTP, sockets, fail()), api_fixes.py (the
bug fixes, limits, routes and ids) and api_features.py (tokenize, the completion fields, CORS,
auth, chat, /metrics, the access log, https).
"""
import argparse
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree

from api_features import (check_access_log, check_auth, check_chat,  # noqa: E402
                          check_chat_refused, check_cors, check_fields, check_metrics,
                          check_no_cors, check_tls, check_tokenize)
from api_fixes import (check_deep_nesting, check_ids, check_leading_space,  # noqa: E402
                       check_limits, check_prompt_limits, check_routes, check_stop_first_token)
from api_support import A, fail, failures, health  # noqa: E402


def run(name, check):
    """One check; an exception in it is one failure, and the next check still runs."""
    try:
        check()
    except Exception as e:
        fail(f"{name}: {type(e).__name__}: {e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["plain", "full", "tls"])
    ap.add_argument("port", type=int)
    ap.add_argument("expect_path", metavar="EXPECT.json")
    ap.add_argument("--stderr")
    ap.add_argument("--ids")
    ap.add_argument("--other-ids")
    ap.add_argument("--cafile")
    ap.parse_args(namespace=A)
    A.key = os.environ.get("JUMBO_API_KEY") if A.mode == "full" else None
    A.expect = json.load(open(A.expect_path))
    A.model = A.expect["model"]
    if A.mode == "plain":
        # Deep nesting last: an old server dies of it, and the other checks still tell.
        checks = [check_routes, check_tokenize, check_leading_space, check_stop_first_token,
                  check_fields, check_prompt_limits, check_limits, check_no_cors,
                  check_chat_refused, check_metrics, check_ids, check_access_log,
                  check_deep_nesting]
    elif A.mode == "full":
        checks = [check_auth, check_cors, check_chat, check_routes, check_limits, check_ids]
    else:
        checks = [check_tls]
    for check in checks:
        run(check.__name__, check)
    run("health at the end", health)
    print(f"api.py {A.mode}: {'FAILED ' + str(len(failures)) if failures else 'ok'}", flush=True)
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
