#!/usr/bin/env python3
"""The fidelity study end to end on a small problem: studies/fidelity_study.py at two
rank counts (minicp-fidelity under mpiexec), then its file checked: every scheme asked for
has a row for every precision, level and tensor at every P where it runs, every figure is
finite and >= 0, every fp32 and bf16 ratio to `none` meets the rule (<= 2; bf16 attention
O, dQ, dK, dV <= 1.1: fidelity.limit), the table names
every scheme, and `minicp_analysis plots` draws fidelity.png from it.
Usage: check_fidelity.py --fidelity BIN --mpiexec MPIEXEC --work DIR"""
import argparse
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "analysis"))
from minicp_analysis import fidelity  # noqa: E402

SCHEMES = ["none", "ring", "zigzag", "ulysses", "passq"]
ATTENTION = {"O", "LSE", "dQ", "dK", "dV"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fidelity", required=True)
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    out = os.path.join(a.work, "fidelity.json")
    if os.path.exists(out):
        os.remove(out)
    study = [sys.executable, os.path.join(ROOT, "studies", "fidelity_study.py"), "--fidelity", a.fidelity,
             "--mpiexec", a.mpiexec, "--ranks", "1,2", "--out", out, "--timeout", "240", "--",
             "--schemes", ",".join(SCHEMES), "--masks", "causal,documents", "--seq-len", "96", "--heads", "4",
             "--kv-heads", "4,2", "--head-dim", "16", "--hidden", "64", "--ffn", "96"]
    r = subprocess.run(study, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    print(r.stdout)
    fails = []
    if r.returncode != 0:
        sys.exit(f"FAIL: the study exited with {r.returncode}")
    doc = fidelity.load(out)
    rows = doc["rows"]
    for scheme in SCHEMES:
        for P in (1, 2):
            mine = [x for x in rows if x["scheme"] == scheme and x["ranks"] == P]
            refused = [s for s in doc["skipped"] if s["scheme"] == scheme and s["ranks"] == P]
            if not mine and not refused:
                fails.append(f"{scheme} P={P}: neither rows nor a skipped entry")
            if not mine:
                continue
            for var in fidelity.VARIANTS:
                att = {x["tensor"] for x in mine if x["variant"] == var and x["level"] == "attention"}
                lay = {x["tensor"] for x in mine if x["variant"] == var and x["level"] == "layer"}
                if att != ATTENTION:
                    fails.append(f"{scheme} P={P} {var}: attention tensors {sorted(att)}")
                if not {"y", "dx", "l0.dwq", "l1.dw2"} <= lay:
                    fails.append(f"{scheme} P={P} {var}: layer tensors {sorted(lay)[:6]}...")
    for x in rows:
        for k in ("rel_fro", "max_rel", "none_rel_fro", "none_max_rel"):
            v = x[k]
            if v is None or not math.isfinite(v) or v < 0:
                fails.append(f"{x['scheme']} P={x['ranks']} {x['variant']} {x['tensor']}: {k} = {v}")
        q = fidelity.ratio(x)
        # At P = 1 the ring schemes are `none` with other buffers; at 2 each must meet the rule.
        if x["variant"] in ("f32", "bf16") and not q <= fidelity.limit(x) and x["none_rel_fro"] > 1e-7:
            fails.append(f"{x['scheme']} P={x['ranks']} {x['variant']} {x['level']} {x['tensor']} {x['mask']}: "
                         f"ratio {q:.2f} > {fidelity.limit(x)}")
    table = fidelity.table_markdown(doc)
    for scheme in SCHEMES:
        if f"| {scheme} |" not in table:
            fails.append(f"the table lacks {scheme}")
    plots = os.path.join(a.work, "plots")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "analysis"))
    r = subprocess.run([sys.executable, "-m", "minicp_analysis", "plots", out, "--out", plots, "--overwrite"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    print(r.stdout)
    if r.returncode != 0 or not os.path.isfile(os.path.join(plots, "fidelity.png")):
        fails.append(f"plots exited {r.returncode} without fidelity.png")
    for f in fails:
        print("FAIL:", f)
    if fails:
        sys.exit(1)
    print(f"fidelity study: {len(rows)} rows, {len(doc['skipped'])} skipped, all checks passed")


if __name__ == "__main__":
    main()
