#!/usr/bin/env python3
"""The Python tools on bad files, from copies of a results file that minicp wrote (made here
with h5py: a text file, an empty one, a truncated one, a file without /cases, one with zero
cases, files with a defect or with what a busy machine leaves):
  --mode analysis  report, plots and trace (python3 -m minicp_analysis, and the minicp-trace
                   wrapper): an output that is one of the inputs, however spelt, or that is
                   a character device or a FIFO (also through a symbolic link) is refused
                   even with --overwrite, and left as it was; an existing file of another
                   kind is refused without --overwrite and replaced with it; a file without
                   cases is refused alone and a row (report) or a skipped line (plots) beside
                   a file with cases; a summary attribute of the wrong type (text or an array
                   for a number) is refused by every command.
  --mode results   tests/check_results.py: a file it cannot read is one message, exit 2; a
                   busy machine's file (phases short of a step, a wide clock bound) passes
                   with warnings; a phase counted twice, phases_s against the timing table,
                   a clock alignment off by more than its bound, fail (exit 1).
Each refusal: exit 2, one message on stderr naming the flag and the value, no traceback,
every file as it was.
Usage: check_bad_files.py --mode M --file SRC.h5 --work DIR [--analysis DIR] [--bin DIR]"""
import argparse
import contextlib
import io
import os
import shutil
import stat
import subprocess
import sys
import traceback

import h5py
import numpy as np

from checks import check, verdict

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
NO_CASE = "holds no complete case (a run stopped in its first case?)"


def snapshot(paths):
    """The bytes of each path (None when absent), to show that a refused command changed nothing."""
    out = {}
    for p in paths:
        if os.path.isdir(p):
            out[p] = sorted(os.listdir(p))
        elif os.path.exists(p):
            with open(p, "rb") as f:
                out[p] = f.read()
        else:
            out[p] = None
    return out


IN_PROCESS = "minicp_analysis"  # a command line that starts with it runs in this process (fast)


def run(cmd, env=None):
    """(exit status, stdout, stderr) of a command line; an exception of the command run in
    this process is its traceback on stderr."""
    if cmd[0] == IN_PROCESS:
        from minicp_analysis.cli import main
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(cmd[1:])
            except SystemExit as e:
                rc = e.code
            except Exception:  # noqa: BLE001 - what the user would see
                rc = "exception"
                err.write(traceback.format_exc())
        p = subprocess.CompletedProcess(cmd, rc, out.getvalue(), err.getvalue())
    else:
        p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    print("$", " ".join(cmd), f"-> exit {p.returncode}")
    return p


def expect(cmd, code, needles=(), keep=(), env=None):
    """The command exits with `code`; with 2: one stderr line holding every needle, no
    traceback; the paths in keep unchanged."""
    before = snapshot(keep)
    p = run(cmd, env)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    ok = check(p.returncode == code, f"{' '.join(cmd)}: exit {p.returncode}, expected {code}: {p.stderr[-600:]}")
    if ok and code == 2:
        check(len(lines) == 1 and all(n in lines[0] for n in needles),
              f"{' '.join(cmd)}: expected one stderr line naming {needles}, got {p.stderr!r}")
    check("Traceback" not in p.stderr, f"{' '.join(cmd)}: a traceback: {p.stderr[-600:]}")
    for path, was in before.items():
        check(snapshot([path])[path] == was, f"{' '.join(cmd)}: {path} changed")
    return p


def bad_copies(src, work):
    """Copies of src that no tool can use: {name: path}."""
    d = {k: os.path.join(work, f"{k}.h5") for k in ("text", "empty", "truncated", "nocases", "zerocases")}
    with open(d["text"], "w") as f:
        f.write("an old result that a refused tool must leave alone\n")
    open(d["empty"], "wb").close()
    with open(src, "rb") as f:
        head = f.read(2000)
    with open(d["truncated"], "wb") as f:
        f.write(head)
    for k in ("nocases", "zerocases"):
        shutil.copy(src, d[k])
    with h5py.File(d["nocases"], "r+") as f:
        del f["cases"]
    with h5py.File(d["zerocases"], "r+") as f:
        for c in list(f["cases"]):
            del f["cases"][c]
    return d


# ------------------------------------------------------------------------------------ analysis
def mode_analysis(a):
    work = os.path.join(a.work, "analysis")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    good = os.path.join(work, "g2.h5")
    shutil.copy(a.file, good)
    with h5py.File(good, "r") as f:
        case = next(c for c, g in f["cases"].items() if g.attrs["status"] == "ok")
    env = {"PYTHONPATH": a.analysis}
    sys.path.insert(0, os.path.abspath(a.analysis))
    tool = [IN_PROCESS]
    # as a user runs it: python3 -m minicp_analysis, and the minicp-trace wrapper of the finding
    expect([PY, "-m", "minicp_analysis", "report", good, "--csv", good], 2, (f"--csv {good}", "the same file as FILE"),
           [good], env)
    spelt = os.path.join(work, ".", "g2.h5")
    link = os.path.join(work, "link.h5")
    os.link(good, link)
    keep = [good]
    # an output that is an input: refused, however spelt, even with --overwrite
    for out in (good, spelt, link):
        for extra in ([], ["--overwrite"]):
            expect(tool + ["report", good, "--csv", out] + extra, 2, (f"--csv {out}", "the same file as FILE"), keep,
                   env)
            expect(tool + ["trace", good, "--case", case, "--out", out] + extra, 2,
                   (f"--out {out}", "the same file as FILE"), keep, env)
    if a.bin:
        expect([os.path.join(a.bin, "minicp-trace"), good, "--case", case, "--out", good], 2,
               (f"--out {good}", "an input is never overwritten"), keep)
    # a fabric study table named as plots' own fabric.csv, in the plots folder
    pdir = os.path.join(work, "plots")
    os.makedirs(pdir)
    table = os.path.join(pdir, "fabric.csv")
    with open(table, "w") as f:
        f.write(f"profile,kind,layout,ranks,alpha_us,beta_fit_GBps,beta_best_GBps,file,comm_json\n"
                f"p-one,local,1x2,2,3,10,11,{good},\n")
    expect(tool + ["plots", table, "--out", pdir, "--only", "memory", "--overwrite"], 2,
           (f"--out {table}", "the same file as INPUT"), keep + [table, pdir], env)
    # an existing file of another kind: refused without --overwrite, replaced with it
    index = os.path.join(work, "index.csv")
    with open(index, "w") as f:
        f.write("task,nodes,fabric,ranks,file,status,reason,job_id,array_task_id,log\n")
    text = os.path.join(work, "notes.txt")
    with open(text, "w") as f:
        f.write("my notes\n")
    expect(tool + ["report", good, "--csv", index], 2, (f"--csv {index}", "--overwrite", "not a CSV table"),
           keep + [index], env)
    expect(tool + ["trace", good, "--case", case, "--out", text], 2, (f"--out {text}", "--overwrite"),
           keep + [text], env)
    csv_out, trace_out = os.path.join(work, "r.csv"), os.path.join(work, "t.json")
    for _ in range(2):  # made, then replaced: its own kind
        expect(tool + ["report", good, "--csv", csv_out], 0, keep=keep, env=env)
        expect(tool + ["trace", good, "--case", case, "--out", trace_out], 0, keep=keep, env=env)
    expect(tool + ["report", good, "--csv", index, "--overwrite"], 0, keep=keep, env=env)
    check(open(index).readline().startswith("file,case,"), "report --csv index.csv --overwrite: not replaced")
    expect(tool + ["trace", good, "--case", case, "--out", text, "--overwrite"], 0, keep=keep, env=env)
    # plots: a folder holding other files, a file given as the folder
    other = os.path.join(work, "other")
    os.makedirs(other)
    shutil.copy(text, other)
    expect(tool + ["plots", good, "--out", other, "--only", "memory"], 2, (f"--out {other}", "notes.txt",
                                                                          "--overwrite"), keep + [other], env)
    expect(tool + ["plots", good, "--out", text, "--only", "memory"], 2, (f"--out {text}", "not a directory"),
           keep + [text], env)
    mine = os.path.join(work, "mine")
    for _ in range(2):
        expect(tool + ["plots", good, "--out", mine, "--only", "memory"], 0, keep=keep, env=env)
    expect(tool + ["plots", good, "--out", other, "--only", "memory", "--overwrite"], 0, keep=keep, env=env)
    check(os.path.exists(os.path.join(other, "memory.png")), "plots --overwrite: memory.png not written")
    for cmd in ("report", "plots", "trace"):
        p = run(tool + [cmd, "--help"], env)
        check("--overwrite" in p.stdout and "default: off" in p.stdout.split("--overwrite", 1)[-1],
              f"{cmd} --help: --overwrite not listed with its default")
    special_outputs(tool, a, good, case, work, env)
    wrong_summary_types(tool, good, case, work, env)
    no_case_files(tool, a.file, good, case, work, env)


def no_case_files(tool, src, good, case, work, env):
    """Files without cases (copies of src) beside a file with cases (good) and alone, and
    files no tool can read."""
    bad = bad_copies(src, work)
    for k in ("nocases", "zerocases"):
        f = bad[k]
        expect(tool + ["report", f], 2, (f"FILE {f}: {NO_CASE}",), [f], env)
        expect(tool + ["plots", f, "--out", os.path.join(work, "p_" + k)], 2, (f"INPUT {f}: {NO_CASE}",), [f], env)
        expect(tool + ["trace", f, "--case", case], 2, (f"FILE {f}: {NO_CASE}",), [f], env)
        p = expect(tool + ["report", good, f, "--csv", "-"], 0, keep=[f], env=env)
        check(NO_CASE in p.stdout and case in p.stdout, f"report of a file with cases and {k}: no row saying so")
        p = expect(tool + ["plots", good, f, "--out", os.path.join(work, "p2_" + k), "--only", "memory"], 0, keep=[f],
                   env=env)
        check(f"skipped {f}: {NO_CASE}" in p.stdout, f"plots of a file with cases and {k}: no line saying so")
    for k in ("text", "empty", "truncated"):
        f = bad[k]
        for cmd in (["report", f], ["plots", f, "--out", os.path.join(work, "p_" + k)], ["trace", f, "--case", case]):
            expect(tool + cmd, 2, (f" {f}: not a minicp results file",), [f], env)


def special_outputs(tool, a, good, case, work, env):
    """Outputs that are not regular files (a character device, /dev/null's numbers; a FIFO;
    a symbolic link to the device): report --csv, trace --out and a file in plots' --out
    folder are refused, with and without --overwrite, and the node stays what it was. Never
    read here (a FIFO would block)."""
    nodes = os.path.join(work, "nodes")
    os.makedirs(nodes)
    made = []  # (path, what stat says it must still be)
    for kind, test in (("chr", stat.S_ISCHR), ("fifo", stat.S_ISFIFO)):
        folder = os.path.join(nodes, f"plots_{kind}")
        os.makedirs(folder)
        for path in (os.path.join(nodes, kind), os.path.join(folder, "memory.png")):
            if kind == "chr":
                os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
            else:
                os.mkfifo(path)
            made.append((path, test))
    link = os.path.join(nodes, "link")
    os.symlink(os.path.join(nodes, "chr"), link)
    keep = [good]
    for out in (os.path.join(nodes, "chr"), os.path.join(nodes, "fifo"), link):
        for extra in ([], ["--overwrite"]):
            expect(tool + ["report", good, "--csv", out] + extra, 2, (f"--csv {out}", "not a regular file"), keep, env)
            expect(tool + ["trace", good, "--case", case, "--out", out] + extra, 2,
                   (f"--out {out}", "not a regular file"), keep, env)
    for kind in ("chr", "fifo"):
        folder = os.path.join(nodes, f"plots_{kind}")
        for extra in ([], ["--overwrite"]):
            expect(tool + ["plots", good, "--out", folder, "--only", "memory"] + extra, 2,
                   (f"--out {os.path.join(folder, 'memory.png')}", "not a regular file"), keep, env)
    if a.bin:  # as the user runs it
        out = os.path.join(nodes, "chr")
        expect([os.path.join(a.bin, "minicp-report"), good, "--csv", out], 2, (f"--csv {out}", "not a regular file"),
               keep)
    for path, test in made:
        check(test(os.lstat(path).st_mode), f"{path}: no longer the node it was made as")
    check(os.path.islink(link), f"{link}: no longer a symbolic link")


def wrong_summary_types(tool, good, case, work, env):
    """Copies whose case has measured_time_s as text and as an array: report, plots and trace
    each refuse them, naming the file, the case, the attribute and that a number is expected."""
    for name, value in (("text", "fast"), ("array", np.array([1.0, 2.0]))):
        path = os.path.join(work, f"summary_{name}.h5")
        shutil.copy(good, path)
        with h5py.File(path, "r+") as f:
            f["cases"][case]["summary"].attrs["measured_time_s"] = value
        needles = (path, f"case {case}", "measured_time_s", "expected a number")
        out = os.path.join(work, f"out_summary_{name}")
        expect(tool + ["report", path], 2, needles, [path], env)
        expect(tool + ["report", path, "--csv", out + ".csv"], 2, needles, [path, out + ".csv"], env)
        expect(tool + ["plots", path, "--out", out], 2, needles, [path, out], env)
        expect(tool + ["trace", path, "--case", case, "--out", out + ".json"], 2, needles, [path, out + ".json"], env)


# ------------------------------------------------------------------------------------- results
def first_ok_case(f):
    """The first case that ran on two ranks or more."""
    return next(g for g in f["cases"].values() if g.attrs["status"] == "ok" and g.attrs["ranks"] > 1)


def longest_step(f):
    """The case that ran on two ranks or more, and its steps row, of the longest step."""
    ok = [g for g in f["cases"].values() if g.attrs["status"] == "ok" and g.attrs["ranks"] > 1]
    g = max(ok, key=lambda g: float(np.max(g["steps"]["step_s"])))
    return g, int(np.argmax(g["steps"]["step_s"]))


def phase_rows(g, r, layer=None):
    """The timing rows of step r (a steps row), of one layer or all: (its phases' indices,
    its totals' indices, the phase names)."""
    t = g["timing"][()]
    names = g["timing"].attrs["phase_names"]
    names = (names.decode() if isinstance(names, bytes) else names).split(",")
    mine = (t["mode"] == r["mode"]) & (t["rep"] == r["rep"]) & (t["rank"] == r["rank"])
    if layer is not None:
        mine &= (t["layer"] == layer) & (t["pass"] == 0)
    total = t["phase"] == names.index("total")
    return t, np.flatnonzero(mine & ~total), np.flatnonzero(mine & total)


def add_to_phases(g, i, share):
    """Adds share x the largest phase of each layer and pass of step i to that phase, its
    layer's total and the step's phases_s: a phase counted 1 + share times."""
    st = g["steps"][()]
    t, parts, totals = phase_rows(g, st[i])
    added = 0.0
    for k in totals:
        same = parts[(t["layer"][parts] == t["layer"][k]) & (t["pass"][parts] == t["pass"][k])]
        j = same[np.argmax(t["seconds"][same])]
        d = share * t["seconds"][j]
        t["seconds"][j] += d
        t["seconds"][k] += d
        added += d
    st["phases_s"][i] += added
    g["timing"][...] = t
    g["steps"][...] = st
    return added, st[i]["step_s"]


def busy_copy(src, dst):
    """What a busy machine leaves: a step whose phases cover less of it (time outside every
    phase: the rank lost its core between the stack's calls), and a clock bound of 300 us."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        g, i = longest_step(f)  # a cut of half its largest phase is more than the checker's 0.2 ms
        cut, step = add_to_phases(g, i, -0.5)
        check(-cut > max(0.01 * step, 2e-4), f"busy copy: phases only {-cut} s short of the {step} s step")
        g["summary"].attrs["clock_uncertainty_s"] = 300e-6


def defect_copy(src, dst, what):
    """A copy with one defect: `double` a phase counted twice in every layer and pass of a
    step (the timing table, the layers' totals and phases_s all say so), `phases_s` a step's
    phases_s that is not its timing table's sum, `clock` rank 1's events so late (1 ms more
    than its lead on rank 0 at the barrier) on an aligned clock that claims 10 us that one
    ends after the next step began."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        g = first_ok_case(f)
        if what == "clock":
            ev = g["events"][()]
            late = ev["rank"] == 1
            shift = rank1_lead(ev) + 1e-3
            ev["t_begin"][late] += shift
            ev["t_end"][late] += shift
            g["events"][...] = ev
            g["summary"].attrs["clock_uncertainty_s"] = 10e-6
        elif what == "double":
            add_to_phases(g, 0, 1.0)
        else:
            st = g["steps"][()]
            st["phases_s"][0] *= 0.9
            g["steps"][...] = st


def rank1_lead(ev):
    """The least time from rank 1's last event of a step to rank 0's first of the next (in
    time order): rank 1's events moved later by more than it end after the next step began."""
    steps = sorted(set(zip(ev["mode"].tolist(), ev["rep"].tolist())),
                   key=lambda k: ev["t_begin"][(ev["mode"] == k[0]) & (ev["rep"] == k[1])].min())
    of = [(ev["mode"] == m) & (ev["rep"] == r) for m, r in steps]
    return min(float(ev["t_begin"][b & (ev["rank"] == 0)].min() - ev["t_end"][a & (ev["rank"] == 1)].max())
               for a, b in zip(of, of[1:]))


def mode_results(a):
    work = os.path.join(a.work, "results")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    checker = [PY, os.path.join(HERE, "check_results.py")]
    bad = bad_copies(a.file, work)
    for k in ("text", "empty", "truncated"):
        expect(checker + [bad[k]], 2, (f"FILE {bad[k]}: ", "truncated" if k == "truncated" else "not an HDF5 file"),
               [bad[k]])
    missing = os.path.join(work, "missing.h5")
    expect(checker + [missing], 2, (f"FILE {missing}: no such file",))
    expect(checker + [work], 2, (f"FILE {work}: is a directory",))
    expect(checker + [a.file], 0)
    busy = os.path.join(work, "busy.h5")
    busy_copy(a.file, busy)
    p = expect(checker + [busy], 0)
    check("WARNING (busy machine" in p.stdout and "clock uncertainty 300 us" in p.stdout and
          "phases miss the step" in p.stdout, f"busy file: no warnings for the short phases and the clock: {p.stdout}")
    for what, needle in (("double", "phases add up to more than the step"),
                         ("phases_s", "but its layers' totals in the timing table add up to"),
                         ("clock", "the aligned clock is off by more than twice its bound")):
        path = os.path.join(work, f"defect_{what}.h5")
        defect_copy(a.file, path, what)
        p = expect(checker + [path], 1)
        check("FAIL: " in p.stdout and needle in p.stdout, f"defect {what}: no FAIL naming {needle!r}: {p.stdout}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", required=True, choices=["analysis", "results"])
    ap.add_argument("--file", required=True, help="a results file minicp wrote (a case that ran, on 2 ranks)")
    ap.add_argument("--work", required=True, help="scratch folder (made)")
    ap.add_argument("--analysis", help="the analysis/ folder (holds minicp_analysis)")
    ap.add_argument("--bin", help="the folder of the minicp-trace wrapper (build/bin)")
    a = ap.parse_args()
    a.work = os.path.abspath(a.work)
    os.makedirs(a.work, exist_ok=True)
    {"analysis": mode_analysis, "results": mode_results}[a.mode](a)
    return verdict("check_bad_files", a.mode)


if __name__ == "__main__":
    sys.exit(main())
