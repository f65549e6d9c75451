#!/usr/bin/env python3
"""Checks slurm/submit and slurm/minicp.sbatch without a running Slurm.

  --mode dryrun     `submit --dry-run` of the tiny deck over nodes 1,2 x fabrics none,ib-ndr:
                    one sbatch line (array) per node count with -N, one task per fabric, the
                    file names, --set sweep.ranks=[R], the seq_len of weak scaling, GPUs
                    and the mpirun launcher; nothing written.
  --mode resubmit   runs the dry run's task command for N1_none under MPI (the COMMAND after
                    --, e.g. mpirun -np 2 --oversubscribe) to make a complete file, makes a
                    partial file (N1_ib-ndr) and an unreadable one (N2_none); a dry run then
                    skips N1_none, resumes N1_ib-ndr (--resume), reruns N2_none (--overwrite).
                    A real submission through a stand-in `sbatch` (on PATH, printing a job
                    id) writes the manifest, the per-task argument file and the log links;
                    minicp.sbatch (MINICP_ECHO=1) reads its task's arguments from that file.
                    A second submission while a task's job is queued leaves that task alone.
  --mode collect    a study with one complete file, one missing task and one failed task
                    (partial file, Slurm output cancelled at the time limit, scontrol's
                    FAILED state; sacct without accounting): collect exits 1, names each
                    status and reason, and writes index.csv. Links planted in the study (under
                    the names of temporaries, or as the next tasks file) are not written
                    through; an output that is a directory or a link is refused (exit 2).
  --mode manifest   a hand-damaged manifest.json (not JSON, not UTF-8, a list, tasks of the
                    wrong type or missing fields, paths out of the study or to a FIFO): collect
                    and submit exit 2 with one message naming the file and what is wrong; the
                    study is left as it was. A control character in a study name, deck name or
                    option value: exit 2, the value shown quoted, nothing made or submitted.
  --mode sbatch     minicp.sbatch outside Slurm refused; the header (ranks, threads, launcher,
                    command) under a Slurm-like environment; the per-rank GPU wrapper sets
                    CUDA_VISIBLE_DEVICES from the local rank; an array task's arguments from
                    the tasks file (NUL-separated) reach minicp as they are.
Usage: check_slurm_submit.py --mode M --dir SCRATCH --deck tiny.toml --bin MINICP [-- MPIRUN...]"""
import argparse
import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

from checks import check, verdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SUBMIT = os.path.join(ROOT, "slurm", "submit")
SBATCH = os.path.join(ROOT, "slurm", "minicp.sbatch")
ONE_CASE = ["--set", "run.pass=train", "--set", 'sweep.schemes=["zigzag"]', "--set", "sweep.seq_len=[64]",
            "--set", "run.reps=1"]


def run(cmd, env=None, show=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, **(env or {})))
    if show:
        print("$", shlex.join(cmd), f"-> exit {p.returncode}")
        print(p.stdout)
    return p


def sbatch_lines(out):
    return [ln.strip() for ln in out.splitlines() if " sbatch --parsable " in ln]


def tasks_of(out):
    """{task name: (mode, command words)} from the dry-run's task lines."""
    res = {}
    for ln in out.splitlines():
        m = re.match(r"^\s+task (\d+) (N\d+_\S+) \[([^\]]*)\]: (.*)$", ln)
        if m:
            res[m.group(2)] = (m.group(3), shlex.split(m.group(4)), int(m.group(1)))
    return res


def read_tasks(path):
    """The tasks of a tasks file: each argument ends with a NUL, each task with one more."""
    tasks, cur = [], []
    data = open(path, "rb").read().decode()
    for rec in data.split("\0")[:-1]:  # the text after the last NUL: none
        if rec:
            cur.append(rec)
        else:
            tasks.append(cur)
            cur = []
    check(data.endswith("\0") and not cur, f"{path}: the last task is not ended: {data[-60:]!r}")
    return tasks


def refused(cmd, want, env=None, cwd=None, timeout=60):
    """Runs cmd; whether it exited 2 with one stderr line that holds every string of want,
    no traceback (a command still running after timeout s counts as not refused)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **(env or {})), cwd=cwd,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return check(False, f"{cmd!r}: still running after {timeout} s")
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    ok = p.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in want) and "Traceback" not in p.stderr
    return check(ok, f"{cmd!r}: exit {p.returncode}, expected 2 and one line with {want}: stderr {p.stderr[-500:]!r}")


def fake_slurm(d):
    """Stand-ins for sbatch (prints the next job id, keeps its arguments and environment),
    squeue (a job is queued when d/queue.d/<id> exists), sacct (no accounting) and scontrol
    (knows the jobs of d/jobs.d/<id>)."""
    os.makedirs(os.path.join(d, "queue.d"), exist_ok=True)
    os.makedirs(os.path.join(d, "jobs.d"), exist_ok=True)
    scripts = {
        "sbatch": f"""#!/bin/bash
n=$(( $(cat {d}/next 2>/dev/null || echo 1000) + 1 )); echo $n > {d}/next
printf '%s\\n' "$@" > {d}/sbatch.$n.args
env | grep '^MINICP_' > {d}/sbatch.$n.env
echo "$n"
""",
        "squeue": f"""#!/bin/bash
while [ $# -gt 0 ]; do [ "$1" = -j ] && j=$2; shift; done
if [ -f "{d}/queue.d/$j" ]; then cat "{d}/queue.d/$j"; exit 0; fi
if [ -f "{d}/queue.d/${{j%_*}}" ]; then cat "{d}/queue.d/${{j%_*}}"; exit 0; fi
echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1
""",
        "sacct": """#!/bin/bash
echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1
""",
        "scontrol": f"""#!/bin/bash
j=$3
if [ -f "{d}/jobs.d/$j" ]; then cat "{d}/jobs.d/$j"; exit 0; fi
echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1
""",
    }
    for name, text in scripts.items():
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    return {"PATH": d + os.pathsep + os.environ["PATH"]}


def set_complete(path, value, drop_cases=0):
    import h5py
    with h5py.File(path, "r+") as f:
        f.attrs["complete"] = value
        for c in list(f["cases"])[:drop_cases]:
            f["cases"][c].attrs["complete"] = "no"


def mode_dryrun(a):
    study = os.path.join(a.dir, "dry")
    base = [SUBMIT, a.deck, "--nodes", "1,2", "--fabrics", "none,ib-ndr", "--ranks-per-node", "2", "--cpus-per-task", "3",
            "--study", study, "--bin", a.bin, "--dry-run"]
    p = run(base + ONE_CASE)
    check(p.returncode == 0, f"dry run exit {p.returncode}")
    lines = sbatch_lines(p.stdout)
    check(len(lines) == 2, f"{len(lines)} sbatch lines, expected 2 (one array per node count)")
    for n, line in zip((1, 2), lines):
        check(f"--nodes={n} " in line, f"N{n}: no --nodes={n} in {line}")
        check("--array=0-1 " in line, f"N{n}: not an array of 2 tasks: {line}")
        check("--ntasks-per-node=2 " in line and "--cpus-per-task=3 " in line, f"N{n}: ranks/threads per node: {line}")
        check(f"'sweep.ranks=[{2 * n}]'" in line, f"N{n}: no --set sweep.ranks=[{2 * n}]: {line}")
        check(f"MINICP_TASKS={study}/tasks/N{n}-1.tasks " in line, f"N{n}: tasks file: {line}")
        check(f"--output={study}/logs/N{n}-%A_%a.out " in line, f"N{n}: output pattern: {line}")
        check(f" {SBATCH} --deck " in line, f"N{n}: not minicp.sbatch: {line}")
        check("MINICP_LAUNCHER" not in line and "--gpus-per-node" not in line, f"N{n}: launcher/GPUs: {line}")
        check(" --exclusive " in line, f"N{n}: not --exclusive: {line}")
    tasks = tasks_of(p.stdout)
    check(sorted(tasks) == ["N1_ib-ndr", "N1_none", "N2_ib-ndr", "N2_none"], f"tasks {sorted(tasks)}")
    for name, (mode, cmd, idx) in tasks.items():
        n, fab = re.match(r"N(\d+)_(\S+)", name).groups()
        check(cmd[0] == a.bin, f"{name}: command does not run {a.bin}: {cmd}")
        check(cmd[-2:] == ["--out", os.path.join(study, name + ".h5")], f"{name}: --out: {cmd}")
        check(("--fabric" in cmd) == (fab != "none") and (fab == "none" or cmd[cmd.index("--fabric") + 1] == fab),
              f"{name}: --fabric: {cmd}")
        check(f"sweep.ranks=[{2 * int(n)}]" in cmd, f"{name}: sweep.ranks: {cmd}")
        check(idx == (0 if fab == "none" else 1) and mode == "new", f"{name}: index {idx} mode {mode}")
    check(not os.path.exists(study), f"--dry-run wrote {study}")
    check("predicted up to" in p.stdout, "the minicp --dry-run check printed no memory per rank")

    # Weak scaling: seq_len x nodes (tiny: [64,128]); the user's --set sweep.seq_len is the base.
    p = run(base + ["--scaling", "weak", "--no-check"])
    lines = sbatch_lines(p.stdout)
    check(len(lines) == 2 and "'sweep.seq_len=[64,128]'" in lines[0] and "'sweep.seq_len=[128,256]'" in lines[1],
          f"weak scaling seq_len: {lines}")
    p = run(base + ["--scaling", "weak", "--no-check", "--nodes", "3", "--set", "sweep.seq_len=96"])
    lines = sbatch_lines(p.stdout)
    check(len(lines) == 1 and "'sweep.seq_len=[288]'" in lines[0] and "sweep.seq_len=96" not in lines[0],
          f"weak scaling of --set sweep.seq_len=96 at 3 nodes: {lines}")
    # Strong scaling keeps the deck's seq_len (no --set of it).
    p = run(base + ["--no-check"])
    check(all("sweep.seq_len" not in ln for ln in sbatch_lines(p.stdout)), "strong scaling sets seq_len")
    # GPUs: one rank per GPU; mpirun launcher; sbatch pass-through options.
    p = run([SUBMIT, a.deck, "--nodes", "2", "--gpus-per-node", "4", "--study", study, "--bin", a.bin, "--dry-run",
             "--no-check", "--launcher", "mpirun", "--bind", "none", "--partition", "gpu", "--account", "proj1", "--time", "0:30:00",
             "--sbatch-opt=--qos=debug", "--no-exclusive"])
    lines = sbatch_lines(p.stdout)
    check(len(lines) == 1 and all(t in lines[0] for t in (
        "--gpus-per-node=4 ", "--ntasks-per-node=4 ", "'sweep.ranks=[8]'", "MINICP_LAUNCHER=mpirun ", "MINICP_BIND=none ", "--partition=gpu ",
        "--account=proj1 ", "--time=0:30:00 ", "--qos=debug ", "--array=0 ", "--oversubscribe ")) and "--exclusive" not in lines[0],
          f"GPU/mpirun/pass-through line: {lines}")
    # A user's sweep.ranks wins over the job's rank count.
    p = run(base + ["--no-check", "--set", "sweep.ranks=[1,2]"])
    check(all("sweep.ranks=[1,2]" in ln and "sweep.ranks=[2]'" not in ln for ln in sbatch_lines(p.stdout)),
          "--set sweep.ranks is not kept")


def resubmit_dry_run(a, study, base):
    """A complete, a partial and an unreadable file, then a dry run: skipped, resumed, run again
    with --overwrite. False where the first dry run has no N1_none task."""
    p = run(base + ["--dry-run", "--no-check"])
    tasks = tasks_of(p.stdout)
    if not check("N1_none" in tasks, "no N1_none task in the dry run"):
        return False
    # The task's command, as the job would run it, under MPI: a complete file.
    os.makedirs(study)
    r = run(a.mpirun + tasks["N1_none"][1] + ["--quiet"])
    f_none = os.path.join(study, "N1_none.h5")
    check(r.returncode == 0 and os.path.exists(f_none), f"the N1_none task command failed ({r.returncode})")
    shutil.copy(f_none, os.path.join(study, "N1_ib-ndr.h5"))
    set_complete(os.path.join(study, "N1_ib-ndr.h5"), "no", drop_cases=1)  # a partial file
    with open(os.path.join(study, "N2_none.h5"), "w") as f:
        f.write("not HDF5\n")
    p = run(base + ["--dry-run"])
    check(p.returncode == 0, f"re-submission dry run exit {p.returncode}")
    check(re.search(r"skip N1_none: complete \(1 cases\)", p.stdout) is not None, "complete N1_none not skipped")
    tasks = tasks_of(p.stdout)
    check("N1_none" not in tasks, "N1_none (complete) is run again")
    ib = tasks.get("N1_ib-ndr")
    if check(ib is not None, "no N1_ib-ndr task"):
        check(ib[1][-2:] == ["--resume", os.path.join(study, "N1_ib-ndr.h5")] and "--out" not in ib[1],
              f"N1_ib-ndr (partial) not resumed: {ib[1]}")
        check("partial: 0 complete cases and 1 incomplete" in ib[0], f"N1_ib-ndr mode: {ib[0]}")
    n2 = tasks.get("N2_none")
    check(n2 is not None and n2[1][-3:] == ["--out", os.path.join(study, "N2_none.h5"), "--overwrite"],
          f"N2_none (unreadable file) not run again with --overwrite: {n2}")
    lines = sbatch_lines(p.stdout)
    check(len(lines) == 2 and "--nodes=1 " in lines[0] and "--array=0 " in lines[0] and "--array=0-1 " in lines[1],
          f"arrays after skipping N1_none: {lines}")
    return True


def resubmit_submission(a, study, base, fake, env):
    """A real submission through the stand-in sbatch: the manifest, the tasks file, the log
    links, and minicp.sbatch reading its task's arguments; the manifest's path, or None."""
    p = run(base + ["--no-check"], env=env)
    check(p.returncode == 0, f"submission exit {p.returncode}")
    man_path = os.path.join(study, "manifest.json")
    if not check(os.path.exists(man_path), "no manifest.json"):
        return None
    man = json.load(open(man_path))
    check(sorted(man["tasks"]) == ["N1_ib-ndr", "N2_ib-ndr", "N2_none"], f"manifest tasks {sorted(man['tasks'])}")
    check([s["job_id"] for s in man["submissions"]] == ["1001", "1002"], f"job ids {man['submissions']}")
    t = man["tasks"].get("N1_ib-ndr", {})
    check(t.get("job_id") == "1001" and t.get("array_task_id") == 0 and t.get("file") == "N1_ib-ndr.h5"
          and t.get("ranks") == 2 and t.get("nodes") == 1, f"manifest N1_ib-ndr {t}")
    check(os.readlink(os.path.join(study, "N2_ib-ndr.log")) == "logs/N2-1002_1.out", "N2_ib-ndr.log link")
    args = open(os.path.join(fake, "sbatch.1002.args")).read().split("\n")
    check("--array=0-1" in args and "--nodes=2" in args and "sweep.ranks=[4]" in args, f"sbatch args {args}")
    tf = os.path.join(study, "tasks", "N2-1.tasks")
    got = read_tasks(tf)
    check(got == [["--out", os.path.join(study, "N2_none.h5"), "--overwrite"],
                  ["--fabric", "ib-ndr", "--out", os.path.join(study, "N2_ib-ndr.h5")]], f"tasks file {got}")
    envs = dict(ln.split("=", 1) for ln in open(os.path.join(fake, "sbatch.1002.env")).read().splitlines())
    check(envs.get("MINICP_TASKS") == tf and envs.get("MINICP_BIN") == a.bin, f"sbatch environment {envs}")
    # minicp.sbatch of array task 1 of that job: its arguments from the tasks file.
    e = dict(envs, SLURM_JOB_ID="1004", SLURM_ARRAY_JOB_ID="1002", SLURM_ARRAY_TASK_ID="1", SLURM_JOB_NUM_NODES="2",
             SLURM_NTASKS_PER_NODE="2", SLURM_CPUS_PER_TASK="1", MINICP_ECHO="1")
    r = run(["bash", SBATCH] + args[args.index(SBATCH) + 1:-1], env=e)
    check(r.returncode == 0 and re.search(r"command +srun --mpi=pmix --nodes=2 --ntasks=4 .*--set sweep\.ranks=\\\[4\\\] "
                                          r".*--fabric ib-ndr --out " + re.escape(os.path.join(study, "N2_ib-ndr.h5")) + "$",
                                          r.stdout, re.M), "minicp.sbatch did not run array task 1's command")
    return man_path


def resubmit_again(base, fake, env, man_path):
    """A second submission leaves a queued task alone; another --scaling is refused."""
    # Submitting again: N2 is queued (stand-in squeue), N1_ib-ndr's job 1001 left the queue.
    with open(os.path.join(fake, "queue.d", "1002"), "w") as f:
        f.write("PENDING|Priority\n")
    p = run(base + ["--no-check"], env=env)
    check(re.search(r"skip N2_none: job 1002_0 still PENDING \(Priority\)", p.stdout) is not None,
          "a queued task was not left alone")
    check(len(sbatch_lines(p.stdout)) == 1 and "--nodes=1 " in sbatch_lines(p.stdout)[0],
          f"second submission: {sbatch_lines(p.stdout)}")
    man = json.load(open(man_path))
    check(man["tasks"]["N1_ib-ndr"]["job_id"] == "1003" and len(man["tasks"]["N1_ib-ndr"]["attempts"]) == 2,
          f"second attempt of N1_ib-ndr: {man['tasks']['N1_ib-ndr']}")
    # The study's sweep is fixed: another --scaling is refused.
    p = run(base + ["--no-check", "--scaling", "weak"], env=env)
    check(p.returncode == 2 and "--scaling weak: study" in p.stdout and "was submitted with --scaling strong" in p.stdout,
          "a study re-submitted with other options")


def mode_resubmit(a):
    study = os.path.join(a.dir, "re")
    shutil.rmtree(study, ignore_errors=True)
    base = [SUBMIT, a.deck, "--nodes", "1,2", "--fabrics", "none,ib-ndr", "--ranks-per-node", "2", "--cpus-per-task", "1",
            "--study", study, "--bin", a.bin] + ONE_CASE
    if not resubmit_dry_run(a, study, base):
        return
    # A real submission through the stand-in sbatch.
    fake = os.path.join(a.dir, "fakebin_re")
    shutil.rmtree(fake, ignore_errors=True)
    env = fake_slurm(fake)
    man_path = resubmit_submission(a, study, base, fake, env)
    if man_path is None:
        return
    resubmit_again(base, fake, env, man_path)


def mode_collect(a):
    study = os.path.join(a.dir, "col")
    shutil.rmtree(study, ignore_errors=True)
    fake = os.path.join(a.dir, "fakebin_col")
    shutil.rmtree(fake, ignore_errors=True)
    env = fake_slurm(fake)
    p = run([SUBMIT, a.deck, "--nodes", "1", "--fabrics", "none,ib-ndr,ob1-tcp", "--ranks-per-node", "2", "--study", study,
             "--bin", a.bin, "--no-check"] + ONE_CASE, env=env)
    if not check(p.returncode == 0, f"submission exit {p.returncode}"):
        return
    # N1_none finished (a complete file); N1_ib-ndr never ran (no file, no log, unknown to Slurm);
    # N1_ob1-tcp failed: a partial file, killed at the time limit, FAILED in scontrol.
    src = os.path.join(a.dir, "collect_src.h5")
    r = run(a.mpirun + [a.bin, "--deck", a.deck] + ONE_CASE + ["--out", src, "--quiet"])
    check(r.returncode == 0, "minicp run for the complete file failed")
    shutil.copy(src, os.path.join(study, "N1_none.h5"))
    shutil.copy(src, os.path.join(study, "N1_ob1-tcp.h5"))
    set_complete(os.path.join(study, "N1_ob1-tcp.h5"), "no", drop_cases=1)
    with open(os.path.join(study, "logs", "N1-1001_2.out"), "w") as f:
        f.write("== minicp.sbatch: job 1001_2 (job id 1004), minicp\n[1/1] 000_train_zigzag_S64_P2\n"
                "slurmstepd: error: *** JOB 1004 ON node1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n")
    with open(os.path.join(fake, "jobs.d", "1001_2"), "w") as f:
        f.write("JobId=1004 ArrayJobId=1001 ArrayTaskId=2 JobName=minicp\n   JobState=TIMEOUT Reason=TimeLimit "
                "Dependency=(null)\n   ExitCode=0:15\n")
    p = run([SUBMIT, "collect", "--study", study], env=env)
    check(p.returncode == 1, f"collect exit {p.returncode}, expected 1 (a task failed, one is missing)")
    check(re.search(r"3 tasks: 1 finished, 1 failed, 1 missing", p.stdout) is not None, "collect summary line")
    check(re.search(r"N1_none +finished +N1_none\.h5 +job 1001_0: complete \(1 cases\)", p.stdout) is not None,
          "N1_none not finished")
    check(re.search(r"N1_ib-ndr +missing .*unknown to Slurm.*never started", p.stdout) is not None, "N1_ib-ndr not missing")
    check(re.search(r"N1_ob1-tcp +failed .*TIMEOUT \(exit 0:15, reason TimeLimit\) \[scontrol\].*DUE TO TIME LIMIT.*"
                    r"partial: 0 complete cases and 1 incomplete", p.stdout) is not None, "N1_ob1-tcp not failed with its reasons")
    rows = list(csv.DictReader(open(os.path.join(study, "index.csv"))))
    check([r["task"] for r in rows] == ["N1_ib-ndr", "N1_none", "N1_ob1-tcp"] and [r["status"] for r in rows] ==
          ["missing", "finished", "failed"], f"index.csv rows {[(r['task'], r['status']) for r in rows]}")
    check(list(rows[0].keys())[:9] == ["task", "nodes", "fabric", "ranks", "file", "status", "reason", "job_id",
                                      "array_task_id"], f"index.csv columns {list(rows[0].keys())}")
    check(rows[2]["job_id"] == "1001" and rows[2]["array_task_id"] == "2" and rows[2]["ranks"] == "2"
          and rows[2]["fabric"] == "ob1-tcp", f"index.csv N1_ob1-tcp {rows[2]}")
    # Once the missing and failed tasks have complete files, collect passes.
    shutil.copy(src, os.path.join(study, "N1_ib-ndr.h5"))
    shutil.copy(src, os.path.join(study, "N1_ob1-tcp.h5"))
    p = run([SUBMIT, "collect", "--study", study], env=env)
    check(p.returncode == 0 and "3 tasks: 3 finished" in p.stdout, f"collect of a finished study: exit {p.returncode}")
    p = run([SUBMIT, "collect", "--study", a.dir], env=env)
    check(p.returncode == 2 and "no manifest.json" in p.stdout, "collect of a directory without a manifest")
    collect_outputs(a, study, env, fake, src)


def collect_outputs(a, study, env, fake, src):
    """collect and submit write through no link planted in the study: not under a temporary's
    name (each write makes a new uniquely named one), not under an output's own name (exit 2,
    nothing submitted, every file as it was)."""
    sub = [SUBMIT, a.deck, "--nodes", "1", "--fabrics", "none,ib-ndr,ob1-tcp", "--ranks-per-node", "2", "--study",
           study, "--bin", a.bin, "--no-check"] + ONE_CASE
    victims = []
    for name in ("index.csv.tmp", "manifest.json.tmp"):
        victims.append(os.path.join(a.dir, "victim_" + name))
        with open(victims[-1], "w") as f:
            f.write("victim\n")
        os.symlink(victims[-1], os.path.join(study, name))
    p = run([SUBMIT, "collect", "--study", study], env=env)
    check(p.returncode == 0, f"collect with planted links: exit {p.returncode}")
    p = run(sub, env=env)  # every task complete: nothing submitted, the manifest saved
    check(p.returncode == 0 and "0 array job(s) submitted" in p.stdout, f"submission of a finished study: {p.returncode}")
    check(all(open(v).read() == "victim\n" for v in victims), "a file was written through a planted link")
    check(not os.path.islink(os.path.join(study, "index.csv")), "index.csv is a link")
    tmps = [f for f in os.listdir(study) if f.endswith(".tmp") and f not in ("index.csv.tmp", "manifest.json.tmp")]
    check(not tmps, f"temporaries left in the study: {tmps}")

    index = os.path.join(study, "index.csv")
    os.remove(index)
    os.mkdir(index)
    refused([SUBMIT, "collect", "--study", study], [f"--study {study}: {index} exists and is a directory"], env=env)
    check(os.path.isdir(index), "index.csv (a directory) was touched")
    # A task to run again, its tasks file (submission 2) a link planted in the study:
    # refused before sbatch.
    os.remove(os.path.join(study, "N1_ib-ndr.h5"))
    tasks_file = os.path.join(study, "tasks", "N1-2.tasks")
    os.symlink(victims[0], tasks_file)
    manifest = open(os.path.join(study, "manifest.json")).read()
    jobs = open(os.path.join(fake, "next")).read()
    refused(sub, [f"--study {study}: {tasks_file} exists and is a symbolic link"], env=env)
    check(open(os.path.join(fake, "next")).read() == jobs and open(victims[0]).read() == "victim\n"
          and open(os.path.join(study, "manifest.json")).read() == manifest,
          "a study with a planted tasks file link: something was submitted or written")
    os.remove(tasks_file)
    shutil.copy(src, os.path.join(study, "N1_ib-ndr.h5"))


def mode_manifest(a):
    """A study whose manifest.json was damaged by hand: collect and a submission to it exit
    2 with one message naming the file and what is wrong, no traceback, nothing written."""
    study = os.path.join(a.dir, "manifest")
    shutil.rmtree(study, ignore_errors=True)
    os.makedirs(study)
    path = os.path.join(study, "manifest.json")
    task = {"nodes": 1, "fabric": "none", "ranks": 2, "file": "N1_none.h5"}
    for body, why in ((b"", "not a readable manifest"), (b"{\"tasks\": {", "not a readable manifest"),
                      (b"\xff\xfe\x00", "not a readable manifest"), (b"[1, 2]", "a JSON list, expected an object"),
                      (json.dumps({"sweep": {}, "tasks": [], "submissions": []}).encode(), "tasks is [], expected"),
                      (json.dumps({"sweep": {}, "tasks": {"N1_none": dict(task, nodes="one")}, "submissions": []})
                       .encode(), 'task N1_none: nodes is "one", expected a node count'),
                      (json.dumps({"sweep": {}, "tasks": {"N1_none": {"fabric": "none"}}, "submissions": []})
                       .encode(), "task N1_none: nodes is null"),
                      (json.dumps({"sweep": {}, "tasks": {"N1_none": dict(task, job_id="7")}, "submissions": []})
                       .encode(), "task N1_none: job_id without array_task_id"),
                      (json.dumps({"sweep": {}, "tasks": {}, "submissions": [{"time": "x"}]}).encode(),
                       "submissions[0]")):
        with open(path, "wb") as f:
            f.write(body)
        for cmd in ([SUBMIT, "collect", "--study", study],
                    [SUBMIT, a.deck, "--study", study, "--bin", a.bin, "--no-check", "--dry-run"]):
            p = subprocess.run(cmd, capture_output=True, text=True)
            lines = [x for x in p.stderr.splitlines() if x.strip()]
            one = len(lines) == 1 and f"{path}: {why}" in lines[0] and "Traceback" not in p.stderr
            check(p.returncode == 2 and one,
                  f"{shlex.join(cmd)} with manifest {body[:60]!r}: exit {p.returncode}, stderr {p.stderr[-400:]!r}")
            check(open(path, "rb").read() == body and sorted(os.listdir(study)) == ["manifest.json"],
                  f"{shlex.join(cmd)} with manifest {body[:60]!r}: the study changed: {os.listdir(study)}")
    manifest_paths(a)
    control_characters(a)


def manifest_paths(a):
    """A manifest whose paths lead out of the study, or to a FIFO: collect and submit exit 2
    naming the manifest, the key and the value; nothing outside is read, nothing hangs."""
    study = os.path.join(a.dir, "paths")
    shutil.rmtree(study, ignore_errors=True)
    os.makedirs(os.path.join(study, "logs"))
    secret = os.path.join(a.dir, "secret.txt")
    with open(secret, "w") as f:
        f.write("minicp: error: SECRET-LINE\n")
    os.mkfifo(os.path.join(study, "logs", "fifo.out"))
    path = os.path.join(study, "manifest.json")
    env = fake_slurm(os.path.join(a.dir, "fakebin_paths"))
    task = {"nodes": 1, "fabric": "none", "ranks": 2, "file": "N1_none.h5", "job_id": "7", "array_task_id": 0,
            "slurm_log": "logs/N1-7_0.out"}
    for key, value, why in (("slurm_log", "../secret.txt", "leads outside the study directory"),
                            ("file", "../../../../etc/passwd", "leads outside the study directory"),
                            ("slurm_log", secret, "leads outside the study directory"),
                            ("slurm_log", "logs/fifo.out", "is not a regular file")):
        body = json.dumps({"sweep": {}, "tasks": {"N1_none": dict(task, **{key: value})}, "submissions": []})
        with open(path, "w") as f:
            f.write(body)
        for cmd in ([SUBMIT, "collect", "--study", study],
                    [SUBMIT, a.deck, "--study", study, "--bin", a.bin, "--no-check", "--dry-run"]):
            refused(cmd, [f"{path}: task N1_none: {key} {value!r} {why}"], env=env, timeout=20)
            check(open(path).read() == body and sorted(os.listdir(study)) == ["logs", "manifest.json"],
                  f"{cmd[1]} with {key} {value!r}: the study changed: {os.listdir(study)}")


def control_characters(a):
    """A study name, a deck name or another option with a control character: exit 2 with one
    message that names the option and shows the value quoted; nothing run, made or submitted."""
    scratch = os.path.join(a.dir, "controls")
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    fake = os.path.join(a.dir, "fakebin_controls")
    shutil.rmtree(fake, ignore_errors=True)
    env = fake_slurm(fake)
    study = os.path.join(scratch, "s\n$(touch PWN)")
    deck = os.path.join(scratch, "d\n$(touch PWN).toml")
    shutil.copy(a.deck, deck)
    base = ["--bin", a.bin, "--no-check"] + ONE_CASE
    for cmd, option, value in (
            ([SUBMIT, a.deck, "--study", study] + base, "--study", study),
            ([SUBMIT, deck] + base, "DECK", deck),  # the study would be results/<deck name>_strong
            ([SUBMIT, a.deck, "--study", scratch + "/ok", "--set", "run.name=a\tb"] + base, "--set", "run.name=a\tb"),
            ([SUBMIT, a.deck, "--study", scratch + "/ok", "--sbatch-opt=--qos=x\x1b[2J"] + base, "--sbatch-opt",
             "--qos=x\x1b[2J"),
            ([SUBMIT, "collect", "--study", study], "--study", study)):
        refused(cmd, [f"{option} {value!r}: control characters"], env=env, cwd=scratch)
        check(sorted(os.listdir(scratch)) == [os.path.basename(deck)] and not os.path.exists(os.path.join(fake, "next")),
              f"{option} {value!r}: something was made or submitted: {os.listdir(scratch)}")


def mode_sbatch(a):
    p = run(["bash", SBATCH, "--deck", a.deck], env={"SLURM_JOB_ID": ""})
    check(p.returncode == 2 and "not inside a Slurm job" in p.stdout, "outside Slurm not refused")
    slurm = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_CPUS_PER_TASK": "3",
             "SLURM_JOB_NODELIST": "node[1-2]", "MINICP_BIN": a.bin, "MINICP_ECHO": "1"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "SLURM_", "MINICP_"))}
    env.update(slurm)

    def sb(extra, *args):
        e = dict(env, **extra)
        r = subprocess.run(["bash", SBATCH] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=e)
        print(r.stdout)
        return r

    r = sb({}, "--deck", a.deck, "--fabric", "ib")
    check(r.returncode == 0, f"echo exit {r.returncode}")
    for pat in (r"job 77", r"nodes +2: node\[1-2\]", r"ranks +8 \(4 per node\)",
                r"threads +3 per rank \(OMP_NUM_THREADS=3 OMP_PROC_BIND=close OMP_PLACES=cores\)", r"GPUs +none",
                r"command +srun --mpi=pmix --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=3 (--cpu-bind=cores )?"
                + re.escape(a.bin) + r" --deck \S+ --fabric ib$"):
        check(re.search(pat, r.stdout, re.M) is not None, f"header lacks /{pat}/")
    r = sb({"MINICP_LAUNCHER": "mpirun"}, "--deck", a.deck)
    check(re.search(r"command +mpirun (-np 8 --map-by ppr:4:node:PE=3|-n 8 -ppn 4)", r.stdout) is not None,
          "mpirun launcher line")
    r = sb({"MINICP_LAUNCHER": "mpirun", "MINICP_BIND": "none"}, "--deck", a.deck)
    check(re.search(r"threads +3 per rank \(OMP_NUM_THREADS=3 OMP_PROC_BIND=false: ranks not bound", r.stdout) and
          re.search(r"command +mpirun (-np 8 --map-by ppr:4:node --bind-to none|-n 8 -ppn 4)", r.stdout), "MINICP_BIND=none")
    r = sb({"MINICP_LAUNCHER": "bogus"})
    check(r.returncode == 2 and "MINICP_LAUNCHER=bogus: not one of srun, mpirun, none" in r.stdout, "bad launcher")
    r = sb({"MINICP_BIN": os.path.join(a.dir, "no-minicp")})
    check(r.returncode == 2 and "not an executable file" in r.stdout, "missing binary")
    # GPUs: one rank per GPU; the wrapper gives each rank its own device.
    r = sb({"SLURM_GPUS_ON_NODE": "2"}, "--deck", a.deck)
    check(re.search(r"ranks +4 \(2 per node\)", r.stdout) and "GPUs      2 per node" in r.stdout
          and "[per-rank wrapper: CUDA_VISIBLE_DEVICES=<its GPU>]" in r.stdout, "GPU ranks per node")
    for extra, want in (({"SLURM_LOCALID": "1"}, "1"), ({"SLURM_LOCALID": "3"}, "1"),
                        ({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "SLURM_LOCALID": "0", "CUDA_VISIBLE_DEVICES": "4,6"}, "6")):
        r = sb(dict(extra, SLURM_GPUS_ON_NODE="2", MINICP_ECHO="0", MINICP_LAUNCHER="none", MINICP_BIN="/usr/bin/env"))
        got = re.findall(r"^CUDA_VISIBLE_DEVICES=(.*)$", r.stdout, re.M)
        check(got == [want], f"wrapper with {extra}: CUDA_VISIBLE_DEVICES={got}, expected {want}")
        check("OMP_NUM_THREADS=3" in r.stdout.split("command")[-1], "the rank lacks OMP_NUM_THREADS=3")
    sbatch_tasks(a, env)


def sbatch_tasks(a, env):
    """An array task's arguments from MINICP_TASKS reach minicp as they are (quotes, $( ),
    newlines and spaces included, nothing run); a task the file lacks is refused."""
    work = os.path.join(a.dir, "sbatch_tasks")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    stub, got_file, tf = (os.path.join(work, x) for x in ("stub", "args", "N1-1.tasks"))
    with open(stub, "w") as f:
        f.write("#!/bin/sh\nprintf '%s\\0' \"$@\" > \"$STUB_OUT\"\n")
    os.chmod(stub, 0o755)
    tasks = [["--out", "/plain.h5"], ["--fabric", "ib", "--resume", "it's \"q\" $HOME `touch PWN` a  b"],
             ["--out", os.path.join(work, "x\n$(touch PWN)/a.h5"), "--overwrite"]]
    with open(tf, "w") as f:
        f.write("".join("".join(x + "\0" for x in t) + "\0" for t in tasks))
    e = dict(env, MINICP_TASKS=tf, SLURM_ARRAY_JOB_ID="76", MINICP_ECHO="0", MINICP_LAUNCHER="none", MINICP_BIN=stub,
             STUB_OUT=got_file)
    for i, t in enumerate(tasks):
        if os.path.exists(got_file):
            os.remove(got_file)
        r = subprocess.run(["bash", SBATCH, "--deck", "d.toml"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=dict(e, SLURM_ARRAY_TASK_ID=str(i)), cwd=work)
        got = open(got_file, "rb").read().decode().split("\0")[:-1] if os.path.exists(got_file) else None
        check(r.returncode == 0 and got == ["--deck", "d.toml"] + t,
              f"array task {i}: exit {r.returncode}, minicp got {got!r}, expected {t!r}: {r.stdout[-300:]!r}")
    check(not os.path.exists(os.path.join(work, "PWN")), "a task's argument was run as a command")
    r = subprocess.run(["bash", SBATCH], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(e, SLURM_ARRAY_TASK_ID="3"), cwd=work)
    check(r.returncode == 2 and "has no arguments for array task 3" in r.stdout, f"array task 3 of 3: {r.stdout!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", required=True, choices=["dryrun", "resubmit", "collect", "sbatch", "manifest"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--deck", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("mpirun", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    a.mpirun = a.mpirun[1:] if a.mpirun[:1] == ["--"] else a.mpirun
    a.dir = os.path.abspath(a.dir)
    a.bin = os.path.abspath(a.bin)
    os.makedirs(a.dir, exist_ok=True)
    {"dryrun": mode_dryrun, "resubmit": mode_resubmit, "collect": mode_collect, "sbatch": mode_sbatch,
     "manifest": mode_manifest}[a.mode](a)
    return verdict("check_slurm_submit", a.mode)


if __name__ == "__main__":
    sys.exit(main())
