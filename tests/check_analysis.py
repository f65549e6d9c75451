#!/usr/bin/env python3
"""Checks the results analysis (analysis/minicp_analysis) on a results file that minicp wrote,
against the file itself read here with h5py:
  report  the table and its CSV: the columns and their units, one row per case with the
          file's figures, statuses (refused cases too) and dtypes, the filters, the sort, --columns,
          the build/bin/minicp-report wrapper, bad input (exit 2, one message naming the flag)
  plots   the Figures before they are saved (axis labels with units, one line or series per
          scheme present, NaN overlaps drawn as missing with their note, the timeline's ranks
          and tracks, memory points per rank), then the command: PNGs written, skips said
  trace   the Chrome / Perfetto JSON: a process per rank with its name, compute and comm on
          their own threads, complete events with ts, dur >= 0 and nested per thread, args with
          step and bytes, the bytes and the event count of the rep equal to the events table's,
          the median rep by default
Usage: check_analysis.py {report,plots,trace} --file FILE.h5 --analysis DIR --work DIR [--wrapper PATH]"""
import argparse
import contextlib
import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

FAILS = []


def fail(msg):
    FAILS.append(msg)
    print(f"FAIL: {msg}")


def verdict(what):
    """The exit status: 1 with the count of failures, else 0 saying what passed."""
    if FAILS:
        print(f"{len(FAILS)} failure(s)")
        return 1
    print(f"{what}: all checks passed")
    return 0


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def cases(path):
    """{case id: (attributes, summary attributes, memory rows)} of the file, read here."""
    out = {}
    with h5py.File(path, "r") as f:
        for cid, g in f["cases"].items():
            attrs = {k: text(v) if isinstance(v, (bytes, str)) else v for k, v in g.attrs.items()}
            summary = dict(g["summary"].attrs) if "summary" in g else {}
            memory = g["memory"][()] if "memory" in g else None
            out[cid] = (attrs, summary, memory)
    return out


def run_cli(argv):
    """The command line in this process: (exit status, stdout, stderr)."""
    from minicp_analysis.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def expect_bad(argv, *needles):
    """Bad input: exit status 2 and one error line naming each needle."""
    rc, out, err = run_cli(argv)
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("usage:") and not x.startswith(" ")]
    if rc != 2:
        fail(f"{' '.join(argv)}: exit {rc}, expected 2 (stderr {err!r})")
    elif len(lines) != 1 or not all(n in lines[0] for n in needles):
        fail(f"{' '.join(argv)}: expected one message naming {needles}, got {err!r}")


# --------------------------------------------------------------------------------------- report
def check_report_csv(a, want, ok, refused):
    """report --csv -: the columns and their units, one row per case in the file's order, its
    statuses and dtypes, its figures (refused cases: NaN)."""
    rc, out, err = run_cli(["report", a.file, "--csv", "-"])
    rows = list(csv.DictReader(io.StringIO(out))) if rc == 0 else []
    if rc != 0:
        fail(f"report --csv -: exit {rc}: {err}")
    has_pred = any("predicted_time_s" in s for _, s, _ in want.values())
    cols = ["file", "case", "scheme", "pass", "mask", "dtype", "seq_len [tokens]", "ranks", "status", "measured_time_s [s]",
            "tokens_per_s [tokens/s]", "cp_efficiency [-]", "cp_efficiency_core_scaled [-]", "overlap [-]",
            "attn_overlap [-]", "exposed_comm_s [s]", "imbalance [-]", "bytes_sent_per_rank [B]",
            "peak_kokkos_bytes [B]", "predicted_bytes [B]"] + \
        (["predicted_time_s [s]", "predicted_ratio [-]"] if has_pred else [])
    if rows and list(rows[0].keys()) != cols:
        fail(f"report CSV columns {list(rows[0].keys())}, expected {cols}")
    if len(rows) != len(want) or [r.get("case") for r in rows] != list(want):
        fail(f"report CSV: {len(rows)} rows ({[r.get('case') for r in rows]}), expected one per case ({len(want)})")
    for r in rows:
        at, s, mem = want.get(r.get("case"), ({}, {}, None))
        for col in ("status", "dtype"):
            if r.get(col) != at.get(col):
                fail(f"report {r.get('case')}: {col} {r.get(col)!r}, file says {at.get(col)!r}")
        if r.get("case") in ok:
            for col, v in (("measured_time_s [s]", s["measured_time_s"]), ("overlap [-]", s["overlap"]),
                           ("peak_kokkos_bytes [B]", float(mem["kokkos_peak_bytes"].max())),
                           ("predicted_bytes [B]", float(mem["predicted_bytes"].max()))):
                got = float(r[col])
                if not (math.isnan(got) and math.isnan(v)) and not math.isclose(got, v, rel_tol=1e-12):
                    fail(f"report {r['case']}: {col} {got}, file says {v}")
        elif r.get("case") in refused and r.get("measured_time_s [s]") != "NaN":
            fail(f"report {r['case']} (refused): measured time {r.get('measured_time_s [s]')!r}, expected NaN")
    if not refused:
        print("note: the file has no refused case")


def check_report_text(a, want, refused):
    """The text table, and --csv FILE beside it."""
    csv_path = os.path.join(a.work, "report.csv")
    rc, out, err = run_cli(["report", a.file, "--csv", csv_path])
    if rc != 0 or "measured_time_s [s]" not in out or not all(c in out for c in want):
        fail(f"report (text): exit {rc}, every case and the unit headers expected: {out[:300]!r} {err}")
    elif "refused" not in out and refused:
        fail("report (text): the refused cases' status is not shown")
    if not os.path.exists(csv_path) or len(list(csv.DictReader(open(csv_path)))) != len(want):
        fail(f"report --csv {csv_path}: not written with one row per case")


def check_report_filters(a, want, ok):
    """--scheme, --pass, --seq-len (alone, repeated, together), --sort --desc, --columns.
    Returns the scheme filtered on."""
    some = sorted(ok)[1]
    scheme, pas, seq = want[some][0]["scheme"], want[some][0]["pass"], int(want[some][0]["seq_len"])
    others = sorted({at["scheme"] for at, _, _ in want.values()} - {scheme})
    for argv, pick in (
            (["--scheme", scheme], lambda at: at["scheme"] == scheme),
            (["--scheme", f"{scheme},{others[0]}"], lambda at: at["scheme"] in (scheme, others[0])),
            (["--scheme", scheme, "--scheme", others[0]], lambda at: at["scheme"] in (scheme, others[0])),
            (["--pass", pas], lambda at: at["pass"] == pas),
            (["--seq-len", str(seq)], lambda at: int(at["seq_len"]) == seq),
            (["--pass", pas, "--seq-len", str(seq), "--scheme", scheme],
             lambda at: at["pass"] == pas and int(at["seq_len"]) == seq and at["scheme"] == scheme)):
        rc, out, err = run_cli(["report", a.file, "--csv", "-"] + argv)
        got = [r["case"] for r in csv.DictReader(io.StringIO(out))]
        exp = [c for c, (at, _, _) in want.items() if pick(at)]
        if rc != 0 or got != exp:
            fail(f"report {' '.join(argv)}: cases {got}, expected {exp} ({err})")
    rc, out, _ = run_cli(["report", a.file, "--csv", "-", "--sort", "measured_time_s", "--desc"])
    times = [float(r["measured_time_s [s]"]) for r in csv.DictReader(io.StringIO(out))]
    finite = [t for t in times if not math.isnan(t)]
    if finite != sorted(finite, reverse=True) or any(not math.isnan(t) for t in times[len(finite):]):
        fail(f"report --sort measured_time_s --desc: not descending with NaN last: {times}")
    rc, out, _ = run_cli(["report", a.file, "--csv", "-", "--columns", "case,measured_time_s [s]", "--columns",
                          "layer_efficiency"])
    head = out.splitlines()[0] if out else ""
    if head != "case,measured_time_s [s],layer_efficiency [-]":
        fail(f"report --columns: header {head!r}")
    return scheme


def check_report_bad_input(a, scheme):
    """Bad input: exit 2 and one message naming the flag, the value and what is allowed."""
    expect_bad(["report", a.file, "--bogus"], "--bogus")
    expect_bad(["report", a.file, "--pass", "training"], "--pass training", "train, prefill, decode")
    expect_bad(["report", a.file, "--scheme", "nosuch"], "--scheme nosuch", scheme)
    expect_bad(["report", a.file, "--seq-len", "abc"], "--seq-len abc")
    expect_bad(["report", a.file, "--sort", "nosuch"], "--sort nosuch", "measured_time_s")
    expect_bad(["report", a.file, "--columns", "case,nosuch"], "--columns nosuch", "measured_time_s")
    expect_bad(["report", os.path.join(a.work, "missing.h5")], "missing.h5: no such file")
    expect_bad(["report", __file__], "check_analysis.py: not a minicp results file")
    expect_bad(["report", a.file, "--csv", "/proc/no/such/dir.csv"], "--csv /proc/no/such/dir.csv")


def check_report_help():
    """--help lists every option with its default."""
    rc, out, _ = run_cli(["report", "--help"])
    options = out.split("options:", 1)[-1]
    for opt in ("--scheme", "--pass", "--seq-len", "--sort", "--desc", "--columns", "--csv"):
        part = options.split(f"\n  {opt}", 1)[-1].split("\n  -", 1)[0] if f"\n  {opt}" in options else ""
        if "default" not in part:
            fail(f"report --help: {opt} not listed with its default")


def check_report_wrapper(a, want, scheme):
    """The wrapper CMake generates, and `python3 -m minicp_analysis`, as a user runs them."""
    if a.wrapper:
        p = subprocess.run([a.wrapper, a.file, "--scheme", scheme, "--csv", "-"], capture_output=True, text=True)
        n = sum(1 for at, _, _ in want.values() if at["scheme"] == scheme)
        if p.returncode != 0 or len(list(csv.DictReader(io.StringIO(p.stdout)))) != n:
            fail(f"{a.wrapper}: exit {p.returncode}, {p.stdout[:200]!r} {p.stderr!r}")
        p = subprocess.run([a.wrapper, a.file, "--pass", "x"], capture_output=True, text=True)
        if p.returncode != 2 or "--pass x" not in p.stderr:
            fail(f"{a.wrapper} --pass x: exit {p.returncode}, {p.stderr!r}")


def check_report(a):
    want = cases(a.file)
    ok = {c for c, (at, _, _) in want.items() if at["status"] == "ok"}
    refused = {c for c, (at, _, _) in want.items() if at["status"] != "ok"}
    check_report_csv(a, want, ok, refused)
    check_report_text(a, want, refused)
    scheme = check_report_filters(a, want, ok)
    check_report_bad_input(a, scheme)
    check_report_help()
    check_report_wrapper(a, want, scheme)


# ---------------------------------------------------------------------------------------- plots
def labelled(ax):
    """The labels of an axes' lines and collections that carry one (not '_...')."""
    items = list(ax.lines) + list(ax.collections)
    return sorted({i.get_label() for i in items if not i.get_label().startswith("_")})


def title(fig):
    """A figure's title, its wrapping undone."""
    return fig._suptitle.get_text().replace("\n", " ")


def check_units(fig, name):
    for ax in fig.axes:
        if not ax.axison:
            continue
        shared = ax.get_shared_x_axes().get_siblings(ax)
        xlab = ax.get_xlabel() or next((s.get_xlabel() for s in shared if s.get_xlabel()), "")
        for what, lab in (("x", xlab), ("y", ax.get_ylabel())):
            if not lab or ("[" not in lab and what == "x" and "case" not in lab and "phase" not in lab
                           and "fabric" not in lab) or (what == "y" and "[" not in lab and "rank" not in lab):
                fail(f"{name}: an axes' {what} label {lab!r} lacks a unit")


def check_scaling_figure(df, ok):
    """Scaling against seq_len: a row per pass, one line per scheme of the pass on the step time."""
    from minicp_analysis import plots
    fig = plots.scaling_seq_len_figure(df, "t")
    check_units(fig, "scaling_seq_len")
    passes = [p for p in ("train", "prefill", "decode") if any(at["pass"] == p for at, _, _ in ok.values())]
    time_axes = [ax for ax in fig.axes if ax.get_ylabel() == "step time [s]"]
    if len(time_axes) != len(passes):
        fail(f"scaling_seq_len: {len(time_axes)} step-time panels, expected one per pass {passes}")
    for ax, p in zip(time_axes, passes):
        schemes = sorted({at["scheme"] for at, _, _ in ok.values() if at["pass"] == p})
        if labelled(ax) != schemes:
            fail(f"scaling_seq_len {p}: lines {labelled(ax)}, expected one per scheme {schemes}")
        for line in ax.lines:
            s = line.get_label()
            exp = sorted((int(at["seq_len"]), float(su["measured_time_s"])) for at, su, _ in ok.values()
                         if at["pass"] == p and at["scheme"] == s)
            got = sorted(zip((int(x) for x in line.get_xdata()), line.get_ydata()))
            if got != exp:
                fail(f"scaling_seq_len {p} {s}: points {got}, the file has {exp}")


def check_timeline_figure(a, df):
    """The timeline of the default case: each rank's tracks, one bar per event of the median rep.
    Returns the default case's row."""
    import matplotlib.collections
    from minicp_analysis import data, plots
    row = data.default_timeline_case(df)
    if row is None or row["scheme"] not in data.table_registry(df).ring_family:
        fail(f"no ring-family default timeline case in {a.file}")
    else:
        fig = plots.timeline_figure(a.file, row["case"], "t")
        check_units(fig, "timeline")
        ranks = int(row["ranks"])
        ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        for r in range(ranks):
            for track in ("compute", "comm", "wait"):
                if f"rank {r} {track}" not in ticks:
                    fail(f"timeline: no row 'rank {r} {track}' ({ticks})")
        bars = [c for c in fig.axes[0].collections if isinstance(c, matplotlib.collections.BrokenBarHCollection)]
        with h5py.File(a.file, "r") as f:
            st = f["cases"][row["case"]]["steps"][()]
            ev = f["cases"][row["case"]]["events"][()]
        full = st[st["mode"] == 0]
        slow = sorted((max(full[full["rep"] == r]["step_s"]), r) for r in sorted(set(full["rep"])))
        rep = slow[len(slow) // 2][1]
        n = int(((ev["mode"] == 0) & (ev["rep"] == rep)).sum())
        if len(bars) != n:
            fail(f"timeline: {len(bars)} bars in the whole-step panel, the median rep {rep} has {n} events")
        if f"rep {rep} (the median)" not in title(fig):
            fail(f"timeline: title {title(fig)!r} does not name the median rep {rep}")
    return row


def check_overlap_figure(df, ok):
    """Overlap: one line per scheme on more than one rank in every panel; NaN drawn as NaN."""
    from minicp_analysis import plots
    fig = plots.overlap_figure(df, "t")
    check_units(fig, "overlap")
    comm = sorted({at["scheme"] for at, _, _ in ok.values() if int(at["ranks"]) > 1})
    panels = [ax for ax in fig.axes if ax.axison]
    if len(panels) != 6:
        fail(f"overlap: {len(panels)} panels, expected 6")
    notes = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    nan_seen = 0
    for ax, (col, _, _) in zip(panels, plots.OVERLAP_PANELS):
        if labelled(ax) != comm:
            fail(f"overlap {col}: lines {labelled(ax)}, expected one per scheme {comm}")
        for line in ax.lines:
            s = line.get_label()
            if s.startswith("_"):
                continue
            lens = sorted({int(at["seq_len"]) for at, _, _ in ok.values() if int(at["ranks"]) > 1})
            vals = {int(at["seq_len"]): float(su[col]) for at, su, _ in ok.values() if at["scheme"] == s}
            scale = 1e3 if col.endswith("_s") else 1.0
            for L, y in zip(lens, line.get_ydata()):
                v = vals.get(L, math.nan) * scale
                if math.isnan(v) != math.isnan(y) or (not math.isnan(v) and not math.isclose(v, y)):
                    fail(f"overlap {col} {s} S={L}: drawn {y}, the file has {v} (NaN must stay NaN, never 0)")
                if math.isnan(v) and L in vals and col.endswith("overlap"):
                    nan_seen += 1
                    if f"{s} S={L} {col}:" not in notes:
                        fail(f"overlap {col} {s} S={L}: NaN without its note under the plot")
    print(f"overlap: {nan_seen} NaN overlaps drawn as missing with their note")


def check_memory_figure(inputs, df, ok):
    """Memory: a point per rank of every case that ran, one series per scheme."""
    from minicp_analysis import plots
    mem = plots.memory_rows(inputs, df)
    fig = plots.memory_figure(mem, "t")
    check_units(fig, "memory")
    a0 = fig.axes[0]
    points = sum(len(c.get_offsets()) for c in a0.collections)
    exp = sum(len(m) for _, (at, _, m) in ok.items())
    if points != exp:
        fail(f"memory: {points} points, expected one per rank and case ({exp})")
    if labelled(a0) != sorted({at["scheme"] for at, _, _ in ok.values()}):
        fail(f"memory: series {labelled(a0)}")


def check_model_figure(a, df, ok):
    """Model: skipped without predicted_time_s; drawn from a copy of the file that has it.
    Returns whether the file itself has predictions."""
    from minicp_analysis import data, plots
    has_pred = any(np.isfinite(su.get("predicted_time_s", np.nan)) for _, su, _ in ok.values())
    if not has_pred:
        try:
            plots.model_figure(df, "t")
            fail("model: drawn though no case has predicted_time_s")
        except plots.Skip as e:
            if str(e) != "no predicted_time_s in the inputs (run minicp with a calibration table)":
                fail(f"model skipped with {e!r}")
        model_file = os.path.join(a.work, "with_prediction.h5")
        shutil.copy(a.file, model_file)
        with h5py.File(model_file, "r+") as f:  # what the C++ adds (docs: predicted_*), 10% over measured
            for cid in ok:
                s = f["cases"][cid]["summary"].attrs
                s["predicted_time_s"] = s["measured_time_s"] * 1.1
                s["predicted_phase_names"] = "attn,other"
                s["predicted_phase_s"] = np.array([0.3, 0.8]) * s["measured_time_s"]
                s["measured_phase_s"] = np.array([0.25, 0.75]) * s["measured_time_s"]
    else:
        model_file = a.file
    mdf = data.case_table(data.load_inputs([model_file]))
    fig = plots.model_figure(mdf, "t")
    check_units(fig, "model")
    n_pred = int(mdf["predicted_time_s"].notna().sum())
    if sum(len(c.get_offsets()) for c in fig.axes[0].collections if not c.get_label().startswith("_")) != n_pred:
        fail(f"model: not one point per case with predicted_time_s ({n_pred})")
    if not has_pred and f"{n_pred} of {n_pred} cases within ±15%" not in title(fig):
        fail(f"model: title {title(fig)!r}")
    return has_pred


def check_fabric_figure(a, ok):
    """Fabric: two profiles (copies of the file with another fabric) and a fabric table.
    Returns the table's path."""
    from minicp_analysis import data, plots
    tab = os.path.join(a.work, "fabric_study.csv")
    with open(tab, "w") as t:
        t.write("profile,kind,layout,ranks,alpha_us,beta_fit_GBps,beta_best_GBps,file,comm_json\n")
        for k, prof in enumerate(("p-one", "p-two")):
            dst = os.path.join(a.work, f"{prof}_1x2.h5")
            shutil.copy(a.file, dst)
            with h5py.File(dst, "r+") as f:
                f.attrs["fabric"] = prof
            t.write(f"{prof},local,1x2,2,{3 + k},{10 - k},{11 - k},{prof}_1x2.h5,\n")
    fin = data.load_inputs([tab])
    ftable = plots.fabric_table(data.case_table(fin), fin.fabric)
    if len(ftable) != 2 * len(ok) or set(ftable["alpha_us"]) != {3.0, 4.0}:
        fail(f"fabric: {len(ftable)} rows (expected {2 * len(ok)}), alpha {set(ftable['alpha_us'])}")
    fig = plots.fabric_figure(ftable, "t")
    check_units(fig, "fabric")
    lens = sorted({int(at["seq_len"]) for at, _, _ in ok.values()})
    if sum(1 for ax in fig.axes if ax.get_ylabel() == "step time [s]") != len(lens):
        fail(f"fabric: not one step-time panel per seq_len {lens}")
    return tab


def check_plots_command(a, row, has_pred, tab, ok):
    """The command: PNGs written, skips said, the fabric table drawn; bad input refused."""
    out = os.path.join(a.work, "plots")
    shutil.rmtree(out, ignore_errors=True)
    rc, so, err = run_cli(["plots", a.file, "--out", out])
    written = [x.split(" ", 1)[1] for x in so.splitlines() if x.startswith("wrote ")]
    names = sorted(os.path.basename(w) for w in written)
    exp = sorted(["scaling_seq_len.png", f"timeline_{row['case']}.png", "overlap.png", "memory.png"] +
                 (["model.png"] if has_pred else []))
    if rc != 0 or names != exp:
        fail(f"plots: exit {rc}, wrote {names}, expected {exp} ({err})")
    for w in written:
        with open(w, "rb") as fh:
            head = fh.read(8)
        if head != b"\x89PNG\r\n\x1a\n" or os.path.getsize(w) < 10000:
            fail(f"plots: {w} is not a PNG of some size ({os.path.getsize(w)} bytes)")
    for skipped in ("scaling_ranks.png skipped: ", "fabric.png skipped: one fabric profile") + \
            (() if has_pred else ("model.png skipped: no predicted_time_s in the inputs (run minicp with a "
                                  "calibration table)",)):
        if skipped not in so:
            fail(f"plots: no line {skipped!r}")
    rc, so, err = run_cli(["plots", tab, "--out", out, "--only", "fabric"])
    if rc != 0 or not os.path.getsize(os.path.join(out, "fabric.png")) or "p-two" not in so:
        fail(f"plots fabric_study.csv --only fabric: exit {rc}: {so} {err}")
    fcsv = list(csv.DictReader(open(os.path.join(out, "fabric.csv"))))
    if len(fcsv) != 2 * len(ok) or "measured_time_s [s]" not in fcsv[0] or "alpha [us]" not in fcsv[0]:
        fail(f"fabric.csv: {len(fcsv)} rows, columns {list(fcsv[0]) if fcsv else []}")
    expect_bad(["plots", a.file, "--out", out, "--only", "scaling,nosuch"], "--only nosuch", "timeline")
    expect_bad(["plots", a.file, "--out", out, "--case", "nosuch"], "--case nosuch", row["case"])
    expect_bad(["plots", a.file, "--out", out, "--dpi", "x"], "--dpi", "'x'")
    bad_csv = os.path.join(a.work, "other.csv")
    with open(bad_csv, "w") as t:
        t.write("a,b\n1,2\n")
    expect_bad(["plots", bad_csv, "--out", out], "other.csv: neither a study index")


def check_plots(a):
    from minicp_analysis import data
    want = cases(a.file)
    inputs = data.load_inputs([a.file])
    df = data.case_table(inputs)
    ok = {c: v for c, v in want.items() if v[0]["status"] == "ok"}
    check_scaling_figure(df, ok)
    row = check_timeline_figure(a, df)
    check_overlap_figure(df, ok)
    check_memory_figure(inputs, df, ok)
    has_pred = check_model_figure(a, df, ok)
    tab = check_fabric_figure(a, ok)
    check_plots_command(a, row, has_pred, tab, ok)


# ---------------------------------------------------------------------------------------- trace
def check_trace(a):
    want = cases(a.file)
    ring = [c for c, (at, _, _) in want.items() if at["status"] == "ok" and at["scheme"] in ("ring", "zigzag")]
    case = ring[-1]
    with h5py.File(a.file, "r") as f:
        g = f["cases"][case]
        ev, st = g["events"][()], g["steps"][()]
        kinds = text(g["events"].attrs["kind_names"]).split(",")
    ranks = int(want[case][0]["ranks"])
    full = st[st["mode"] == 0]
    slow = sorted((max(full[full["rep"] == r]["step_s"]), r) for r in sorted(set(full["rep"])))
    median = slow[len(slow) // 2][1]
    for extra, rep, mode in (([], median, 0), (["--rep", "0", "--mode", "comm-only"], 0, 2)):
        path = os.path.join(a.work, f"trace_{mode}.json")
        rc, out, err = run_cli(["trace", a.file, "--case", case, "--out", path] + extra)
        if rc != 0:
            fail(f"trace {' '.join(extra)}: exit {rc}: {err}")
            continue
        try:
            t = json.load(open(path))
        except ValueError as e:
            fail(f"trace: not JSON: {e}")
            continue
        evs = t.get("traceEvents")
        if not isinstance(evs, list):
            fail("trace: no traceEvents list")
            continue
        procs = {e["pid"]: e["args"]["name"] for e in evs if e.get("ph") == "M" and e["name"] == "process_name"}
        if procs != {r: f"rank {r}" for r in range(ranks)}:
            fail(f"trace: processes {procs}, expected one per rank named 'rank r'")
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e.get("ph") == "M"
                   and e["name"] == "thread_name"}
        xs = [e for e in evs if e.get("ph") == "X"]
        sel = ev[(ev["rep"] == rep) & (ev["mode"] == mode)]
        if len(xs) != len(sel):
            fail(f"trace mode {mode}: {len(xs)} X events, the events table has {len(sel)} rows for rep {rep}")
        if t.get("otherData", {}).get("rep") != rep:
            fail(f"trace: rep {t.get('otherData', {}).get('rep')}, expected {rep} (the median when not given)")
        by_thread = {}
        for e in xs:
            if not (e["ts"] >= 0 and e["dur"] >= 0):
                fail(f"trace: event with ts {e['ts']} dur {e['dur']}")
                break
            if (e["pid"], e["tid"]) not in threads:
                fail(f"trace: event on pid {e['pid']} tid {e['tid']} without thread_name metadata")
                break
            if not {"step", "bytes", "layer", "pass", "peer", "flops"} <= set(e.get("args", {})):
                fail(f"trace: event args {e.get('args')} lack step, bytes, layer, pass, peer or flops")
                break
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
        for key, es in by_thread.items():  # slices of one thread must not overlap
            es.sort(key=lambda e: e["ts"])
            for p, q in zip(es, es[1:]):
                if q["ts"] < p["ts"] + p["dur"] - 1e-3:
                    fail(f"trace: thread {threads[key]} of rank {key[0]}: {p['name']} and {q['name']} overlap")
                    break
        names = {threads[k] for k in by_thread}
        comm_kinds = {kinds.index(k) for k in kinds if k not in ("compute", "wait", "kernel")}
        is_comm = np.isin(sel["kind"], list(comm_kinds))
        comm_threads = {k for k, n in threads.items() if n.split(" ")[0] in ("comm", "grad")}
        compute_threads = {k for k, n in threads.items() if n == "compute"}
        if mode == 0 and (not comm_threads or not compute_threads or comm_threads & compute_threads):
            fail(f"trace: compute and comm not on separate threads ({sorted(names)})")
        got = sum(e["args"]["bytes"] for e in xs if (e["pid"], e["tid"]) in comm_threads)
        if got != int(sel["bytes"][is_comm].sum()) or got != int(sel["bytes"].sum()) or got <= 0:
            fail(f"trace mode {mode}: comm bytes {got}, the events table has {int(sel['bytes'][is_comm].sum())}")
        steps = {e["args"]["step"] for e in xs if e["cat"] == "compute" and e["name"].startswith("attention")}
        if mode == 0 and not steps >= {0, 1}:
            fail(f"trace: attention events carry steps {steps}, expected the ring steps 0 and 1")
    expect_bad(["trace", a.file, "--case", case, "--rep", "99"], "--rep 99", "reps: 0")
    expect_bad(["trace", a.file, "--case", case, "--mode", "half"], "--mode", "'half'")
    expect_bad(["trace", a.file, "--case", "nosuch"], "--case nosuch", case)
    refused = [c for c, (at, _, _) in want.items() if at["status"] != "ok"]
    if refused:
        expect_bad(["trace", a.file, "--case", refused[0]], f"--case {refused[0]}", "did not run")
    expect_bad(["trace", a.file], "--case")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["report", "plots", "trace"])
    ap.add_argument("--file", required=True, help="a results file written by minicp")
    ap.add_argument("--analysis", required=True, help="the analysis/ folder (holds minicp_analysis)")
    ap.add_argument("--work", required=True, help="scratch folder (made)")
    ap.add_argument("--wrapper", help="build/bin/minicp-report, run as a user would")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.analysis))
    os.makedirs(a.work, exist_ok=True)
    {"report": check_report, "plots": check_plots, "trace": check_trace}[a.what](a)
    return verdict(a.what)


if __name__ == "__main__":
    sys.exit(main())
