#!/usr/bin/python3
"""The Makefile's variables reach the shell as values, never as commands.

A copy of the Makefile in a scratch directory (analysis/ linked beside it) is run two ways.
For real, the targets that build nothing: `make report` and `make plots` with RUN and OUT
values holding `;`, backquotes and `$(...)` exit non-zero with the analysis' message and
the commands inside them never run (the files they would touch stay absent). Dry (`make -n`,
which runs no recipe) for the targets that would build: the rendered command lines of
run, calibrate, plots, report and clean, split as the shell splits them, keep DECK, BUILD,
RANKS, OUT one argument each and RUN one argument a word, and nothing is written.
Exit code 0 when every check passes, 1 otherwise, 77 without make.

Usage: check_make_vars.py --source DIR --work DIR"""
import argparse
import os
import shlex
import shutil
import subprocess
import sys

failures = []
# The Makefile's own variables, and make's: none may come in from the caller's environment.
CLEAR = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES", "RUN", "OUT", "DECK", "BUILD", "RANKS",
         "SANITIZE_BUILD", "PY", "MPIRUN", "JOBS", "CLANG_FORMAT")


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
    return ok


def make(work, args):
    env = {k: v for k, v in os.environ.items() if k not in CLEAR}
    return subprocess.run(["make", "--no-print-directory", "-C", work] + args, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, timeout=60)


def words(line):
    """The shell's words of a command line; ; & | ( ) stand alone, as the shell reads them."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError as e:  # an unbalanced quote: a value that was not quoted
        return [f"unreadable: {e}", line]


def rendered(work, args, marker):
    """The words of the line of `make -n ARGS` that holds marker (None if none does)."""
    r = make(work, ["-n"] + args)
    for line in r.stdout.splitlines():
        if marker in line:
            return words(line)
    print(r.stdout + r.stderr)
    return None


def rest(ws, word):
    """The words after word (None without it)."""
    return ws[ws.index(word) + 1:] if ws and word in ws else None


def after(ws, flag):
    return (rest(ws, flag) or [None])[0]


def real_runs(work, d):
    """report / plots for real: nothing to build, only the analysis' refusal."""
    cases = [
        ("report RUN with ;", ["report", f"RUN={d}/a;touch {d}/X1;.h5"], "X1"),
        ("report RUN with backquotes", ["report", f"RUN=`touch {d}/X2`"], "X2"),
        ("report RUN with $(...)", ["report", f"RUN=$$(touch {d}/X3)"], "X3"),
        ("plots OUT with ;", ["plots", f"RUN={d}/none.h5", f"OUT={d}/o;touch {d}/X4"], "X4"),
        ("plots RUN with ' and ;", ["plots", f"RUN={d}/it's;touch {d}/X5;'"], "X5"),
    ]
    for what, args, touched in cases:
        r = make(work, args)
        check(not os.path.exists(os.path.join(d, touched)), f"{what}: the command inside did not run")
        check(r.returncode != 0 and "no such file" in r.stderr,
              f"{what}: exit {r.returncode} (want non-zero) with the analysis' message: {r.stderr.strip()[-300:]!r}")


def dry_runs(work, d):
    # BUILD names a make target too ($(BUILD)/CMakeCache.txt), where a space or ; cannot be.
    deck, build, ranks = f"{d}/x;touch {d}/X6", f"{d}/it's&b`d`", "2;true"
    for target in ("run", "calibrate"):
        ws = rendered(work, [target, f"DECK={deck}", f"BUILD={build}", f"RANKS={ranks}"], "/bin/minicp")
        check(after(ws, "--deck") == deck, f"make -n {target}: DECK one argument: {ws}")
        check(ws is not None and build + "/bin/minicp" in ws, f"make -n {target}: BUILD one argument: {ws}")
        check(after(ws, "-np") == ranks, f"make -n {target}: RANKS one argument: {ws}")
        check(ws is not None and not {";", "&", "|", "&&"} & set(ws), f"make -n {target}: no command separator: {ws}")
    ws = rendered(work, ["report", "RUN=a.h5 it's.h5 b;c.h5"], "minicp_analysis")
    check(rest(ws, "report") == ["a.h5", "it's.h5", "b;c.h5"],
          f"make -n report: RUN one argument a word: {ws}")
    ws = rendered(work, ["plots", "RUN=a.h5", f"OUT={d}/o p;q"], "minicp_analysis")
    check(after(ws, "--out") == f"{d}/o p;q", f"make -n plots: OUT one argument: {ws}")
    ws = rendered(work, ["clean", f"BUILD={build}", "SANITIZE_BUILD=s;t"], "rm -rf")
    check(ws is not None and ws[-2:] == [build, "s;t"], f"make -n clean: BUILD, SANITIZE_BUILD one argument each: {ws}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="the repository (its Makefile and analysis/)")
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    if not shutil.which("make"):
        print("skipped: no make")
        return 77
    root = os.path.abspath(a.work)
    shutil.rmtree(root, ignore_errors=True)
    work, d = os.path.join(root, "mk"), os.path.join(root, "touched")
    os.makedirs(work)
    os.makedirs(d)
    shutil.copy(os.path.join(a.source, "Makefile"), work)
    os.symlink(os.path.join(os.path.abspath(a.source), "analysis"), os.path.join(work, "analysis"))

    real_runs(work, d)
    dry_runs(work, d)
    check(sorted(os.listdir(d)) == [], f"nothing written where the values point: {sorted(os.listdir(d))}")
    check(sorted(os.listdir(work)) == ["Makefile", "analysis"], f"make -n wrote nothing: {sorted(os.listdir(work))}")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
