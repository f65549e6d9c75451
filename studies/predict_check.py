#!/usr/bin/python3
"""The performance model against measurement: `minicp --predict --against FILE` on results
files (the default study, the fabric study's files). By default each file is predicted with
the calibration table its run measured at start-up (run.calibration = "measure", kept in the
file); with --table, with that table, whose link rows for the fabric profiles come from the
fabric study's alpha and beta (fabric_study.csv, measured by minicp-comm-bench): intra-node
for a local profile, inter-node for an emulated one. Prints, per file and in all, the cases within 15% and 10%, the worst
predicted / measured ratio, and how often the scheme the model ranks first is the measured
best or within 5% of it; writes the per-case ratios as CSV.

  /usr/bin/python3 studies/predict_check.py --minicp build/bin/minicp \\
      results/study.h5 results/fabric/*.h5
"""
import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile


def link_rows(fabric_csv, table_text):
    """`link` rows from the fabric study: alpha (us) and the fitted beta (GB/s) per profile."""
    m = re.search(r"^link default intra (\S+) (\S+) (\S+)", table_text, re.M)
    copy_Bps = float(m.group(3)) if m else 0.0  # what a CPU copies per second on this node
    rows = []
    with open(fabric_csv) as f:
        for r in csv.DictReader(f):
            alpha, beta = float(r["alpha_us"]) * 1e-6, float(r["beta_fit_GBps"]) * 1e9
            if r["kind"] == "local":
                rows.append(f"link {r['profile']} intra {alpha:.4g} {beta:.4g} {beta:.4g}")
            else:  # emulated nodes: TCP across a veth link, copied by the CPU at the node's rate
                rows.append(f"link {r['profile']} inter {alpha:.4g} {beta:.4g} {copy_Bps or beta:.4g}")
    return sorted(set(rows))


def check(minicp, table, path):
    cmd = [minicp, "--predict", "--against", path] + (["--calibration", table] if table else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        sys.exit(f"predict_check: minicp --predict --against {path} failed:\n{out.stderr}{out.stdout}")
    cases = []
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) >= 13 and re.match(r"^\d{3}_", f[0]):
            cases.append({"file": path, "case": f[0], "scheme": f[1], "predicted_s": float(f[2]),
                          "measured_s": float(f[-2]), "ratio": float(f[-1])})
    hits = re.search(r"advise_hits=(\d+)/(\d+)", out.stdout)
    return cases, (int(hits.group(1)), int(hits.group(2))) if hits else (0, 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="results files to compare with")
    ap.add_argument("--minicp", default="build/bin/minicp", help="the minicp binary (default: %(default)s)")
    ap.add_argument("--table", default="",
                    help="calibration table written by minicp --calibrate (default: each file's own)")
    ap.add_argument("--fabric-csv", default="results/fabric/fabric_study.csv",
                    help="the fabric study's alpha/beta per profile, for the links (default: %(default)s; "
                         "skipped when absent)")
    ap.add_argument("--csv", default="results/predict_check.csv", help="per-case output (default: %(default)s)")
    a = ap.parse_args()
    table = ""
    if a.table:
        if not os.path.exists(a.table):
            ap.error(f"--table {a.table}: no such file (write one with minicp --calibrate)")
        text = open(a.table).read()
        extra = link_rows(a.fabric_csv, text) if os.path.exists(a.fabric_csv) else []
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as t:
            t.write(text + "\n# links from " + a.fabric_csv + "\n" + "\n".join(extra) + "\n")
            table = t.name
    try:
        rows, hit, groups = [], 0, 0
        print(f"{'file':44s} {'cases':>5s} {'<=15%':>6s} {'<=10%':>6s} {'worst':>7s}  worst case / advise")
        for path in a.files:
            cases, (h, n) = check(a.minicp, table, path)
            rows += cases
            hit, groups = hit + h, groups + n
            if not cases:
                continue
            worst = max(cases, key=lambda c: abs(c["ratio"] - 1))
            print(f"{os.path.basename(path):44s} {len(cases):5d} {sum(abs(c['ratio'] - 1) <= 0.15 for c in cases):6d} "
                  f"{sum(abs(c['ratio'] - 1) <= 0.10 for c in cases):6d} {worst['ratio']:7.3f}  {worst['case']}; "
                  f"advise {h}/{n}")
        worst = max(rows, key=lambda c: abs(c["ratio"] - 1))
        print(f"MINICP_MODEL_CHECK files={len(a.files)} cases={len(rows)} "
              f"within_15pct={sum(abs(c['ratio'] - 1) <= 0.15 for c in rows)} "
              f"within_10pct={sum(abs(c['ratio'] - 1) <= 0.10 for c in rows)} worst_ratio={worst['ratio']:.3f} "
              f"worst_case={os.path.basename(worst['file'])}:{worst['case']} advise_hits={hit}/{groups}")
        os.makedirs(os.path.dirname(a.csv) or ".", exist_ok=True)
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"predict_check: per-case ratios in {a.csv}")
    finally:
        if table:
            os.unlink(table)


if __name__ == "__main__":
    main()
