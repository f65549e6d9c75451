#!/usr/bin/env python3
"""Fidelity study (`make fidelity-study`): minicp-fidelity at each rank count (ranks may
outnumber the cores: this measures numbers, not speed), every scheme, the four masks, MHA
and GQA, in fp32, bf16 and bf16 with bf16 accumulators, against fp64 on the same inputs.
Joins the runs into one JSON file (results/fidelity.json), prints the table of each scheme's
worst error over the single-rank error (analysis/minicp_analysis/fidelity.py) and one
grep-able MINICP_FIDELITY line. `make plots RUN=results/fidelity.json` draws it."""
import argparse
import json
import os
import sys

from common import run_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "analysis"))
from minicp_analysis import fidelity  # noqa: E402
from minicp_analysis.outputs import write_whole  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fidelity", default="build/bin/minicp-fidelity", help="minicp-fidelity binary")
    p.add_argument("--mpiexec", default="mpiexec", help="MPI launcher")
    p.add_argument("--ranks", default="1,2,3,4,6,8", help="comma list of rank counts P")
    p.add_argument("--out", default="results/fidelity.json", help="the study's JSON file")
    p.add_argument("--timeout", type=int, default=1800, help="seconds one rank count may take")
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="after --: flags for minicp-fidelity (--schemes, --masks, --seq-len, ...)")
    a = p.parse_args()
    try:
        a.ranks = [int(x) for x in a.ranks.split(",")]
    except ValueError:
        p.error(f"--ranks {a.ranks}: must be a comma list of integers")
    if not a.ranks or min(a.ranks) < 1:
        p.error(f"--ranks {a.ranks}: each must be >= 1")
    if a.timeout < 1:
        p.error(f"--timeout {a.timeout}: must be >= 1")
    if a.args[:1] == ["--"]:
        a.args = a.args[1:]
    return a


def run_at(a, P):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [a.mpiexec, "-n", str(P), "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1",
           "-x", "OMP_PROC_BIND=false", a.fidelity]
    return run_json(lambda path: cmd + ["--out", path] + a.args, "fidelity_study", f"minicp-fidelity at P={P}",
                    env=env, timeout=a.timeout, show=("minicp-fidelity",))


def main():
    a = parse_args()
    runs = [run_at(a, P) for P in a.ranks]
    doc = {"file_kind": fidelity.FILE_KIND, "ranks": a.ranks, "command": " ".join(sys.argv),
           "attention_isa": runs[0].get("attention_isa", ""), "gemm_bf16_engine": runs[0].get("gemm_bf16_engine", ""),
           "scheme_registry": runs[0].get("scheme_registry", []),
           "rows": [r for d in runs for r in d["rows"]],
           "skipped": [dict(s, ranks=d["ranks"]) for d in runs for s in d["skipped"]]}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    write_whole("--out", a.out, lambda fh: json.dump(doc, fh, indent=1))
    print(fidelity.table_markdown(doc))
    print()
    print(fidelity.none_errors_markdown(doc))
    worst = max((fidelity.ratio(r) for r in doc["rows"] if r["variant"] == "bf16"), default=float("nan"))
    print(f"MINICP_FIDELITY ranks={','.join(map(str, a.ranks))} rows={len(doc['rows'])} "
          f"skipped={len(doc['skipped'])} bf16_worst_ratio={worst:.3f} limit={fidelity.LIMIT} file={a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
