#!/usr/bin/python3
"""Peer study (`make peer-study`): the cpu-small layers' train step in miniCP (`none`, one
rank) against the same layers in PyTorch (studies/peer_layer.py), bf16 and fp32.

Each round runs, in turn: miniCP bf16, PyTorch bf16, miniCP f32, PyTorch f32, at the same S
and thread count (miniCP 1 rank x T threads through OMP_NUM_THREADS, PyTorch
torch.set_num_threads(T)), so a drift of a shared machine falls on both sides of a ratio.
Both count a step's FLOPs by miniCP's rule (model::layer_flops: docs/figures-of-merit.md),
checked equal, so a speed ratio is a time ratio: peer step time / miniCP step time (above 1:
miniCP is faster). miniCP's step time and FLOPs come from its results file (the median
full-mode step, /cases/<id>/summary), cross-checked with the MINICP line it prints.

Both programs run with the same environment. By default that includes
GLIBC_TUNABLES=glibc.malloc.hugetlb=1: PyTorch allocates every [H, S, S] temporary afresh,
glibc hands it a new mmap, and on a VM whose first-touch page faults are slow (0.4 s per
256 MiB on the development host) the faults, not the arithmetic, set PyTorch's time; with
the tunable glibc asks for transparent huge pages (THP `madvise` mode). `--glibc-tunables ''`
runs without it.

Writes the per-round times, the ratios and the platform (CPU, torch version, threads, the
BLAS core each side ran) as JSON, and prints a table and one grep-able MINICP_PEER_STUDY line."""
import argparse
import json
import os
import re
import subprocess
import sys

from common import HOST_KINDS, cpu_info, int_at_least, median, run_program

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The closing line of every minicp run (miniapp/run/driver.cpp, docs/results-file.md).
MINICP_LINE = re.compile(r"^MINICP deck=(?P<deck>\S+) cases=(?P<cases>\d+) run_s=(?P<run_s>\S+) "
                         r"sgemm_gflops=(?P<sgemm_gflops>\S+) blas_core=(?P<blas_core>\S+) "
                         r"layer_efficiency:(?P<eff>.*)$")
TOKEN = re.compile(r"^(?P<pass>train|prefill|decode)_(?P<scheme>[a-z]+)_S(?P<S>\d+)_P(?P<P>\d+)=(?P<value>\S+)$")


def parse_minicp_line(text):
    """The MINICP line of a minicp run's output, as a dict: deck, cases, run_s, sgemm_gflops,
    blas_core and layer_efficiency {"<pass>_<scheme>_S<S>_P<P>": value}; None when the
    output has no such line. A token that is not of that form raises ValueError."""
    for line in text.splitlines():
        m = MINICP_LINE.match(line.strip())
        if not m:
            continue
        eff = {}
        for tok in m.group("eff").split():
            t = TOKEN.match(tok)
            if not t:
                raise ValueError(f"MINICP line: token '{tok}' is not <pass>_<scheme>_S<S>_P<P>=<value>")
            eff[tok.split("=")[0]] = float(t.group("value"))
        return {"deck": m.group("deck"), "cases": int(m.group("cases")), "run_s": float(m.group("run_s")),
                "sgemm_gflops": float(m.group("sgemm_gflops")), "blas_core": m.group("blas_core"),
                "layer_efficiency": eff}
    return None


def read_minicp_record(path):
    """The one case of a peer-deck results file: its median step (s), every full-mode rep's
    step (s), its useful FLOPs per step and what ran it."""
    import h5py

    with h5py.File(path, "r") as f:
        cases = list(f["cases"])
        if len(cases) != 1:
            raise ValueError(f"{path}: {len(cases)} cases, the peer deck runs one")
        g = f["cases"][cases[0]]
        s = g["summary"].attrs
        steps = g["steps"][()]
        full = [float(r["step_s"]) for r in steps if int(r["mode"]) == 0]
        t = float(s["measured_time_s"])
        root = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        case = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()}
        return {
            "case": cases[0],
            "dtype": str(case["dtype"]),
            "seq_len": int(case["seq_len"]),
            "median_step_s": t,
            "step_s": full,
            # useful_flops_per_s is the step's useful FLOPs over measured_time_s: their product
            # is miniCP's count, an integer for these shapes.
            "useful_flops": round(float(s["useful_flops_per_s"]) * t),
            "useful_gflops_per_s": float(s["useful_flops_per_s"]) / 1e9,
            "layer_efficiency": float(s["layer_efficiency"]),
            "blas_core": str(root.get("blas_core", "")),
            "blas_core_source": str(root.get("blas_core_source", "")),
            "blas_library": str(root.get("blas_library", "")),
            "gemm_bf16_engine": str(root.get("gemm_bf16_engine", "")),
            "attention_isa": str(root.get("attention_isa", "")),
            "kokkos_concurrency": int(root.get("kokkos_concurrency", 0)),
            "cpu_model": str(root.get("cpu_model", "")),
            "environment": str(root.get("environment", "")),
        }


def parse_args(argv):
    p = argparse.ArgumentParser(prog="peer_study.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = " (default: %(default)s)"
    p.add_argument("--minicp", default="build/bin/minicp", help="the minicp binary" + d)
    p.add_argument("--mpiexec", default="mpirun", help="MPI launcher of the one-rank minicp runs" + d)
    p.add_argument("--deck", default=os.path.join(ROOT, "inputs", "peer.toml"), help="miniCP's deck" + d)
    p.add_argument("--peer", default=os.path.join(HERE, "peer_layer.py"), help="the PyTorch layer" + d)
    p.add_argument("--python", default="/usr/bin/python3", help="the Python that runs --peer" + d)
    p.add_argument("--seq-len", type=int_at_least(1), default=4096, help="tokens S" + d)
    p.add_argument("--threads", type=int_at_least(1), default=2, help="threads of each program" + d)
    p.add_argument("--rounds", type=int_at_least(1), default=3, help="alternated rounds" + d)
    p.add_argument("--warmup", type=int_at_least(0), default=1, help="untimed steps of each run" + d)
    p.add_argument("--reps", type=int_at_least(1), default=2, help="timed steps of each run (their median)" + d)
    p.add_argument("--glibc-tunables", default="glibc.malloc.hugetlb=1",
                   help="GLIBC_TUNABLES of both programs, '' for none (see above)" + d)
    p.add_argument("--work", default="results/peer", help="folder of miniCP's results files" + d)
    p.add_argument("--out", default="results/peer.json", help="JSON written" + d)
    a = p.parse_args(argv)
    if not (os.path.isfile(a.minicp) and os.access(a.minicp, os.X_OK)):
        p.error(f"--minicp '{a.minicp}' is not an executable file (`make` builds build/bin/minicp)")
    for flag, path in (("--deck", a.deck), ("--peer", a.peer)):
        if not os.path.isfile(path):
            p.error(f"{flag} '{path}' is not a file")
    return a


def environment(a):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS=str(a.threads), OMP_PROC_BIND="false")
    env.pop("GLIBC_TUNABLES", None)
    if a.glibc_tunables:
        env["GLIBC_TUNABLES"] = a.glibc_tunables
    return env


def load_1min():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def run_minicp(a, dtype, rnd):
    out = os.path.join(a.work, f"minicp_{dtype}_r{rnd}.h5")
    # Rank placement as the Makefile's `run`; the environment that differs goes with -x.
    exported = ["OMP_NUM_THREADS", "OMP_PROC_BIND"] + (["GLIBC_TUNABLES"] if a.glibc_tunables else [])
    cmd = [a.mpiexec, "-np", "1", "--oversubscribe", "--bind-to", "none"]
    for name in exported:
        cmd += ["-x", name]
    cmd += [a.minicp, "--deck", a.deck, "--set", f'run.dtype="{dtype}"', "--set", f"sweep.seq_len=[{a.seq_len}]",
            "--set", f"run.warmup={a.warmup}", "--set", f"run.reps={a.reps}", "--out", out, "--overwrite"]
    p = run_program(cmd, "peer_study.py", f"minicp ({dtype}, round {rnd})", env=environment(a), show=())
    stdout, stderr, wall = p.stdout, p.stderr, p.wall_s
    line = parse_minicp_line(stdout)
    if line is None:
        sys.stderr.write(stdout + stderr)
        raise SystemExit("peer_study.py: minicp printed no MINICP line")
    rec = read_minicp_record(out)
    token = f"train_none_S{a.seq_len}_P1"
    if rec["dtype"] != dtype or rec["seq_len"] != a.seq_len or token not in line["layer_efficiency"]:
        raise SystemExit(f"peer_study.py: {out} holds {rec['case']} ({rec['dtype']}), the MINICP line "
                         f"{sorted(line['layer_efficiency'])}; expected {token} in {dtype}")
    if line["blas_core"] != rec["blas_core"]:
        raise SystemExit(f"peer_study.py: the MINICP line says blas_core={line['blas_core']}, "
                         f"the results file {rec['blas_core']}")
    if abs(line["layer_efficiency"][token] - rec["layer_efficiency"]) > 6e-4:
        raise SystemExit(f"peer_study.py: layer efficiency {line['layer_efficiency'][token]} printed, "
                         f"{rec['layer_efficiency']} in {out}")
    rec["file"] = out
    rec["wall_s"] = wall
    rec["warnings"] = [x for x in stderr.splitlines() if "WARNING" in x]
    return rec


def run_peer(a, dtype):
    cmd = [a.python, a.peer, "--dtype", dtype, "--seq-len", str(a.seq_len), "--threads", str(a.threads),
           "--warmup", str(a.warmup), "--reps", str(a.reps)]
    p = run_program(cmd, "peer_study.py", f"peer_layer.py ({dtype})", env=environment(a), show=())
    rec = json.loads(p.stdout)
    rec["wall_s"] = p.wall_s
    return rec


def debian_version(pkg):
    """The installed version of a Debian package ('' when dpkg does not know it): torch's own
    __version__ reads 1.13.0a0 in Debian's 1.13.1 build."""
    try:
        p = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return ""
    return p.stdout.strip() if p.returncode == 0 else ""


# miniCP bf16 / PyTorch bf16, per host kind (the AMX issue's targets).
BF16_TARGET = {"amx": 3.0, "avx512_bf16": 2.0, "other": 2.0}


def summarise(rounds):
    out = {}
    for dt in ("bf16", "f32"):
        ratios = [r[f"speed_ratio_{dt}"] for r in rounds]
        out[dt] = {
            "speed_ratio_min": min(ratios), "speed_ratio_median": median(ratios), "speed_ratio_max": max(ratios),
            "minicp_gflops_per_s": [r[f"minicp_{dt}"]["useful_gflops_per_s"] for r in rounds],
            "peer_gflops_per_s": [r[f"peer_{dt}"]["useful_gflops_per_s"] for r in rounds],
        }
    return out


def table(res):
    rows = [("round", "miniCP bf16 s", "GF/s", "PyTorch bf16 s", "GF/s", "ratio bf16",
             "miniCP f32 s", "GF/s", "PyTorch f32 s", "GF/s", "ratio f32")]
    for r in res["rounds"]:
        row = [str(r["round"])]
        for dt in ("bf16", "f32"):
            for side in ("minicp", "peer"):
                x = r[f"{side}_{dt}"]
                row += [f"{x['median_step_s']:.3f}", f"{x['useful_gflops_per_s']:.1f}"]
            row.append(f"{r[f'speed_ratio_{dt}']:.2f}")
        rows.append(tuple(row))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w[i]) for i, c in enumerate(r)) for r in rows)


def main(argv):
    a = parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    print(f"peer_study: cpu-small, train, S={a.seq_len}, {a.threads} threads, {a.rounds} rounds of miniCP bf16, "
          f"PyTorch bf16, miniCP f32, PyTorch f32 ({a.warmup} warm-up + {a.reps} steps each)", flush=True)
    rounds = []
    for rnd in range(1, a.rounds + 1):
        r = {"round": rnd}
        for dt in ("bf16", "f32"):
            # The load average before each run: another job on the cores shows as a load
            # above this study's own (one program of --threads threads at a time).
            load_m = load_1min()
            m = run_minicp(a, dt, rnd)
            load_q = load_1min()
            q = run_peer(a, dt)
            m["load_1min_before"], q["load_1min_before"] = load_m, load_q
            if abs(q["useful_flops"] - m["useful_flops"]) > 1e-9 * m["useful_flops"]:
                raise SystemExit(f"peer_study.py: PyTorch's layers count {q['useful_flops']:.0f} FLOPs per step, "
                                 f"miniCP's {m['useful_flops']:.0f}: not the same shapes")
            # The same FLOPs on both sides: the speed ratio is the time ratio.
            r[f"minicp_{dt}"], r[f"peer_{dt}"] = m, q
            r[f"speed_ratio_{dt}"] = q["median_step_s"] / m["median_step_s"]
            print(f"  round {rnd} {dt}: miniCP {m['median_step_s']:.3f} s ({m['useful_gflops_per_s']:.1f} GFLOP/s, "
                  f"BLAS {m['blas_core']}), PyTorch {q['median_step_s']:.3f} s ({q['useful_gflops_per_s']:.1f} GFLOP/s, "
                  f"BLAS {q['platform']['blas_core']}): miniCP {r[f'speed_ratio_{dt}']:.2f}x", flush=True)
        rounds.append(r)
    first = rounds[0]
    res = {
        "study": "peer",
        "model": "cpu-small",
        "pass": "train",
        "seq_len": a.seq_len,
        "threads": a.threads,
        "warmup": a.warmup,
        "reps": a.reps,
        "useful_flops_per_step": first["minicp_f32"]["useful_flops"],
        "speed_ratio": "PyTorch step time / miniCP step time, the same FLOPs (miniCP's count); above 1: miniCP faster",
        "platform": {
            **cpu_info(),
            "glibc_tunables": a.glibc_tunables,
            "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", ""),
            "minicp_blas_core": first["minicp_f32"]["blas_core"],
            "minicp_blas_core_source": first["minicp_f32"]["blas_core_source"],
            "minicp_blas_library": first["minicp_f32"]["blas_library"],
            "minicp_gemm_bf16_engine": first["minicp_bf16"]["gemm_bf16_engine"],
            "minicp_attention_isa": first["minicp_bf16"]["attention_isa"],
            "minicp_threads": first["minicp_f32"]["kokkos_concurrency"],
            "torch_version": first["peer_f32"]["platform"]["torch_version"],
            "torch_package": "python3-torch " + debian_version("python3-torch"),
            "torch_threads": first["peer_f32"]["platform"]["threads"],
            "torch_blas_core": first["peer_f32"]["platform"]["blas_core"],
            "torch_blas_library": first["peer_f32"]["platform"]["blas_library"],
            "torch_blas_threads": first["peer_f32"]["platform"]["blas_threads"],
            "torch_mkldnn": first["peer_f32"]["platform"]["mkldnn"],
        },
        "rounds": rounds,
    }
    res["summary"] = summarise(rounds)
    loads = [r[f"{side}_{dt}"]["load_1min_before"] for r in rounds for side in ("minicp", "peer") for dt in ("bf16", "f32")]
    res["summary"]["load_1min_max"] = max(loads)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    report(a, res, loads)
    return 0


def report(a, res, loads):
    """The study's table, its host-kind line and its MINICP_PEER_STUDY summary line."""
    p = res["platform"]
    print(f"\npeer study: S={a.seq_len}, 1 rank x {a.threads} threads against torch {p['torch_version']} ({p['torch_package']}) at "
          f"{p['torch_threads']} threads; {p['cpu_model']} ({p['cpu_flags']}); BLAS core miniCP {p['minicp_blas_core']}, "
          f"PyTorch {p['torch_blas_core']}; GLIBC_TUNABLES={a.glibc_tunables or '(none)'}")
    print(f"step s and GFLOP/s ({res['useful_flops_per_step'] / 1e9:.1f} GFLOP per step, miniCP's count); "
          "ratio = PyTorch time / miniCP time")
    print(table(res))
    s = res["summary"]
    print(f"host kind: {HOST_KINDS[p['host_kind']]}; miniCP's bf16 attention path {p['minicp_attention_isa']}; target "
          f"bf16 ratio >= {BF16_TARGET[p['host_kind']]}")
    print(f"MINICP_PEER_STUDY host_kind={p['host_kind']} attention_isa={p['minicp_attention_isa']} "
          f"S={a.seq_len} threads={a.threads} rounds={a.rounds} "
          f"bf16_ratio={s['bf16']['speed_ratio_median']:.3f} ({s['bf16']['speed_ratio_min']:.3f}-{s['bf16']['speed_ratio_max']:.3f}) "
          f"f32_ratio={s['f32']['speed_ratio_median']:.3f} ({s['f32']['speed_ratio_min']:.3f}-{s['f32']['speed_ratio_max']:.3f})")
    if max(loads) > a.threads + 0.75:
        print(f"peer_study: WARNING: the 1-minute load average reached {max(loads):.2f} before a run "
              f"({a.threads} threads of this study's): other work shared the cores")
    print(f"peer_study: wrote {a.out}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
