#!/usr/bin/env python3
"""Fabric study (`make fabric-study`): one small sweep (inputs/fabric-study.toml) under every
local and every emulated fabric profile of inputs/fabrics/, and the latency (alpha) and
bandwidth (beta) of each fabric measured by minicp-comm-bench in the same study.

  local profiles     2 ranks on this machine (layout 1x2)
  emulated profiles  slurm/vcluster brings up 2 nodes with the profile's link cap; the sweep
                     runs on 2 nodes x 1 rank (2x1) and 2 nodes x 2 ranks (2x2: doublering's
                     inner ring on a node, its outer ring over the link; --rounds-2x2 rounds)

Writes one results file per profile and layout (DIR/<profile>_<layout>.h5), the comm-bench
JSON beside it, and the study index DIR/fabric_study.csv (one row per file: the profile, the
layout, alpha and beta, and the file). Prints the comparison: per scheme and seq_len, step
time, exposed communication and overlap under each fabric; and one grep-able line.
alpha = the pingpong time of the smallest message; beta = the slope of a least-squares fit of
time against size over messages >= 64 KiB, checked against the best measured bandwidth."""
import argparse
import csv
import os
import re
import sys
import time
import tomllib

import h5py

from common import run_json, run_program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The lines of a run's output worth seeing as the study goes.
SHOWN = ("MINICP", "minicp: fabric", "WARNING", "minicp:")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build tree (default: %(default)s)")
    p.add_argument("--deck", default=os.path.join(ROOT, "inputs", "fabric-study.toml"), help="(default: %(default)s)")
    p.add_argument("--out-dir", default=os.path.join(ROOT, "results", "fabric"), help="(default: %(default)s)")
    p.add_argument("--profiles", default="",
                   help="comma-separated profile names (default: every local and emulated profile)")
    p.add_argument("--set", action="append", default=[], help="a deck override for every run (repeatable)")
    p.add_argument("--vcluster-name", default="fs", help="name prefix of the emulated cluster (default: %(default)s)")
    p.add_argument("--rounds-2x2", type=int, default=3,
                   help="run.rounds of the 2x2 layouts (default: %(default)s; the deck's for the others). "
                        "Their 4 ranks share 2 cores here, so the model is not checked on them and fewer "
                        "rounds keep the study to about 105 minutes here (70 without the 2x2 layouts); 0: the deck's")
    p.add_argument("--layouts", default="1x2,2x1,2x2",
                   help="comma-separated layouts to run (default: %(default)s; 1x2 under local profiles, "
                        "2x1 and 2x2 under emulated ones); the index keeps the other layouts' rows")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run (default: %(default)s)")
    p.add_argument("--table-only", action="store_true", help="print the comparison of the files already in --out-dir")
    a = p.parse_args()
    if a.timeout < 1:
        p.error(f"--timeout {a.timeout}: must be >= 1")
    a.layouts = [x.strip() for x in a.layouts.split(",") if x.strip()]
    bad = [x for x in a.layouts if x not in ("1x2", "2x1", "2x2")]
    if bad or not a.layouts:
        p.error(f"--layouts {','.join(a.layouts)}: each must be one of 1x2, 2x1, 2x2")
    if "2x2" in a.layouts and "2x1" not in a.layouts:
        p.error("--layouts: 2x2 needs 2x1 too (a 2x2 layout takes its alpha and beta from the 2x1 one)")
    if a.rounds_2x2 < 0:
        p.error(f"--rounds-2x2 {a.rounds_2x2}: must be >= 0 (0: the deck's rounds)")
    return a


def read_profile(path):
    with open(path, "rb") as f:
        return tomllib.load(f)


def profiles(a):
    d = os.path.join(ROOT, "inputs", "fabrics")
    names = sorted(f[:-5] for f in os.listdir(d) if f.endswith(".toml"))
    if a.profiles:
        want = a.profiles.split(",")
        bad = [w for w in want if w not in names]
        if bad:
            sys.exit(f"fabric_study: --profiles {','.join(bad)}: unknown (known: {', '.join(names)})")
        names = want
    out = []
    for n in names:
        prof = read_profile(os.path.join(d, n + ".toml"))
        kind = prof.get("kind", "local")
        if kind in ("local", "emulated"):
            out.append((n, kind, prof.get("emulated", {}).get("rate", "")))
    return out


def run(cmd, timeout, check=True):
    return run_program(cmd, "fabric_study", timeout=timeout, check=check, timed=True, show=SHOWN)


def alpha_beta(js):
    rows = [r for r in js["results"] if r["op"] == "pingpong"]
    alpha_us = min(rows, key=lambda r: r["bytes"])["time_us"]
    big = [(r["bytes"], r["time_us"]) for r in rows if r["bytes"] >= 65536]
    n = len(big)
    mx = sum(b for b, _ in big) / n
    my = sum(t for _, t in big) / n
    slope = sum((b - mx) * (t - my) for b, t in big) / sum((b - mx) ** 2 for b, _ in big)  # us per byte
    beta_fit = 1e-3 / slope if slope > 0 else float("nan")  # GB/s
    beta_best = max(r["algbw_GBps"] for r in rows)
    return alpha_us, beta_fit, beta_best


def launcher(a, kind, np, vc):
    common = ["--bind-to", "none", "-x", "OMP_NUM_THREADS=1", "-x", "OMP_PROC_BIND=false"]
    if kind == "local":
        return ["mpirun", "--oversubscribe", "-np", str(np)] + common
    return [vc, "mpirun", "--name", a.vcluster_name, "-np", str(np), "--map-by", "node"] + common


def measure(a, name, kind, layout, np, vc, link=None):
    """One layout under one profile. alpha and beta are measured with 2 ranks (1x2, 2x1: across
    the link); a 2x2 layout keeps those of 2x1 (link): with 4 ranks on a 2-core machine the
    idle ranks' polling would be measured, not the fabric."""
    base = os.path.join(a.out_dir, f"{name}_{layout}")
    launch = launcher(a, kind, np, vc)
    js = base + "_comm.json"
    if link:
        alpha, beta_fit, beta_best, js = link["alpha_us"], link["beta_fit_GBps"], link["beta_best_GBps"], link["comm_json"]
    else:
        comm = run_json(lambda path: launch + [os.path.join(a.build, "bin", "minicp-comm-bench"), "--fabric", name,
                                               "--ops", "pingpong", "-b", "8", "-e", "16M", "-f", "4", "-n", "10",
                                               "-w", "3", "--json", path],
                        "fabric_study", path=js, timeout=a.timeout, timed=True, show=SHOWN)
        alpha, beta_fit, beta_best = alpha_beta(comm)
    sets = []
    rounds = [f"run.rounds={a.rounds_2x2}"] if layout == "2x2" and a.rounds_2x2 else []
    for s in [f"sweep.ranks=[{np}]"] + rounds + a.set:
        sets += ["--set", s]
    run(launch + [os.path.join(a.build, "bin", "minicp"), "--deck", a.deck, "--fabric", name, "--out", base + ".h5",
                  "--overwrite"] + sets, a.timeout)
    return {"profile": name, "kind": kind, "layout": layout, "ranks": np, "alpha_us": round(alpha, 3),
            "beta_fit_GBps": round(beta_fit, 4), "beta_best_GBps": round(beta_best, 4), "file": base + ".h5",
            "comm_json": js}


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def median_slowest(g, mode, column):
    """The median over reps of the slowest rank's `column` in the steps table (mode 0 full,
    1 compute-only, 2 comm-only)."""
    steps = g["steps"][()]
    per_rep = {}
    for row in steps[steps["mode"] == mode]:
        per_rep[row["rep"]] = max(per_rep.get(row["rep"], 0.0), float(row[column]))
    v = sorted(per_rep.values())
    return v[len(v) // 2] if v else float("nan")


def fig(s, name, out_of_range):
    """An overlap as printed: its value, "n/r" when not resolved (NaN), "out" when the file
    flags it outside [0, 1] (a measurement defect, see its note in the file)."""
    v = float(s[name])
    if v != v:
        return "n/r"
    if re.search(r"(^|[ ,;])" + name + "=", out_of_range):
        return "out"
    return f"{v:.2f}"


def table(rows):
    cols = [(r["profile"], r["layout"]) for r in rows]
    data = {}
    for r in rows:
        with h5py.File(r["file"], "r") as f:
            for cid, g in f["cases"].items():
                s = g["summary"].attrs
                key = (text(g.attrs["scheme"]), int(g.attrs["seq_len"]))
                bad = text(s["out_of_range"])
                data.setdefault(key, {})[(r["profile"], r["layout"])] = (
                    float(s["measured_time_s"]), float(s["exposed_comm_s"]), fig(s, "overlap", bad),
                    float(s["grad_allreduce_exposed_s"]), fig(s, "grad_allreduce_overlap", bad),
                    median_slowest(g, 0, "grad_allreduce_busy_s"), median_slowest(g, 1, "backward_s"))
    print("\nalpha (pingpong latency) and beta (bandwidth) of each fabric, measured by minicp-comm-bench:")
    print(f"  {'profile':<14}{'layout':<8}{'alpha [us]':>12}{'beta fit [GB/s]':>17}{'beta best [GB/s]':>18}")
    for r in rows:
        if r["layout"] != "2x2":  # 2x2 keeps its 2x1 figures (measure())
            print(f"  {r['profile']:<14}{r['layout']:<8}{r['alpha_us']:>12.2f}{r['beta_fit_GBps']:>17.3f}"
                  f"{r['beta_best_GBps']:>18.3f}")
    print("\nper scheme and seq_len: step [s] / exposed comm [s] / overlap; then the gradient all-reduce: "
          "exposed [s] / its run time on the collective thread [s] / the compute-only backward [s] / overlap (n/r: not resolved; out: flagged outside "
          "[0, 1] in the file)")
    print(f"  {'scheme':<11}{'S':>6}  " + "".join(f"{p + ' ' + l:>36}" for p, l in cols))
    for (scheme, S) in sorted(data):
        line = f"  {scheme:<11}{S:>6}  "
        grad = f"  {'  grad':<11}{'':>6}  "
        for c in cols:
            v = data[(scheme, S)].get(c)
            line += f"{v[0]:>14.3f} / {v[1]:>7.3f} / {v[2]:>6}  " if v else f"{'-':>36}"
            grad += f"{v[3]:>6.3f} / {v[5]:>5.3f} / {v[6]:>5.3f} / {v[4]:>6}  " if v else f"{'-':>36}"
        print(line)
        print(grad)
    return data


def main():
    a = parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    index = os.path.join(a.out_dir, "fabric_study.csv")
    if a.table_only:
        with open(index) as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            for k in ("alpha_us", "beta_fit_GBps", "beta_best_GBps"):
                r[k] = float(r[k])
        table(rows)
        return 0
    vc = os.path.join(ROOT, "slurm", "vcluster")
    env_ok = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_MCA_pml", "OMPI_MCA_btl", "UCX_"))}
    os.environ.clear()
    os.environ.update(env_ok, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rows = []
    t0 = time.time()
    for name, kind, rate in profiles(a):
        print(f"\n== fabric {name} ({kind}{', link ' + rate if rate else ''})", flush=True)
        if kind == "local":
            if "1x2" in a.layouts:
                rows.append(measure(a, name, kind, "1x2", 2, vc))
            continue
        if "2x1" not in a.layouts:
            continue
        up = [vc, "up", "2", "--name", a.vcluster_name] + (["--rate", rate] if rate else [])
        run([vc, "down", "--name", a.vcluster_name], 120, check=False)
        run(up, 300)
        try:
            rows.append(measure(a, name, kind, "2x1", 2, vc))
            if "2x2" in a.layouts:
                rows.append(measure(a, name, kind, "2x2", 4, vc, link=rows[-1]))
        finally:
            run([vc, "down", "--name", a.vcluster_name], 120, check=False)
    # The index keeps the rows of profiles this run did not measure again (--profiles: a part
    # of the study), so the study adds up.
    if os.path.exists(index):
        with open(index) as f:
            done = {(r["profile"], r["layout"]) for r in rows}
            rows = [r for r in csv.DictReader(f) if (r["profile"], r["layout"]) not in done] + rows
        for r in rows:
            for k in ("alpha_us", "beta_fit_GBps", "beta_best_GBps"):
                r[k] = float(r[k])
    with open(index + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    os.replace(index + ".tmp", index)
    table(rows)
    worst = max(rows, key=lambda r: r["alpha_us"])
    print(f"\nMINICP_FABRIC_STUDY files={len(rows)} minutes={(time.time() - t0) / 60:.1f} "
          + " ".join(f"{r['profile']}_{r['layout']}_beta_GBps={r['beta_fit_GBps']:.3f}" for r in rows)
          + f" worst_alpha_us={worst['alpha_us']:.1f}")
    print(f"fabric_study: index {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
