"""What the study drivers share: running one program of the build (printed first, its
verdict checked, the lines worth seeing echoed) and reading the JSON it writes, and the
argparse type of an integer option with a lower bound, the median of repeated timings, and
the CPU a study ran on, with its host kind.

Standard library only: peer_layer.py imports it under the Python that has torch, and the
other drivers under any Python 3."""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time


def int_at_least(lo):
    """An argparse type: an integer >= lo, else the option's error names what is allowed."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got '{text}'")
        return v

    return parse


def median(xs):
    """The upper middle sample (docs/figures-of-merit.md): a time that was measured."""
    return sorted(xs)[len(xs) // 2]


def run_program(cmd, prog, what=None, *, env=None, timeout=None, show=None, timed=False, check=True):
    """Runs cmd, printed first as "+ cmd". show=None: its output passes through as it comes
    (long runs show their progress); else the output is kept and the lines that start with one
    of the prefixes in show are echoed, indented. Exit code != 0 with check: the kept output
    goes to stderr and the study ends with "<prog>: <what> failed with exit code N" (what: the
    command by default); past timeout (s) it ends with "<prog>: <what> ran past N s". Returns
    the CompletedProcess, its run time in wall_s."""
    what = what or " ".join(cmd)
    print("+ " + " ".join(cmd), flush=True)
    pipe = None if show is None else subprocess.PIPE
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, stdout=pipe, stderr=pipe, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{prog}: {what} ran past {timeout} s")
    p.wall_s = time.perf_counter() - t0
    output = (p.stdout or "") + (p.stderr or "")
    for line in output.splitlines():
        if show and line.startswith(tuple(show)):
            print("  " + line)
    if timed:
        print(f"  ({p.wall_s:.1f} s, exit code {p.returncode})", flush=True)
    if check and p.returncode != 0:
        sys.stderr.write(output)
        raise SystemExit(f"{prog}: {what} failed with exit code {p.returncode}")
    return p


def run_json(make_cmd, prog, what=None, *, path=None, **run):
    """Runs make_cmd(json_path) with run_program (its keyword arguments in run) and returns the
    JSON the program wrote to json_path. Without path, json_path is a name no file has yet in
    a private temporary folder, removed afterwards; with path, the file is kept there."""
    if path is not None:
        return _read_json(run_program(make_cmd(path), prog, what, **run), path, prog, what)
    with tempfile.TemporaryDirectory(prefix=f"{prog}_") as d:
        tmp = os.path.join(d, "out.json")
        return _read_json(run_program(make_cmd(tmp), prog, what, **run), tmp, prog, what)


def _read_json(p, path, prog, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{prog}: {what or ' '.join(p.args)} exited {p.returncode} without readable JSON "
                         f"in {path}: {e}")


# The kinds of host the bf16 figures are reported by, from the CPU's flags (cpu_info).
HOST_KINDS = {"amx": "AMX host (amx_bf16, amx_tile)",
              "avx512_bf16": "AVX512-BF16 host without AMX",
              "other": "host without AVX512-BF16 or AMX"}


def cpu_info():
    """The CPU of this host: its model, the flags the kernels choose by, its CPU count and
    name, and its kind (a key of HOST_KINDS)."""
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k.strip() == "model name" and not model.strip():
                    model = v.strip()
                if k.strip() == "flags" and not flags:
                    flags = set(v.split())
    except OSError:
        pass
    keep = ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
    kind = ("amx" if {"amx_bf16", "amx_tile"} <= flags else "avx512_bf16" if "avx512_bf16" in flags else "other")
    return {"cpu_model": model, "cpu_flags": " ".join(k for k in keep if k in flags),
            "cpus": os.cpu_count(), "host": platform.node(), "host_kind": kind}
