#!/usr/bin/env python3
"""Runs `minicp --deck DECK --dry-run` and checks what it prints: one row per case of the
deck (id, scheme, pass, ranks, mask, memory per rank with its unit, status), and an exit
code that agrees with the statuses: 0 when every case fits in a rank's share of this
machine's memory, 2 (with the refusal naming the case) when one does not.
Usage: check_dry_run.py --deck DECK -- COMMAND [ARGS...]"""
import argparse
import re
import subprocess
import sys

ROW = re.compile(r"^(\d{3}_(train|prefill|decode)_[a-z]+_S\d+_P\d+\S*)\s+([a-z]+)\s+(train|prefill|decode)\s+(\d+)\s+"
                 r".*?\s(\d+(\.\d)? (B|KiB|MiB|GiB|TiB|PiB|EiB))\s+(ok|does not fit|refused: .*)$")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--deck", required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(p.stdout)
    head = re.search(r"minicp --dry-run: (\d+) cases", p.stdout)
    rows = [m for m in (ROW.match(line) for line in p.stdout.splitlines()) if m]
    fail = []
    if not head:
        fail.append("no 'minicp --dry-run: N cases' line")
    elif int(head.group(1)) != len(rows) or not rows:
        fail.append(f"{head.group(1)} cases announced, {len(rows)} rows printed")
    statuses = [m.group(9) for m in rows]
    misfits = [m.group(1) for m in rows if m.group(9) == "does not fit"]
    want = 2 if misfits else 0
    if p.returncode != want:
        fail.append(f"exit code {p.returncode}, expected {want} (cases that do not fit: {misfits})")
    if misfits and "needs" not in p.stdout:
        fail.append("a case does not fit but no refusal message says what it needs")
    if "[1/" in p.stdout:
        fail.append("a dry run ran a case")
    for f in fail:
        print("FAIL:", f)
    print(f"check_dry_run: {len(rows)} cases, statuses {sorted(set(statuses))}, exit {p.returncode}")
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
