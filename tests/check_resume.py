#!/usr/bin/env python3
"""A minicp run killed (SIGKILL to the whole job) after its third case has started leaves a
valid results file holding only complete cases (never a truncated file or a half-written
case); `--resume FILE` then runs only the missing cases and completes the file, which
check_results.py accepts, with cp_efficiency_core_scaled measured for every case whose
`none` (same pass and S) ran before the kill.
Usage: check_resume.py --out FILE.h5 --cases N -- MPIRUN... MINICP [ARGS...]"""
import argparse
import math
import os
import signal
import subprocess
import sys
import time

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))


def descendants(pid):
    """pid and every process below it (the launcher and the ranks it started)."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except OSError:
                pass
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo.extend(children.get(q, []))
    return out


def cases_in(path):
    with h5py.File(path, "r") as f:
        done = [c for c, g in f["cases"].items() if g.attrs.get("complete", b"") in (b"yes", "yes")]
        return done, len(f["cases"]), f.attrs["complete"]


def unscaled(path):
    """Cases that have a `none` of their pass and S in the file, yet no cp_efficiency_core_scaled."""
    with h5py.File(path, "r") as f:
        cases = [(c, g.attrs) for c, g in f["cases"].items() if g.attrs.get("status", b"") in (b"ok", "ok")]
        nones = {(a["pass"], int(a["seq_len"])) for _, a in cases if a["scheme"] in (b"none", "none")}
        return [c for c, a in cases if a["scheme"] not in (b"none", "none") and (a["pass"], int(a["seq_len"])) in nones
                and not math.isfinite(f["cases"][c]["summary"].attrs["cp_efficiency_core_scaled"])]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if os.path.exists(args.out):
        os.remove(args.out)
    fails = []
    # 1. Killed while its third case runs.
    p = subprocess.Popen(cmd + ["--out", args.out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith("[3/"):
            for q in descendants(p.pid):  # the ranks too: at once, as a node failure would
                try:
                    os.kill(q, signal.SIGKILL)
                except OSError:
                    pass
            break
    p.wait()
    sys.stdout.write("".join(seen))
    time.sleep(0.5)
    if not os.path.exists(args.out):
        fails.append("the killed run left no results file (the cases done before the kill are lost)")
    else:
        done, groups, complete = cases_in(args.out)
        print(f"check_resume: killed run left {groups} case groups, {len(done)} complete, file complete={complete}")
        if groups != len(done):
            fails.append("the killed run's file holds a case that is not complete")
        if not (1 <= len(done) < args.cases):
            fails.append(f"{len(done)} complete cases after the kill; expected between 1 and {args.cases - 1}")
        # 2. Resumed: only the missing cases run, the file is completed.
        r = subprocess.run(cmd + ["--resume", args.out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            fails.append(f"the resumed run exited {r.returncode}")
        if f"resuming: {len(done)} cases done" not in r.stdout:
            fails.append("the resumed run does not say how many cases it kept")
        ran = r.stdout.count("\n[")
        if ran != args.cases - len(done):
            fails.append(f"the resumed run ran {ran} cases, expected {args.cases - len(done)}")
        c = subprocess.run([sys.executable, os.path.join(HERE, "check_results.py"), args.out, "--cases",
                            str(args.cases), "--complete"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sys.stdout.write(c.stdout)
        if c.returncode != 0:
            fails.append("check_results.py rejects the resumed file")
        lost = unscaled(args.out)
        if lost:
            fails.append(f"cp_efficiency_core_scaled is NaN after the resume, though `none` is in the file: {lost}")
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
