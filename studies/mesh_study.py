#!/usr/bin/env python3
"""Mesh placement study (`make mesh-study`, as root): why the rank order matters. Two emulated
nodes (slurm/vcluster, each node's link capped, profile vc-1g by default) hold 2 ranks each,
consecutive ranks on one node (ranks 0, 1 on node1; 2, 3 on node2). One TP2 x CP2 layer runs
in two orders of its axes:

  tp-cp-dp  a TP group is a node's two ranks: TP's collectives stay inside the node (shared
            memory) and only CP's ring crosses the capped link (Megatron's order);
  cp-tp-dp  the reverse: a CP group is a node's two ranks and every TP collective crosses the
            link.

Each placement runs --rounds times, alternated (the host drifts), with the model's table
measured at start-up under the fabric. Prints, per placement: the step time (median over the
rounds of each file's measured_time_s), the TP collectives' bytes and exposed time, the
attention's communication wait, the model's prediction; then the ratio of the reverse order's
step to Megatron's and one grep-able line. The 4 ranks share this machine's cores: the ratio
and the bytes are the result, the absolute times are the host's.

  mesh_study.py [--build DIR] [--fabric vc-1g] [--rounds 2] [--out-dir results/mesh]"""
import argparse
import os
import statistics
import sys
import time
import tomllib

import h5py

from common import run_program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORDERS = ("tp-cp-dp", "cp-tp-dp")
SHOWN = ("MINICP", "minicp: fabric", "WARNING", "minicp:")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build tree (default: %(default)s)")
    p.add_argument("--fabric", default="vc-1g", help="an emulated fabric profile of inputs/fabrics/ (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each placement, alternated (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=1024, help="global tokens (default: %(default)s)")
    p.add_argument("--scheme", default="zigzag", help="the CP scheme (default: %(default)s)")
    p.add_argument("--tp-overlap", default="off", choices=("off", "on"),
                   help="run.tp_overlap: TP collectives beside the GEMMs that do not need them (default: %(default)s)")
    p.add_argument("--out-dir", default=os.path.join(ROOT, "results", "mesh"), help="(default: %(default)s)")
    p.add_argument("--vcluster-name", default="ms", help="name prefix of the emulated cluster (default: %(default)s)")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per run (default: %(default)s)")
    a = p.parse_args()
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: must be >= 1")
    if a.seq_len < 4:
        p.error(f"--seq-len {a.seq_len}: must be >= 4")
    path = os.path.join(ROOT, "inputs", "fabrics", a.fabric + ".toml")
    if not os.path.isfile(path):
        p.error(f"--fabric {a.fabric}: no profile inputs/fabrics/{a.fabric}.toml")
    with open(path, "rb") as f:
        prof = tomllib.load(f)
    if prof.get("kind") != "emulated":
        p.error(f"--fabric {a.fabric}: kind {prof.get('kind')!r}, the study needs an emulated profile (vc-*)")
    a.rate = prof.get("emulated", {}).get("rate", "")
    return a


def one_run(a, vc, order, k):
    out = os.path.join(a.out_dir, f"{order}_{k}.h5")
    cmd = [vc, "mpirun", "--name", a.vcluster_name, "-np", "4", "--map-by", "ppr:2:node", "--bind-to", "none",
           "-x", "OMP_NUM_THREADS=1", "-x", "OMP_PROC_BIND=false",
           os.path.join(a.build, "bin", "minicp"), "--deck", os.path.join(ROOT, "inputs", "fabric-study.toml"),
           "--fabric", a.fabric, "--out", out, "--overwrite",
           "--set", f"sweep.schemes=[\"{a.scheme}\"]", "--set", f"sweep.seq_len=[{a.seq_len}]",
           "--set", "sweep.ranks=[2]", "--set", "sweep.tp=[2]", "--set", f"run.rank_order=\"{order}\"",
           "--set", "run.rounds=3", "--set", "run.modes=[\"full\"]", "--set", f"run.tp_overlap=\"{a.tp_overlap}\""]
    run_program(cmd, "mesh_study", timeout=a.timeout, show=SHOWN)
    with h5py.File(out, "r") as f:
        (g,) = f["cases"].values()
        s = g["summary"].attrs
        return {k2: float(s[k2]) for k2 in ("measured_time_s", "predicted_time_s", "tp_bytes_sent_per_rank",
                                             "tp_comm_wait_s", "attn_comm_wait_s", "attn_bytes_sent_per_rank")}


def main():
    a = parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    vc = os.path.join(ROOT, "slurm", "vcluster")
    os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    t0 = time.time()
    run_program([vc, "down", "--name", a.vcluster_name], "mesh_study", timeout=120, check=False)
    run_program([vc, "up", "2", "--name", a.vcluster_name] + (["--rate", a.rate] if a.rate else []), "mesh_study",
                timeout=300)
    got = {o: [] for o in ORDERS}
    try:
        for k in range(a.rounds):
            for order in ORDERS:
                got[order].append(one_run(a, vc, order, k))
    finally:
        run_program([vc, "down", "--name", a.vcluster_name], "mesh_study", timeout=120, check=False)
    print(f"\nmesh study: TP2 x CP2, {a.scheme}, S = {a.seq_len}, fabric {a.fabric}, 2 nodes x 2 ranks, "
          f"tp_overlap {a.tp_overlap}, {a.rounds} runs each")
    print(f"{'order':10} {'step s':>9} {'pred s':>9} {'TP MB/rank':>11} {'TP wait s':>13} {'attn wait s':>12} "
          f"{'attn MB/rank':>13}")
    med = {}
    for order in ORDERS:
        m = {k: statistics.median(r[k] for r in got[order]) for k in got[order][0]}
        med[order] = m
        print(f"{order:10} {m['measured_time_s']:9.4f} {m['predicted_time_s']:9.4f} "
              f"{m['tp_bytes_sent_per_rank'] / 1e6:11.2f} {m['tp_comm_wait_s']:13.4f} {m['attn_comm_wait_s']:12.4f} "
              f"{m['attn_bytes_sent_per_rank'] / 1e6:13.2f}")
    ratio = med["cp-tp-dp"]["measured_time_s"] / med["tp-cp-dp"]["measured_time_s"]
    pratio = med["cp-tp-dp"]["predicted_time_s"] / med["tp-cp-dp"]["predicted_time_s"]
    print(f"TP across the link / TP inside the node: step {ratio:.2f}x measured, {pratio:.2f}x predicted")
    print(f"MINICP_MESH_STUDY fabric={a.fabric} seq_len={a.seq_len} tp_overlap={a.tp_overlap} rounds={a.rounds} step_ratio={ratio:.3f} predicted_ratio={pratio:.3f} "
          f"tp_inside_s={med['tp-cp-dp']['measured_time_s']:.4f} tp_across_s={med['cp-tp-dp']['measured_time_s']:.4f} "
          f"minutes={(time.time() - t0) / 60:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
