#!/usr/bin/env python3
"""Checks a CloudWatch Embedded Metric Format file, one JSON object per line.

usage: python3 tests/obs/validate_emf.py FILE [--expect-metrics Loss,TokensPerSecond,...]

Prints one line per problem ("FILE:LINE: ...") and exits 1 if there is any; otherwise prints
"N lines ok". --expect-metrics names metrics every line must declare and carry.
The rules are those of the EMF specification (docs.aws.amazon.com, "Specification: Embedded
metric format"); docs/metrics.md says which of them jumbo's lines rely on. Standard library only.
"""
import argparse
import json
import math
import sys

UNITS = {
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes",
    "Terabytes", "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count",
    "Bytes/Second", "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second",
    "Terabytes/Second", "Bits/Second", "Kilobits/Second", "Megabits/Second", "Gigabits/Second",
    "Terabits/Second", "Count/Second", "None",
}
MAX_METRICS = 100          # per directive
MAX_DIMENSION_KEYS = 30    # per dimension set
MAX_VALUES = 100           # values in one metric's array
MAX_LINE_BYTES = 256 * 1024  # a CloudWatch Logs event


def reject_constant(name):
    # Python's json accepts NaN and Infinity; JSON (and CloudWatch) does not.
    raise ValueError(f"{name} is not JSON")


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_directive(obj, d, problems):
    """Problems of one CloudWatchMetrics entry; returns the metric names it declares."""
    if not isinstance(d, dict):
        problems.append("a CloudWatchMetrics entry is not an object")
        return []
    ns = d.get("Namespace")
    if not isinstance(ns, str) or not 1 <= len(ns) <= 255:
        problems.append(f"Namespace {ns!r}: expected a string of 1 to 255 characters")
    dims = d.get("Dimensions")
    if not isinstance(dims, list):
        problems.append("Dimensions: expected an array of dimension sets")
        dims = []
    for dset in dims:
        if not isinstance(dset, list) or not all(isinstance(k, str) for k in dset):
            problems.append(f"dimension set {dset!r}: expected an array of strings")
            continue
        if len(dset) > MAX_DIMENSION_KEYS:
            problems.append(f"dimension set has {len(dset)} keys: at most {MAX_DIMENSION_KEYS}")
        for key in dset:
            value = obj.get(key)
            if not isinstance(value, str):
                problems.append(f"dimension {key!r}: expected a string member, found {value!r}")
            elif not value.strip() or len(value) > 1024 or not value.isascii():
                problems.append(f"dimension {key!r} = {value!r}: expected 1 to 1024 ASCII "
                                "characters, not blank")
    metrics = d.get("Metrics")
    if not isinstance(metrics, list):
        problems.append("Metrics: expected an array")
        return []
    if len(metrics) > MAX_METRICS:
        problems.append(f"{len(metrics)} metrics in one directive: at most {MAX_METRICS}")
    names = []
    for m in metrics:
        name = m.get("Name") if isinstance(m, dict) else None
        if not isinstance(name, str) or not 1 <= len(name) <= 1024:
            problems.append(f"metric {m!r}: expected a Name of 1 to 1024 characters")
            continue
        if name in names:
            problems.append(f"metric {name!r} declared twice")
        names.append(name)
        if "Unit" in m and m["Unit"] not in UNITS:
            problems.append(f"metric {name!r}: unit {m['Unit']!r} is not a CloudWatch unit")
        if "StorageResolution" in m and m["StorageResolution"] not in (1, 60):
            problems.append(f"metric {name!r}: StorageResolution must be 1 or 60")
        value = obj.get(name)
        values = value if isinstance(value, list) else [value]
        if name not in obj:
            problems.append(f"metric {name!r} declared but has no value member")
        elif not values or len(values) > MAX_VALUES or not all(is_number(v) for v in values):
            problems.append(f"metric {name!r} = {value!r}: expected a finite number "
                            f"(or an array of 1 to {MAX_VALUES})")
    return names


def check_line(line, expect):
    """The problems of one line, as strings."""
    problems = []
    if len(line.encode()) > MAX_LINE_BYTES:
        problems.append(f"{len(line.encode())} bytes: a log event holds at most {MAX_LINE_BYTES}")
    try:
        obj = json.loads(line, parse_constant=reject_constant)
    except ValueError as e:
        return [f"not JSON: {e}"]
    if not isinstance(obj, dict):
        return ["not a JSON object"]
    aws = obj.get("_aws")
    if not isinstance(aws, dict):
        return ["no _aws object"]
    ts = aws.get("Timestamp")
    if not isinstance(ts, int) or isinstance(ts, bool) or ts <= 0:
        problems.append(f"_aws.Timestamp {ts!r}: expected milliseconds since the epoch, an integer")
    elif not 946684800000 <= ts <= 4102444800000:  # 2000 .. 2100: seconds would fail this
        problems.append(f"_aws.Timestamp {ts}: not milliseconds since the epoch")
    directives = aws.get("CloudWatchMetrics")
    if not isinstance(directives, list) or not directives:
        problems.append("_aws.CloudWatchMetrics: expected a non-empty array")
        directives = []
    declared = []
    for d in directives:
        declared += check_directive(obj, d, problems)
    for name in expect:
        if name not in declared:
            problems.append(f"expected metric {name!r} is not declared")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--expect-metrics", default="",
                        help="comma-separated metric names every line must declare")
    args = parser.parse_args()
    expect = [n for n in args.expect_metrics.split(",") if n]
    try:
        with open(args.file, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        print(f"{args.file}: cannot read: {e}")
        return 1
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    problems = 0
    for number, line in enumerate(lines, 1):
        found = check_line(line, expect) if line.strip() else ["blank line"]
        if number == len(lines) and not text.endswith("\n"):
            found.append("no newline at the end: the agent waits for one")
        for p in found:
            print(f"{args.file}:{number}: {p}")
            problems += 1
    if not lines:
        print(f"{args.file}: empty: no EMF lines")
        problems += 1
    if problems:
        return 1
    print(f"{len(lines)} lines ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
