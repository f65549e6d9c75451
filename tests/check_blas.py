#!/usr/bin/env python3
"""Runs minicp under a chosen OPENBLAS_CORETYPE setting (set, or removed from the environment)
and checks what it says and records about its BLAS: the start-up line names the core that
runs, the results file records the same core and where it came from (check_results.py
--blas-* flags), and a warning is printed exactly when the core is below what the CPU offers
(--warning yes|no|any).
Usage: check_blas.py --out FILE.h5 [--env NAME=VALUE] [--unset NAME] [--warning yes|no|any]
                     [--check ARG ...] -- MPIRUN... MINICP [ARGS...]"""
import argparse
import os
import re
import subprocess
import sys

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE set for the run")
    ap.add_argument("--unset", action="append", default=[], help="NAME removed from the run's environment")
    ap.add_argument("--warning", choices=["yes", "no", "any"], default="any")
    ap.add_argument("--check", action="append", default=[], help="an argument for check_results.py")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    env = dict(os.environ)
    for name in args.unset + ["MINICP_BLAS_SELECTED"]:
        env.pop(name, None)
    for kv in args.env:
        k, v = kv.split("=", 1)
        env[k] = v
    if os.path.exists(args.out):
        os.remove(args.out)
    p = subprocess.run(cmd + ["--out", args.out], env=env, capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    fails = []
    if p.returncode != 0:
        fails.append(f"exit code {p.returncode}:\n{out}")
    m = re.search(r"BLAS OpenBLAS [0-9.]+, core (\w+) \(([^)]*\)?)\)", out)
    if not m:
        fails.append(f"the start-up line names no OpenBLAS core:\n{out[:2000]}")
    warned = "WARNING: OpenBLAS runs the" in out
    if args.warning != "any" and warned != (args.warning == "yes"):
        fails.append(f"warning printed: {warned}, expected {args.warning}:\n{out[:2000]}")
    if not fails:
        with h5py.File(args.out, "r") as f:
            core = f.attrs["blas_core"]
            core = core.decode() if isinstance(core, bytes) else str(core)
        if core != m.group(1):
            fails.append(f"start-up line says core {m.group(1)}, the file records {core}")
        c = subprocess.run([sys.executable, os.path.join(HERE, "check_results.py"), args.out, "--complete"] +
                           args.check, capture_output=True, text=True)
        if c.returncode != 0:
            fails.append("check_results.py: " + c.stdout + c.stderr)
        print(f"check_blas: core {m.group(1)} ({m.group(2)}); warning printed: {warned}")
    for x in fails:
        print("FAIL:", x)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
