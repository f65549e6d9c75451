#!/usr/bin/env python3
"""Runs a command and passes only if it exits with exactly the expected code, its output
(stdout + stderr) contains every expected text, and the file system is as expected after it.
Usage: expect_exit_code.py --code N [options] -- COMMAND [ARGS...]
(write --contains=TEXT with "=" when TEXT starts with a dash).

Output:
  --contains=TEXT   TEXT appears in the output
  --once=TEXT       TEXT appears exactly once (a message printed by one rank only)
  --lacks=TEXT      TEXT does not appear (e.g. a line the program prints when work starts)
  --within=SECONDS  the command ends within SECONDS (refused at once, not after allocating);
                    one still running 10 s later is killed (with every process it started)
Set-up, before the command runs (in this order):
  --make-dir=PATH   PATH is made an empty directory (parents created; an old one removed)
  --make-file=PATH  PATH is made a file holding a fixed text (parents created)
  --make-fifo=PATH  PATH is made a FIFO (a named pipe: opening it to read blocks)
  --make-sparse=PATH:BYTES  PATH is made a file of BYTES zero bytes (sparse: takes no room)
  --copy=SRC:DST[:BYTES]  DST is made a copy of SRC (parents created), cut to its first BYTES
                    bytes when given (a truncated file)
  --symlink=TARGET:LINK, --hardlink=TARGET:LINK  LINK is made a symbolic (hard) link to TARGET
Checks, after it ran:
  --absent=PATH     PATH does not exist (checked before the run too)
  --unchanged=PATH  PATH is as before the run: a file's bytes, a directory's entries
                    (recursively, names and file contents; a link as a link, a FIFO as one),
                    or still absent"""
import argparse
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

OLD_TEXT = b"an old result that a refused run must leave alone\n"


def snapshot(path):
    """What --unchanged compares: None (absent), a file's bytes (their hash past 1 MiB), a
    link's target, another kind of file's kind, or a sorted tree of entries."""
    if os.path.islink(path):
        return f"symbolic link to {os.readlink(path)}"
    if os.path.isdir(path):
        return sorted((name, snapshot(os.path.join(path, name))) for name in os.listdir(path))
    if not os.path.lexists(path):
        return None
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):  # never opened: a FIFO would block
        return f"not a regular file (mode {stat.S_IFMT(st.st_mode):o})"
    try:
        with open(path, "rb") as f:
            if st.st_size <= 1 << 20:
                return f.read()
            h = hashlib.sha256()
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return f"{st.st_size} bytes, sha256 {h.hexdigest()}"
    except OSError as e:
        return f"unreadable: {e}"


def run(cmd, within):
    """(exit code, output, seconds); past within + 10 s the command is killed, and every
    process it started (mpirun gives each rank a process group of its own)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = p.communicate(timeout=None if within is None else within + 10)[0]
    except subprocess.TimeoutExpired:
        from check_resume import descendants  # here only: it loads h5py, which the other runs need not

        for q in reversed(descendants(p.pid)):
            try:
                os.kill(q, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out = p.communicate()[0] + f"\n(killed: still running after {within + 10:g} s)\n"
    return p.returncode, out, time.monotonic() - t0


def make_parent(path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def parse_args():
    """The options and the command after them; no command is a usage error (exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", type=int, required=True)
    ap.add_argument("--contains", action="append", default=[])
    ap.add_argument("--once", action="append", default=[])
    ap.add_argument("--lacks", action="append", default=[])
    ap.add_argument("--within", type=float)
    ap.add_argument("--make-dir", action="append", default=[])
    ap.add_argument("--make-file", action="append", default=[])
    ap.add_argument("--make-fifo", action="append", default=[])
    ap.add_argument("--make-sparse", action="append", default=[])
    ap.add_argument("--copy", action="append", default=[])
    ap.add_argument("--symlink", action="append", default=[])
    ap.add_argument("--hardlink", action="append", default=[])
    ap.add_argument("--absent", action="append", default=[])
    ap.add_argument("--unchanged", action="append", default=[])
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given")
    return args, cmd


def set_up(args):
    """The --make-*, --copy and link set-up, in the order the usage gives."""
    for d in args.make_dir:
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    for f in args.make_file:
        make_parent(f)
        with open(f, "wb") as out:
            out.write(OLD_TEXT)
    for f in args.make_fifo:
        make_parent(f)
        os.mkfifo(f)
    for s in args.make_sparse:
        path, size = s.rsplit(":", 1)
        make_parent(path)
        with open(path, "wb") as out:
            out.truncate(int(size))
    for c in args.copy:
        src, dst, *cut = c.split(":")
        make_parent(dst)
        with open(src, "rb") as f:
            data = f.read()
        with open(dst, "wb") as out:
            out.write(data[:int(cut[0])] if cut else data)
    for links, make in ((args.symlink, os.symlink), (args.hardlink, os.link)):
        for pair in links:
            target, link = pair.split(":")
            make_parent(link)
            make(target, link)


def output_ok(args, code, output, seconds):
    """The exit code, the output's texts and the time; prints a FAIL line for each miss."""
    ok = True
    if code != args.code:
        print(f"FAIL: exit code {code}, expected {args.code}")
        ok = False
    for text in args.contains:
        if text not in output:
            print(f"FAIL: output does not contain {text!r}")
            ok = False
    for text in args.once:
        n = output.count(text)
        if n != 1:
            print(f"FAIL: output contains {text!r} {n} times, expected once")
            ok = False
    for text in args.lacks:
        if text in output:
            print(f"FAIL: output contains {text!r}")
            ok = False
    if args.within is not None and seconds > args.within:
        print(f"FAIL: took {seconds:.1f} s, expected at most {args.within:g} s")
        ok = False
    return ok


def files_ok(args, before):
    """--absent and --unchanged after the run; prints a FAIL line for each miss."""
    ok = True
    for path in args.absent:
        if os.path.lexists(path):
            print(f"FAIL: {path} exists after the run")
            ok = False
    for path, snap in before.items():
        after = snapshot(path)
        if after != snap:
            print(f"FAIL: {path} changed: before {snap!r}, after {after!r}")
            ok = False
    return ok


def main():
    args, cmd = parse_args()
    set_up(args)
    ok = True
    for p in args.absent:
        if os.path.lexists(p):
            print(f"FAIL: set-up: {p} exists before the run")
            ok = False
    before = {p: snapshot(p) for p in args.unchanged}
    code, output, seconds = run(cmd, args.within)
    sys.stdout.write(output)
    # Both always run (not short-circuited), so every miss is printed.
    ok = output_ok(args, code, output, seconds) and ok
    ok = files_ok(args, before) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
