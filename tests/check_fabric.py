#!/usr/bin/env python3
"""Runs minicp under a fabric profile and checks that the run used it: exit code 0, the
start-up line names the profile, and the results file records the profile, its settings and
what MPI selected (the PML, and for ob1 every BTL the profile lists), and is complete.
Usage: check_fabric.py --out FILE.h5 --fabric NAME --pml PML [--btls a,b] -- MPIRUN... MINICP [ARGS...]"""
import argparse
import os
import subprocess
import sys

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))


def text(f, k):
    v = f.attrs[k]
    return v.decode() if isinstance(v, bytes) else str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fabric", required=True)
    ap.add_argument("--pml", required=True, help="the PML MPI must have selected")
    ap.add_argument("--btls", default="", help="BTLs that must be initialised (ob1)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if os.path.exists(args.out):
        os.remove(args.out)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_pml") and not k.startswith("UCX_")}
    p = subprocess.run(cmd + ["--fabric", args.fabric, "--out", args.out], env=env, capture_output=True,
                       text=True, timeout=240)
    out = p.stdout + p.stderr
    fails = []
    if p.returncode != 0:
        fails.append(f"exit code {p.returncode}:\n{out[-3000:]}")
    else:
        with h5py.File(args.out, "r") as f:
            got = {k: text(f, k) for k in ("fabric", "fabric_settings", "mpi_pml", "mpi_btls", "mpi_selection_source")}
        if got["fabric"] != args.fabric:
            fails.append(f"file records fabric {got['fabric']!r}, expected {args.fabric!r}")
        if not got["fabric_settings"]:
            fails.append("file records no fabric_settings")
        if got["mpi_pml"] != args.pml:
            fails.append(f"file records mpi_pml {got['mpi_pml']!r}, expected {args.pml!r}")
        missing = [b for b in args.btls.split(",") if b and b not in got["mpi_btls"].split(",")]
        if missing:
            fails.append(f"BTLs {missing} not in the recorded mpi_btls {got['mpi_btls']!r}")
        if f"fabric {args.fabric}" not in out:
            fails.append(f"the start-up output does not name the fabric:\n{out[:1500]}")
        c = subprocess.run([sys.executable, os.path.join(HERE, "check_results.py"), args.out, "--complete"],
                           capture_output=True, text=True)
        if c.returncode != 0:
            fails.append("check_results.py: " + c.stdout + c.stderr)
        print(f"check_fabric: {args.fabric}: pml {got['mpi_pml']}, btls {got['mpi_btls']} "
              f"({got['mpi_selection_source']}); settings {got['fabric_settings']}")
    for x in fails:
        print("FAIL:", x)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
