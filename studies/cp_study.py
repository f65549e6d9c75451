#!/usr/bin/env python3
"""CP study (`make cp-study`): the part-2 figures of merit on one node, from
minicp-cp-bench runs launched here with mpiexec:
  - overlap of zigzag (causal, forward+backward, 2 ranks x 1 thread) at a size where
    T_compute >= 2 T_comm, for progress = thread and none, and with the progress threads on
    CPUs that do not compute;
  - CP efficiency = T(none, 1 rank x 2 threads) / T(zigzag, 2 ranks x 1 thread), runs
    alternated so drifts of a shared machine hit both;
  - load imbalance (max/mean compute time per rank) of contiguous `ring` vs `zigzag`.
Prints a table and one grep-able MINICP_CP_STUDY line; writes the raw runs as JSON."""
import argparse
import json
import os
import shutil
import statistics
import sys

from common import run_json


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--bench", default="build/bin/minicp-cp-bench", help="minicp-cp-bench binary")
    p.add_argument("--mpiexec", default="mpiexec", help="MPI launcher")
    p.add_argument("--out", default="results/cp_study.json", help="JSON file written")
    p.add_argument("--overlap-seq", type=int, default=1024, help="S of the overlap runs, tokens")
    p.add_argument("--eff-seq", type=int, default=8192, help="S of the CP-efficiency and imbalance runs, tokens")
    p.add_argument("--heads", type=int, default=8, help="heads (= kv heads)")
    p.add_argument("--head-dim", type=int, default=128, help="head dimension D")
    p.add_argument("--reps", type=int, default=41, help="repetitions of each overlap run (median)")
    p.add_argument("--eff-rounds", type=int, default=3, help="alternated none/zigzag rounds for CP efficiency")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"], help="stored values of every run")
    a = p.parse_args()
    for k in ("overlap_seq", "eff_seq", "heads", "head_dim", "reps", "eff_rounds"):
        if getattr(a, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be >= 1 (got {getattr(a, k)})")
    return a


def bench(a, ranks, threads, args, bind=None, wrap=()):
    """One minicp-cp-bench run; bind: Open MPI --bind-to (default core for 1 thread per
    rank), wrap: a command each rank runs under (e.g. taskset -c 0)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    bind = bind or ("core" if threads == 1 else "none")
    cmd = [a.mpiexec, "-n", str(ranks), "--oversubscribe", "--bind-to", bind,
           "-x", f"OMP_NUM_THREADS={threads}", "-x", "OMP_PROC_BIND=false", *wrap, a.bench,
           "--heads", str(a.heads), "--kv-heads", str(a.heads), "--head-dim", str(a.head_dim), "--dtype", a.dtype] + args
    return run_json(lambda path: cmd + ["--json", path], "cp_study", "minicp-cp-bench", env=env,
                    show=("MINICP_CP", "overlap", "load imbalance"))


def main():
    a = parse_args()
    if not os.access(a.bench, os.X_OK):
        print(f"cp_study: --bench {a.bench} is not an executable (run `make` first)", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    runs = {}
    print(f"cp_study: overlap at S={a.overlap_seq}, CP efficiency and imbalance at S={a.eff_seq}, "
          f"H={a.heads}, D={a.head_dim}, causal, forward+backward; takes a few minutes", flush=True)
    for prog in ("thread", "none"):
        runs[f"overlap_{prog}"] = bench(a, 2, 1, ["--scheme", "zigzag", "--seq", str(a.overlap_seq), "--reps",
                                                  str(a.reps), "--warmup", "2", "--progress", prog])
    # The same overlap runs with the progress threads on CPUs that do not compute. A node
    # with >= 4 CPUs: ranks on cores 0 and 1, progress threads on CPUs 2 and 3. Fewer CPUs:
    # both ranks compute on CPU 0 (so each computes at half speed) and the progress threads
    # run on CPU 1, against a control with the progress threads on CPU 0 as well.
    ov_args = ["--scheme", "zigzag", "--seq", str(a.overlap_seq), "--reps", str(a.reps), "--warmup", "2"]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 4:
        pc = f"{cpus[2]},{cpus[3]}"
        spare = [(f"progress threads on CPUs {pc}; ranks on the first two cores",
                  bench(a, 2, 1, ov_args + ["--progress-cpus", pc]))]
    elif len(cpus) >= 2 and shutil.which("taskset"):
        wrap = ("taskset", "-c", str(cpus[0]))
        spare = [(f"both ranks on CPU {cpus[0]}, progress threads on CPU {cpus[1]}",
                  bench(a, 2, 1, ov_args + ["--progress-cpus", str(cpus[1])], bind="none", wrap=wrap)),
                 (f"both ranks on CPU {cpus[0]}, progress threads on CPU {cpus[0]}",
                  bench(a, 2, 1, ov_args, bind="none", wrap=wrap))]
    else:
        print("cp_study: skipped the spare-CPU overlap runs: they need 2 CPUs and taskset, or 4 CPUs", flush=True)
        spare = []
    runs["overlap_spare_cpu"] = [{"placement": name, **r} for name, r in spare]
    t_none, t_zz = [], []
    for _ in range(a.eff_rounds):
        r1 = bench(a, 1, 2, ["--scheme", "none", "--seq", str(a.eff_seq), "--reps", "1", "--warmup", "1",
                             "--modes", "full"])
        r2 = bench(a, 2, 1, ["--scheme", "zigzag", "--seq", str(a.eff_seq), "--reps", "1", "--warmup", "1",
                             "--modes", "full,compute-only"])
        t_none.append(r1["modes"]["full"]["time_s"])
        t_zz.append(r2["modes"]["full"]["time_s"])
        runs.setdefault("eff_zigzag", []).append(r2)
    runs["imbalance_ring"] = bench(a, 2, 1, ["--scheme", "ring", "--seq", str(a.eff_seq), "--reps", "1",
                                             "--warmup", "1", "--modes", "compute-only"])
    eff = statistics.median(t_none) / statistics.median(t_zz)
    ov_t, ov_n = runs["overlap_thread"], runs["overlap_none"]
    ratio = ov_t["modes"]["compute-only"]["time_s"] / ov_t["modes"]["comm-only"]["time_s"]
    zz_imb = statistics.median(r["imbalance"] for r in runs["eff_zigzag"])
    zz_fimb = runs["eff_zigzag"][0]["flop_imbalance"]
    ring = runs["imbalance_ring"]
    print()
    print(f"{'measure':<58}{'value':>10}")
    print(f"{'overlap, zigzag S=%d, progress=thread (T_compute/T_comm=%.1f)' % (a.overlap_seq, ratio):<58}"
          f"{ov_t['overlap']:>10.3f}   quartiles {ov_t['overlap_q1']:.2f} .. {ov_t['overlap_q3']:.2f}")
    print(f"{'overlap, zigzag S=%d, progress=none' % a.overlap_seq:<58}{ov_n['overlap']:>10.3f}"
          f"   quartiles {ov_n['overlap_q1']:.2f} .. {ov_n['overlap_q3']:.2f}")
    busy = max(ov_t["modes"]["full"]["progress_s"])
    print(f"{'  exposed comm T_full - T_compute, progress=thread [ms]':<58}{ov_t['exposed_comm_s'] * 1e3:>10.2f}")
    print(f"{'  progress thread time inside MPI (copies), full [ms]':<58}{busy * 1e3:>10.2f}")
    for name, r in spare:
        print(f"{'overlap, ' + name:<58}{r['overlap']:>10.3f}   exposed {r['exposed_comm_s'] * 1e3:.2f} ms"
              f" of T_comm {r['modes']['comm-only']['time_s'] * 1e3:.2f} ms")
    print(f"{'CP efficiency T(none,1x2)/T(zigzag,2x1), S=%d' % a.eff_seq:<58}{eff:>10.3f}")
    print(f"{'imbalance (compute time max/mean), zigzag S=%d' % a.eff_seq:<58}{zz_imb:>10.3f}")
    print(f"{'imbalance (executed FLOPs max/mean), zigzag':<58}{zz_fimb:>10.3f}")
    print(f"{'imbalance (compute time max/mean), ring S=%d' % a.eff_seq:<58}{ring['imbalance']:>10.3f}")
    print(f"{'imbalance (executed FLOPs max/mean), ring':<58}{ring['flop_imbalance']:>10.3f}")
    print(f"MINICP_CP_STUDY dtype={a.dtype} overlap_thread={ov_t['overlap']:.3f} overlap_none={ov_n['overlap']:.3f} "
          f"overlap_spare_cpu={spare[0][1]['overlap'] if spare else float('nan'):.3f} exposed_ms={ov_t['exposed_comm_s'] * 1e3:.2f} "
          f"progress_copy_ms={busy * 1e3:.2f} "
          f"compute_over_comm={ratio:.1f} cp_efficiency={eff:.3f} t_none_s={statistics.median(t_none):.3f} "
          f"t_zigzag_s={statistics.median(t_zz):.3f} imbalance_zigzag={zz_imb:.3f} "
          f"imbalance_ring={ring['imbalance']:.3f} flop_imbalance_ring={ring['flop_imbalance']:.3f}")
    with open(a.out + ".tmp", "w") as f:
        json.dump({"t_none_s": t_none, "t_zigzag_s": t_zz, "cp_efficiency": eff, "runs": runs}, f, indent=1)
    os.replace(a.out + ".tmp", a.out)
    print(f"cp_study: JSON written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
