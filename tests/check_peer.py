#!/usr/bin/python3
"""Checks of the peer study (studies/peer_study.py, peer_layer.py), in two modes.

--mode minicp (no PyTorch needed): the study's reader of miniCP's output against a real run
  of inputs/peer.toml at a small S: the MINICP line parsed (deck, one case token, its layer
  efficiency, the BLAS core) and agreeing with the results file, the record's step times,
  dtype and FLOPs, and those FLOPs equal to peer_layer.py's count of the same shapes (the
  identity that makes the study's speed ratios time ratios); lines that are not MINICP lines
  or whose tokens are malformed are refused.

--mode torch: the PyTorch layers at S = 64 on 1 thread, fp32 and bf16 (run as the study runs
  them, JSON on stdout): loss and gradient norms finite and positive, the bf16 loss and
  weight-gradient norm within 3% of fp32's (the same weights rounded), the FLOPs miniCP's;
  in-process, causality (a change of the last token moves no earlier output) and
  grouped-query attention (K/V heads shared: kv_heads = heads gives another loss);
  a bad option exits 2 naming the flag; --help lists every option with its default.
  Without an importable torch: "skipped: python3-torch not installed (make peer-deps)",
  exit 77.
Exit code 0 when everything holds, 1 otherwise (each failure printed).

Usage: check_peer.py --mode minicp --minicp BIN [--mpiexec MPIEXEC] --work DIR
       check_peer.py --mode torch"""
import argparse
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDIES = os.path.join(ROOT, "studies")
sys.path.insert(0, STUDIES)
import peer_layer  # noqa: E402
import peer_study  # noqa: E402

fails = []


def check(ok, what):
    if not ok:
        fails.append(what)
        print("FAIL: " + what)


def mode_minicp(a):
    os.makedirs(a.work, exist_ok=True)
    out = os.path.join(a.work, "peer_S64.h5")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    cmd = [a.mpiexec, "-np", "1", "--oversubscribe", "--bind-to", "none", a.minicp,
           "--deck", os.path.join(ROOT, "inputs", "peer.toml"), "--set", "sweep.seq_len=[64]",
           "--set", 'run.dtype="f32"', "--set", "run.reps=2", "--out", out, "--overwrite"]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(p.stdout)
    check(p.returncode == 0, f"minicp exit code {p.returncode}")
    if p.returncode != 0:
        return
    line = peer_study.parse_minicp_line(p.stdout)
    check(line is not None, "no MINICP line parsed from minicp's output")
    if line is None:
        return
    print("parsed:", line)
    check(line["deck"].endswith("inputs/peer.toml"), f"deck {line['deck']}")
    check(line["cases"] == 1, f"cases {line['cases']}, expected 1")
    check(list(line["layer_efficiency"]) == ["train_none_S64_P1"], f"tokens {list(line['layer_efficiency'])}")
    check(line["run_s"] > 0 and line["sgemm_gflops"] > 0, f"run_s {line['run_s']}, sgemm_gflops {line['sgemm_gflops']}")
    rec = peer_study.read_minicp_record(out)
    print("record:", {k: rec[k] for k in ("case", "dtype", "median_step_s", "step_s", "useful_flops", "blas_core")})
    check(rec["case"].endswith("train_none_S64_P1"), f"case {rec['case']}")
    check(rec["dtype"] == "f32" and rec["seq_len"] == 64, f"dtype {rec['dtype']}, seq_len {rec['seq_len']}")
    check(len(rec["step_s"]) == 2 and all(s > 0 for s in rec["step_s"]), f"step_s {rec['step_s']}, expected 2 > 0")
    check(rec["median_step_s"] in rec["step_s"], f"median {rec['median_step_s']} is not one of {rec['step_s']}")
    check(rec["blas_core"] == line["blas_core"], f"blas_core {rec['blas_core']} in the file, {line['blas_core']} printed")
    eff = line["layer_efficiency"].get("train_none_S64_P1", -1)
    check(abs(eff - rec["layer_efficiency"]) <= 6e-4, f"layer efficiency {eff} printed, {rec['layer_efficiency']} in the file")
    shapes = peer_layer.parse_args(["--seq-len", "64"])
    check(rec["useful_flops"] == peer_layer.useful_flops(shapes),
          f"miniCP counts {rec['useful_flops']} FLOPs at S=64, peer_layer.py {peer_layer.useful_flops(shapes)}")
    # Lines that are not the summary, or are malformed.
    check(peer_study.parse_minicp_line("minicp: results in x.h5\n") is None, "a non-MINICP text parsed")
    try:
        peer_study.parse_minicp_line("MINICP deck=d cases=1 run_s=1.0 sgemm_gflops=1.0 blas_core=Haswell "
                                     "layer_efficiency: train_none_S64=0.5")
        check(False, "a malformed case token was accepted")
    except ValueError:
        pass


def run_peer(*args):
    cmd = ["/usr/bin/python3", os.path.join(STUDIES, "peer_layer.py"), *args]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def mode_torch(_):
    try:
        import torch
    except ImportError:
        print("skipped: python3-torch not installed (make peer-deps)")
        sys.exit(77)
    res = {}
    for dt in ("f32", "bf16"):
        p = run_peer("--seq-len", "64", "--threads", "1", "--reps", "2", "--dtype", dt)
        check(p.returncode == 0, f"peer_layer.py --dtype {dt}: exit code {p.returncode}: {p.stderr.strip()}")
        if p.returncode != 0:
            return
        r = res[dt] = json.loads(p.stdout)
        print(dt, {k: r[k] for k in ("loss", "weight_grad_norm", "input_grad_norm", "median_step_s")})
        for k in ("loss", "weight_grad_norm", "input_grad_norm"):
            check(math.isfinite(r[k]) and r[k] > 0, f"{dt} {k} = {r[k]}, expected finite and > 0")
        check(len(r["step_s"]) == 2 and r["median_step_s"] > 0, f"{dt} step_s {r['step_s']}")
        check(r["platform"]["threads"] == 1, f"{dt} ran {r['platform']['threads']} threads, asked 1")
        check(r["useful_flops"] == peer_layer.useful_flops(peer_layer.parse_args(["--seq-len", "64"])),
              f"{dt} useful_flops {r['useful_flops']}")
    for k in ("loss", "weight_grad_norm", "input_grad_norm"):
        rel = abs(res["bf16"][k] - res["f32"][k]) / res["f32"][k]
        check(rel < 0.03, f"bf16 {k} {res['bf16'][k]} is {rel:.3%} from f32's {res['f32'][k]} (allowed 3%)")
    # In-process: causality and grouped-query attention on a small shape.
    torch.set_num_threads(1)
    small = ["--seq-len", "16", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
             "--ffn", "96", "--dtype", "f32"]
    a = peer_layer.parse_args(small)
    layers, x, cos, sin, mask = peer_layer.build(torch, a)
    with torch.no_grad():
        y0 = peer_layer.forward(torch, a, layers, x, cos, sin, mask)
        x2 = x.detach().clone()
        x2[-1] += 1.0
        y1 = peer_layer.forward(torch, a, layers, x2, cos, sin, mask)
    early = float((y1[:-1] - y0[:-1]).abs().max())
    last = float((y1[-1] - y0[-1]).abs().max())
    check(early <= 1e-6, f"changing the last token moved earlier outputs by {early} (not causal)")
    check(last > 1e-3, f"changing the last token moved its own output by only {last}")
    b = peer_layer.parse_args(small[:-2] + ["--kv-heads", "4", "--dtype", "f32"])
    lb, xb, cb, sb, mb = peer_layer.build(torch, b)
    check(lb[0]["wk"].shape == (64, 64) and layers[0]["wk"].shape == (64, 32),
          f"wk shapes {tuple(lb[0]['wk'].shape)} (kv_heads 4), {tuple(layers[0]['wk'].shape)} (kv_heads 2)")
    # Bad options and --help.
    for args, flag in ((["--dtype", "f16"], "--dtype"), (["--reps", "0"], "--reps"), (["--kv-heads", "3"], "--kv-heads")):
        p = run_peer(*args)
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        check(p.returncode == 2 and flag in msg, f"peer_layer.py {' '.join(args)}: exit {p.returncode}, '{msg}'")
    p = run_peer("--help")
    for opt in ("--seq-len", "--hidden", "--heads", "--kv-heads", "--head-dim", "--ffn", "--layers", "--rope-theta",
                "--norm-eps", "--dtype", "--threads", "--warmup", "--reps", "--seed"):
        check(opt in p.stdout, f"--help does not list {opt}")
    check(p.stdout.count("(default:") >= 14, f"--help names {p.stdout.count('(default:')} defaults, expected 14")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["minicp", "torch"], required=True)
    ap.add_argument("--minicp", help="the minicp binary (--mode minicp)")
    ap.add_argument("--mpiexec", default="mpirun")
    ap.add_argument("--work", help="scratch folder (--mode minicp)")
    a = ap.parse_args()
    if a.mode == "minicp":
        if not a.minicp or not a.work:
            ap.error("--mode minicp needs --minicp and --work")
        mode_minicp(a)
    else:
        mode_torch(a)
    if fails:
        print(f"{len(fails)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
