#!/usr/bin/env python3
"""Runs a command and passes only if it exits with exactly the expected code, its output
(stdout + stderr) contains every expected text, and the file system is as expected after it.
Usage: expect_exit_code.py --code N [options] -- COMMAND [ARGS...]
(write --contains=TEXT with "=" when TEXT starts with a dash).

Output:
  --contains=TEXT   TEXT appears in the output
  --once=TEXT       TEXT appears exactly once (a message printed by one rank only)
  --lacks=TEXT      TEXT does not appear (e.g. a line the program prints when work starts)
  --within=SECONDS  the command ends within SECONDS (refused at once, not after allocating)
Set-up, before the command runs:
  --make-dir=PATH   PATH is made an empty directory (parents created; an old one removed)
  --make-file=PATH  PATH is made a file holding a fixed text (parents created)
  --copy=SRC:DST[:BYTES]  DST is made a copy of SRC (parents created), cut to its first BYTES
                    bytes when given (a truncated file)
Checks, after it ran:
  --absent=PATH     PATH does not exist (checked before the run too)
  --unchanged=PATH  PATH is as before the run: a file's bytes, a directory's entries
                    (recursively, names and file contents), or still absent"""
import argparse
import os
import shutil
import subprocess
import sys
import time

OLD_TEXT = b"an old result that a refused run must leave alone\n"


def snapshot(path):
    """What --unchanged compares: None (absent), bytes (file) or a sorted tree of entries."""
    if os.path.isdir(path) and not os.path.islink(path):
        return sorted((name, snapshot(os.path.join(path, name))) for name in os.listdir(path))
    if os.path.lexists(path):
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            return f"unreadable: {e}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", type=int, required=True)
    ap.add_argument("--contains", action="append", default=[])
    ap.add_argument("--once", action="append", default=[])
    ap.add_argument("--lacks", action="append", default=[])
    ap.add_argument("--within", type=float)
    ap.add_argument("--make-dir", action="append", default=[])
    ap.add_argument("--make-file", action="append", default=[])
    ap.add_argument("--copy", action="append", default=[])
    ap.add_argument("--absent", action="append", default=[])
    ap.add_argument("--unchanged", action="append", default=[])
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given")
    for d in args.make_dir:
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    for f in args.make_file:
        os.makedirs(os.path.dirname(os.path.abspath(f)), exist_ok=True)
        with open(f, "wb") as out:
            out.write(OLD_TEXT)
    for c in args.copy:
        src, dst, *cut = c.split(":")
        os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
        with open(src, "rb") as f:
            data = f.read()
        with open(dst, "wb") as out:
            out.write(data[:int(cut[0])] if cut else data)
    ok = True
    for p in args.absent:
        if os.path.lexists(p):
            print(f"FAIL: set-up: {p} exists before the run")
            ok = False
    before = {p: snapshot(p) for p in args.unchanged}
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.monotonic() - t0
    sys.stdout.write(p.stdout)
    if p.returncode != args.code:
        print(f"FAIL: exit code {p.returncode}, expected {args.code}")
        ok = False
    for text in args.contains:
        if text not in p.stdout:
            print(f"FAIL: output does not contain {text!r}")
            ok = False
    for text in args.once:
        n = p.stdout.count(text)
        if n != 1:
            print(f"FAIL: output contains {text!r} {n} times, expected once")
            ok = False
    for text in args.lacks:
        if text in p.stdout:
            print(f"FAIL: output contains {text!r}")
            ok = False
    if args.within is not None and seconds > args.within:
        print(f"FAIL: took {seconds:.1f} s, expected at most {args.within:g} s")
        ok = False
    for path in args.absent:
        if os.path.lexists(path):
            print(f"FAIL: {path} exists after the run")
            ok = False
    for path, snap in before.items():
        after = snapshot(path)
        if after != snap:
            print(f"FAIL: {path} changed: before {snap!r}, after {after!r}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
