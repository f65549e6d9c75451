#!/usr/bin/python3
"""What the code says of itself agrees with every copy kept elsewhere.

The schemes: `minicp --list-schemes --json` (the registry) against the names the tests'
CMake found in miniapp/cp/registry.cpp (--cmake-schemes, in order), the analysis package's
scheme order (plots.SCHEME_ORDER), its ring family (data.RING_FAMILY: the schemes with
ring_family true) and its integer columns (report.COUNT_COLUMNS: every scheme setting).
The deck keys: the keys `minicp --help` lists, section by section (deck_keys.cpp), against
the table of docs/deck-keys.md. Exit code 0 when all agree, 1 naming each difference.

Usage: check_self_description.py --minicp BIN --source DIR --cmake-schemes "a;b;..." """
import argparse
import json
import os
import re
import subprocess
import sys


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[:400]}")
    return r.stdout


def help_keys(text):
    """{(section, key)} of the deck-key block of --help: '  [section]' then '    key   ...'."""
    keys, section = set(), None
    block = text[text.index("Deck keys"):] if "Deck keys" in text else ""
    for line in block.splitlines():
        m = re.match(r"^  \[(\w+)\]\s*$", line)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"^    (\w+)\s+\S", line)
        if m and section:
            keys.add((section, m.group(1)))
    return keys


def doc_keys(text):
    """{(section, key)} of docs/deck-keys.md's table: the section column carries down, the key
    column may name several keys in backticks."""
    keys, section = set(), None
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 4 or not line.startswith("|") or re.fullmatch(r"-+", cells[1]):
            continue
        m = re.fullmatch(r"`\[(\w+)\]`", cells[1])
        if m:
            section = m.group(1)
        if section:
            keys.update((section, k) for k in re.findall(r"`(\w+)`", cells[2]))
    return keys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minicp", required=True, help="the minicp program")
    ap.add_argument("--source", required=True, help="the miniCP source tree")
    ap.add_argument("--cmake-schemes", required=True, help="the schemes tests/CMakeLists.txt found, ';'-separated")
    a = ap.parse_args()
    fails = []
    registry = json.loads(run([a.minicp, "--list-schemes", "--json"]))
    names = [s["name"] for s in registry]
    cmake = [n for n in a.cmake_schemes.split(";") if n]
    if names != cmake:
        fails.append(f"registry {names} but tests/CMakeLists.txt found {cmake} in registry.cpp")
    sys.path.insert(0, os.path.join(a.source, "analysis"))
    from minicp_analysis import data, plots, report  # noqa: E402
    if list(plots.SCHEME_ORDER) != names:
        fails.append(f"analysis plots.SCHEME_ORDER {list(plots.SCHEME_ORDER)} is not the registry's order {names}")
    ring = sorted(s["name"] for s in registry if s["ring_family"])
    if sorted(data.RING_FAMILY) != ring:
        fails.append(f"analysis data.RING_FAMILY {sorted(data.RING_FAMILY)} but the registry's ring family is {ring}")
    settings = sorted({st["name"] for s in registry for st in s["settings"]})
    missing = [st for st in settings if st not in report.COUNT_COLUMNS]
    if missing:
        fails.append(f"scheme settings {missing} are not in analysis report.COUNT_COLUMNS")
    for s in registry:
        for st in s["settings"]:
            if not st["help"] or not isinstance(st["default"], int) or not isinstance(st["min"], int):
                fails.append(f"scheme {s['name']}: setting {st}: needs a help text and integer default and min")
    helped = help_keys(run([a.minicp, "--help"]))
    documented = doc_keys(open(os.path.join(a.source, "docs", "deck-keys.md")).read())
    if not helped:
        fails.append("minicp --help lists no deck keys (its 'Deck keys' block was not found)")
    for k in sorted(helped - documented):
        fails.append(f"deck key [{k[0]}] {k[1]}: in minicp --help, not in docs/deck-keys.md")
    for k in sorted(documented - helped):
        fails.append(f"deck key [{k[0]}] {k[1]}: in docs/deck-keys.md, not in minicp --help")
    if fails:
        print("FAIL:\n  " + "\n  ".join(fails))
        return 1
    print(f"ok: {len(names)} schemes ({len(ring)} ring family, settings {', '.join(settings)}) and "
          f"{len(helped)} deck keys agree with the CMake list, the analysis package and docs/deck-keys.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
