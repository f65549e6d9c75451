#!/usr/bin/env python3
"""Runs a command and passes only if it exits with exactly the expected code and its
output (stdout + stderr) contains every expected text.
Usage: expect_exit_code.py --code N [--contains=TEXT]... -- COMMAND [ARGS...]
(write --contains=TEXT with "=" when TEXT starts with a dash)."""
import argparse
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--code", type=int, required=True)
    ap.add_argument("--contains", action="append", default=[])
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(p.stdout)
    ok = True
    if p.returncode != args.code:
        print(f"FAIL: exit code {p.returncode}, expected {args.code}")
        ok = False
    for text in args.contains:
        if text not in p.stdout:
            print(f"FAIL: output does not contain {text!r}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
