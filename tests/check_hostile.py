#!/usr/bin/env python3
"""Hostile input to minicp and its benches: files that are inputs under another role (a deck
named like a scratch file, /tmp/minicp_against_deck.*; a fabric profile given as an output; a
results file given to a bench), fabric profiles that would load code, checks that fail on one rank
only, thread counts out of range, control characters in paths, sizes and flags out of range,
and a run stopped by SIGTERM. Each refusal: exit 2, one message naming the flag or key, no
traceback, every file as it was.
A program missing from --bin (a build without it) has its cases skipped, said on stdout.
Usage: check_hostile.py --bin DIR --work DIR [--inputs DIR] [--mpiexec PATH]"""
import argparse
import concurrent.futures
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import h5py

from checks import FAILS, check, verdict

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
           OMP_PROC_BIND="false", OMPI_MCA_rmaps_base_oversubscribe="1")
ENV.pop("MINICP_ATTENTION_ISA", None)
# -x OMP_NUM_THREADS: every rank gets the value of the environment the test gives mpirun.
MPI_FLAGS = ["--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS"]
SMALL = ["--set", "sweep.seq_len=[64]", "--set", 'sweep.schemes=["none","ring"]', "--set", 'run.pass="train"']
# A calibration table written by hand: placeholder rates, enough for --predict of the tiny deck.
TABLE = """# placeholder rates for the tests of --predict
sgemm 1 5e10
gemm f32 1 NN 64 64 64 5e10
attn f32 1 fwd 16 256 128 2e-05 2e-05 3e-05 1e-05
attn f32 1 bwd 16 128 128 3e-05 3e-05 8e-06 1e-06
elem f32 1 rmsnorm_fwd 5e-10
elem f32 1 rmsnorm_bwd 8e-10
elem f32 1 rope 2e-09
elem f32 1 swiglu_fwd 4e-10
elem f32 1 swiglu_bwd 4e-10
elem f32 1 copy 2e-10
link default intra 1e-05 1e+09 1e+09
"""
ALLOWED = "must be a whole number of threads per rank from 1 to 512"


class Run:
    """Where the programs, the decks and the scratch files are."""
    bin = work = inputs = mpiexec = None

    @classmethod
    def exe(cls, name):
        return os.path.join(cls.bin, name)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.work, name)

    @classmethod
    def deck(cls):
        return os.path.join(cls.inputs, "tiny.toml")

    @classmethod
    def mpi(cls, np, *args):
        return [cls.mpiexec, "-np", str(np)] + MPI_FLAGS + [str(a) for a in args]


def run(cmd, env=None, timeout=60, **kw):
    """(exit status, stdout + stderr, stderr, seconds) of a command in its own session; the
    bytes as written (no newline translation: a carriage return stays one). A command that
    outlives timeout is killed with its children and its status is "timeout"."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(ENV, **(env or {})),
                         start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = "timeout"
    secs = time.monotonic() - t0
    out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    print("$", " ".join(repr(c) if not c.isprintable() else c for c in map(str, cmd)), f"-> exit {rc} ({secs:.1f} s)")
    return rc, out + err, err, secs


def snapshot(*paths):
    """The bytes of each file, None when absent."""
    out = {}
    for p in paths:
        out[p] = None
        if os.path.isfile(p):
            with open(p, "rb") as f:
                out[p] = f.read()
    return out


def expect(what, res, code, once=(), has=(), keep=None):
    """The command exited with `code`; each `once` text is in its output exactly once, each
    `has` text at least once; no traceback; the files of `keep` (a snapshot) unchanged."""
    rc, both, err, _ = res
    ok = check(rc == code, f"{what}: exit {rc}, expected {code}; output:\n{both[-1500:]}")
    for t in once:
        ok &= check(both.count(t) == 1, f"{what}: {t!r} printed {both.count(t)} times, expected once")
    for t in has:
        ok &= check(t in both, f"{what}: no {t!r} in the output")
    ok &= check("Traceback" not in both, f"{what}: a traceback")
    for p, before in (keep or {}).items():
        ok &= check(snapshot(p)[p] == before, f"{what}: {p} changed")
    return ok


def write(name, text):
    path = Run.path(name)
    with open(path, "w") as f:
        f.write(text)
    return path


def minicp(np, *args, env=None, timeout=60):
    """minicp on np ranks; one rank is a singleton (no mpiexec: a refusal under mpiexec costs its
    clean-up, 2 s)."""
    cmd = [Run.exe("minicp"), *map(str, args)]
    return run(cmd if np == 1 else Run.mpi(np, *cmd), env=env, timeout=timeout)


def dry(*args, env=None, seq_len="[64]"):
    """A one-rank dry run of the tiny deck at these sequence lengths with these extra arguments."""
    return minicp(1, "--deck", Run.deck(), "--set", f"sweep.seq_len={seq_len}", *args, "--dry-run", env=env)


def case_scratch_named_deck():
    """1. A deck whose path looks like a scratch file of minicp (/tmp/minicp_against_deck.*) is
    the user's, and stays."""
    d = tempfile.mkdtemp(prefix="minicp_against_deck.", dir="/tmp")
    try:
        deck = os.path.join(d, "d.toml")
        shutil.copy(Run.deck(), deck)
        res = minicp(1, "--deck", deck, "--set", "sweep.seq_len=[64]", "--dry-run")
        expect("deck under /tmp/minicp_against_deck.*", res, 0)
        check(os.path.isfile(deck), f"deck {deck} removed by a dry run")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def results_file():
    """R: a small two-rank run, on 2 threads per rank by the environment and 1 by Kokkos' flag
    in the spelling of Kokkos 4 (case 6 reads what it recorded)."""
    r = Run.path("r.h5")
    res = run(Run.mpi(2, Run.exe("minicp"), "--deck", Run.deck(), *SMALL, "--set", "run.reps=1",
                      "--out", r, "--overwrite", "--kokkos-num-threads=1"), env={"OMP_NUM_THREADS": "2"})
    return r, res


def plant_scratch_link(victim):
    """In the child before exec: /tmp/minicp_against_deck.<its pid>.toml, a link to victim (a
    program that wrote its scratch deck there would write through it)."""
    def plant():
        os.symlink(victim, f"/tmp/minicp_against_deck.{os.getpid()}.toml")
    return plant


def case_against(r, table):
    """2. --predict --against writes no scratch file (not even through a planted link), and a
    results file whose deck is not TOML is refused naming it, leaving no file either."""
    victim = write("victim.txt", "the victim\n")
    before = set(glob.glob("/tmp/minicp_against_deck.*"))
    # One process (--predict runs in one), so the link is planted under its own pid.
    res = run([Run.exe("minicp"), "--predict", "--against", r, "--calibration", table],
              preexec_fn=plant_scratch_link(victim))
    expect("--predict --against", res, 0)
    check(snapshot(victim)[victim] == b"the victim\n", "--predict --against wrote through a link to another file")
    bad = Run.path("bad_deck.h5")
    shutil.copy(r, bad)
    with h5py.File(bad, "r+") as f:
        f.attrs["deck"] = "x = ["
    res = run([Run.exe("minicp"), "--predict", "--against", bad, "--calibration", table])
    expect("--against with a deck that is not TOML", res, 2, once=(f"--against {bad} (its deck)",))
    new = set(glob.glob("/tmp/minicp_against_deck.*")) - before
    planted = {f for f in new if os.path.islink(f) and os.readlink(f) == victim}
    check(not new - planted, f"--predict --against left {sorted(new - planted)}")
    for f in new:
        os.remove(f)


def case_fabric_as_output():
    """3. A fabric profile file is an input: never an --out or --dump, even with --overwrite."""
    prof = Run.path("p.toml")
    shutil.copy(os.path.join(Run.inputs, "fabrics", "ob1-tcp.toml"), prof)
    keep = snapshot(prof)
    flags = ("--out", "--dump")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda flag: minicp(2, "--deck", Run.deck(), *SMALL, "--fabric", prof, flag, prof,
                                                    "--overwrite"), flags))
    for flag, res in zip(flags, results):
        expect(f"{flag} onto the --fabric file", res, 2, once=("the same file as --fabric",), keep=keep)


PROFILES = {  # [section] body -> the key a refusal names ("" : accepted)
    'mca|mca_base_component_path = "/tmp"': 'mca."mca_base_component_path"',
    'env|LD_PRELOAD = "/x.so"': 'env."LD_PRELOAD"',
    'env|"A=B" = "1"': 'env."A=B"',
    'env|"" = "1"': 'env.""',
    'env|NCCL_NET_PLUGIN = "x"': 'env."NCCL_NET_PLUGIN"',
    'env|UCX_IB_GPU_DIRECT_RDMA = "yes"\nUCX_TLS = "tcp"': "",
}


def profile(name, body):
    section, entries = body.split("|", 1)
    return write(name, f'description = "a test profile"\n\n[{section}]\n{entries}\n')


def case_fabric_allowlist():
    """4. A profile may only tune the transports: no paths, plug-ins, loaders or odd names."""
    for i, (body, key) in enumerate(PROFILES.items()):
        prof = profile(f"allow{i}.toml", body)
        res = dry("--fabric", prof)
        what = f"fabric profile [{body.replace('|', '] ')}"
        if key:
            expect(what, res, 2, once=(key,))
        else:
            expect(what, res, 0)
            check("env." not in res[1], f"{what}: refused by the allowlist")


def mpmd(args0, args1, x1=()):
    """Rank 0 and rank 1 of one job, each with its own arguments (and rank 1 with the
    variables of x1): a check that fails on rank 1 only."""
    exe = Run.exe("minicp")
    return Run.mpi(1, exe, *args0) + [":", "-np", "1"] + [w for v in x1 for w in ("-x", v)] + [exe, *args1]


def rank_only_jobs():
    """5. Bad input seen by rank 1 alone: (what, the message, the command line) of each job."""
    base = ["--deck", Run.deck(), "--set", "sweep.seq_len=[64]", "--dry-run"]
    missing = Run.path("missing_deck.toml")
    good = write("good_profile.toml", 'description = "a test profile"\n')
    bad = profile("bad_profile.toml", 'env|LD_PRELOAD = "/x.so"')
    return [("MINICP_ATTENTION_ISA=bogus on rank 1", "MINICP_ATTENTION_ISA",
             mpmd(base, base, ["MINICP_ATTENTION_ISA=bogus"])),
            ("a deck missing on rank 1", missing, mpmd(base, ["--deck", missing] + base[2:])),
            ("a fabric profile refused on rank 1", 'env."LD_PRELOAD"',
             mpmd(base + ["--fabric", good], base + ["--fabric", bad]))]


def case_rank_only(jobs):
    """5. ... exits 2 with the message once, within 40 s (jobs: rank_only_jobs, started early)."""
    for what, text, job in jobs:
        res = job.result()
        if expect(what, res, 2, once=(text,)):
            check(res[3] < 40, f"{what}: took {res[3]:.0f} s")


def case_threads(r):
    """6. Thread counts: OMP_NUM_THREADS and Kokkos' flags from 1 to 512; Kokkos' flag in either
    spelling reaches this Kokkos in its own (R ran with --kokkos-num-threads=1), and the
    command_line attribute records it as given."""
    cp = os.path.isfile(Run.exe("minicp-cp-bench"))
    for v in ("1024", "0", "abc", "-1"):
        text = f"OMP_NUM_THREADS={v}: {ALLOWED}"
        expect(f"minicp with OMP_NUM_THREADS={v}", dry(env={"OMP_NUM_THREADS": v}), 2, once=(text,))
        if cp:
            res = run([Run.exe("minicp-cp-bench"), "--seq", "64"], env={"OMP_NUM_THREADS": v})
            expect(f"minicp-cp-bench with OMP_NUM_THREADS={v}", res, 2, once=(text,))
    for flag in ("--kokkos-threads=abc", "--kokkos-num-threads=0"):
        expect(f"minicp {flag}", dry(flag), 2, once=(f"{flag}: {ALLOWED}",))
    with h5py.File(r, "r") as f:
        line, threads = str(f.attrs.get("command_line", "")), f.attrs.get("kokkos_concurrency")
    check("--kokkos-num-threads=1" in line.split(), f"R's command_line has no --kokkos-num-threads=1: {line}")
    check(threads == 1, f"R ran on {threads} threads per rank, not the 1 of --kokkos-num-threads=1")


def case_named_keys():
    """7. A message names the key the bad value came from, and shows control characters escaped."""
    out = Run.path("missing/x.h5")
    res = minicp(1, "--deck", Run.deck(), *SMALL, "--set", f'output.file="{out}"')
    expect("output.file in a missing directory", res, 2)
    check(any(line.startswith(f"minicp: output.file {out}:") for line in res[2].splitlines()),
          f"output.file: no message that starts with 'minicp: output.file {out}:': {res[2][:300]!r}")
    res = dry("--fabric", "ab\ncd_hostile")
    expect("--fabric with a newline", res, 2, once=("--fabric",), has=("ab\\ncd_hostile",))
    check(not any(line.startswith("cd_hostile") for line in res[1].splitlines()),
          "--fabric: a raw newline in the message")
    deck = Run.path("dk\x1b[31mred.toml")
    res = minicp(1, "--deck", deck, "--dry-run")
    expect("--deck with an escape character", res, 2)
    check("\x1b" not in res[1], f"--deck: a raw escape character in the output: {res[1][:300]!r}")


def case_resume_other_deck(r):
    """8. --resume of a file of another deck names the first key that differs, with both values."""
    keep = snapshot(r)
    args = ["--deck", Run.deck(), *SMALL[2:], "--set", "run.reps=1", "--set", "sweep.seq_len=[128]", "--resume", r]
    expect("--resume with another seq_len", minicp(2, *args), 2,
           once=("sweep.seq_len is [ 64 ] in the file and [ 128 ] in this run",), keep=keep)


def case_quiet(table):
    """9. --quiet prints the summary alone: one line for a dry run, far fewer lines for --predict."""
    res = dry("--quiet")
    expect("--dry-run --quiet", res, 0)
    stdout = res[1][:len(res[1]) - len(res[2])]
    check(len(stdout.splitlines()) == 1, f"--dry-run --quiet printed {len(stdout.splitlines())} lines:\n{stdout}")
    lines = []
    for quiet in ([], ["--quiet"]):
        res = run([Run.exe("minicp"), "--predict", "--deck", Run.deck(), "--calibration", table, *quiet])
        expect(f"--predict {' '.join(quiet)}", res, 0)
        lines.append(len(res[1][:len(res[1]) - len(res[2])].splitlines()))
    check(lines[1] <= 2 and lines[0] >= 5 * lines[1], f"--predict printed {lines[0]} lines, --quiet {lines[1]}")


def case_ids():
    """10. Over 1000 cases: every case id has 4 digits, and the ids sort in sweep order."""
    seqs = ",".join(str(64 + 2 * i) for i in range(100))
    res = dry("--set", "sweep.ranks=[2]", "--quiet=off", seq_len=f"[{seqs}]")
    expect("a dry run of 1100 cases", res, 0)
    ids = [line.split()[0] for line in res[1].splitlines() if re.match(r"\d{3,}_", line)]
    check(len(ids) > 1000, f"the dry run listed {len(ids)} cases, expected over 1000")
    short = [i for i in ids if not re.match(r"\d{4}_", i)]
    check(not short, f"case ids without 4 digits: {short[:3]}")
    check(ids == sorted(ids), "the case ids do not sort in sweep order")


def case_rank_memory():
    """11. --rank-memory: a size with a unit, at least 1 B."""
    for v, code, text in (("0x10GiB", 2, "expected a size"), ("0.0001KiB", 2, "at least 1 B"),
                          ("1EiB", 0, ""), ("-1GiB", 2, "expected a size")):
        expect(f"--rank-memory {v}", dry("--rank-memory", v), code, once=(text,) if text else ())


def case_predict_refused(table):
    """12. --predict of a scheme named in the deck that can run no case: exit 2, as --dry-run."""
    sets = ["--set", 'sweep.schemes=["ulysses"]', "--set", "sweep.ranks=[3]"]
    res = run([Run.exe("minicp"), "--predict", "--deck", Run.deck(), "--calibration", table, *sets])
    expect("--predict of ulysses at 3 ranks (4 heads)", res, 2)
    expect("--dry-run of ulysses at 3 ranks (4 heads)", dry(*sets), 2)


def case_cp_bench():
    """13. minicp-cp-bench: a mode named twice; the header; one progress line per rep; --json onto
    a file of another kind."""
    exe = Run.exe("minicp-cp-bench")
    if not os.path.isfile(exe):
        print("skipped: no minicp-cp-bench")
        return
    small = ["--scheme", "none", "--seq", "64", "--heads", "2", "--kv-heads", "2", "--head-dim", "16",
             "--warmup", "0", "--reps", "4"]  # over 3 reps: progress lines
    expect("--modes full,full", run([exe, *small, "--modes", "full,full"]), 2, once=("named twice",))
    js = Run.path("deck.toml")
    shutil.copy(Run.deck(), js)
    keep = snapshot(js)
    res = run([exe, *small, "--modes", "full", "--json", js])
    expect("minicp-cp-bench --json onto a deck", res, 2, once=("is not a minicp-cp-bench result",), keep=keep)
    res = run([exe, *small, "--modes", "full", "--json", js, "--overwrite"])
    expect("minicp-cp-bench --json --overwrite onto a deck", res, 0, has=("mask=\"causal\"",))
    check(snapshot(js)[js] != keep[js], "--overwrite: the deck was not replaced")
    reps = [line for line in res[2].split("\n") if re.search(r"rep \d+/\d+", line)]
    check(len(reps) >= 2 and all(len(re.findall(r"rep \d+/\d+", line)) == 1 for line in reps) and "\r" not in res[2],
          f"progress not one rep per line: {res[2][-500:]!r}")


def case_bench_outputs(r):
    """14. The benches' outputs onto files of another kind, and a fidelity table with no case
    (the jobs at once: each refusal under mpiexec waits for its clean-up)."""
    text = write("table.txt", "a text file\n")
    copy, out = Run.path("r_copy.h5"), Run.path("fidelity.json")
    shutil.copy(r, copy)
    comm, fid, kern = (Run.exe(n) for n in ("minicp-comm-bench", "minicp-fidelity", "minicp-kernels-bench"))
    jobs = [(comm, "minicp-comm-bench --json onto a text file", "is not a minicp-comm-bench result", text,
             Run.mpi(2, comm, "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--ops", "pingpong", "--json", text)),
            (fid, "minicp-fidelity --out onto a results file", "is not a minicp fidelity table", copy,
             Run.mpi(2, fid, "--seq-len", "64", "--out", copy)),
            (fid, "minicp-fidelity --seq-len 63 --schemes ring,zigzag at 2 ranks", "no case of the table can run", out,
             Run.mpi(2, fid, "--seq-len", "63", "--schemes", "ring,zigzag", "--out", out)),
            (kern, "minicp-kernels-bench --benchmark_out onto a text file", "is not a Google Benchmark JSON file", text,
             [kern, "--benchmark_filter=NONE", f"--benchmark_out={text}"])]
    for exe in sorted({j[0] for j in jobs if not os.path.isfile(j[0])}):
        print(f"skipped: no {os.path.basename(exe)}")
    jobs = [j for j in jobs if os.path.isfile(j[0])]
    keep = snapshot(text, copy, out)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda j: run(j[4]), jobs))
    for (_, what, message, path, _), res in zip(jobs, results):
        expect(what, res, 2, once=(message,), keep={path: keep[path]})


def case_deck_rules():
    """15, 16. run.grad_allreduce needs a train pass; MINICP_ATTENTION_ISA=avx512_bf16 needs the CPU's."""
    sets = ["--set", 'run.dtype="bf16"', "--set", 'run.grad_allreduce="bf16"', "--set", 'run.pass="decode"']
    expect("run.grad_allreduce without train", dry(*sets), 2, once=('only with run.pass including "train"',))
    with open("/proc/cpuinfo") as f:
        has = "avx512_bf16" in f.read().split()
    res = dry("--set", 'run.dtype="bf16"', env={"MINICP_ATTENTION_ISA": "avx512_bf16"})
    if has:
        expect("MINICP_ATTENTION_ISA=avx512_bf16 on a CPU with it", res, 0)
    else:
        expect("MINICP_ATTENTION_ISA=avx512_bf16 on a CPU without it", res, 2, once=("this CPU has no avx512_bf16",))


def started_second_case(p, deadline_s):
    """Reads the run's stdout until its second case starts ("[2/N] ..."): the first is then
    complete, so the file keeps one. False at the end of the output or after deadline_s."""
    timer = threading.Timer(deadline_s, lambda: os.killpg(p.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in p.stdout:
            if line.startswith(b"[2/"):
                return True
        return False
    finally:
        timer.cancel()


def case_sigterm(resume):
    """17. SIGTERM to mpirun during a run: the run says how it stopped and how to go on, its lock
    is removed, its file keeps the complete cases, and (resume) --resume completes it."""
    out = Run.path("s.h5")
    args = ["--deck", Run.deck(), "--set", "sweep.seq_len=[1024,2048]", "--set", "run.reps=1", "--out", out]
    with open(Run.path("sigterm.err"), "w+b") as err:
        p = subprocess.Popen(Run.mpi(2, Run.exe("minicp"), *args), env=ENV, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=err)
        if check(started_second_case(p, 60), "SIGTERM: the run did not reach its second case"):
            check(os.path.exists(out + ".lock"), f"no {out}.lock while the run ran")
            p.send_signal(signal.SIGTERM)
        try:
            p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    print(f"$ SIGTERM to mpirun -> exit {p.returncode}")
    check(p.returncode != 0, "SIGTERM: exit 0")
    check("stopped by SIGTERM" in text and f"--resume {out}" in text,
          f"SIGTERM: the run did not say so: {text[-800:]!r}")
    check(not os.path.exists(out + ".lock"), f"SIGTERM left {out}.lock")
    try:
        with h5py.File(out, "r") as f:
            kept, complete = len(f["cases"]), f.attrs["complete"]
        check(kept >= 1 and complete == "no", f"SIGTERM: {out} holds {kept} cases, complete={complete}")
    except (OSError, KeyError) as e:
        check(False, f"SIGTERM: {out} is not a results file ({e})")
    if resume:
        expect("--resume after SIGTERM", minicp(2, *args[:-2], "--resume", out, timeout=120), 0)


class Shared:
    """What the cases share: R and the jobs of case 5, started first and run beside the cases
    that need neither (a rank-only failure spends its 10 s waiting for the others)."""

    def __init__(self, pool, wanted, resume):
        self.table = write("table_cal.txt", TABLE)
        self.resume = resume
        self._r = pool.submit(results_file) if not wanted or wanted & {"2", "6", "8", "14"} else None
        self._r_checked = False
        rank_only = rank_only_jobs() if not wanted or "5" in wanted else []
        self.rank_only = [(what, text, pool.submit(run, cmd)) for what, text, cmd in rank_only]

    def r(self):
        path, res = self._r.result()
        if not self._r_checked:
            self._r_checked = True
            expect("the small run R", res, 0)
        return path


CASES = [  # those that need R or the early jobs last
    ("1 deck named like a scratch file", lambda c: case_scratch_named_deck()),
    ("3 fabric profile as output", lambda c: case_fabric_as_output()),
    ("4 fabric profile allowlist", lambda c: case_fabric_allowlist()),
    ("7 messages name the key", lambda c: case_named_keys()),
    ("9 --quiet", lambda c: case_quiet(c.table)),
    ("10 case ids", lambda c: case_ids()),
    ("11 --rank-memory", lambda c: case_rank_memory()),
    ("12 --predict of a refused scheme", lambda c: case_predict_refused(c.table)),
    ("13 minicp-cp-bench", lambda c: case_cp_bench()),
    ("15-16 deck rules", lambda c: case_deck_rules()),
    ("5 bad input on rank 1 only", lambda c: case_rank_only(c.rank_only)),
    ("2 --predict --against", lambda c: case_against(c.r(), c.table)),
    ("6 thread counts", lambda c: case_threads(c.r())),
    ("8 --resume of another deck", lambda c: case_resume_other_deck(c.r())),
    ("14 bench outputs", lambda c: case_bench_outputs(c.r())),
    ("17 SIGTERM", lambda c: case_sigterm(c.resume)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the build's bin directory")
    ap.add_argument("--work", required=True, help="scratch directory (emptied first)")
    ap.add_argument("--inputs", default=os.path.join(HERE, "..", "inputs"), help="the decks and fabric profiles")
    ap.add_argument("--mpiexec", default="mpirun")
    ap.add_argument("--cases", default="", help="comma list of case numbers to run (default: all)")
    ap.add_argument("--no-resume", action="store_true",
                    help="case 17 without finishing the stopped run by --resume (10 to 20 s less)")
    a = ap.parse_args()
    Run.bin, Run.work, Run.inputs, Run.mpiexec = (os.path.abspath(a.bin), os.path.abspath(a.work),
                                                  os.path.abspath(a.inputs), a.mpiexec)
    shutil.rmtree(Run.work, ignore_errors=True)
    os.makedirs(Run.work)
    t0 = time.monotonic()
    wanted = set(a.cases.split(",")) if a.cases else None
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        shared = Shared(pool, wanted, not a.no_resume)
        for name, fn in CASES:
            if wanted and not wanted & set(name.split()[0].split("-")):
                continue
            n, t = len(FAILS), time.monotonic()
            fn(shared)
            print(f"== case {name}: {'ok' if len(FAILS) == n else 'FAIL'} ({time.monotonic() - t:.1f} s)")
    print(f"total {time.monotonic() - t0:.1f} s")
    return verdict("check_hostile.py", "all")


if __name__ == "__main__":
    sys.exit(main())
