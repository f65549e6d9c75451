#!/usr/bin/env python3
"""Kernel study (`make kernel-study`): one run of minicp-kernels-bench measuring SGEMM and fp32
attention forward/backward, printed as ratios of attention useful FLOP/s to the SGEMM
FLOP/s of the same run, plus a grep-able MINICP_KERNELS summary line. Then the small blocks:
the causal forward and backward, fp32 and bf16, at --small-seq rows against --seq rows (the
same --small-head-dim), in alternated rounds: the rate a ring step's block of S/P rows keeps.
Then the bf16 attention paths: each path this host can run (plain, avx512_bf16, amx), and
the AMX engine with its tile operations as no-ops (its bound, on any host), causal at --seq
and --head-dim, against the bf16 GEMM engine at --gemm-n^3 and the path's own tile kernel
in the same call, the paths alternated over --path-rounds rounds; the host's kind
(AMX, AVX512-BF16 without AMX, or neither) labels the section and the summary line."""
import argparse
import json
import os
import sys

from common import HOST_KINDS, cpu_info, median, run_json


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--bench", default="build/bin/minicp-kernels-bench", help="benchmark binary")
    p.add_argument("--out", default="results/kernel_study.json", help="JSON file written (Google Benchmark output)")
    p.add_argument("--seq", type=int, default=4096, help="sequence length S of the ratio cases, tokens")
    p.add_argument("--long-seq", type=int, default=32768,
                   help="longer causal S also run (forward+backward), tokens; 0 skips it")
    p.add_argument("--head-dim", type=int, default=128, help="head dimension D")
    p.add_argument("--heads", type=int, default=8, help="query heads (= kv heads)")
    p.add_argument("--gemm-n", type=int, default=2048, choices=[512, 1024, 2048],
                   help="SGEMM and bf16 GEMM size M=N=K")
    p.add_argument("--threads", type=int, default=0, help="OpenMP threads (0: OMP_NUM_THREADS or all cores)")
    p.add_argument("--min-time", type=float, default=0.5, help="Google Benchmark min time per case, seconds")
    p.add_argument("--small-seq", type=int, default=1024, help="rows of the small-block cases, tokens; 0 skips them")
    p.add_argument("--small-head-dim", type=int, default=64, help="head dimension D of the small-block cases")
    p.add_argument("--small-rounds", type=int, default=2, help="alternated rounds of the small-block cases")
    p.add_argument("--path-rounds", type=int, default=2,
                   help="alternated rounds of the bf16 attention paths (each path beside the bf16 GEMM and its own "
                        "tile kernel); 0 skips them")
    a = p.parse_args()
    for name in ("seq", "head_dim", "heads", "min_time", "small_head_dim", "small_rounds"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0 (got {getattr(a, name)})")
    for name in ("long_seq", "small_seq", "path_rounds"):
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

    def bench(filt, extra=(), isa=None):
        """One benchmark call; isa: the bf16 attention path it forces (MINICP_ATTENTION_ISA)."""
        return run_json(lambda path: [a.bench, f"--benchmark_filter={filt}", f"--benchmark_min_time={a.min_time}",
                                      f"--benchmark_out={path}", "--benchmark_out_format=json", *extra],
                        "kernel_study", "minicp-kernels-bench",
                        env=env if isa is None else {**env, "MINICP_ATTENTION_ISA": isa})

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
    # The later sections, each written into the JSON as soon as it is measured.
    for key, wanted, section in (("small_blocks", a.small_seq, small_blocks), ("bf16_paths", a.path_rounds, bf16_paths)):
        if not wanted:
            continue
        data[key], fields = section(a, bench)
        with open(a.out, "w") as f:
            json.dump(data, f, indent=1)
        line += " " + fields
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


# The AMX engine with its tile operations as no-ops (BM_Attention*Bf16AmxNoTiles), timed on
# every host beside the paths: its work between the tile products, the amx path's bound.
NO_TILES = "amx_no_tiles"


def path_row(a, bench, isa, rnd):
    """One round's row of one path (or of NO_TILES): its forward and backward beside the bf16
    GEMM engine at a.gemm_n^3 and the tile kernels, in one benchmark call."""
    S, D = a.seq, a.head_dim
    fam = "Bf16AmxNoTiles" if isa == NO_TILES else "Bf16"
    filt = f"BM_Bf16Gemm/{a.gemm_n}/|BM_(Bf16)?TileGemm|BM_Attention(Fwd|Bwd){fam}/{S}/{D}/1/"
    out = bench(filt, [f"--seq={S}", f"--head-dim={D}", "--causal=1", f"--heads={a.heads}"],
                None if isa == NO_TILES else isa)
    rate = {b["name"].split("/")[0]: b["FLOPS"] for b in out["benchmarks"] if b.get("run_type", "iteration") == "iteration"}
    row = {"round": rnd, "isa": isa, "fwd": rate[f"BM_AttentionFwd{fam}"], "bwd": rate[f"BM_AttentionBwd{fam}"],
           "gemm": rate["BM_Bf16Gemm"]}
    if isa != NO_TILES:  # a path's own tiles: its bf16 tiles, or for plain (widened to fp32) the fp32 ones
        row["tile"] = rate["BM_Bf16TileGemm"] or rate["BM_TileGemm"]
        row["tile_kernel"] = "bf16 tiles" if rate["BM_Bf16TileGemm"] else "fp32 tiles"
    for k in ("fwd", "bwd"):
        row[f"{k}_over_gemm"] = row[k] / row["gemm"]
        if "tile" in row:
            row[f"{k}_over_tile"] = row[k] / row["tile"]
    return row


def print_paths(a, host, refused, rows):
    print()
    print(f"bf16 attention paths: causal, S={a.seq}, D={a.head_dim}, H={a.heads}, useful GFLOP/s; "
          f"{HOST_KINDS[host['host_kind']]}: {host['cpu_model']} ({host['cpu_flags']})")
    if refused:
        print(f"not run here: {refused}")
    print(f"{'path':<13}{'round':>6}{'fwd':>8}{'bwd':>8}{'bf16 GEMM':>11}{'own tiles':>11}{'fwd/GEMM':>10}"
          f"{'bwd/GEMM':>10}{'fwd/tiles':>11}{'bwd/tiles':>11}")
    for w in rows:
        tiles = [f"{w['tile'] / 1e9:>11.1f}", f"{w['fwd_over_tile']:>11.2f}", f"{w['bwd_over_tile']:>11.2f}"] \
            if "tile" in w else [f"{'-':>11}"] * 3
        print(f"{w['isa']:<13}{w['round']:>6}{w['fwd'] / 1e9:>8.1f}{w['bwd'] / 1e9:>8.1f}{w['gemm'] / 1e9:>11.1f}"
              f"{tiles[0]}{w['fwd_over_gemm']:>10.2f}{w['bwd_over_gemm']:>10.2f}{tiles[1]}{tiles[2]}")
    print("own tiles: the path's bf16 tile kernel (plain: the fp32 tiles it widens to). amx_no_tiles: the AMX engine "
          "with its tile operations as no-ops, the rate the amx path cannot pass.\nTargets: AMX host, amx fwd and bwd "
          "/ bf16 GEMM >= 0.5; AVX512-BF16 host without AMX, / own tiles >= 0.5")


def bf16_paths(a, bench):
    """bf16 attention, causal, S = a.seq, D = a.head_dim, on each path the bench says this host
    can run (its context's attention_paths_usable) and the AMX engine without its tiles
    (NO_TILES), each beside the bf16 GEMM engine and the tile kernels (ceiling.hpp's product
    rates), alternated within each of a.path_rounds rounds. Returns (the JSON part, the
    summary fields)."""
    first = bench("BM_Bf16TileGemm", [f"--head-dim={a.head_dim}"])["context"]  # which paths run here
    usable = [x for x in first.get("attention_paths_usable", "").split(",") if x]
    refused = first.get("attention_paths_refused", "")
    host = cpu_info()
    rows = [path_row(a, bench, isa, r + 1) for r in range(a.path_rounds) for isa in usable + [NO_TILES]]
    print_paths(a, host, refused, rows)
    # The fastest by the measured choice's rule (kernels::fastest_attention_path), on medians.
    med = {isa: {k: median([w[k] for w in rows if w["isa"] == isa]) for k in ("fwd", "bwd")} for isa in usable}
    fastest = min(usable, key=lambda i: 1 / med[i]["fwd"] + 2.5 / med[i]["bwd"]) if usable else ""
    fields = [f"host_kind={host['host_kind']}", f"bf16_fastest={fastest}"]
    for isa in usable + [NO_TILES]:
        mine = [w for w in rows if w["isa"] == isa]
        for k in [k for k in ("fwd_over_gemm", "bwd_over_gemm", "fwd_over_tile", "bwd_over_tile") if k in mine[0]]:
            fields.append(f"{isa}_{k}_min={min(w[k] for w in mine):.3f}")
    part = {"seq": a.seq, "head_dim": a.head_dim, "heads": a.heads, "host": host, "usable": usable,
            "refused": refused, "rows": rows, "fastest": fastest}
    return part, " ".join(fields)


if __name__ == "__main__":
    sys.exit(main())
