#!/usr/bin/env python3
"""slurm/vcluster end to end: an emulated 2-node cluster with links capped at 1 Gbit/s and a
private Slurm under a prefix of its own (vt<pid>):
  - both links capped on both sides (tbf 1Gbit on the node's eth0 and the host-side veth);
  - `vcluster status` shows the four daemons alive and both nodes idle;
  - `vcluster mpirun -np 2 --map-by node hostname` prints node1 and node2;
  - `srun -N 2 hostname` prints node1 and node2;
  - `sbatch --wait -N 2` of a script that runs, with `srun --mpi=pmix`, an MPI hello (built
    here with mpicc: rank, size and MPI_Get_processor_name, after an allreduce) and, when
    given, minicp-comm-bench pingpong across the nodes: the output names both hosts;
  - with --minicp: the project's own `slurm/minicp.sbatch` by `sbatch --wait -N 2` (minicp on
    the tiny deck under the emulated fabric profile vc-uncapped), and `slurm/submit --wait` of
    a job array per node count (1 and 2 nodes), then `slurm/submit collect`: each results file
    is complete and records the Slurm job (job id, array job and task ids, 2 nodes), both host
    names and the fabric MPI selected; the study index lists every task as finished;
  - `vcluster down` (also when a step fails), after which no namespace, link, qdisc, daemon or
    process of the prefix is left and its directory is gone;
  - first, a 1-node cluster (prefix vt<pid>c) up with a --dir of its own: `down` without --dir
    removes that directory too, and a --dir other than up's is refused (exit 2).
Skipped (exit 77, "skipped: <reason>") only where namespaces or Slurm cannot start: not root,
no `ip netns`, no slurmctld/slurmd/munged. Prints the time of each step.
Usage: check_vcluster.py --vcluster slurm/vcluster --work DIR [--bench minicp-comm-bench]
                         [--minicp build/bin/minicp]"""
import argparse
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import time

SKIP = 77
HELLO_C = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size, len, one = 1, sum = 0;
  char name[MPI_MAX_PROCESSOR_NAME];
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Get_processor_name(name, &len);
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  printf("hello rank %d of %d on %s sum %d\n", rank, size, name, sum);
  MPI_Finalize();
  return 0;
}
"""


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def run(cmd, timeout, env=None, cwd=None, check=True):
    """Runs cmd in a session of its own, prints it with its output and time; returns the output
    (stdout + stderr) and the time. Past the timeout the whole session is killed (so that no
    child left holding the output pipe keeps this waiting) and AssertionError raised."""
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         cwd=cwd, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        try:
            out, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out = "(output not read: the pipe stayed open)\n"
        print(f"$ {' '.join(cmd)}\n{out}-> TIMED OUT after {timeout} s", flush=True)
        raise AssertionError(f"{' '.join(cmd[:3])}: no answer within {timeout} s")
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    dt = time.monotonic() - t
    print(f"$ {' '.join(cmd)}   [{dt:.1f} s, exit {p.returncode}]\n{out}", end="", flush=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[:3])}: exit {p.returncode}")
    run.returncode = p.returncode
    return out, dt


def skip_reason(vcluster):
    if os.geteuid() != 0:
        return "not root (network namespaces, links and qdiscs need root)"
    for tool in ("ip", "tc", "nsenter", "unshare", "slurmctld", "slurmd", "munged", "srun", "sbatch", "mpicc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"vtprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace (ip netns add: {r.stdout.strip()})"
    subprocess.run(["ip", "netns", "del", probe])
    return None


def names(out):
    return sorted(re.findall(r"^(node\d+)\s*$", out, re.M))


def start_time(pid):
    """Field 22 of /proc/PID/stat (start time since boot): with the PID, one process for good."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def processes(prefix, vdir):
    """{pid: (what, start time)}: the daemons recorded in vdir/pids and every process in the
    cluster's namespaces."""
    procs = {}
    piddir = os.path.join(vdir, "pids")
    for f in os.listdir(piddir) if os.path.isdir(piddir) else []:
        if f.endswith(".pid"):
            with open(os.path.join(piddir, f)) as fh:
                pid = int(fh.read())
            procs[pid] = (f"daemon {f[:-4]}", start_time(pid))
    for k in (1, 2):
        r = subprocess.run(["ip", "netns", "pids", f"{prefix}-node{k}"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        for pid in map(int, r.stdout.split()):
            procs.setdefault(pid, (f"process in {prefix}-node{k}", start_time(pid)))
    return procs


def diagnose(prefix, env):
    """What the cluster is doing: the Slurm queue and the processes in its namespaces."""
    for cmd in (["squeue"], ["scontrol", "show", "job"]):
        try:
            run(["timeout", "20"] + cmd, 30, env=env, check=False)
        except AssertionError:
            pass
    for k in (1, 2):
        r = subprocess.run(["ip", "netns", "pids", f"{prefix}-node{k}"], stdout=subprocess.PIPE, text=True)
        print(f"---- processes in {prefix}-node{k}")
        for pid in r.stdout.split():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    st = f.read().rsplit(")", 1)
                with open(f"/proc/{pid}/wchan") as f:
                    wchan = f.read()
                print(f"  {pid} {st[0].split('(', 1)[1]} state {st[1].split()[0]} wchan {wchan}")
            except (OSError, IndexError):
                pass
    sys.stdout.flush()


def leftovers(prefix, vdir, procs):
    """What of the cluster still exists: namespaces, links, qdiscs, processes, the directory."""
    left = []
    ns = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    left += [f"namespace {l.split()[0]}" for l in ns.splitlines() if l.startswith(prefix + "-")]
    links = subprocess.run(["ip", "-o", "link", "show"], stdout=subprocess.PIPE, text=True).stdout
    left += [f"link {m}" for m in re.findall(r"^\d+: ([^:@]+)", links, re.M) if m.startswith(prefix + "-")]
    qd = subprocess.run(["tc", "qdisc", "show"], stdout=subprocess.PIPE, text=True).stdout
    left += [f"qdisc {l}" for l in qd.splitlines() if f"dev {prefix}-" in l]
    for pid, (what, start) in procs.items():
        if start is not None and start_time(pid) == start:
            left.append(f"{what} (pid {pid})")
    if os.path.exists(vdir):
        left.append(f"directory {vdir}")
    return left


def h5_attrs(path):
    """The root attributes of a results file as text ({} when it cannot be read)."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            return {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in f.attrs.items()}
    except OSError:
        return {}


def check_file(path, nodes, fabric, array, fails):
    """A results file written by a Slurm job: complete, the job's attributes, its hosts and fabric."""
    at = h5_attrs(path)
    want = {"complete": "yes", "slurm_job_num_nodes": str(nodes), "nodes": str(nodes),
            "hosts": ",".join(f"node{k}" for k in range(1, nodes + 1)), "fabric": fabric}
    if fabric:
        want["mpi_pml"] = "ob1"
    bad = {k: at.get(k) for k, v in want.items() if at.get(k) != v}
    if not at.get("slurm_job_id"):
        bad["slurm_job_id"] = at.get("slurm_job_id")
    if array and not (at.get("slurm_array_job_id") and at.get("slurm_array_task_id") == "0"):
        bad["slurm_array"] = (at.get("slurm_array_job_id"), at.get("slurm_array_task_id"))
    if bad:
        fails.append(f"{path}: attributes {bad}, expected {want} and the Slurm ids")
    else:
        print(f"{os.path.basename(path)}: complete, Slurm job {at['slurm_job_id']} (array {at.get('slurm_array_job_id')}"
              f"_{at.get('slurm_array_task_id')}), hosts {at['hosts']}, fabric {fabric or 'none'} "
              f"(pml {at.get('mpi_pml')}, btls {at.get('mpi_btls')})", flush=True)


def custom_dir_down(vc, work, prefix, fails):
    """`up --dir D` records D on its bridge: `down` without --dir finds and removes it (and says
    so), and a --dir other than D is refused with the cluster left as it is."""
    vdir = os.path.join(work, "custom-dir")
    try:
        run([vc, "up", "1", "--name", prefix, "--dir", vdir], 60)
        out, _ = run([vc, "down", "--name", prefix, "--dir", vdir + "-other"], 30, check=False)
        if run.returncode != 2 or f"was brought up with --dir {vdir}" not in out or not os.path.isdir(vdir):
            fails.append(f"down --dir <another>: exit {run.returncode}, expected 2 and {vdir} kept: {out!r}")
        out, _ = run([vc, "down", "--name", prefix], 60)
        if f"{vdir} removed" not in out:
            fails.append(f"down without --dir: does not say that {vdir} was removed: {out!r}")
    except AssertionError as e:
        fails.append(f"up/down with a custom --dir: {e}")
    left = leftovers(prefix, vdir, {})
    if left:
        fails.append(f"left after down without --dir (up had --dir {vdir}): " + "; ".join(left))
        subprocess.run([vc, "down", "--name", prefix, "--dir", vdir])


def minicp_jobs(vc, minicp, work, env, fails, times):
    """The project's sbatch script on 2 nodes, and submit's job arrays over 1 and 2 nodes."""
    repo = os.path.dirname(os.path.dirname(vc))
    tiny = os.path.join(repo, "inputs", "tiny.toml")
    case = ["--set", "run.pass=train", "--set", 'sweep.schemes=["zigzag"]', "--set", "sweep.seq_len=[64]",
            "--set", "run.reps=1"]
    jenv = dict(env, MINICP_BIN=minicp, MINICP_HOME=repo, MINICP_BIND="none")
    out_file = os.path.join(work, "sbatch_N2.h5")
    log = os.path.join(work, "minicp-sbatch.out")
    out, times["sbatch minicp.sbatch"] = run(
        ["timeout", "150", "sbatch", "--wait", "-N", "2", "--ntasks-per-node=1", "--cpus-per-task=1", "-o", log,
         os.path.join(repo, "slurm", "minicp.sbatch"), "--deck", tiny] + case +
        ["--fabric", "vc-uncapped", "--out", out_file], 160, env=jenv, cwd=work, check=False)
    print(f"---- {log}\n{open(log).read() if os.path.exists(log) else '(no log)'}----", flush=True)
    if run.returncode != 0:
        fails.append(f"sbatch --wait -N 2 slurm/minicp.sbatch: exit {run.returncode}")
    check_file(out_file, 2, "vc-uncapped", False, fails)

    study = os.path.join(work, "study")
    submit = os.path.join(repo, "slurm", "submit")
    _, times["submit --wait"] = run(
        ["/usr/bin/python3", submit, tiny, "--nodes", "1,2", "--fabrics", "none", "--ranks-per-node", "1",
         "--cpus-per-task", "1", "--bind", "none", "--time", "5", "--study", study, "--bin", minicp, "--wait",
         "--timeout", "200"] + case, 220, env=jenv, cwd=work, check=False)
    if run.returncode != 0:
        fails.append(f"slurm/submit --wait: exit {run.returncode}")
    _, _ = run(["/usr/bin/python3", submit, "collect", "--study", study], 60, env=jenv, cwd=work, check=False)
    if run.returncode != 0:
        fails.append(f"slurm/submit collect: exit {run.returncode}")
    index = os.path.join(study, "index.csv")
    rows = list(csv.DictReader(open(index))) if os.path.exists(index) else []
    got = sorted((r["task"], r["status"]) for r in rows)
    if got != [("N1_none", "finished"), ("N2_none", "finished")]:
        fails.append(f"study index {index}: {got}, expected N1_none and N2_none finished")
    for n in (1, 2):
        check_file(os.path.join(study, f"N{n}_none.h5"), n, "", True, fails)


def check_cluster_up(vc, prefix, vdir, fails, times):
    """A 2-node cluster up at 1gbit with Slurm: its four daemons recorded."""
    _, times["up"] = run([vc, "up", "2", "--rate", "1gbit", "--slurm", "--name", prefix], 120)
    recorded = sorted(f[:-4] for f in os.listdir(os.path.join(vdir, "pids")) if f.endswith(".pid"))
    if recorded != ["munged", "slurmctld", "slurmd-node1", "slurmd-node2"]:
        fails.append(f"daemons recorded: {recorded}")


def check_link_caps(prefix, fails):
    """The caps: tbf at 1Gbit on both sides of each link."""
    for k in (1, 2):
        node = subprocess.run(["tc", "-n", f"{prefix}-node{k}", "qdisc", "show", "dev", "eth0"],
                              stdout=subprocess.PIPE, text=True).stdout
        host = subprocess.run(["tc", "qdisc", "show", "dev", f"{prefix}-h{k}"], stdout=subprocess.PIPE, text=True).stdout
        for side, q in (("node side", node), ("host side", host)):
            if not re.search(r"qdisc tbf .*rate 1Gbit", q):
                fails.append(f"node{k} {side}: no tbf at 1Gbit ({q.strip()!r})")


def check_status(vc, prefix, fails):
    """`vcluster status`: the four daemons alive, both nodes idle."""
    out, _ = run([vc, "status", "--name", prefix], 30)
    alive = sorted(re.findall(r"^(\S+)\s+\d+\s+alive$", out, re.M))
    if alive != ["munged", "slurmctld", "slurmd-node1", "slurmd-node2"]:
        fails.append(f"vcluster status: daemons alive {alive}, expected munged, slurmctld, slurmd-node1, slurmd-node2")
    if len(re.findall(r"^node\d\s.*\sidle\s*$", out, re.M)) != 2:
        fails.append("vcluster status: sinfo does not show node1 and node2 idle")


def check_mpirun_hostname(vc, prefix, fails, times):
    """`vcluster mpirun -np 2 --map-by node hostname`: one rank per node, the transports said."""
    out, times["mpirun hostname"] = run([vc, "mpirun", "--name", prefix, "-np", "2", "--map-by", "node", "hostname"], 60)
    if names(out) != ["node1", "node2"]:
        fails.append(f"vcluster mpirun -np 2 --map-by node hostname: host names {names(out)}, expected node1 and node2")
    if "shared memory" not in out or "TCP" not in out:
        fails.append("vcluster mpirun does not say which transport ranks use")


def check_env_and_srun(vc, prefix, vdir, env, work, fails, times):
    """`vcluster env` (its exports added to env) points at the cluster's slurm.conf, and
    `srun -N 2 hostname` runs on both nodes."""
    exports, _ = run([vc, "env", "--name", prefix], 30)
    for k, v in re.findall(r"^export (\w+)=(\S+)$", exports, re.M):
        env[k] = v
    if env.get("SLURM_CONF") != f"{vdir}/slurm.conf":
        fails.append(f"vcluster env: SLURM_CONF={env.get('SLURM_CONF')}, expected {vdir}/slurm.conf")
    out, times["srun hostname"] = run(["timeout", "60", "srun", "-N", "2", "hostname"], 70, env=env, cwd=work)
    if names(out) != ["node1", "node2"]:
        fails.append(f"srun -N 2 hostname: host names {names(out)}, expected node1 and node2")


def check_batch_job(bench, hello, work, env, fails, times):
    """`sbatch --wait -N 2`: the MPI hello by srun --mpi=pmix on both nodes, and with bench
    minicp-comm-bench pingpong across them."""
    script = os.path.join(work, "job.sh")
    joblog = os.path.join(work, "job.out")
    with open(script, "w") as f:
        f.write("#!/bin/sh\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n"
                f"#SBATCH -o {joblog}\n"
                "echo \"batch script on $(hostname)\"\n"
                f"srun --mpi=pmix {hello} || exit 1\n")
        if bench:
            f.write(f"OMP_NUM_THREADS=1 OMP_PROC_BIND=false srun --mpi=pmix {os.path.abspath(bench)}"
                    " --ops pingpong -b 8 -e 64K -f 64 -w 1 -n 2 -c 1 || exit 1\n")
    out, times["sbatch --wait"] = run(["timeout", "90", "sbatch", "--wait", script], 100, env=env, cwd=work, check=False)
    log = open(joblog).read() if os.path.exists(joblog) else ""
    print(f"---- {joblog}\n{log}----", flush=True)
    if "Submitted batch job" not in out or run.returncode != 0:
        fails.append(f"sbatch --wait: exit {run.returncode} (the job failed or was not submitted)")
    hellos = re.findall(r"^hello rank (\d) of 2 on (node\d+) sum 2$", log, re.M)
    if sorted(hellos) != [("0", "node1"), ("1", "node2")] and sorted(hellos) != [("0", "node2"), ("1", "node1")]:
        fails.append(f"job output: MPI hello lines {hellos}, expected ranks 0 and 1 on node1 and node2")
    if bench:
        bench_hosts = sorted(re.findall(r"^#\s+host (node\d+): 1 rank", log, re.M))
        if bench_hosts != ["node1", "node2"]:
            fails.append(f"job output: minicp-comm-bench hosts {bench_hosts}, expected node1 and node2")
        if not re.search(r"^MINICP_COMM op=pingpong ranks=2 .* wrong=0$", log, re.M):
            fails.append("job output: no MINICP_COMM pingpong line with wrong=0")


def check_down(vc, prefix, vdir, env, fails, times):
    """`vcluster down`, after the daemons' logs are printed when something failed: nothing of
    the prefix left (else a second down cleans up what was found)."""
    if fails:  # what the cluster is doing, and the daemons' logs, before down removes them
        diagnose(prefix, env)
        logdir = os.path.join(vdir, "log")
        for name in sorted(os.listdir(logdir)) if os.path.isdir(logdir) else []:
            with open(os.path.join(logdir, name), errors="replace") as f:
                tail = f.readlines()[-30:]
            print(f"---- last lines of {logdir}/{name}\n{''.join(tail)}", end="", flush=True)
    procs = processes(prefix, vdir)
    try:
        _, times["down"] = run([vc, "down", "--name", prefix], 90)
    except AssertionError as e:
        fails.append(str(e))
    left = leftovers(prefix, vdir, procs)
    if left:
        fails.append("left after down: " + "; ".join(left))
        try:  # clean up what the check found, so that no later run trips on it
            run([vc, "down", "--name", prefix], 90)
        except AssertionError as e:
            fails.append(f"second down: {e}")


def build_hello(work):
    """The MPI hello, built with mpicc in a fresh work directory; returns its path."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    hello = os.path.join(work, "hello")
    with open(hello + ".c", "w") as f:
        f.write(HELLO_C)
    run(["mpicc", "-O1", "-o", hello, hello + ".c"], 60)
    return hello


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vcluster", required=True)
    ap.add_argument("--work", required=True, help="a scratch directory (every node sees this machine's file system)")
    ap.add_argument("--bench", help="minicp-comm-bench to run across the nodes in the batch job")
    ap.add_argument("--minicp", help="minicp: submit slurm/minicp.sbatch and a slurm/submit job array")
    a = ap.parse_args()
    t0 = time.monotonic()
    vc = os.path.abspath(a.vcluster)

    reason = skip_reason(vc)
    if reason:
        print(f"skipped: {reason}")
        return SKIP

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    prefix = f"vt{os.getpid()}"
    vdir = f"/var/tmp/minicp-vcluster-{prefix}"
    work = os.path.abspath(a.work)
    hello = build_hello(work)

    fails = []
    times = {}
    env = dict(os.environ)
    try:
        run([vc, "down", "--name", prefix], 60)  # a leftover of an earlier run with this pid
        custom_dir_down(vc, work, prefix + "c", fails)
        check_cluster_up(vc, prefix, vdir, fails, times)
        check_link_caps(prefix, fails)
        check_status(vc, prefix, fails)
        check_mpirun_hostname(vc, prefix, fails, times)
        check_env_and_srun(vc, prefix, vdir, env, work, fails, times)
        check_batch_job(a.bench, hello, work, env, fails, times)
        if a.minicp:
            minicp_jobs(vc, os.path.abspath(a.minicp), work, env, fails, times)
    except (AssertionError, Interrupted) as e:
        fails.append(str(e))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        check_down(vc, prefix, vdir, env, fails, times)
    times["total"] = time.monotonic() - t0
    print("times: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    if fails:
        print("FAILED:\n  " + "\n  ".join(fails))
        return 1
    print(f"vcluster: OK (2 nodes at 1gbit, mpirun, srun, sbatch with srun --mpi=pmix"
          f"{', minicp.sbatch, submit job arrays and collect' if a.minicp else ''}; nothing of {prefix} left)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
