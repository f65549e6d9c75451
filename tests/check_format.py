#!/usr/bin/python3
"""Every tracked C++ source is formatted as .clang-format says.

Runs `clang-format --dry-run --Werror` over the files git tracks in the source tree
(*.cpp, *.hpp) and fails naming each file that `make format` would change, with the first
places clang-format reports. The style is written for clang-format 14 (Debian 12's, which
`make deps` installs); another major version formats some constructs differently, so with
one, or with no clang-format or no git checkout, the check is "skipped: ..." (exit 77).
Exit code 0 when every file is formatted, 1 otherwise.

Usage: check_format.py --source DIR [--clang-format PROGRAM]"""
import argparse
import re
import shutil
import subprocess
import sys

STYLE_MAJOR = 14  # the clang-format the style is checked with


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="the miniCP source tree (a git checkout)")
    ap.add_argument("--clang-format", default="clang-format", help="the program (default clang-format)")
    a = ap.parse_args()
    exe = shutil.which(a.clang_format)
    if not exe:
        print(f"skipped: {a.clang_format} not found (make deps installs it)")
        return 77
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\d+)\.", version)
    if not m or int(m.group(1)) != STYLE_MAJOR:
        print(f"skipped: {version.strip() or exe}: the style is checked with clang-format {STYLE_MAJOR}")
        return 77
    ls = subprocess.run(["git", "-C", a.source, "ls-files", "*.cpp", "*.hpp"], capture_output=True, text=True)
    if ls.returncode != 0:
        print(f"skipped: {a.source} is not a git checkout ({ls.stderr.strip()})")
        return 77
    files = ls.stdout.split()
    if not files:
        print(f"FAIL: git ls-files found no C++ source in {a.source}")
        return 1
    bad = {}
    for f in files:
        r = subprocess.run([exe, "--dry-run", "--Werror", f], cwd=a.source, capture_output=True, text=True)
        if r.returncode != 0:
            bad[f] = [ln for ln in r.stderr.splitlines() if ": error:" in ln or ": warning:" in ln]
    if bad:
        print(f"FAIL: {len(bad)} of {len(files)} files are not formatted (run `make format`):")
        for f, places in bad.items():
            print(f"  {f}: {len(places)} places, first: {places[0] if places else '?'}")
        return 1
    print(f"ok: {len(files)} files formatted as .clang-format says ({version.strip()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
