#!/usr/bin/python3
"""Packed documents: area imbalance, traffic and step time per dispatch and scheme, per mix.

Runs one deck (default inputs/documents-study.toml: every named mix, the dispatches on ring,
groupcast, allgather and ulysses, training) three times and predicts it once:
  - at 2 ranks, timed (the deck's reps), with the model's prediction of every case beside it
    (run.calibration = "measure": prediction_ratio);
  - at 4 and 8 ranks for the counted figures only (area_imbalance, traffic_redundancy: one rep,
    no warm-up; the ranks may oversubscribe the cores, which changes no count);
  - at 64 ranks by the model (minicp --predict, with the table the 2-rank run measured;
    schemes that cannot run 64 ranks at the deck's heads are left out).
Writes one JSON file (every case's figures and the targets' ratios) and one plot (area
imbalance and step time per scheme/dispatch, one column per mix), and prints the table that
docs/measurements.md keeps, with the host it ran on.

  /usr/bin/python3 studies/documents_study.py --minicp build/bin/minicp --mpiexec mpirun \\
      --out results/documents/documents.json
"""
import argparse
import json
import os
import platform
import re
import shlex
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "analysis"))
import h5py  # noqa: E402

from common import median, run_program  # noqa: E402
from minicp_analysis import data  # noqa: E402

PROG = "documents_study"
COUNTED = (4, 8)  # rank counts run for the counted figures
PREDICTED = 64  # rank count the model predicts


def mpi_cmd(a, ranks, *args):
    return [a.mpiexec, "-np", str(ranks), *shlex.split(a.mpiexec_flags), a.minicp, "--deck", a.deck, *args]


def run_decks(a, outdir):
    """The 2-rank timed run and the counted runs (none with --no-run); returns {ranks: results file}."""
    files = {P: os.path.join(outdir, f"p{P}.h5") for P in (2,) + COUNTED}
    if a.no_run:
        for path in files.values():
            if not os.path.isfile(path):
                sys.exit(f"{PROG}: --no-run: no {path} (run the study once without it)")
        return files
    run_program(mpi_cmd(a, 2, "--out", files[2], "--overwrite", "--quiet", *a.set), PROG, timeout=a.timeout)
    for P in COUNTED:
        counted = ["--set", f"sweep.ranks=[{P}]", "--set", "run.warmup=0", "--set", "run.reps=1",
                   "--set", 'run.calibration=""']
        run_program(mpi_cmd(a, P, "--out", files[P], "--overwrite", "--quiet", *counted, *a.set), PROG,
                    timeout=a.timeout)
    return files


def predict_at(a, table, schemes, outdir):
    """The model's step per case at PREDICTED ranks: {case id: seconds}."""
    path = os.path.join(outdir, "calibration.txt")
    with open(path, "w") as f:
        f.write(table)
    cmd = [a.minicp, "--predict", "--deck", a.deck, "--calibration", path, "--set", f"sweep.ranks=[{PREDICTED}]",
           "--set", "sweep.schemes=" + json.dumps(schemes), *a.set]
    out = run_program(cmd, PROG, show=("minicp --predict:",), timeout=a.timeout).stdout
    steps = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 10 and re.match(r"^\d{3}_", f[0]) and f[2] != "refused:":
            steps[f[0]] = float(f[2])
    return steps


def variant(row):
    return row["scheme"] + ("/" + row["dispatch"] if row["dispatch"] else "")


def key(row):
    """A case apart from its rank count: its mix and scheme/dispatch."""
    return (row["documents"], variant(row))


def slowest_attention(path, case):
    """The slowest rank's attention compute per step (phase attn_compute over every layer and
    both passes, full mode), median over reps: the time an imbalance costs, which the median
    rep's phase times of one rank do not show."""
    with h5py.File(path, "r") as f:
        t = f["cases"][case]["timing"]
        phase = data.names(t.attrs["phase_names"]).index("attn_compute")
        rows = t[()]
    rows = rows[(rows["mode"] == 0) & (rows["phase"] == phase)]
    per = {}
    for r in rows:
        per.setdefault(int(r["rep"]), {}).setdefault(int(r["rank"]), 0.0)
        per[int(r["rep"])][int(r["rank"])] += float(r["seconds"])
    return median([max(ranks.values()) for ranks in per.values()]) if per else float("nan")


def rows_of(files):
    """Every case that ran, with its figures, keyed by (mix, scheme/dispatch) per rank count."""
    df = data.ok_cases(data.case_table(data.load_inputs(list(files.values()))))
    out = {}
    for _, r in df.iterrows():
        row = {"ranks": int(r["ranks"]), "scheme": r["scheme"], "dispatch": r.get("dispatch", "") or "",
               "documents": r.get("documents", "") or "", "case": r["case"],
               "area_imbalance": r["area_imbalance"], "traffic_redundancy": r["traffic_redundancy"],
               "imbalance": r["imbalance"], "step_s": r["measured_time_s"],
               "attention_s": slowest_attention(r["file"], r["case"]) if int(r["ranks"]) == 2 else float("nan"),
               "predicted_step_s": r["predicted_time_s"], "prediction_ratio": r["prediction_ratio"]}
        out.setdefault(key(row), {})[row["ranks"]] = row
    return out


def point_of(case_id):
    """A case id without its number and rank count: the same point of the sweep at any ranks."""
    return re.sub(r"_P\d+", "", re.sub(r"^\d+_", "", case_id), count=1)


def targets(table):
    """The issue's ratios on the outlier mix: area imbalance per dispatch at 4 and 8 ranks,
    the measured imbalance with area dispatch at 2, sequence zigzag over the best dispatch
    (attention time against what the areas predict), groupcast's redundancy on every mix."""
    out = {}
    for P in (2,) + COUNTED:
        for d in ("area", "doc-zigzag", "zigzag"):
            r = table.get(("outlier", "ring/" + d), {}).get(P)
            if r:
                out[f"area_imbalance_outlier_P{P}_{d}"] = r["area_imbalance"]
    ring = {v: by[2] for (mix, v), by in table.items() if mix == "outlier" and v.startswith("ring/") and 2 in by}
    if "ring/area" in ring:
        out["imbalance_outlier_P2_area"] = ring["ring/area"]["imbalance"]
    if "ring/zigzag" in ring and len(ring) > 1:
        best = min(ring.values(), key=lambda r: r["attention_s"])
        out["attention_zigzag_over_best_outlier_P2"] = ring["ring/zigzag"]["attention_s"] / best["attention_s"]
        out["area_zigzag_over_best_outlier_P2"] = ring["ring/zigzag"]["area_imbalance"] / best["area_imbalance"]
        out["best_dispatch_outlier_P2"] = best["dispatch"]
    def redundancy(prefix):  # NaN where the mask needs nothing moved
        return [by[P]["traffic_redundancy"] for (_, v), by in table.items() if v.startswith(prefix) for P in by
                if by[P]["traffic_redundancy"] == by[P]["traffic_redundancy"]]
    gc, ring_all = redundancy("groupcast"), redundancy("ring")
    if gc:
        out["groupcast_traffic_redundancy_max"] = max(gc)
        out["ring_traffic_redundancy_range"] = [min(ring_all), max(ring_all)]
    ratios = [by[2]["prediction_ratio"] for by in table.values() if 2 in by]
    if ratios:
        out["prediction_ratio_P2_range"] = [min(ratios), max(ratios)]
        out["prediction_within_15pct"] = f"{sum(abs(x - 1) <= 0.15 for x in ratios)}/{len(ratios)}"
    return out


def fmt(x, spec=".3g"):
    return "-" if x is None or x != x else format(x, spec)


def markdown(table, predicted):
    """The table of docs/measurements.md: one row per mix and scheme/dispatch."""
    head = ("| mix | scheme/dispatch | area_imbalance P=2 / 4 / 8 | traffic_redundancy P=2 / 4 / 8 | step s P=2 "
            "| attention s P=2 (slowest rank) | predicted / measured P=2 | predicted step s P=64 |")
    lines = [head, "|" + "---|" * 8]
    for (mix, v), by in sorted(table.items()):
        p2 = by.get(2, {})
        area = " / ".join(fmt(by.get(P, {}).get("area_imbalance")) for P in (2,) + COUNTED)
        red = " / ".join(fmt(by.get(P, {}).get("traffic_redundancy")) for P in (2,) + COUNTED)
        lines.append(f"| {mix} | {v} | {area} | {red} | {fmt(p2.get('step_s'))} | {fmt(p2.get('attention_s'))} "
                     f"| {fmt(p2.get('prediction_ratio'))} | {fmt(predicted.get(point_of(p2.get('case', ''))))} |")
    return "\n".join(lines)


def plot(table, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mixes = sorted({mix for mix, _ in table})
    fig, axes = plt.subplots(2, len(mixes), figsize=(4.2 * len(mixes), 7), squeeze=False)
    for j, mix in enumerate(mixes):
        names = sorted(v for m, v in table if m == mix)
        top, bottom = axes[0][j], axes[1][j]
        for i, P in enumerate((2,) + COUNTED):
            vals = [table[(mix, v)].get(P, {}).get("area_imbalance", float("nan")) for v in names]
            top.bar([x + 0.27 * (i - 1) for x in range(len(names))], vals, 0.27, label=f"P = {P}")
        steps = [table[(mix, v)].get(2, {}).get("step_s", float("nan")) for v in names]
        pred = [table[(mix, v)].get(2, {}).get("predicted_step_s", float("nan")) for v in names]
        bottom.bar(range(len(names)), steps, 0.6, label="measured, P = 2")
        bottom.plot(range(len(names)), pred, "k_", markersize=14, label="model, P = 2")
        top.set_title(f"mix {mix}")
        top.set_ylabel("area_imbalance [1] (max / mean)")
        bottom.set_ylabel("step time [s]")
        for ax in (top, bottom):
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
        top.axhline(1.0, color="grey", lw=0.8)
        if j == 0:
            top.legend(fontsize=8)
            bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minicp", default="build/bin/minicp", help="the minicp binary (default: %(default)s)")
    ap.add_argument("--mpiexec", default="mpirun", help="MPI launcher (default: %(default)s)")
    ap.add_argument("--mpiexec-flags", default="--oversubscribe --bind-to none -x OMP_NUM_THREADS=1 "
                    "-x OMP_PROC_BIND=false", help="its flags (default: %(default)s)")
    ap.add_argument("--deck", default="inputs/documents-study.toml", help="the study's deck (default: %(default)s)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a deck override passed to every run (repeatable; default: none)")
    ap.add_argument("--out", default="results/documents/documents.json",
                    help="the study's JSON; its results files, table and plot go beside it (default: %(default)s)")
    ap.add_argument("--no-run", action="store_true",
                    help="analyse the results files a previous run left beside --out, run nothing (default: off)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds each run may take (default: %(default)s)")
    a = ap.parse_args()
    a.set = [x for kv in a.set for x in ("--set", kv)]
    if not os.path.isfile(a.minicp):
        sys.exit(f"{PROG}: --minicp {a.minicp}: no such file (make build first)")
    outdir = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(outdir, exist_ok=True)
    files = run_decks(a, outdir)
    with h5py.File(files[2], "r") as f:
        table_text = data.text(f.attrs["calibration"])
    table = rows_of(files)
    schemes = sorted({r["scheme"] for by in table.values() for r in by.values() if r["scheme"] != "ulysses"})
    predicted = {point_of(k): v for k, v in predict_at(a, table_text, schemes, outdir).items()}
    doc = {"host": platform.processor() or platform.machine(), "cpu": cpu_model(), "deck": a.deck,
           "files": files, "targets": targets(table),
           "cases": [dict(r, predicted_step_s_P64=predicted.get(point_of(r["case"]))) for by in table.values()
                     for r in by.values()]}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, default=float)
    md = markdown(table, predicted)
    with open(os.path.splitext(a.out)[0] + ".md", "w") as f:
        f.write(md + "\n")
    plot(table, os.path.splitext(a.out)[0] + ".png")
    print(md)
    print(f"host: {doc['cpu']}")
    for k, v in doc["targets"].items():
        print(f"  {k}: {v}")
    print(f"{PROG}: {a.out}, {os.path.splitext(a.out)[0]}.md and .png")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
