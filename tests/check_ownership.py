#!/usr/bin/env python3
"""A minicp run owns its output files (docs/results-file.md). Modes:
  lock       while a run writes --out FILE and --dump D (its ranks held stopped, so that it is
             surely running), a second run given FILE, and a third given D, are refused at once:
             exit 2, one message naming the holder (pid of its rank 0, host). The first run then
             ends normally with its own deck and cases only, and no lock file stays behind.
  links      while a run writes FILE (held stopped, as in `lock`), a second run given a symbolic
             link to FILE is refused as FILE's lock holder, and a third given a hard link to FILE
             (a second name of its file) is refused naming the hard links. A run given the
             symbolic link afterwards writes FILE through it: the link stays a link.
  stale      temporaries left by runs killed in a transaction (FILE.tmp.<pid>, D.tmp.<pid>) and a
             lock file left by a dead run are removed by the next run of FILE; files that only
             look alike stay.
  disk-full  a transaction whose copy fills the disk (--resume of a file larger than a 300 KiB
             tmpfs, marked unfinished so that it is resumed, --out on it) is reported once, naming the file and "No space left on
             device", and leaves no temporary and no half-written FILE; exit 77 (a skip) where a
             tmpfs cannot be mounted.
Usage: check_ownership.py --mode MODE --dir DIR -- MPIRUN... MINICP --deck ... [--set ...]"""
import argparse
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import h5py

from check_resume import descendants

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77
TMPFS = "300k"


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    sys.stdout.write(r.stdout)
    return r


def ranks_of(pid):
    """{MPI rank: pid} of the minicp processes started under pid."""
    out = {}
    for q in descendants(pid):
        try:
            with open(f"/proc/{q}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            exe = os.path.basename(os.readlink(f"/proc/{q}/exe"))
        except OSError:  # gone meanwhile
            continue
        if b"OMPI_COMM_WORLD_RANK" in env and exe == "minicp":
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = q
    return out


def check_results(path, *extra):
    c = run([sys.executable, os.path.join(HERE, "check_results.py"), path, *extra])
    return [] if c.returncode == 0 else [f"check_results.py rejects {path}"]


def refused(r, text, fails):
    if r.returncode != 2:
        fails.append(f"a run that should be refused exited {r.returncode}, expected 2")
    if r.stdout.count(text) != 1:
        fails.append(f"the output holds {r.stdout.count(text)} times {text!r}, expected once")
    if "elapsed" in r.stdout:
        fails.append("a refused run started its cases")


class Held:
    """A run writing args' files, its ranks held stopped (so that it is surely running, its
    locks taken in the parse step) until finish()."""

    def __init__(self, cmd, args):
        self.p = subprocess.Popen(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        self.seen, self.cases = [], None
        for line in self.p.stdout:  # the locks are taken in the parse step, before "[1/"
            self.seen.append(line)
            m = re.match(r"minicp: .*, (\d+) cases,", line)
            self.cases = int(m.group(1)) if m else self.cases
            if line.startswith("[1/"):
                break
        self.ranks = ranks_of(self.p.pid)
        for q in self.ranks.values():
            os.kill(q, signal.SIGSTOP)
        self.holder = f"(pid {self.ranks.get(0)} on host {socket.gethostname()}, since "

    def go_on(self):
        for q in self.ranks.values():
            os.kill(q, signal.SIGCONT)

    def finish(self, out, fails):
        """Lets the run go on; it must end normally with its own cases in out."""
        self.go_on()
        rest = self.p.communicate(timeout=240)[0]
        sys.stdout.write("".join(self.seen) + rest)
        if self.p.returncode != 0:
            fails.append(f"the run that owns the files exited {self.p.returncode}")
        fails += check_results(out, "--complete", "--cases", str(self.cases))


def mode_lock(cmd, d):
    out, dump, other = (os.path.join(d, n) for n in ("r.h5", "d.h5", "other.h5"))
    fails = []
    a = Held(cmd, ["--out", out, "--dump", dump])
    try:
        # Another deck: had it run, the file would hold the cases of two decks.
        b = run(cmd + ["--set", "run.seed=2", "--out", out])
        refused(b, f"minicp: --out {out}: in use by another minicp run {a.holder}", fails)
        c = run(cmd + ["--out", other, "--dump", dump])
        refused(c, f"minicp: --dump {dump}: in use by another minicp run {a.holder}", fails)
    finally:
        a.go_on()
    a.finish(out, fails)
    for p in (out + ".lock", dump + ".lock", other, other + ".lock"):
        if os.path.exists(p):
            fails.append(f"{p} is left behind")
    return fails


def mode_links(cmd, d):
    out, sym, hard = (os.path.join(d, n) for n in ("r.h5", "s.h5", "h.h5"))
    fails = []
    a = Held(cmd, ["--out", out])
    try:
        os.symlink("r.h5", sym)
        b = run(cmd + ["--set", "run.seed=2", "--out", sym])
        refused(b, f"minicp: --out {out}: in use by another minicp run {a.holder}", fails)
        os.link(out, hard)
        c = run(cmd + ["--set", "run.seed=2", "--out", hard])
        refused(c, f"minicp: --out {hard}: the file has 2 names (hard links)", fails)
        os.unlink(hard)
    finally:
        a.go_on()
    a.finish(out, fails)
    r = run(cmd + ["--out", sym, "--quiet"])
    if r.returncode != 0:
        fails.append(f"the run through the symbolic link exited {r.returncode}")
    if not os.path.islink(sym) or os.readlink(sym) != "r.h5":
        fails.append(f"{sym} is no longer the symbolic link to r.h5")
    fails += check_results(out, "--complete", "--cases", str(a.cases))
    fails += [f"{p} is left behind" for p in (out + ".lock", sym + ".lock", hard) if os.path.lexists(p)]
    return fails


def mode_stale(cmd, d):
    out, dump = os.path.join(d, "r.h5"), os.path.join(d, "d.h5")
    stale = [out + ".tmp.999999", dump + ".tmp.12345"]
    keep = [out + ".tmp.keep", os.path.join(d, "other.h5.tmp.1")]
    for p in stale + keep:
        with open(p, "w") as f:
            f.write("half a transaction\n")
    with open(out + ".lock", "w") as f:  # its run is gone: nobody holds the lock
        f.write("pid=999999 host=gone since=2000-01-01T00:00:00Z\n")
    r = run(cmd + ["--out", out, "--dump", dump])
    fails = [] if r.returncode == 0 else [f"the run exited {r.returncode}"]
    fails += [f"{p} is left behind" for p in stale + [out + ".lock", dump + ".lock"] if os.path.exists(p)]
    fails += [f"{p} was removed, but it is no temporary of this run's files" for p in keep if not os.path.exists(p)]
    return fails + check_results(out, "--complete")


def mode_disk_full(cmd, d):
    src, full = os.path.join(d, "src.h5"), os.path.join(d, "full")
    os.makedirs(full)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS}", "tmpfs", full], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if m.returncode != 0:
        print(f"skipped: cannot mount a {TMPFS} tmpfs to fill ({m.stdout.strip()}); needs root")
        sys.exit(SKIP)
    try:
        r = run(cmd + ["--out", src, "--quiet"])
        if r.returncode != 0:
            return [f"making the file to resume failed (exit {r.returncode})"]
        if os.path.getsize(src) <= 300 * 1024:
            return [f"{src} has {os.path.getsize(src)} bytes: too small to fill the {TMPFS} tmpfs; give a longer sweep"]
        with h5py.File(src, "r+") as f:  # as if stopped before its end record: a finished file is left alone
            f.attrs.modify("complete", "no")
        out = os.path.join(full, "r.h5")
        r = run(cmd + ["--resume", src, "--out", out])
        fails = [] if r.returncode not in (0, 2) else [f"the run on a full disk exited {r.returncode}"]
        said = [line for line in r.stdout.splitlines() if "No space left on device" in line]
        if len(said) != 1 or out not in said[0]:
            fails.append(f"expected one message naming {out} and 'No space left on device', got {said}")
        if "truncated" in r.stdout:
            fails.append("the message blames a truncated file, not the full disk")
        fails += [f"{p} is left behind" for p in glob.glob(out + ".tmp.*") + [out] if os.path.exists(p)]
        return fails
    finally:
        subprocess.run(["umount", full])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", required=True, choices=["lock", "links", "stale", "disk-full"])
    ap.add_argument("--dir", required=True, help="scratch directory (emptied first)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if os.path.ismount(os.path.join(args.dir, "full")):  # left by a run that was killed
        subprocess.run(["umount", os.path.join(args.dir, "full")])
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    fails = {"lock": mode_lock, "links": mode_links, "stale": mode_stale, "disk-full": mode_disk_full}[args.mode](cmd, args.dir)
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
