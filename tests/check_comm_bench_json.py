#!/usr/bin/env python3
"""Checks a minicp-comm-bench --json file: the expected rank count, every op present with
at least one size, busbw/algbw >= 0, time > 0, and no wrong elements anywhere.
Usage: check_comm_bench_json.py FILE --ranks N [--ops op1,op2,...]"""
import argparse
import json
import math
import sys

ALL_OPS = ["pingpong", "sendrecv", "alltoall", "allgather", "reduce_scatter", "allreduce"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("file")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--ops", default=",".join(ALL_OPS))
    args = ap.parse_args()
    want = [o for o in args.ops.split(",") if o]
    errors = []
    try:
        with open(args.file) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{args.file}: cannot read JSON: {e}")
        return 1
    for key in ("backend", "ranks", "progress", "results"):
        if key not in doc:
            errors.append(f"missing key '{key}'")
    if doc.get("ranks") != args.ranks:
        errors.append(f"ranks = {doc.get('ranks')}, expected {args.ranks}")
    if doc.get("progress") not in ("none", "thread"):
        errors.append(f"progress = {doc.get('progress')!r}")
    results = doc.get("results", [])
    seen = {}
    for i, r in enumerate(results):
        where = f"results[{i}] ({r.get('op')}, {r.get('bytes')} B)"
        for key in ("op", "bytes", "count", "time_us", "algbw_GBps", "busbw_GBps", "wrong"):
            if key not in r:
                errors.append(f"{where}: missing '{key}'")
        if r.get("op") not in ALL_OPS:
            errors.append(f"{where}: unknown op")
        seen[r.get("op")] = seen.get(r.get("op"), 0) + 1
        for key in ("algbw_GBps", "busbw_GBps"):
            v = r.get(key)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                errors.append(f"{where}: {key} = {v!r}, expected a number >= 0")
        t = r.get("time_us")
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            errors.append(f"{where}: time_us = {t!r}, expected > 0")
        if r.get("wrong") != 0:
            errors.append(f"{where}: wrong = {r.get('wrong')!r}, expected 0")
    for op in want:
        if not seen.get(op):
            errors.append(f"op '{op}' has no results")
    for e in errors:
        print(f"{args.file}: {e}")
    if not errors:
        print(f"{args.file}: ok, {len(results)} results, ops: {', '.join(sorted(seen))}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
