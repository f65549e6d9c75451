#!/usr/bin/python3
"""tools/device-check on a machine without a GPU: its bundle and its run.

Bad arguments exit 2 with one line naming the flag, and write nothing: among them a
`bundle --out` that exists (without --overwrite; with it, anything but a bundle this script
wrote: a deck, a FIFO, a link, a file under inputs/, a program the bundle packs), whose
directory is missing, and a `run --bundle` that is not a bundle. `bundle` from the host
build replaces, with --overwrite, a bundle at --out with a file under 64 MiB holding
MANIFEST.txt and the programs, and leaves no temporary beside it. Unpacked into a
temporary directory, every bundled program and the bundled mpirun/orted, under ldd with the
bundle's lib/ on LD_LIBRARY_PATH, find every library but the CUDA ones (which the GPU
machine brings), and every library that is not of the glibc family resolves inside the
bundle. The bundled mpirun, relocated by the bundle's env.sh (OPAL_PREFIX, ...), runs
`-np 2 minicp --dry-run` of the tiny deck from there; as root with unshare(1), again with the
system's Open MPI, PMIx and every library the bundle holds hidden by bind mounts, so only
the bundle's copies can serve. `run --bundle` exits 77 with summary.json saying every GPU
step was skipped for no GPU. `run --build` of a program that needs libcuda.so.1, on a
machine without it, prints "no usable GPU driver on this node: libcuda.so.1 not found" once
and exits 3 before running anything. Exit code 0 when every check passes, 1 otherwise.

Usage: check_device_check.py --script tools/device-check --bin DIR --work DIR"""
import argparse
import json
import os
import io
import re
import shutil
import stat
import subprocess
import sys
import tarfile

LIMIT = 64 * 1048576
GLIBC = re.compile(r"^(lib(c|m|pthread|dl|rt|resolv|util|anl|nsl)\.so|ld-linux|linux-vdso)")
CUDA = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|nccl)\.so")
NO_DRIVER = "no usable GPU driver on this node: libcuda.so.1 not found"
MARKER = b"# minicp device bundle\n"
GPU_STEPS = ["kernels", "kernels_bench", "attention_ratio", "layer_none_p1", "layer_zigzag_p2",
             "layer_zigzag_p4", "layer_ulysses_p2", "layer_ulysses_p4", "nccl_p1"]

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
    return ok


def run(cmd, env=None, timeout=120):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          timeout=timeout)


def bundle_env(root):
    """The environment after sourcing the bundle's env.sh (what `run` does), for mpirun."""
    r = subprocess.run(["bash", "-c", 'source "$1" && env -0', "env", os.path.join(root, "env.sh")],
                       stdout=subprocess.PIPE, check=True)
    env = dict(x.split("=", 1) for x in r.stdout.decode().split("\0") if "=" in x)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               OMP_PROC_BIND="false")
    return env


def marker_bundle(path, members=()):
    """A tar.gz that reads as a bundle this script wrote (its MANIFEST.txt first), holding
    only the given empty members besides."""
    with tarfile.open(path, "w:gz") as t:
        for name, data in [("minicp-device/MANIFEST.txt", MARKER)] + [(m, b"") for m in members]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def snapshot(d):
    """Each entry of d: its kind and its bytes (a regular file) or target (a link)."""
    out = {}
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        mode = os.lstat(p).st_mode
        body = open(p, "rb").read() if stat.S_ISREG(mode) else os.readlink(p) if stat.S_ISLNK(mode) else None
        out[name] = (stat.S_IFMT(mode), body)
    return out


def refused(script, args, text):
    r = run([script] + args, timeout=300)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and text in lines[0],
          f"bad arguments {args[-3:]}: exit {r.returncode} (want 2), one line naming {text!r}: {r.stderr.strip()[-300:]!r}")


def bad_args(script, work, build, repo):
    d = os.path.join(work, "badargs")
    out = os.path.join(d, "out")
    bundle = os.path.join(d, "b.tar.gz")
    deck, fifo, link, text, wrong = (os.path.join(d, x) for x in ("deck.toml", "fifo", "link.tar.gz", "text.txt", "wrong.tar.gz"))
    os.makedirs(d)
    open(bundle, "w").close()
    shutil.copy(os.path.join(repo, "inputs", "tiny.toml"), deck)
    os.mkfifo(fifo)
    marker_bundle(wrong)  # reads as a bundle, but holds no bin/minicp
    os.symlink("wrong.tar.gz", link)
    with open(text, "w") as f:
        f.write("not a tar\n")
    before = snapshot(d)
    bb = ["bundle", "--build", build, "--out"]
    cases = [
        (["frobnicate"], "subcommand 'frobnicate'"),
        (["bundle", "--out", bundle], "--build"),
        (bb + [out + ".tar.gz", "--compress", "zip"], "--compress 'zip'"),
        (["bundle", "--build", d, "--out", out + ".tar.gz"], f"--build '{d}'"),
        (bb + [out + ".tar.gz", "--level", "9"], "'--level'"),
        (bb + [deck], f"--out '{deck}': exists"),
        (bb + [deck, "--overwrite"], f"--out '{deck}': not a bundle this script wrote"),
        (bb + [fifo], f"--out '{fifo}': exists"),
        (bb + [fifo, "--overwrite"], f"--out '{fifo}': not a regular file"),
        (bb + [link, "--overwrite"], f"--out '{link}': not a regular file"),
        (bb + [wrong], f"--out '{wrong}': exists"),
        (bb + [d + "/missing/"], f"--out '{d}/missing/': directory {d}/missing does not exist"),
        (bb + [d + "/missing/b.tar.gz"], f"--out '{d}/missing/b.tar.gz': directory {d}/missing does not exist"),
        (bb + [d + "/"], f"--out '{d}/': is a directory"),
        (["run", "--out", out, "--bundle", os.path.join(d, "nothing.tar.gz")], "--bundle"),
        (["run", "--out", out, "--bundle", bundle], f"--bundle '{bundle}': not a bundle"),
        (["run", "--out", out, "--bundle", text], f"--bundle '{text}': not a bundle"),
        (["run", "--out", out, "--bundle", wrong], f"--bundle '{wrong}': not a bundle"),
        (["run", "--out", out, "--bundle", bundle, "--timeout-s", "5"], "--timeout-s '5'"),
        (["run", "--out", out, "--bundle", bundle, "--timeout-s", "ten"], "--timeout-s 'ten'"),
        (["run", "--out", out, "--bundle", bundle, "--build", build], "give one of them"),
        (["run", "--out", out], "--bundle/--build: missing"),
        (["run", "--out", bundle, "--bundle", bundle], f"--out '{bundle}'"),
        (["run", "--out", out, "--bundle", bundle, "--seq-len", "0"], "--seq-len '0'"),
        (["run", "--out", out, "--bundle"], "--bundle: missing value"),
    ]
    for args, text in cases:
        refused(script, args, text)
    check(snapshot(d) == before, f"bad arguments wrote nothing, changed nothing: {sorted(snapshot(d))}")
    packed_out(script, work, build)


def packed_out(script, work, build):
    """--overwrite never replaces a file the bundle packs: a deck under inputs/ (a copy of
    the script in a tree of its own, whose inputs/ it packs) or one of the programs."""
    tree = os.path.join(work, "tree")
    os.makedirs(os.path.join(tree, "tools"))
    shutil.copy(script, os.path.join(tree, "tools"))
    shutil.copytree(os.path.join(os.path.dirname(os.path.abspath(script)), "..", "inputs"), os.path.join(tree, "inputs"))
    deck = os.path.join(tree, "inputs", "tiny.toml")
    fake = os.path.join(tree, "inputs", "old.tar.gz")
    marker_bundle(fake, ["minicp-device/bin/minicp"])
    before = snapshot(os.path.join(tree, "inputs"))
    copy = os.path.join(tree, "tools", os.path.basename(script))
    refused(copy, ["bundle", "--build", build, "--out", deck, "--overwrite"], f"--out '{deck}': inside")
    refused(copy, ["bundle", "--build", build, "--out", fake, "--overwrite"], f"--out '{fake}': inside")
    check(snapshot(os.path.join(tree, "inputs")) == before, "inputs/ as it was")
    # A build whose optional program minicp-cp-bench is (absurdly) a bundle.
    fb = os.path.join(work, "fakebuild", "bin")
    os.makedirs(fb)
    for p in ("minicp", "minicp-test-kernels"):
        os.symlink(os.path.join(build, "bin", p), os.path.join(fb, p))
    prog = os.path.join(fb, "minicp-cp-bench")
    marker_bundle(prog, ["minicp-device/bin/minicp"])
    os.chmod(prog, 0o755)
    before = snapshot(fb)
    refused(script, ["bundle", "--build", os.path.dirname(fb), "--out", prog, "--overwrite"],
            f"--out '{prog}': is the program file")
    check(snapshot(fb) == before, f"a packed program as it was, no temporary beside it: {sorted(snapshot(fb))}")


def no_driver(script, work):
    """run --build of a program that needs libcuda.so.1 where there is none: one line, exit 3,
    nothing run. The program is linked against a stub libcuda.so.1, removed afterwards."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        print("skipped: no libcuda.so.1 (no C compiler to make a program that needs it)")
        return
    d = os.path.join(work, "nodriver")
    os.makedirs(os.path.join(d, "bin"))
    with open(os.path.join(d, "stub.c"), "w") as f:
        f.write("int cuInit(int x) { return x; }\n")
    with open(os.path.join(d, "main.c"), "w") as f:
        f.write("int cuInit(int);\nint main(void) { return cuInit(0); }\n")
    stub, prog = os.path.join(d, "libcuda.so.1"), os.path.join(d, "bin", "minicp")
    r1 = run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", stub, os.path.join(d, "stub.c")])
    r2 = run([cc, "-o", prog, os.path.join(d, "main.c"), "-Wl,--no-as-needed", stub])
    if not check(r1.returncode == 0 and r2.returncode == 0, f"a program that needs libcuda.so.1: {r1.stderr}{r2.stderr}"):
        return
    os.remove(stub)
    if "libcuda.so.1 => not found" not in run(["ldd", prog]).stdout:
        print("skipped: no libcuda.so.1 (this machine has one)")
        return
    out = os.path.join(d, "run")
    r = run([script, "run", "--build", d, "--out", out], timeout=120)
    print(r.stdout.strip())
    check(r.returncode == 3, f"run without libcuda.so.1: exit {r.returncode} (want 3) {r.stderr.strip()[-300:]}")
    check(r.stderr.count(NO_DRIVER) == 1, f"run without libcuda.so.1 says so once on stderr: {r.stderr.strip()!r}")
    try:
        st = {x["step"]: x for x in json.load(open(os.path.join(out, "summary.json")))["steps"]}
    except (OSError, ValueError) as e:
        check(False, f"summary.json readable: {e}")
        return
    x = st.get("driver", {})
    check(x.get("status") == "failed" and x.get("reason", "").startswith(NO_DRIVER), f"summary.json: driver failed ({x})")
    for name in GPU_STEPS:
        x = st.get(name, {})
        check(x.get("status") == "skipped" and x.get("reason") == NO_DRIVER, f"summary.json: {name} skipped, no driver ({x})")


def ldd_check(root):
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(root, "lib"))
    files = [os.path.join(root, "bin", p) for p in sorted(os.listdir(os.path.join(root, "bin")))]
    files += [os.path.join(root, "ompi", "bin", p) for p in ("orterun", "orted")]
    for f in files:
        r = run(["ldd", f], env=env)
        missing, outside = [], []
        for line in r.stdout.splitlines():
            parts = line.split()
            if not parts or "=>" not in parts:
                continue
            name = parts[0]
            if "not found" in line:
                if not CUDA.match(name):
                    missing.append(name)
                continue
            path = parts[2]
            if not GLIBC.match(name) and not CUDA.match(name) and \
                    not os.path.realpath(path).startswith(os.path.realpath(root) + os.sep):
                outside.append(f"{name} => {path}")
        check(r.returncode == 0 and not missing, f"ldd {os.path.relpath(f, root)}: nothing not found {missing}")
        check(not outside, f"ldd {os.path.relpath(f, root)}: non-system libraries inside the bundle {outside}")


def hidden_mpirun(root, cmd, env, work):
    """cmd with the system's Open MPI, PMIx and the bundle's libraries hidden (a mount
    namespace); None where that cannot be made here."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return None
    probe = run(["unshare", "-m", "true"])
    if probe.returncode != 0:
        return None
    empty = os.path.join(work, "empty")
    os.makedirs(empty, exist_ok=True)
    hide_dirs = [d for d in ("/usr/lib/x86_64-linux-gnu/openmpi", "/usr/lib/x86_64-linux-gnu/pmix2",
                             "/usr/share/openmpi", "/etc/openmpi", "/opt/minicp") if os.path.isdir(d)]
    hide_files = []
    for name in os.listdir(os.path.join(root, "lib")):
        for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/openblas-openmp", "/usr/lib"):
            p = os.path.join(d, name)
            if os.path.exists(p):
                hide_files.append(os.path.realpath(p))
    for p in ("/usr/bin/orterun", "/usr/bin/orted"):
        if os.path.exists(p):
            hide_files.append(os.path.realpath(p))
    # Files first: a file under a hidden directory is gone once the directory is covered.
    script = "set -e\n"
    script += "".join(f"mount --bind /dev/null '{f}'\n" for f in sorted(set(hide_files)))
    script += "".join(f"mount --bind '{empty}' '{d}'\n" for d in hide_dirs)
    script += 'exec "$@"\n'
    return run(["unshare", "-m", "bash", "-c", script, "hide"] + cmd, env=env, timeout=120), len(hide_files)


def built_bundle(script, work, build):
    """The bundle written over one this script wrote: refused without --overwrite, replaced
    with it; its path, or None where `bundle` failed."""
    bundle = os.path.join(work, "minicp-device.tar.gz")
    marker_bundle(bundle)
    refused(script, ["bundle", "--build", build, "--out", bundle], f"--out '{bundle}': exists")
    r = run([script, "bundle", "--build", build, "--out", bundle, "--overwrite"], timeout=300)
    print(r.stdout.strip())
    if not check(r.returncode == 0 and os.path.isfile(bundle), f"bundle: exit {r.returncode} {r.stderr.strip()[-400:]}"):
        return None
    left = [x for x in os.listdir(work) if x.startswith(".minicp-device.tar.gz")]
    check(not left, f"bundle: no temporary left beside --out {left}")
    size = os.path.getsize(bundle)
    check(size < LIMIT, f"bundle: {size} bytes ({size / 1048576:.1f} MiB) < 64 MiB")
    return bundle


def unpacked_bundle(bundle, work, bin_dir):
    """The bundle unpacked under work, its members and MANIFEST.txt checked; its root."""
    unpacked = os.path.join(work, "unpacked")
    with tarfile.open(bundle) as t:
        names = t.getnames()
        t.extractall(unpacked)
    root = os.path.join(unpacked, "minicp-device")
    for p in ("MANIFEST.txt", "env.sh", "bin/minicp", "bin/minicp-test-kernels", "ompi/bin/mpirun",
              "tools/device-check", "inputs/tiny.toml"):
        check(f"minicp-device/{p}" in names, f"bundle holds {p}")
    manifest = open(os.path.join(root, "MANIFEST.txt")).read()
    check(re.search(r"^commit [0-9a-f]{40}", manifest, re.M) is not None, "MANIFEST.txt names the git commit")
    check(re.search(r"^program bin/minicp /", manifest, re.M) is not None, "MANIFEST.txt names where minicp came from")
    for p in ("minicp-kernels-bench", "minicp-cp-bench"):
        if os.path.exists(os.path.join(bin_dir, p)):
            check(os.path.exists(os.path.join(root, "bin", p)), f"bundle holds bin/{p} (in the build)")
    libs = os.listdir(os.path.join(root, "lib"))
    check(not [x for x in libs if GLIBC.match(x) or CUDA.match(x)],
          f"no glibc or CUDA library packed: {[x for x in libs if GLIBC.match(x) or CUDA.match(x)]}")
    return root


def bundled_mpirun(root, work):
    """The bundled mpirun runs -np 2 minicp --dry-run; again with the system's Open MPI hidden."""
    env = bundle_env(root)
    cmd = [os.path.join(root, "ompi", "bin", "mpirun"), "-np", "2", "--oversubscribe", "--bind-to", "none",
           os.path.join(root, "bin", "minicp"), "--deck", os.path.join(root, "inputs", "tiny.toml"), "--dry-run"]
    r = run(cmd, env=env)
    check(r.returncode == 0 and "001_" in r.stdout,
          f"bundled mpirun -np 2 minicp --dry-run: exit {r.returncode} {r.stderr.strip()[-400:]}")
    hidden = hidden_mpirun(root, cmd, env, work)
    if hidden is None:
        print("skipped: the same with the system's Open MPI hidden (needs root and unshare -m)")
    else:
        h, n = hidden
        check(h.returncode == 0 and "001_" in h.stdout,
              f"bundled mpirun -np 2 minicp --dry-run, system Open MPI/PMIx and {n} libraries hidden: "
              f"exit {h.returncode} {h.stderr.strip()[-400:]}")


def run_without_gpu(script, bundle, work):
    """`run --bundle` on this machine without a GPU: exit 77, every GPU step skipped."""
    out = os.path.join(work, "run")
    r = run([script, "run", "--bundle", bundle, "--out", out], env=dict(os.environ), timeout=120)
    print(r.stdout.strip())
    check(r.returncode == 77, f"run without a GPU: exit {r.returncode} (want 77) {r.stderr.strip()[-300:]}")
    check(re.search(r"^MINICP_DEVICE_CHECK gpu=none steps=\d+ passed=\d+ failed=0 skipped=10", r.stdout, re.M)
          is not None, "run prints the MINICP_DEVICE_CHECK line")
    try:
        s = json.load(open(os.path.join(out, "summary.json")))
    except (OSError, ValueError) as e:
        check(False, f"summary.json readable: {e}")
        s = {"steps": []}
    st = {x["step"]: x for x in s["steps"]}
    for name in GPU_STEPS:
        x = st.get(name, {})
        check(x.get("status") == "skipped" and x.get("reason", "").startswith("no GPU"),
              f"summary.json: {name} skipped for no GPU ({x})")
    for name in ("unpack", "manifest", "ldd"):
        check(st.get(name, {}).get("status") == "passed", f"summary.json: {name} passed ({st.get(name)})")
    x = st.get("driver", {})
    check(x.get("status") == "skipped" and "no program needs libcuda.so.1" in x.get("reason", ""),
          f"summary.json: driver skipped, a host build ({x})")
    check(os.path.isfile(os.path.join(out, "ldd", "minicp.txt")), "run recorded ldd of minicp")
    check(os.path.isfile(os.path.join(out, "MANIFEST.txt")), "run copied MANIFEST.txt")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", required=True, help="tools/device-check")
    ap.add_argument("--bin", required=True, help="bin/ of the host build (its programs are bundled)")
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    build = os.path.dirname(os.path.abspath(a.bin))

    repo = os.path.join(os.path.dirname(os.path.abspath(a.script)), "..")
    bad_args(a.script, work, build, repo)
    no_driver(a.script, work)

    bundle = built_bundle(a.script, work, build)
    if bundle is None:
        return 1
    root = unpacked_bundle(bundle, work, a.bin)
    ldd_check(root)
    bundled_mpirun(root, work)

    if shutil.which("nvidia-smi"):
        print("skipped: run without a GPU (this machine has nvidia-smi)")
    else:
        run_without_gpu(a.script, bundle, work)

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
