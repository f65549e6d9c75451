#!/usr/bin/python3
"""What the code says of itself agrees with every copy kept elsewhere.

The schemes: `minicp --list-schemes --json` (the registry) against the names CMake read from
miniapp/cp/schemes.list (--cmake-schemes, in order). The analysis package keeps no copy of the
registry: it reads the scheme order, the ring family and the settings (integer columns) from
the results files' `scheme_registry` attribute. That is checked on small HDF5 files made here:
the registry with a made-up ring-family scheme `zz_test` (first, where alphabetical order would
put it last) and its setting `zz_hops` must reach the order, the colours, the ring family, the
default timeline case and the report's columns; a file without `scheme_registry` or
`figure_catalog` (an older minicp's) is refused with one message naming the attribute; and no
line of the package may quote two scheme names (the shape of a hand-kept list). The deck keys:
`minicp --list-deck-keys --json` against the keys `minicp --help` lists, section by section.
The docs: `tools/gen-docs` run into a temporary directory must write what docs/generated/ holds
(the tables of schemes, deck keys and figures the docs link to), else `make docs` is due.
Exit code 0 when all agree, 1 naming each difference.

Usage: check_self_description.py --minicp BIN --source DIR --cmake-schemes "a;b;..." """
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


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


def check_generated(minicp, source, fails):
    """tools/gen-docs into a temporary directory against docs/generated/."""
    committed = os.path.join(source, "docs", "generated")
    with tempfile.TemporaryDirectory() as tmp:
        run([sys.executable, os.path.join(source, "tools", "gen-docs"), "--minicp", minicp, "--out", tmp])
        fresh = sorted(os.listdir(tmp))
        if not fresh:
            fails.append("tools/gen-docs wrote nothing")
        for name in fresh:
            path = os.path.join(committed, name)
            want = open(os.path.join(tmp, name), encoding="utf-8").read()
            have = open(path, encoding="utf-8").read() if os.path.isfile(path) else None
            if have != want:
                fails.append(f"docs/generated/{name} {'is missing' if have is None else 'differs from what minicp prints'}: "
                             f"run `make docs`")
        if os.path.isdir(committed):
            for name in sorted(set(os.listdir(committed)) - set(fresh)):
                fails.append(f"docs/generated/{name}: not written by tools/gen-docs (remove it, or `make docs`)")


MADE_UP = {"name": "zz_test", "summary": "a scheme only this test knows", "problems": ["train"],
           "ring_family": True, "takes_dispatch": False, "refuses": "", "settings": [{"name": "zz_hops", "help": "hops", "default": 1,
                                                              "min": 1}]}


def write_results(path, registry, catalog):
    """A results file as small as the analysis package reads: one ok case of zz_test with its
    setting zz_hops = 3 and a full-mode step, and the figure catalog `catalog` (None: the
    attribute left out, as `registry` None leaves out scheme_registry)."""
    import h5py
    import numpy as np
    with h5py.File(path, "w") as f:
        f.attrs["file_kind"] = "minicp results"
        f.attrs["minicp_version"] = "test"
        f.attrs["world_ranks"] = 2
        if registry is not None:
            f.attrs["scheme_registry"] = json.dumps(registry)
        if catalog is not None:
            f.attrs["figure_catalog"] = json.dumps(catalog)
        for cid, scheme in (("000_train_zz_test_S64_P2", "zz_test"), ("001_train_ring_S64_P2", "ring")):
            g = f.create_group(f"cases/{cid}")
            g.attrs.update({"scheme": scheme, "pass": "train", "mask": "causal", "seq_len": 64, "ranks": 2,
                            "status": "ok", "reps": 1, "complete": "yes", "zz_hops": 3})
            g.create_group("summary").attrs["measured_time_s"] = 1.0
            steps = g.create_dataset("steps", data=np.array([(0, 0, 0, 1.0)], dtype=[
                ("mode", "i4"), ("rep", "i4"), ("rank", "i4"), ("step_s", "f8")]))
            steps.attrs["mode_names"] = "full,compute-only,comm-only"


def check_analysis_reads(registry, catalog, source, fails):
    """The analysis package takes the schemes' order, ring family and settings from the
    results files it is given (see the module's docstring)."""
    sys.path.insert(0, os.path.join(source, "analysis"))
    from minicp_analysis import UsageError, data, plots, report  # noqa: E402
    names = [s["name"] for s in registry]
    ring = sorted(s["name"] for s in registry if s["ring_family"])
    settings = list(dict.fromkeys(st["name"] for s in registry for st in s["settings"]))
    with tempfile.TemporaryDirectory() as tmp:
        made, real = (os.path.join(tmp, n) for n in ("made_up.h5", "real.h5"))
        write_results(made, [MADE_UP] + registry, catalog)
        write_results(real, registry, catalog)
        reg = data.registry_of(real)
        if list(reg.schemes) != names or sorted(reg.ring_family) != ring or list(reg.settings) != settings:
            fails.append(f"analysis registry_of a file with the registry: order {list(reg.schemes)}, ring family "
                         f"{sorted(reg.ring_family)}, settings {list(reg.settings)}; the registry's: {names}, {ring}, "
                         f"{settings}")
        inputs = data.load_inputs([made, real])
        df = data.case_table(inputs)
        reg = data.table_registry(df)
        want = ["zz_test"] + names
        if list(reg.schemes) != want:
            fails.append(f"analysis scheme order {list(reg.schemes)} is not the files' registry order {want}")
        if plots.color("zz_test", reg) != plots.PALETTE[0] or reg.in_order(["ring", "zz_test"]) != ["zz_test", "ring"]:
            fails.append("analysis plots: zz_test, first in the file's registry, is not first in order and colour")
        if sorted(reg.ring_family) != sorted(ring + ["zz_test"]):
            fails.append(f"analysis ring family {sorted(reg.ring_family)}: not the file's {sorted(ring + ['zz_test'])}")
        row = data.default_timeline_case(df)
        if row is None or row["scheme"] != "zz_test":
            fails.append(f"analysis default timeline case {None if row is None else row['case']}: not the file's "
                         f"first ring-family case (zz_test)")
        missing = [st for st in settings + ["zz_hops"] if st not in report.count_columns(reg)]
        if missing:
            fails.append(f"scheme settings {missing} of the file are not integer columns of analysis report")
        if "zz_hops" not in df or list(df["zz_hops"]) != [3, 3, 3, 3]:
            fails.append(f"analysis case table: the setting zz_hops not read as a column "
                         f"({list(df['zz_hops']) if 'zz_hops' in df else 'absent'})")
        try:
            headers = list(report.build(None, columns=["scheme,zz_hops"], inputs=inputs).columns)
        except UsageError as e:
            headers = [f"refused: {e}"]
        if headers != ["scheme", "zz_hops"]:
            fails.append(f"analysis report --columns scheme,zz_hops: headers {headers} (a setting is a count, no unit)")
        for attr, reg_of, cat_of in (("scheme_registry", None, catalog), ("figure_catalog", registry, None)):
            old = os.path.join(tmp, f"without_{attr}.h5")
            write_results(old, reg_of, cat_of)
            try:
                data.load_inputs([old])
                fails.append(f"analysis load_inputs read a results file without {attr} (expected: refused)")
            except UsageError as e:
                if attr not in str(e):
                    fails.append(f"analysis refused a results file without {attr} but its message does not "
                                 f"name it: {e}")
    package = os.path.join(source, "analysis", "minicp_analysis")
    quoted = re.compile(r"""["']([a-z_]+)["']""")
    for name in sorted(os.listdir(package)):
        if not name.endswith(".py"):
            continue
        for n, line in enumerate(open(os.path.join(package, name)), 1):
            hits = sorted(set(quoted.findall(line)) & set(names))
            if len(hits) >= 2:
                fails.append(f"analysis/minicp_analysis/{name}:{n} quotes the schemes {hits}: a hand-kept list? "
                             f"(read them from the results file: data.registry_of)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minicp", required=True, help="the minicp program")
    ap.add_argument("--source", required=True, help="the miniCP source tree")
    ap.add_argument("--cmake-schemes", required=True, help="the schemes CMake read from miniapp/cp/schemes.list, ';'-separated")
    a = ap.parse_args()
    fails = []
    registry = json.loads(run([a.minicp, "--list-schemes", "--json"]))
    names = [s["name"] for s in registry]
    cmake = [n for n in a.cmake_schemes.split(";") if n]
    if names != cmake:
        fails.append(f"registry {names} but CMake read {cmake} from miniapp/cp/schemes.list")
    figures = json.loads(run([a.minicp, "--list-figures", "--json"]))
    check_analysis_reads(registry, figures, a.source, fails)
    ring = sorted(s["name"] for s in registry if s["ring_family"])
    settings = sorted({st["name"] for s in registry for st in s["settings"]})
    for s in registry:
        for st in s["settings"]:
            if not st["help"] or not isinstance(st["default"], int) or not isinstance(st["min"], int):
                fails.append(f"scheme {s['name']}: setting {st}: needs a help text and integer default and min")
    listed = {(k["section"], k["key"]) for k in json.loads(run([a.minicp, "--list-deck-keys", "--json"]))}
    helped = help_keys(run([a.minicp, "--help"]))
    if listed != helped:
        fails.append(f"minicp --list-deck-keys --json {sorted(listed ^ helped)} differ from the keys of --help")
    for fig in figures:
        if fig["unit"] not in ("s", "FLOP/s", "tokens/s", "B", "B/value", "1", "pairs", "flag", "text") or not fig["definition"]:
            fails.append(f"figure {fig['name']}: unit {fig['unit']!r} / definition {fig['definition']!r}")
    if not helped:
        fails.append("minicp --help lists no deck keys (its 'Deck keys' block was not found)")
    check_generated(a.minicp, a.source, fails)
    if fails:
        print("FAIL:\n  " + "\n  ".join(fails))
        return 1
    print(f"ok: {len(names)} schemes ({len(ring)} ring family, settings {', '.join(settings)}), "
          f"{len(helped)} deck keys and {len(figures)} figures agree with the CMake list, --help, the analysis "
          f"package (reading a results file's scheme_registry, refusing a file without it) and docs/generated/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
