#!/usr/bin/python3
"""The CUDA configuration compiled against a CUDA Kokkos that was built elsewhere.

Configures this source tree with -DMINICP_ENABLE_CUDA=ON -DKokkos_ROOT=<kokkos root> in a
directory of its own, builds every target, and checks that each program the host build made
(the --host-bin directory) was made by the CUDA build too. Nothing runs: this machine may
have no GPU. The root must hold a Kokkos whose devices include CUDA (its
KokkosConfigCommon.cmake says so); a root without one fails, naming what it found.
Without --kokkos-root (the CMake variable MINICP_CUDA_KOKKOS_ROOT empty): "skipped: ...",
exit 77. Exit code 0 when the build and the check pass, 1 otherwise.

Usage: check_cuda_build.py --source DIR --work DIR --host-bin DIR [--kokkos-root DIR]
                           [--cuda DIR] [--host-compiler CXX] [--jobs N]"""
import argparse
import glob
import os
import re
import subprocess
import sys


def kokkos_devices(root):
    """The devices a Kokkos install was built for, from its CMake package; None without one."""
    found = glob.glob(os.path.join(root, "lib*", "cmake", "Kokkos", "KokkosConfigCommon.cmake"))
    if not found:
        return None
    m = re.search(r"set\(Kokkos_DEVICES\s+([^)]*)\)", open(found[0]).read())
    return m.group(1).replace('"', "").replace(";", " ").split() if m else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="the miniCP source tree")
    ap.add_argument("--work", required=True, help="build directory of the CUDA configuration (made)")
    ap.add_argument("--host-bin", required=True, help="bin/ of the host build: its programs are expected")
    ap.add_argument("--kokkos-root", default="", help="install prefix of a CUDA Kokkos (default: none: skip)")
    ap.add_argument("--cuda", default="/usr/local/cuda", help="CUDA toolkit (default /usr/local/cuda)")
    ap.add_argument("--host-compiler", default="g++", help="host C++ compiler (default g++)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    a = ap.parse_args()
    if not a.kokkos_root:
        print("skipped: no CUDA Kokkos named (configure with -DMINICP_CUDA_KOKKOS_ROOT=<its install prefix>)")
        return 77
    devices = kokkos_devices(a.kokkos_root)
    if devices is None:
        print(f"FAIL: --kokkos-root {a.kokkos_root}: no lib*/cmake/Kokkos/KokkosConfigCommon.cmake there")
        return 1
    if "CUDA" not in devices:
        print(f"FAIL: --kokkos-root {a.kokkos_root}: a Kokkos for {' '.join(devices) or 'no device'}, not CUDA")
        return 1
    env = dict(os.environ)
    env["PATH"] = os.path.join(a.cuda, "bin") + os.pathsep + env.get("PATH", "")
    configure = ["cmake", "-S", a.source, "-B", a.work, "-DCMAKE_BUILD_TYPE=Release", "-DMINICP_ENABLE_CUDA=ON",
                 f"-DKokkos_ROOT={a.kokkos_root}", f"-DCMAKE_CXX_COMPILER={a.host_compiler}",
                 f"-DCUDAToolkit_ROOT={a.cuda}"]
    print("+", " ".join(configure), flush=True)
    if subprocess.run(configure, env=env).returncode != 0:
        print("FAIL: the CUDA configuration did not configure")
        return 1
    build = ["cmake", "--build", a.work, "-j", str(a.jobs)]
    print("+", " ".join(build), flush=True)
    if subprocess.run(build, env=env).returncode != 0:
        print("FAIL: the CUDA configuration did not build (the first error is above)")
        return 1
    host = sorted(f for f in os.listdir(a.host_bin) if os.access(os.path.join(a.host_bin, f), os.X_OK))
    cuda_bin = os.path.join(a.work, "bin")
    missing = [f for f in host if not os.path.exists(os.path.join(cuda_bin, f))]
    if missing:
        print(f"FAIL: the CUDA build made no {', '.join(missing)} (the host build has them)")
        return 1
    print(f"ok: the CUDA configuration built, {len(host)} programs as in the host build ({a.kokkos_root}: "
          f"Kokkos devices {' '.join(devices)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
