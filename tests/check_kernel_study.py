#!/usr/bin/python3
"""Checks of the kernel study's bf16 paths section (studies/kernel_study.py), on a real run of
minicp-kernels-bench at a small size (S = 256, D = 64, GEMMs 512^3, one round, short times):

- the paths run are the bench's usable ones: plain always, avx512_bf16 exactly where the CPU
  has the flag, amx only on an AMX host; every path not run is named with its reason;
- one row per path and round, and one of the AMX engine without its tiles (its bound, on any
  host, with no tile kernel of its own), each rate positive and each ratio its rates'
  quotient (a second way of computing the figure), the tile kernel named (plain: the fp32
  tiles);
- the host kind is the CPU's (common.cpu_info), and the summary line names it, the fastest path
  by the measured choice's rule (1/fwd + 2.5/bwd) and each path's minimum ratios.

Exit code 0 when everything holds, 1 otherwise (each failure printed).

Usage: check_kernel_study.py --bench BIN --work DIR"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "studies"))
from common import cpu_info  # noqa: E402

fails = []


def check(ok, what):
    if not ok:
        fails.append(what)
        print(f"FAIL: {what}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True, help="minicp-kernels-bench")
    p.add_argument("--work", required=True, help="directory for the study's JSON")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    out = os.path.join(a.work, "kernel_study.json")
    cmd = [sys.executable, os.path.join(ROOT, "studies", "kernel_study.py"), "--bench", a.bench, "--out", out,
           "--seq", "256", "--head-dim", "64", "--heads", "2", "--gemm-n", "512", "--long-seq", "0",
           "--small-seq", "0", "--min-time", "0.01", "--path-rounds", "1", "--threads", "2"]
    env = {k: v for k, v in os.environ.items() if k != "MINICP_ATTENTION_ISA"}
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300)
    if r.returncode != 0:
        print(r.stdout)
        print(f"FAIL: kernel_study.py exited {r.returncode}")
        return 1
    with open(out) as f:
        part = json.load(f)["bf16_paths"]
    host = cpu_info()
    flags = set(host["cpu_flags"].split())
    usable, refused = part["usable"], part["refused"]
    check(usable[:1] == ["plain"], f"plain first among the paths run: {usable}")
    check(("avx512_bf16" in usable) == ("avx512_bf16" in flags), f"avx512_bf16 run where the CPU has it: {usable}")
    check("amx" not in usable or host["host_kind"] == "amx", f"amx run on a {host['host_kind']} host")
    for isa in ("plain", "avx512_bf16", "amx"):
        check(isa in usable or f"{isa}: " in refused, f"{isa} neither run nor refused with a reason ({refused!r})")
    check(part["host"]["host_kind"] == host["host_kind"], f"host kind {part['host']['host_kind']}")
    check([w["isa"] for w in part["rows"]] == usable + ["amx_no_tiles"],
          f"one row per path and the AMX engine without tiles: {[w['isa'] for w in part['rows']]}")
    for w in part["rows"]:
        paths = w["isa"] != "amx_no_tiles"  # the bound has no tile kernel of its own
        for k in ("fwd", "bwd", "gemm") + (("tile",) if paths else ()):
            check(w[k] > 0, f"{w['isa']} {k} rate {w[k]}")
        check(("tile" in w) == paths, f"{w['isa']}: own tiles {'missing' if paths else 'given'}")
        for k in ("fwd", "bwd"):
            check(abs(w[f"{k}_over_gemm"] * w["gemm"] - w[k]) <= 1e-9 * w[k], f"{w['isa']} {k}_over_gemm")
            if paths:
                check(abs(w[f"{k}_over_tile"] * w["tile"] - w[k]) <= 1e-9 * w[k], f"{w['isa']} {k}_over_tile")
        if paths:
            check(w["tile_kernel"] == ("fp32 tiles" if w["isa"] == "plain" else "bf16 tiles"),
                  f"{w['isa']} own tiles: {w['tile_kernel']}")
    step = {w["isa"]: 1 / w["fwd"] + 2.5 / w["bwd"] for w in part["rows"] if w["isa"] in usable}
    check(part["fastest"] == min(step, key=step.get), f"fastest {part['fastest']} against {step}")
    line = [x for x in r.stdout.splitlines() if x.startswith("MINICP_KERNELS ")]
    check(len(line) == 1, "one MINICP_KERNELS line")
    fields = dict(t.split("=", 1) for t in line[0].split()[1:]) if line else {}
    check(fields.get("host_kind") == host["host_kind"], f"summary host_kind {fields.get('host_kind')}")
    check(fields.get("bf16_fastest") == part["fastest"], f"summary bf16_fastest {fields.get('bf16_fastest')}")
    for w in part["rows"]:
        k = "fwd_over_gemm" if w["isa"] == "amx_no_tiles" else "fwd_over_tile"
        got = fields.get(f"{w['isa']}_{k}_min")
        check(got is not None and abs(float(got) - w[k]) < 1e-3, f"summary {w['isa']}_{k}_min")
    print("kernel study paths section: " + ("FAILED" if fails else "ok") + f" ({', '.join(usable)} run; {refused})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
