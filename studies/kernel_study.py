#!/usr/bin/env python3
"""Kernel study (`make kernel-study`): one run of minicp-kernels-bench measuring SGEMM and fp32
attention forward/backward, printed as ratios of attention useful FLOP/s to the SGEMM
FLOP/s of the same run, plus a grep-able MINICP_KERNELS summary line. Then the small blocks:
the causal forward and backward, fp32 and bf16, at --small-seq rows against --seq rows (the
same --small-head-dim), in alternated rounds: the rate a ring step's block of S/P rows keeps."""
import argparse
import json
import os
import sys

from common import run_json


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--bench", default="build/bin/minicp-kernels-bench", help="benchmark binary")
    p.add_argument("--out", default="results/kernel_study.json", help="JSON file written (Google Benchmark output)")
    p.add_argument("--seq", type=int, default=4096, help="sequence length S of the ratio cases, tokens")
    p.add_argument("--long-seq", type=int, default=32768,
                   help="longer causal S also run (forward+backward), tokens; 0 skips it")
    p.add_argument("--head-dim", type=int, default=128, help="head dimension D")
    p.add_argument("--heads", type=int, default=8, help="query heads (= kv heads)")
    p.add_argument("--gemm-n", type=int, default=2048, choices=[512, 1024, 2048], help="SGEMM size M=N=K")
    p.add_argument("--threads", type=int, default=0, help="OpenMP threads (0: OMP_NUM_THREADS or all cores)")
    p.add_argument("--min-time", type=float, default=0.5, help="Google Benchmark min time per case, seconds")
    p.add_argument("--small-seq", type=int, default=1024, help="rows of the small-block cases, tokens; 0 skips them")
    p.add_argument("--small-head-dim", type=int, default=64, help="head dimension D of the small-block cases")
    p.add_argument("--small-rounds", type=int, default=2, help="alternated rounds of the small-block cases")
    a = p.parse_args()
    for name in ("seq", "head_dim", "heads", "min_time", "small_head_dim", "small_rounds"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0 (got {getattr(a, name)})")
    for name in ("long_seq", "small_seq"):
        if getattr(a, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(a, name)})")
    if a.small_head_dim % 2:
        p.error(f"--small-head-dim must be even (got {a.small_head_dim})")
    return a


def main():
    a = parse_args()
    if not os.access(a.bench, os.X_OK):
        print(f"kernel_study: --bench {a.bench} is not an executable (run `make` first)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    threads = a.threads or int(env.get("OMP_NUM_THREADS", "0") or 0) or os.cpu_count()
    env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("OMP_PROC_BIND", "false")
    seqs = [a.seq] + ([a.long_seq] if a.long_seq else [])
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    print(f"kernel_study: {threads} threads, S={a.seq} (and causal S={a.long_seq}), D={a.head_dim}, "
          f"H={a.heads}, fp32; this takes a few minutes", flush=True)

    def bench(filt, extra=()):
        return run_json(lambda path: [a.bench, f"--benchmark_filter={filt}", f"--benchmark_min_time={a.min_time}",
                                      f"--benchmark_out={path}", "--benchmark_out_format=json", *extra],
                        "kernel_study", "minicp-kernels-bench", env=env)

    # SGEMM before and after the attention cases; the faster of the two is the reference,
    # so a machine slowed down by a neighbour for part of the run cannot inflate the ratios.
    gemm_filter = f"BM_Sgemm/{a.gemm_n}/"
    gemm_before = bench(gemm_filter)
    filt = f"BM_Attention(Fwd|Bwd)/{a.seq}/{a.head_dim}/"
    if a.long_seq:
        filt += f"|BM_Attention(Fwd|Bwd)/{a.long_seq}/{a.head_dim}/1/"
    attn = bench(filt, ["--seq=" + ",".join(map(str, seqs)), f"--head-dim={a.head_dim}", f"--heads={a.heads}"])
    gemm_after = bench(gemm_filter)
    data = {"context": attn["context"], "sgemm_before": gemm_before["benchmarks"],
            "sgemm_after": gemm_after["benchmarks"], "benchmarks": attn["benchmarks"]}
    with open(a.out, "w") as f:
        json.dump(data, f, indent=1)
    rows = [b for b in data["benchmarks"] if b.get("run_type", "iteration") == "iteration"]
    rates = [b["FLOPS"] for b in data["sgemm_before"] + data["sgemm_after"]]
    if len(rates) != 2:
        print("kernel_study: missing SGEMM results in the benchmark output", file=sys.stderr)
        return 1
    sgemm = max(rates)
    print()
    print(f"SGEMM {a.gemm_n}^3: {rates[0] / 1e9:.1f} GFLOP/s before, {rates[1] / 1e9:.1f} after; "
          f"reference = the faster, {sgemm / 1e9:.1f} GFLOP/s")
    print(f"{'kernel':<14}{'S':>8}{'D':>6}{'mask':>8}{'time [ms]':>12}{'useful GFLOP/s':>16}{'exec GFLOP/s':>14}"
          f"{'/ SGEMM':>9}")
    summary = {}
    for b in rows:
        if not b["name"].startswith("BM_Attention"):
            continue
        kind, S, D, causal = b["name"].split("/")[:4]
        kern = "attn_fwd" if kind.endswith("Fwd") else "attn_bwd"
        mask = "causal" if causal == "1" else "full"
        ratio = b["FLOPS"] / sgemm
        print(f"{kern:<14}{S:>8}{D:>6}{mask:>8}{b['real_time']:>12.1f}{b['FLOPS'] / 1e9:>16.1f}"
              f"{b['exec_FLOPS'] / 1e9:>14.1f}{ratio:>9.2f}")
        summary[f"{kern[5:]}_{mask}_S{S}"] = ratio
    print()
    print("goals (ratio to SGEMM at S=4096): forward >= 0.60 (long-term 0.75), backward >= 0.40 (long-term 0.85)")
    line = " ".join([f"threads={threads}", f"sgemm_gflops={sgemm / 1e9:.1f}",
                     f"sgemm_spread={min(rates) / max(rates):.2f}"] +
                    [f"{k}={v:.3f}" for k, v in summary.items()])
    if a.small_seq:
        small, small_line = small_blocks(a, bench)
        data["small_blocks"] = small
        with open(a.out, "w") as f:
            json.dump(data, f, indent=1)
        line += " " + small_line
    print("MINICP_KERNELS " + line)
    print(f"kernel_study: JSON written to {a.out}")
    return 0


def small_blocks(a, bench):
    """Causal fwd/bwd, fp32 and bf16, at a.small_seq and a.seq rows (D = a.small_head_dim):
    per round both sizes in one benchmark call, so each ratio compares neighbours in time."""
    fams = ["BM_AttentionFwd", "BM_AttentionBwd", "BM_AttentionFwdBf16", "BM_AttentionBwdBf16"]
    D = a.small_head_dim
    filt = "|".join(f"{f}/({a.small_seq}|{a.seq})/{D}/1/" for f in fams)
    rounds = []
    for r in range(a.small_rounds):
        out = bench(filt, [f"--seq={a.small_seq},{a.seq}", f"--head-dim={D}", "--causal=1", f"--heads={a.heads}"])
        rate = {}
        for b in out["benchmarks"]:
            if b.get("run_type", "iteration") != "iteration":
                continue
            fam, S = b["name"].split("/")[:2]
            rate[(fam, int(S))] = b["FLOPS"]
        rounds.append({f"{fam}/{S}": v for (fam, S), v in rate.items()})
        rounds[-1]["ratios"] = {fam: rate[(fam, a.small_seq)] / rate[(fam, a.seq)] for fam in fams}
    print()
    print(f"small blocks: causal, D={D}, {a.small_seq} rows against {a.seq} rows, useful GFLOP/s per round "
          f"(goal: ratio >= 0.7)")
    print(f"{'kernel':<22}{'round':>6}{f'S={a.small_seq}':>12}{f'S={a.seq}':>12}{'ratio':>8}")
    for fam in fams:
        for r, rd in enumerate(rounds):
            print(f"{fam[3:]:<22}{r + 1:>6}{rd[f'{fam}/{a.small_seq}'] / 1e9:>12.1f}{rd[f'{fam}/{a.seq}'] / 1e9:>12.1f}"
                  f"{rd['ratios'][fam]:>8.2f}")
    names = {"BM_AttentionFwd": "fwd_f32", "BM_AttentionBwd": "bwd_f32", "BM_AttentionFwdBf16": "fwd_bf16",
             "BM_AttentionBwdBf16": "bwd_bf16"}
    line = " ".join(f"small_{names[f]}_min={min(rd['ratios'][f] for rd in rounds):.3f}" for f in fams)
    return {"seq": a.small_seq, "large_seq": a.seq, "head_dim": D, "rounds": rounds}, line


if __name__ == "__main__":
    sys.exit(main())
