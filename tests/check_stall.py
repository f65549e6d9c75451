#!/usr/bin/env python3
"""A rank stopped for good (SIGSTOP): the stall watchdog (run.stall_timeout_s = LIMIT) ends the
job within --within seconds of the stop, with a non-zero exit, exactly one message naming that
rank and its host and, with --expect, where it was (a regular expression the rest of the
message must match), no process of the job left, and a results file (when --cases says how many
complete cases it must hold at least, by default 1) holding only complete cases, which
check_results.py accepts. The rank is stopped from outside when rank 0 prints its second case
("[2/"), or with --stop-at RANK:POINT[:CASE] by itself at a named point (MINICP_TEST_STOP,
harness/watchdog.hpp). Whatever happens, the script ends every process it started (SIGCONT,
then SIGKILL) within --deadline seconds, so it never hangs.
Usage: check_stall.py --out FILE.h5 [--limit 5] [--rank 1 | --stop-at R:POINT[:CASE]] [--expect RE] [--cases N]
                      -- MPIRUN... MINICP [ARGS...]"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from check_ownership import check_results, ranks_of
from check_resume import cases_in, descendants


def stat_field(pid, i):
    """Field i after the command name of /proc/PID/stat, None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[i]
    except (OSError, IndexError):
        return None


def start_time(pid):
    """The process's start time (clock ticks since boot), None once it is gone: with the pid it
    names one process, so that a pid the system has given to another process is left alone."""
    t = stat_field(pid, 19)
    return None if t is None else int(t)


def known(pids):
    return {q: start_time(q) for q in pids if start_time(q) is not None}


def state(pid):
    """The process's state letter (R, S, T: stopped, Z: a zombie), None once it is gone."""
    return stat_field(pid, 0)


def left(procs):
    """The processes of procs still running (not gone, not a zombie waiting for its parent)."""
    return [q for q, t in procs.items() if start_time(q) == t and state(q) not in (None, "Z")]


def watch_for_stop(pid, rank, stopped):
    """Notes in stopped when rank (a process under pid) has stopped itself, and the ranks."""
    while "at" not in stopped:
        ranks = ranks_of(pid)
        if rank in ranks and state(ranks[rank]) == "T":
            stopped.update(procs=known(ranks.values()), at=time.monotonic())
        time.sleep(0.05)


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


def parse_args():
    """The options and the job's command after them."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--stop-at", default="", help="RANK:POINT[:CASE]: the rank stops itself there (MINICP_TEST_STOP)")
    ap.add_argument("--expect", default="", help="a regular expression the message after 'made no progress' matches")
    ap.add_argument("--cases", type=int, default=1, help="complete cases the results file must hold at least")
    ap.add_argument("--within", type=float, default=30, help="seconds from the stop to the end of the job")
    ap.add_argument("--deadline", type=float, default=90, help="seconds before everything is killed")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return args, cmd


def launch(args, cmd):
    """The job started with the watchdog's limit (and --stop-at's stop), old outputs removed."""
    for p in (args.out, args.out + ".lock"):
        if os.path.exists(p):
            os.remove(p)
    env = dict(os.environ)
    if args.stop_at:
        args.rank = int(args.stop_at.split(":")[0])
        env["MINICP_TEST_STOP"] = args.stop_at
    return subprocess.Popen(cmd + ["--out", args.out, "--set", f"run.stall_timeout_s={args.limit}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def follow(args, p):
    """Reads the job to its end, stopping the rank at its second case (unless --stop-at), and
    ends every process it started: (fails, output, when the rank stopped or None, when it ended)."""
    started = known(descendants(p.pid))
    killer = threading.Timer(args.deadline, lambda: end_all(known(descendants(p.pid))))
    killer.start()
    stopped = {}
    if args.stop_at:
        threading.Thread(target=watch_for_stop, args=(p.pid, args.rank, stopped), daemon=True).start()
    fails, seen, stopped_at = [], [], None
    try:
        for line in p.stdout:
            seen.append(line)
            if stopped_at is None and not args.stop_at and line.startswith("[2/"):
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
        stopped_at = stopped.get("at", stopped_at)
        started.update(stopped.get("procs", {}))
        for _ in range(50):  # the launcher's end reaps the ranks a moment later
            running = left(started)
            if not running:
                break
            time.sleep(0.1)
        if running:
            fails.append(f"processes of the job left running after it ended: {running}")
    finally:
        killer.cancel()
        stopped.setdefault("at", None)
        started.update(stopped.get("procs", {}))
        started.update(known(descendants(p.pid)))
        end_all(started)
    return fails, "".join(seen), stopped_at, ended


def judge(args, code, out, stopped_at, ended, fails):
    """The exit code, the time to the end, the one message and the results file; report's code."""
    if code == 0:
        fails.append("the job with a stopped rank exited 0")
    if ended - stopped_at > args.within:
        fails.append(f"the job ended {ended - stopped_at:.1f} s after the stop, expected within {args.within:g} s")
    said = f"minicp: rank {args.rank} (host {socket.gethostname()}) made no progress for "
    if out.count(said) != 1 or out.count("made no progress") != 1:
        fails.append(f"expected exactly one message starting {said!r}")
    elif args.expect:
        rest = re.search(re.escape(said) + r"\d+ s (.*)", out).group(1)
        if not re.fullmatch(args.expect, rest):
            fails.append(f"the message goes on {rest!r}, expected {args.expect!r}")
    if args.cases == 0:
        return report(fails)
    if not os.path.exists(args.out):
        return report(fails + ["no results file"])
    done, groups, _ = cases_in(args.out)
    if groups != len(done) or len(done) < args.cases:
        fails.append(f"the file holds {groups} cases, {len(done)} complete: expected only complete ones, "
                     f"at least {args.cases}")
    return report(fails + check_results(args.out))


def main():
    args, cmd = parse_args()
    p = launch(args, cmd)
    fails, out, stopped_at, ended = follow(args, p)
    sys.stdout.write(out)
    if stopped_at is None:
        where = args.stop_at or "the run's second case"
        return report(fails + [f"nothing was stopped at {where}"])
    return judge(args, p.returncode, out, stopped_at, ended, fails)


def report(fails):
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
