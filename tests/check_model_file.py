#!/usr/bin/python3
"""Checks the performance model's figures in a results file that minicp wrote with
run.calibration = "measure", against the file itself and against `minicp --predict --against`:
  - the table kept in the file (root attribute `calibration`) holds the links measured alone
    (a `link` row with the all-reduce's rate) and beside compute (`busy` rows, exchange and
    all-reduce, with a wire rate > 0 and a loss >= 0);
  - every case that ran has a finite predicted_time_s > 0, and its predicted phases add up to it;
  - `minicp --predict --against FILE` exits 0, prints the links beside compute, and predicts each
    case as the run did (same table, same drift scale: the two computations agree to the 4
    digits printed).
Usage: check_model_file.py --minicp BIN --file FILE.h5"""
import argparse
import math
import re
import subprocess
import sys

import h5py

from check_analysis import fail, text, verdict  # the same failure list, attribute reading and verdict


def check_table(table):
    rows = [ln.split() for ln in table.splitlines() if ln and not ln.startswith("#")]
    links = [r for r in rows if r[0] == "link"]
    busy = {(r[2], r[3]): (float(r[4]), float(r[5])) for r in rows if r[0] == "busy"}
    if not links or len(links[0]) < 7 or float(links[0][6]) <= 0:
        fail(f"calibration: no link row with the all-reduce's rate: {links}")
    for kind in ("p2p", "allreduce"):
        if ("intra", kind) not in busy:
            fail(f"calibration: no 'busy <fabric> intra {kind}' row (rows: {sorted(busy)})")
            continue
        wire, cpu = busy[("intra", kind)]
        if not (wire > 0 and cpu >= 0 and math.isfinite(wire) and math.isfinite(cpu)):
            fail(f"calibration: busy intra {kind}: wire {wire} B/s, loss {cpu} B/s out of range")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minicp", required=True)
    ap.add_argument("--file", required=True)
    a = ap.parse_args()
    stored = {}
    with h5py.File(a.file, "r") as f:
        check_table(text(f.attrs["calibration"]))
        for cid, g in f["cases"].items():
            if text(g.attrs["status"]) != "ok":
                continue
            s = g["summary"].attrs
            t = float(s["predicted_time_s"])
            if not (math.isfinite(t) and t > 0):
                fail(f"{cid}: predicted_time_s {t}")
                continue
            phases = sum(float(v) for k, v in s.items() if k.startswith("predicted_") and k.endswith("_s")
                         and k not in ("predicted_time_s", "predicted_forward_time_s", "predicted_backward_time_s"))
            if abs(phases - t) > 1e-6 * t:
                fail(f"{cid}: predicted phases add up to {phases:.6g} s, the step is {t:.6g} s")
            stored[cid] = t
    if not stored:
        fail("no case ran")
    out = subprocess.run([a.minicp, "--predict", "--against", a.file], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail(f"minicp --predict --against: exit {out.returncode}: {out.stderr}")
    for what in ("intra-node exchange", "intra-node all-reduce"):
        if not re.search(rf"beside compute, {what}: [0-9.e+-]+ GB/s; compute loses", out.stdout):
            fail(f"--against does not print the {what} beside compute:\n{out.stdout}")
    seen = 0
    for line in out.stdout.splitlines():
        f = line.split()
        if f and f[0] in stored:
            seen += 1
            predicted = float(f[2])
            if abs(predicted - stored[f[0]]) > 1e-3 * stored[f[0]]:
                fail(f"{f[0]}: --against predicts {predicted} s, the run stored {stored[f[0]]:.6g} s")
    if seen != len(stored):
        fail(f"--against printed {seen} of the {len(stored)} cases that ran:\n{out.stdout}")
    return verdict(f"model figures of {len(stored)} cases")


if __name__ == "__main__":
    sys.exit(main())
