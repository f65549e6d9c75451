#!/usr/bin/env python3
"""slurm/vcluster end to end: an emulated 2-node cluster with links capped at 1 Gbit/s and a
private Slurm under a prefix of its own (vt<pid>):
  - both links capped on both sides (tbf 1Gbit on the node's eth0 and the host-side veth);
  - `vcluster mpirun -np 2 --map-by node hostname` prints node1 and node2;
  - `srun -N 2 hostname` prints node1 and node2;
  - `sbatch --wait -N 2` of a script that runs, with `srun --mpi=pmix`, an MPI hello (built
    here with mpicc: rank, size and MPI_Get_processor_name, after an allreduce) and, when
    given, minicp-comm-bench pingpong across the nodes: the output names both hosts;
  - `vcluster down` (also when a step fails), after which no namespace, link, qdisc, daemon or
    process of the prefix is left and its directory is gone.
Skipped (exit 77, "skipped: <reason>") only where namespaces or Slurm cannot start: not root,
no `ip netns`, no slurmctld/slurmd/munged. Prints the time of each step.
Usage: check_vcluster.py --vcluster slurm/vcluster --work DIR [--bench minicp-comm-bench]"""
import argparse
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
    """Runs cmd, prints it with its output and time; returns the output (stdout + stderr)."""
    t = time.monotonic()
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(f"$ {' '.join(cmd)}\n{out}-> TIMED OUT after {timeout} s", flush=True)
        raise AssertionError(f"{' '.join(cmd[:3])}: no answer within {timeout} s")
    dt = time.monotonic() - t
    print(f"$ {' '.join(cmd)}   [{dt:.1f} s, exit {r.returncode}]\n{r.stdout}", end="", flush=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[:3])}: exit {r.returncode}")
    run.returncode = r.returncode
    return r.stdout, dt


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


def leftovers(prefix, vdir, pids):
    """What of the cluster still exists: namespaces, links, qdiscs, processes, the directory."""
    left = []
    ns = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    left += [f"namespace {l.split()[0]}" for l in ns.splitlines() if l.startswith(prefix + "-")]
    links = subprocess.run(["ip", "-o", "link", "show"], stdout=subprocess.PIPE, text=True).stdout
    left += [f"link {m}" for m in re.findall(r"^\d+: ([^:@]+)", links, re.M) if m.startswith(prefix + "-")]
    qd = subprocess.run(["tc", "qdisc", "show"], stdout=subprocess.PIPE, text=True).stdout
    left += [f"qdisc {l}" for l in qd.splitlines() if f"dev {prefix}-" in l]
    for label, pid in pids.items():
        if os.path.exists(f"/proc/{pid}"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if vdir.encode() in f.read():
                        left.append(f"daemon {label} (pid {pid})")
            except OSError:
                pass
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if vdir.encode() + b"/" in cmd or cmd.endswith(vdir.encode() + b"\0"):
                text = cmd.replace(b"\0", b" ").decode(errors="replace")
                left.append(f"process {p}: {text[:120]}")
    if os.path.exists(vdir):
        left.append(f"directory {vdir}")
    return left


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vcluster", required=True)
    ap.add_argument("--work", required=True, help="a directory outside /tmp that every node sees")
    ap.add_argument("--bench", help="minicp-comm-bench to run across the nodes in the batch job")
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
    if work == "/tmp" or work.startswith("/tmp/"):
        print(f"check_vcluster.py: --work {work}: must not be under /tmp (each node has its own)")
        return 2
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    hello = os.path.join(work, "hello")
    with open(hello + ".c", "w") as f:
        f.write(HELLO_C)
    run(["mpicc", "-O1", "-o", hello, hello + ".c"], 60)

    fails = []
    pids = {}
    times = {}
    down_ran = False
    try:
        run([vc, "down", "--name", prefix], 60)  # a leftover of an earlier run with this pid
        _, times["up"] = run([vc, "up", "2", "--rate", "1gbit", "--slurm", "--name", prefix], 120)
        for f in os.listdir(os.path.join(vdir, "pids")):
            with open(os.path.join(vdir, "pids", f)) as fh:
                pids[f[:-4]] = int(fh.read())
        if sorted(pids) != ["munged", "slurmctld", "slurmd-node1", "slurmd-node2"]:
            fails.append(f"daemons recorded: {sorted(pids)}")

        # The caps: tbf at 1Gbit on both sides of each link.
        for k in (1, 2):
            node = subprocess.run(["tc", "-n", f"{prefix}-node{k}", "qdisc", "show", "dev", "eth0"],
                                  stdout=subprocess.PIPE, text=True).stdout
            host = subprocess.run(["tc", "qdisc", "show", "dev", f"{prefix}-h{k}"], stdout=subprocess.PIPE, text=True).stdout
            for side, q in (("node side", node), ("host side", host)):
                if not re.search(r"qdisc tbf .*rate 1Gbit", q):
                    fails.append(f"node{k} {side}: no tbf at 1Gbit ({q.strip()!r})")

        out, times["mpirun hostname"] = run([vc, "mpirun", "--name", prefix, "-np", "2", "--map-by", "node", "hostname"], 60)
        if names(out) != ["node1", "node2"]:
            fails.append(f"vcluster mpirun -np 2 --map-by node hostname: host names {names(out)}, expected node1 and node2")
        if "shared memory" not in out or "TCP" not in out:
            fails.append("vcluster mpirun does not say which transport ranks use")

        env = dict(os.environ)
        exports, _ = run([vc, "env", "--name", prefix], 30)
        for k, v in re.findall(r"^export (\w+)=(\S+)$", exports, re.M):
            env[k] = v
        if env.get("SLURM_CONF") != f"{vdir}/slurm.conf":
            fails.append(f"vcluster env: SLURM_CONF={env.get('SLURM_CONF')}, expected {vdir}/slurm.conf")
        out, times["srun hostname"] = run(["timeout", "60", "srun", "-N", "2", "hostname"], 70, env=env, cwd=work)
        if names(out) != ["node1", "node2"]:
            fails.append(f"srun -N 2 hostname: host names {names(out)}, expected node1 and node2")

        script = os.path.join(work, "job.sh")
        joblog = os.path.join(work, "job.out")
        with open(script, "w") as f:
            f.write("#!/bin/sh\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n"
                    f"#SBATCH -o {joblog}\n"
                    "echo \"batch script on $(hostname)\"\n"
                    f"srun --mpi=pmix {hello} || exit 1\n")
            if a.bench:
                f.write(f"OMP_NUM_THREADS=1 OMP_PROC_BIND=false srun --mpi=pmix {os.path.abspath(a.bench)}"
                        " --ops pingpong -b 8 -e 64K -f 64 -w 1 -n 2 -c 1 || exit 1\n")
        out, times["sbatch --wait"] = run(["timeout", "90", "sbatch", "--wait", script], 100, env=env, cwd=work, check=False)
        log = open(joblog).read() if os.path.exists(joblog) else ""
        print(f"---- {joblog}\n{log}----", flush=True)
        if "Submitted batch job" not in out or run.returncode != 0:
            fails.append(f"sbatch --wait: exit {run.returncode} (the job failed or was not submitted)")
        hellos = re.findall(r"^hello rank (\d) of 2 on (node\d+) sum 2$", log, re.M)
        if sorted(hellos) != [("0", "node1"), ("1", "node2")] and sorted(hellos) != [("0", "node2"), ("1", "node1")]:
            fails.append(f"job output: MPI hello lines {hellos}, expected ranks 0 and 1 on node1 and node2")
        if a.bench:
            bench_hosts = sorted(re.findall(r"^#\s+host (node\d+): 1 rank", log, re.M))
            if bench_hosts != ["node1", "node2"]:
                fails.append(f"job output: minicp-comm-bench hosts {bench_hosts}, expected node1 and node2")
            if not re.search(r"^MINICP_COMM op=pingpong ranks=2 .* wrong=0$", log, re.M):
                fails.append("job output: no MINICP_COMM pingpong line with wrong=0")
    except (AssertionError, Interrupted) as e:
        fails.append(str(e))
    finally:
        if fails:  # the daemons' logs, before down removes them
            for name in sorted(os.listdir(os.path.join(vdir, "log"))) if os.path.isdir(os.path.join(vdir, "log")) else []:
                path = os.path.join(vdir, "log", name)
                with open(path, errors="replace") as f:
                    tail = f.readlines()[-15:]
                print(f"---- last lines of {path}\n{''.join(tail)}", end="", flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            _, times["down"] = run([vc, "down", "--name", prefix], 60)
            down_ran = True
        except AssertionError as e:
            fails.append(str(e))
        left = leftovers(prefix, vdir, pids)
        if left:
            fails.append("left after down: " + "; ".join(left))
            if down_ran:  # clean up what the check found, so that no later run trips on it
                subprocess.run([vc, "down", "--name", prefix], timeout=60)
    times["total"] = time.monotonic() - t0
    print("times: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    if fails:
        print("FAILED:\n  " + "\n  ".join(fails))
        return 1
    print(f"vcluster: OK (2 nodes at 1gbit, mpirun, srun, sbatch with srun --mpi=pmix; nothing of {prefix} left)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
