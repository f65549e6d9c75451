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
             tmpfs, marked unfinished so that it is resumed, --out on it) ends the run by itself (it
             is killed after 45 s) with exit 1 and one message from one rank naming the file and
             "No space left on device" (nothing from Open MPI), and leaves no temporary, no lock
             file and no half-written FILE.
  disk-full-dump  the same for a --dump that does not fit a 200 KiB tmpfs (--out elsewhere),
             where rank 0 alone would fail inside a collective write (the others waiting in it).
  disk-full-new  the same for a new --out on an 8 KiB tmpfs.
The disk-full modes exit 77 (a skip) where a tmpfs cannot be mounted.
Usage: check_ownership.py --mode MODE --dir DIR -- MPIRUN... MINICP --deck ... [--set ...]"""
import argparse
import contextlib
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
HANG_S = 45  # a run on a full disk that has not ended by then hangs


def run(cmd, timeout=120):
    """The finished run (returncode None: still running after timeout s, then killed with its ranks)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        for q in reversed(descendants(p.pid)):
            with contextlib.suppress(OSError):
                os.kill(q, signal.SIGKILL)
        out, p.returncode = p.communicate()[0], None
    sys.stdout.write(out)
    return subprocess.CompletedProcess(cmd, p.returncode, out)


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


@contextlib.contextmanager
def tmpfs(path, size):
    """A tmpfs of `size` mounted on the new directory path while in the block (exit 77 where it cannot be)."""
    os.makedirs(path)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if m.returncode != 0:
        print(f"skipped: cannot mount a {size} tmpfs to fill ({m.stdout.strip()}); needs root")
        sys.exit(SKIP)
    try:
        yield path
    finally:
        subprocess.run(["umount", path])


def out_of_space(r, path, outputs):
    """What is wrong with run r that found no room for path: it must end by itself with exit 1 and
    one message (one rank) naming path and the full disk, and leave none of outputs' temporaries or
    lock files, nor a half-written path."""
    if r.returncode is None:
        return [f"the run on a full disk hung: killed after {HANG_S} s"]
    fails = [] if r.returncode == 1 else [f"the run on a full disk exited {r.returncode}, expected 1"]
    said = [line for line in r.stdout.splitlines() if "No space left on device" in line]
    if len(said) != 1 or path not in said[0]:
        fails.append(f"expected one message naming {path} and 'No space left on device', got {said}")
    for bad in ("minicp (rank", "mca_fbtl", "MPI_ABORT", "truncated"):
        if bad in r.stdout:
            fails.append(f"the output holds {bad!r}: the failure is not reported once, by minicp, as a full disk")
    left = [path] + [p for o in outputs for p in glob.glob(o + ".tmp.*") + [o + ".lock"]]
    return fails + [f"{p} is left behind" for p in left if os.path.exists(p)]


def mode_disk_full(cmd, d):
    src = os.path.join(d, "src.h5")
    with tmpfs(os.path.join(d, "full"), "300k") as full:
        r = run(cmd + ["--out", src, "--quiet"])
        if r.returncode != 0:
            return [f"making the file to resume failed (exit {r.returncode})"]
        if os.path.getsize(src) <= 300 * 1024:
            return [f"{src} has {os.path.getsize(src)} bytes: too small to fill the 300 KiB tmpfs; give a longer sweep"]
        with h5py.File(src, "r+") as f:  # as if stopped before its end record: a finished file is left alone
            f.attrs.modify("complete", "no")
        out = os.path.join(full, "r.h5")
        return out_of_space(run(cmd + ["--resume", src, "--out", out], HANG_S), out, [out])


def mode_disk_full_dump(cmd, d):
    out = os.path.join(d, "x.h5")
    with tmpfs(os.path.join(d, "full"), "200k") as full:
        dump = os.path.join(full, "d.h5")
        return out_of_space(run(cmd + ["--out", out, "--dump", dump], HANG_S), dump, [out, dump])


def mode_disk_full_new(cmd, d):
    with tmpfs(os.path.join(d, "full"), "8k") as full:
        out = os.path.join(full, "r.h5")
        return out_of_space(run(cmd + ["--out", out], HANG_S), out, [out])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = {"lock": mode_lock, "links": mode_links, "stale": mode_stale, "disk-full": mode_disk_full,
             "disk-full-dump": mode_disk_full_dump, "disk-full-new": mode_disk_full_new}
    ap.add_argument("--mode", required=True, choices=sorted(modes))
    ap.add_argument("--dir", required=True, help="scratch directory (emptied first)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if os.path.ismount(os.path.join(args.dir, "full")):  # left by a run that was killed
        subprocess.run(["umount", os.path.join(args.dir, "full")])
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    fails = modes[args.mode](cmd, args.dir)
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
