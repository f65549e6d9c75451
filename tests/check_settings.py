#!/usr/bin/python3
"""Every scheme setting of the registry reaches every place a setting is promised to reach.

A setting is declared once, in its scheme's registry entry (`minicp --list-schemes --json`).
From there it must appear as: the deck key `sweep.<name>` of `minicp --help`; the flag
`--<name with - for _>` of `minicp-cp-bench --help`; a part `_<name><value>` of the case ids
of a sweep that lists two values for it; the case attribute `<name>` of the results file, with
the value the case ran (the value given, when not 0, the default rule); and an integer column
of `minicp-report`. One sweep on the tiny model (2 ranks, S = 64, forward and backward, full
mode only) runs every scheme that declares a setting at its default and at the next value.
Exit code 0 when every setting reaches every place, 1 naming each one it misses.

Usage: check_settings.py --minicp BIN --cp-bench BIN --deck tiny.toml --source DIR --work DIR
       -- MPIEXEC ARGS... (the launch prefix for 2 ranks)"""
import argparse
import json
import os
import re
import subprocess
import sys


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-800:]}{r.stderr[-800:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--minicp", "--cp-bench", "--deck", "--source", "--work"):
        ap.add_argument(flag, required=True)
    ap.add_argument("launch", nargs=argparse.REMAINDER, help="-- then the mpiexec prefix for 2 ranks")
    a = ap.parse_args()
    launch = a.launch[1:] if a.launch[:1] == ["--"] else a.launch
    registry = json.loads(run([a.minicp, "--list-schemes", "--json"]))
    owned = [(s["name"], st) for s in registry for st in s["settings"]]
    if not owned:
        raise SystemExit("FAIL: the registry declares no setting: nothing to check")
    fails = []
    helped = run([a.minicp, "--help"])
    sweep = helped[helped.index("  [sweep]"):] if "  [sweep]" in helped else ""
    bench_help = run([a.cp_bench, "--help"])
    for scheme, st in owned:
        if not re.search(rf"^    {st['name']}\s", sweep, re.M):
            fails.append(f"{scheme}.{st['name']}: no deck key sweep.{st['name']} in minicp --help")
        if "--" + st["name"].replace("_", "-") not in bench_help:
            fails.append(f"{scheme}.{st['name']}: no flag --{st['name'].replace('_', '-')} in minicp-cp-bench --help")
    # One sweep: each scheme with a setting, each setting at its default and the next value.
    values = {st["name"]: [st["default"], max(st["default"], st["min"]) + 1] for _, st in owned}
    os.makedirs(a.work, exist_ok=True)
    out = os.path.join(a.work, "settings.h5")
    if os.path.exists(out):
        os.remove(out)
    sets = ["sweep.schemes=[" + ",".join(f'"{s}"' for s in sorted({s for s, _ in owned})) + "]",
            "sweep.seq_len=[64]", "sweep.ranks=[2]", 'run.pass=["train"]', 'run.modes=["full"]',
            "run.warmup=0", "run.reps=1"]
    sets += [f"sweep.{n}=[{v[0]},{v[1]}]" for n, v in values.items()]
    base = launch + [a.minicp, "--deck", a.deck] + [x for s in sets for x in ("--set", s)]
    dry = run(base + ["--dry-run"])
    for scheme, st in owned:
        for v in values[st["name"]]:
            if not re.search(rf"_{scheme}_S64_P2\S*_{st['name']}{v}\b", dry):
                fails.append(f"{scheme}.{st['name']}: no case id with _{st['name']}{v} in the dry run")
    run(base + ["--out", out, "--quiet"])
    import h5py
    with h5py.File(out, "r") as f:
        cases = f["cases"] if "cases" in f else f
        for scheme, st in owned:
            got = sorted(int(cases[k].attrs[st["name"]]) for k in cases
                         if isinstance(cases[k], h5py.Group) and cases[k].attrs.get("scheme") == scheme
                         and st["name"] in cases[k].attrs)
            nonzero = [v for v in values[st["name"]] if v != 0]
            if len(got) != 2 or any(v not in got for v in nonzero):
                fails.append(f"{scheme}.{st['name']}: case attributes {got}, expected the values run, "
                             f"{values[st['name']]} (0 resolved by the scheme's rule)")
    env = dict(os.environ, PYTHONPATH=os.path.join(a.source, "analysis"))
    names = [st["name"] for _, st in owned]
    report = run([sys.executable, "-m", "minicp_analysis", "report", out, "--columns", ",".join(["case"] + names)],
                 env=env)
    head = report.splitlines()[0].split() if report.strip() else []
    for scheme, st in owned:
        if st["name"] not in head:
            fails.append(f"{scheme}.{st['name']}: no column {st['name']} in minicp-report (header {head})")
            continue
        col = head.index(st["name"])
        cells = [line.split()[col] for line in report.splitlines()[1:] if f"_{scheme}_" in line]
        if not cells or not all(re.fullmatch(r"-?\d+", c) for c in cells):
            fails.append(f"{scheme}.{st['name']}: minicp-report column {st['name']} is not integer: {cells}")
    if fails:
        print("FAIL:\n  " + "\n  ".join(fails))
        return 1
    listed = ", ".join(s + "." + st["name"] for s, st in owned)
    print(f"ok: {len(owned)} settings ({listed}) reach minicp --help, "
          f"minicp-cp-bench --help, the case ids, the case attributes and minicp-report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
