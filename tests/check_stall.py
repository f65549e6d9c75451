#!/usr/bin/env python3
"""A rank stopped for good (SIGSTOP) while a minicp run is in its second case: the stall watchdog
(run.stall_timeout_s = LIMIT) ends the job within 30 s of the stop, with a non-zero exit and
exactly one message naming that rank and its host, and the results file holds only complete
cases, which check_results.py accepts. Whatever happens, the script ends every process it
started (SIGCONT, then SIGKILL) within --deadline seconds, so it never hangs.
Usage: check_stall.py --out FILE.h5 [--limit 5] [--rank 1] -- MPIRUN... MINICP [ARGS...]"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from check_ownership import check_results, ranks_of
from check_resume import cases_in, descendants


def start_time(pid):
    """The process's start time (clock ticks since boot), None once it is gone: with the pid it
    names one process, so that a pid the system has given to another process is left alone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def known(pids):
    return {q: start_time(q) for q in pids if start_time(q) is not None}


def end_all(procs):
    """SIGCONT, then SIGKILL, to each process of procs that is still the one we started (the
    stopped rank is continued first, so that nothing is left stopped should the kill fail)."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for q, t in procs.items():
            if start_time(q) == t:
                try:
                    os.kill(q, sig)
                except OSError:
                    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--within", type=float, default=30, help="seconds from the stop to the end of the job")
    ap.add_argument("--deadline", type=float, default=90, help="seconds before everything is killed")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    for p in (args.out, args.out + ".lock"):
        if os.path.exists(p):
            os.remove(p)
    p = subprocess.Popen(cmd + ["--out", args.out, "--set", f"run.stall_timeout_s={args.limit}"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    started = known(descendants(p.pid))
    killer = threading.Timer(args.deadline, lambda: end_all(known(descendants(p.pid))))
    killer.start()
    fails, seen, stopped_at = [], [], None
    try:
        for line in p.stdout:
            seen.append(line)
            if stopped_at is None and line.startswith("[2/"):
                ranks = ranks_of(p.pid)
                started.update(known(ranks.values()))
                if args.rank not in ranks:
                    fails.append(f"rank {args.rank} not found among {ranks}")
                    break
                os.kill(ranks[args.rank], signal.SIGSTOP)
                stopped_at = time.monotonic()
                print(f"check_stall: rank {args.rank} (pid {ranks[args.rank]}) stopped", flush=True)
        p.wait()
        ended = time.monotonic()
    finally:
        killer.cancel()
        started.update(known(descendants(p.pid)))
        end_all(started)
    out = "".join(seen)
    sys.stdout.write(out)
    if stopped_at is None:
        return report(fails + ["the run never reached its second case, nothing was stopped"])
    if p.returncode == 0:
        fails.append("the job with a stopped rank exited 0")
    if ended - stopped_at > args.within:
        fails.append(f"the job ended {ended - stopped_at:.1f} s after the stop, expected within {args.within:g} s")
    said = f"minicp: rank {args.rank} (host {socket.gethostname()}) made no progress for "
    if out.count(said) != 1 or out.count("made no progress") != 1:
        fails.append(f"expected exactly one message starting {said!r}")
    if not os.path.exists(args.out):
        return report(fails + ["no results file"])
    done, groups, _ = cases_in(args.out)
    if groups != len(done) or not done:
        fails.append(f"the file holds {groups} cases, {len(done)} complete: expected only complete ones, at least 1")
    return report(fails + check_results(args.out))


def report(fails):
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
