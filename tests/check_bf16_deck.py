#!/usr/bin/env python3
"""Checks three results files of inputs/bf16.toml cut down to one small S at 2 ranks: BF16 (as
the deck is: bf16 values, fp32 dK/dV accumulators and gradient all-reduce), F32 (the same deck
with run.dtype = "f32") and THIN (bf16 with run.dkv_accumulator and run.grad_allreduce "bf16").

  - every case's dtype, and its bytes per value of each message kind (block_, partial_, dkv_,
    grad_allreduce_bytes_per_value): 2/4/4/4 in BF16, 4/4/4/4 in F32, 2/4/2/2 in THIN;
  - layer_efficiency in (0, 1] everywhere: a bf16 case against the bf16 engines' ceiling
    (bf16_gemm_flops_per_s > 0), never against SGEMM's;
  - the bytes on the wire against F32, per rank and step: `ring` at 2 ranks sends one K/V block
    forward and one dK/dV accumulator block backward, so BF16 sends 0.75 of F32's attention
    bytes and THIN 0.5; every other scheme's THIN bytes are half of F32's plus its fp32 LSEs
    (0.49 .. 0.5 + 2/head_dim of F32's), except `passq`, whose partial results (O, dQ) travel
    home in fp32 in every run (above 0.5, at most 0.75); the gradient all-reduce is the same
    in BF16 and half in THIN;
  - the attention path each bf16 file chose is the fastest it measured: `attention_isa` is the
    path of `attention_paths` ("plain fwd A bwd B GFLOP/s; ...") with the smallest training
    step per forward FLOP, 1/fwd + 2.5/bwd (the F32 file measures none).
Exit code 0 when everything holds, 1 otherwise (each failure printed).

Usage: check_bf16_deck.py BF16 F32 THIN"""
import re
import sys

import h5py

SIZES = {"bf16": (2, 4, 4, 4), "f32": (4, 4, 4, 4), "thin": (2, 4, 2, 2)}
SIZE_KEYS = ["block_bytes_per_value", "partial_bytes_per_value", "dkv_bytes_per_value",
             "grad_allreduce_bytes_per_value"]


def cases(path):
    """{(scheme, ranks): (case attrs, summary attrs)} of a results file."""
    out = {}
    with h5py.File(path, "r") as f:
        for name, g in f["cases"].items():
            a, s = dict(g.attrs), dict(g["summary"].attrs)
            out[(str(a["scheme"]), int(a["ranks"]))] = (a, s)
    return out


def path_choice(path):
    """[] when the file's attention path is the fastest of those it measured, else why not."""
    with h5py.File(path, "r") as f:
        isa, text = str(f.attrs["attention_isa"]), str(f.attrs.get("attention_paths", ""))
    rates = {m[0]: 1 / float(m[1]) + 2.5 / float(m[2])
             for m in re.findall(r"(\S+) fwd ([0-9.]+) bwd ([0-9.]+) GFLOP/s", text)}
    if "plain" not in rates:
        return [f"{path}: attention_paths {text!r} lacks the plain path's rates"]
    best = min(rates, key=rates.get)
    return [] if isa == best else [f"{path}: attention_isa {isa}, the fastest measured is {best} ({text})"]


def main(argv):
    if len(argv) != 4:
        print(__doc__)
        return 2
    files = {"bf16": cases(argv[1]), "f32": cases(argv[2]), "thin": cases(argv[3])}
    bad = path_choice(argv[1]) + path_choice(argv[3])
    for kind, cs in files.items():
        if not cs:
            bad.append(f"{kind}: no cases")
        for key, (a, s) in cs.items():
            want = "f32" if kind == "f32" else "bf16"
            if str(a["dtype"]) != want:
                bad.append(f"{kind} {key}: dtype {a['dtype']}, want {want}")
            got = tuple(int(s[k]) for k in SIZE_KEYS)
            if got != SIZES[kind]:
                bad.append(f"{kind} {key}: bytes per value {dict(zip(SIZE_KEYS, got))}, want {SIZES[kind]}")
            eff = float(s["layer_efficiency"])
            if not 0 < eff <= 1:
                bad.append(f"{kind} {key}: layer_efficiency {eff:.3f} outside (0, 1]")
            if kind != "f32" and not float(s.get("bf16_gemm_flops_per_s", 0)) > 0:
                bad.append(f"{kind} {key}: no bf16_gemm_flops_per_s")
    for key, (a, s32) in files["f32"].items():
        if key[1] < 2:
            continue
        head_dim = int(a["head_dim"])
        ref = float(s32["attn_bytes_sent_per_rank"])
        for kind in ("bf16", "thin"):
            if key not in files[kind]:
                bad.append(f"{kind}: no case {key}")
                continue
            s = files[kind][key][1]
            r = float(s["attn_bytes_sent_per_rank"]) / ref
            if key[0] == "ring":
                want = 0.75 if kind == "bf16" else 0.5
                if abs(r - want) > 0.005:
                    bad.append(f"{kind} {key}: attention bytes {r:.4f} of f32's, want {want}")
            elif kind == "thin":
                lo, hi = (0.5, 0.75) if key[0] == "passq" else (0.49, 0.5 + 2.0 / head_dim)
                if not lo <= r <= hi:
                    bad.append(f"{kind} {key}: attention bytes {r:.4f} of f32's, want {lo} .. {hi:.3f}")
            g = float(s["grad_allreduce_bytes_per_rank"]) / float(s32["grad_allreduce_bytes_per_rank"])
            want = 1.0 if kind == "bf16" else 0.5
            if abs(g - want) > 0.005:
                bad.append(f"{kind} {key}: gradient all-reduce bytes {g:.4f} of f32's, want {want}")
            print(f"  {kind:4s} {key[0]:10s} P={key[1]}: attention bytes {r:.4f}, gradient bytes {g:.4f} of f32's")
    for b in bad:
        print("FAIL:", b)
    print("check_bf16_deck:", "FAILED" if bad else "ok", f"({sum(len(c) for c in files.values())} cases)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
