"""The plots. Each `*_figure` function builds and returns matplotlib Figures (Agg, no window)
or raises Skip with the reason; `run` decides which the inputs allow, saves them as PNGs and
prints one line per file written or plot skipped."""
import math
import os
import textwrap
import zlib

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from . import UsageError  # noqa: E402
from .data import (case_table, default_timeline_case, load_inputs, median_rep, registry_of,  # noqa: E402
                   table_registry, TRACKS, lanes, listing, mode_code, names, ok_cases, open_case, read_events, text)
from .outputs import OVERWRITE, check_not_input, check_regular, input_files, write_whole  # noqa: E402
from .report import split_values  # noqa: E402

PLOTS = ("scaling", "timeline", "overlap", "memory", "fabric", "model")
PALETTE = matplotlib.colormaps["tab10"].colors
RANK_MARKERS = "os^vD<>ph*"
STYLES = ("-", "--", ":", "-.")
PASS_MARKERS = {"train": "o", "prefill": "s", "decode": "^"}
MODEL_BAND = 0.15  # the model's agreement goal: predicted within ±15% of measured
MIB = 2.0 ** 20


class Skip(Exception):
    """A plot the inputs do not allow; the message says why."""


def color(scheme, registry):
    """One colour per scheme, the same in every plot of the inputs: by its place in the
    inputs' registry (data.Registry); a scheme it does not know by a checksum of its name (the
    same from run to run, unlike hash())."""
    i = registry.schemes.index(scheme) if scheme in registry.schemes else zlib.crc32(scheme.encode())
    return PALETTE[i % len(PALETTE)]


def series_order(labels, registry):
    """The (scheme, pass) keys of series_labels in the registry's scheme order."""
    return sorted(labels, key=lambda k: (registry.key(k[0]), k))


def series_labels(df):
    """Label of each (scheme, pass): the scheme, or `scheme (pass)` where a scheme runs in
    several passes of the data."""
    passes = df.groupby("scheme")["pass"].nunique()
    return {(s, p): (s if passes[s] == 1 else f"{s} ({p})") for s, p in df[["scheme", "pass"]].drop_duplicates().values}


def describe(df, paths=None):
    """The inputs as a title names them: one file (with its name in the study, if any) and
    its deck; several: the study table given, or the number of files, and the decks."""
    srcs = df[["file", "source"]].drop_duplicates()
    decks = sorted(set(d for d in df.get("deck", pd.Series(dtype=str)).dropna() if d))
    deck = f", deck {', '.join(decks)}" if decks else ""
    if len(srcs) == 1:
        name = os.path.basename(srcs.iloc[0]["file"])
        label = srcs.iloc[0]["source"]
        return f"{name if label == os.path.splitext(name)[0] else f'{label} ({name})'}{deck}"
    tables = [os.path.basename(p) for p in paths or [] if p.lower().endswith(".csv")]
    return f"{' + '.join(tables) + ': ' if tables else ''}{len(srcs)} results files{deck}"


def _title(fig, text):
    """The figure's title, wrapped to the figure's width."""
    fig.suptitle(textwrap.fill(text, int(fig.get_figwidth() * 9)))


def source_title(inputs, i, d):
    """The title of one source's plots: its file and deck, or its path when it holds no case."""
    s = inputs.sources[i]
    return describe(d) if not d.empty else f"{s.label} ({s.shown})" if s.label not in s.shown else s.shown


def _new(rows, cols, width, height):
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def _empty(ax, message):
    ax.text(0.5, 0.5, message, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.4", wrap=True)


# ---------------------------------------------------------------------------------- scaling
def cp_column(df):
    """The CP efficiency to show: the measured one where it exists, else the core-scaled one
    (`none` on 1 rank with the scheme's total cores: docs/figures-of-merit.md)."""
    for col, label in (("cp_efficiency", "CP efficiency [-]"),
                       ("cp_efficiency_core_scaled", "CP efficiency, core-scaled [-]")):
        if col in df and df[col].notna().any():
            return col, label
    return None, "CP efficiency [-]"


def scaling_seq_len_figure(df, title):
    """Step time and CP efficiency against seq_len, one line per scheme, a row per pass."""
    reg = table_registry(df)
    df = ok_cases(df).dropna(subset=["measured_time_s"])
    if df.empty:
        raise Skip(f"no case that ran in {title}")
    if df["seq_len"].nunique() < 2:
        raise Skip(f"one seq_len ({', '.join(map(str, sorted(df['seq_len'].unique())))}) in {title}")
    passes = [p for p in ("train", "prefill", "decode") if p in set(df["pass"])]
    cp_col, cp_label = cp_column(df)
    fig, axes = _new(len(passes), 2 if cp_col else 1, 12 if cp_col else 7, 3.6 * len(passes) + 0.6)
    for row, p in zip(axes, passes):
        d = df[df["pass"] == p]
        for scheme in reg.in_order(d["scheme"]):
            s = d[d["scheme"] == scheme].groupby("seq_len", as_index=False).median(numeric_only=True)
            ranks = "/".join(str(int(r)) for r in sorted(s["ranks"].unique()))
            row[0].plot(s["seq_len"], s["measured_time_s"], "o-", color=color(scheme, reg), label=scheme)
            if cp_col and s[cp_col].notna().any():
                row[1].plot(s["seq_len"], s[cp_col], "o-", color=color(scheme, reg), label=f"{scheme} (P={ranks})")
        row[0].set_ylabel("step time [s]")
        row[0].set_title(f"{p}: step time (median rep, slowest rank)", fontsize=10)
        if cp_col:
            row[1].set_ylabel(cp_label)
            row[1].set_title(f"{p}: CP efficiency" + (" (`none` on 1 rank with the same cores against the scheme)"
                                                      if cp_col == "cp_efficiency_core_scaled" else ""), fontsize=10)
            if not row[1].lines:
                _empty(row[1], "no CP efficiency: no `none` case of this pass to compare with")
        for ax in row:
            ax.set_xlabel("seq_len [tokens]")
            ax.set_xticks(sorted(d["seq_len"].unique()))
            ax.set_xlim(row[0].get_xlim())
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    note = "" if cp_col else " (no CP efficiency: no `none` case in the file)"
    _title(fig, f"{title}: scaling with sequence length{note}")
    return fig


def _efficiency(s, xcol):
    """Parallel efficiency of a series against its smallest rank count: strong scaling (one
    seq_len) T0 P0 / (T P); weak (seq_len per rank constant) T0 / T; else NaN."""
    s = s.sort_values("ranks")
    t0, p0, n0 = s["measured_time_s"].iloc[0], s["ranks"].iloc[0], s["seq_len"].iloc[0]
    if s["seq_len"].nunique() == 1:
        return t0 * p0 / (s["measured_time_s"] * s["ranks"]), "strong"
    if np.allclose(s["seq_len"] / s["ranks"], n0 / p0):
        return t0 / s["measured_time_s"], "weak"
    return pd.Series(np.nan, index=s.index), ""


def scaling_count_figure(df, xcol, title):
    """Step time, CP efficiency (where the inputs have it) and parallel efficiency against
    ranks (at one node count) or nodes (at one number of ranks per node): one line per scheme
    and series (the study's scaling, else the seq_len), a row per fabric profile."""
    reg = table_registry(df)
    df = ok_cases(df).dropna(subset=["measured_time_s"])
    df["series"] = df["scaling"].fillna("") if "scaling" in df and df["scaling"].notna().any() else \
        "S=" + df["seq_len"].astype(str)
    fixed, unit = ("nodes", "node(s)") if xcol == "ranks" else ("per_node", "rank(s)/node")
    df["per_node"] = df["world_ranks"] // df["nodes"].clip(lower=1)
    cp_cols = [c for c in ("cp_efficiency", "cp_efficiency_core_scaled") if c in df]
    lines = []
    for key, s in df.groupby(["fabric", "scheme", "pass", "series", fixed], sort=False):
        s = s.groupby(xcol, as_index=False).agg({"measured_time_s": "median", "ranks": "first", "seq_len": "first",
                                                 **{c: "median" for c in cp_cols}})
        if len(s) >= 2:
            lines.append((key, s.sort_values(xcol)))
    if not lines:
        raise Skip(f"no scheme with several {xcol[:-1]} counts" +
                   (" at one node count" if xcol == "ranks" else " at one number of ranks per node"))
    fabrics = list(dict.fromkeys(k[0] for k, _ in lines))
    all_series = sorted(set(k[3] for k, _ in lines))
    several_fixed = len(set(k[4] for k, _ in lines)) > 1
    labels = series_labels(df)
    cp_col, cp_label = cp_column(pd.concat([s for _, s in lines]))
    panels = ["time"] + (["cp"] if cp_col else []) + ["eff"]
    fig, axes = _new(len(fabrics), len(panels), 5 * len(panels), 3.6 * len(fabrics) + 0.6)
    for row, fab in zip(axes, fabrics):
        ax = dict(zip(panels, row))
        for (f, scheme, p, series, fix), s in lines:
            if f != fab:
                continue
            label = " ".join(x for x in (labels[(scheme, p)], series,
                                         f"{fix} {unit}" if several_fixed else "") if x)
            kw = dict(color=color(scheme, reg), ls=STYLES[all_series.index(series) % len(STYLES)], marker="o")
            ax["time"].plot(s[xcol], s["measured_time_s"], label=label, **kw)
            if cp_col and s[cp_col].notna().any():
                ax["cp"].plot(s[xcol], s[cp_col], label=label, **kw)
            eff, kind = _efficiency(s, xcol)
            if eff.notna().any():
                ax["eff"].plot(s[xcol], eff, label=label if kind in label.split() else f"{label} ({kind})", **kw)
        where = f" ({fab})" if len(fabrics) > 1 else ""
        ax["time"].set_ylabel("step time [s]")
        ax["time"].set_title(f"step time{where}", fontsize=10)
        if cp_col:
            ax["cp"].set_ylabel(cp_label)
            ax["cp"].set_title(f"CP efficiency{where}", fontsize=10)
        ax["eff"].set_ylabel("parallel efficiency [-]")
        ax["eff"].set_title(f"against the smallest {xcol[:-1]} count{where}", fontsize=10)
        if not ax["eff"].lines:
            _empty(ax["eff"], "neither strong (one seq_len) nor weak\n(seq_len per rank constant) scaling")
        xs = sorted(set(x for (f, *_), s in lines if f == fab for x in s[xcol]))
        for a in row:
            a.set_xlabel(f"{xcol} [count]")
            a.set_xticks(xs)
            a.grid(alpha=0.3)
            if a.lines:
                a.legend(fontsize=7)
    note = "" if cp_col else " (no CP efficiency: no `none` case in the inputs)"
    _title(fig, f"{title}: scaling with the number of {xcol}{note}")
    return fig


# --------------------------------------------------------------------------------- timeline
COMM_COLORS = {"sendrecv": "tab:blue", "alltoall": "tab:cyan", "alltoallv": "tab:cyan", "allgather": "tab:olive",
               "reduce_scatter": "tab:pink", "allreduce": "tab:purple", "barrier": "0.3"}
def _draw_tracks(ax, ev, rows, step_color, window):
    """Bars of each rank's tracks in `window` (ms); overlapping calls of one track sit in
    thinner lanes; the ring step is written on the bars wide enough to hold it."""
    lo, hi = window
    width = hi - lo
    ev = ev[(ev["e"] >= lo) & (ev["b"] <= hi)]
    yticks, ylabels = [], []
    for i, r in enumerate(sorted(set(ev["rank"]) | set(rows.keys()))):
        for j, row in enumerate(rows[r]):
            y = -(i * (len(rows[r]) + 0.6) + j)
            yticks.append(y)
            ylabels.append(f"rank {r} {row}")
            sel = ev[(ev["rank"] == r) & (ev["track"] == row)]
            if sel.empty:
                continue
            lane_of = lanes(zip(sel["b"], sel["e"]))
            h = 0.8 / (max(lane_of) + 1)
            for rw, lane in zip(sel.itertuples(index=False), lane_of):
                if row == "compute":
                    c = step_color[rw.step] if rw.kind_name == "compute" and rw.step >= 0 else "0.75"
                else:
                    c = "tab:red" if row == "wait" else COMM_COLORS.get(rw.kind_name, "tab:gray")
                yb = y - 0.4 + lane * h
                ax.broken_barh([(rw.b, max(rw.e - rw.b, width * 2e-4))], (yb, h * 0.95), facecolors=c,
                               edgecolor="none")
                if rw.step >= 0 and rw.kind_name != "kernel" and row in ("compute", "comm") and rw.e - rw.b > width * 0.015 and h > 0.3:
                    ax.text((max(rw.b, lo) + min(rw.e, hi)) / 2, yb + h * 0.47, str(rw.step), ha="center",
                            va="center", fontsize=7, color="white" if row == "compute" else "black")
    ax.set_yticks(yticks, ylabels, fontsize=8)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("time from the rep's first event [ms] (rank 0's aligned clock)")
    ax.set_ylabel("rank and track")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)


def _zoom_window(ev):
    """The (layer, pass) whose ring steps take longest: its window, padded, and its name."""
    steps = ev[(ev["kind_name"] == "compute") | (ev["track"] == "comm")]
    steps = steps[steps["layer"] >= 0]
    if steps.empty or (ev["step"] < 0).all():
        return None, ""
    spans = steps.groupby(["layer", "pass_name"]).agg(b=("b", "min"), e=("e", "max"))
    (layer, p), w = max(spans.iterrows(), key=lambda kv: kv[1]["e"] - kv[1]["b"])
    pad = 0.08 * (w["e"] - w["b"])
    return (w["b"] - pad, w["e"] + pad), f"layer {layer} {p}"


def timeline_figure(path, case, title, mode="full"):
    """Per-rank timeline of one rep (the median) of one case on rank 0's aligned clock: the
    whole step, and below it the attention of the layer and pass whose ring steps take
    longest. Compute (attention blocks coloured by ring step, other kernels grey), the
    communicator calls (posted to complete) and the time blocked in waits: comm under compute
    is hidden; a wait bar is comm that was not."""
    f, g = open_case(path, case)
    with f:
        code = mode_code(g, mode)
        rep = median_rep(g, code)
        ev = read_events(g)
        word = "ring step" if text(g.attrs.get("scheme", "")) in registry_of(f).ring_family else "step"
    ev = ev[(ev["mode"] == code) & (ev["rep"] == rep)]
    t0 = ev["t_begin"].min()
    ev = ev.assign(b=(ev["t_begin"] - t0) * 1e3, e=(ev["t_end"] - t0) * 1e3)
    ranks = sorted(ev["rank"].unique())
    present = [t for t in TRACKS if t in set(ev["track"])]
    rows = {r: present for r in ranks}
    steps = sorted(s for s in ev.loc[ev["kind_name"] == "compute", "step"].unique() if s >= 0)
    step_color = {s: matplotlib.colormaps["viridis"](0.1 + 0.75 * i / max(len(steps) - 1, 1))
                  for i, s in enumerate(steps)}
    zoom, zoom_name = _zoom_window(ev)
    per_panel = 0.45 * len(ranks) * len(present) + 0.9
    fig = Figure(figsize=(15, per_panel * (2 if zoom else 1) + 0.6), layout="constrained")
    axes = fig.subplots(2 if zoom else 1, 1, squeeze=False)[:, 0]
    span = (0.0, float(ev["e"].max()) * 1.005)
    _draw_tracks(axes[0], ev, rows, step_color, span)
    axes[0].set_title("the whole step (dotted: first event of each layer and pass on rank 0)", fontsize=9)
    first = ev[(ev["rank"] == ranks[0]) & (ev["layer"] >= 0)].groupby(["layer", "pass_name"], sort=False)["b"].min()
    trans = blended_transform_factory(axes[0].transData, axes[0].transAxes)
    for (layer, p), b in first.items():
        axes[0].axvline(b, color="0.4", lw=0.7, ls=":")
        axes[0].text(b, 0.995, f" L{layer} {'fwd' if p == 'forward' else 'bwd' if p == 'backward' else p}",
                     transform=trans, fontsize=7, va="top", color="0.25")
    if zoom:
        _draw_tracks(axes[1], ev, rows, step_color, zoom)
        axes[1].set_title(f"zoom: the attention of {zoom_name} (numbers: {word})", fontsize=9)
        axes[0].axvspan(*zoom, color="gold", alpha=0.25, zorder=0)
    kinds_present = [k for k in COMM_COLORS if k in set(ev["kind_name"])]
    handles = [Patch(color=step_color[s], label=f"attention, {word} {s}") for s in steps] + \
              [Patch(color="0.75", label="other kernels (norm, qkv, mlp...)")] + \
              [Patch(color=COMM_COLORS[k], label=f"{k}, posted to complete") for k in kinds_present] + \
              [Patch(color="tab:red", label="blocked in wait (exposed)") for _ in ["wait"] if "wait" in present]
    if zoom:
        handles.append(Patch(color="gold", alpha=0.25, label="zoomed below"))
    axes[0].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    _title(fig, f"{title}: {case}, rep {rep} (the median), {mode} mode")
    return fig


# ---------------------------------------------------------------------------------- overlap
OVERLAP_PANELS = (("overlap", "overlap, whole step [-]", True), ("attn_overlap", "overlap, attention [-]", True),
                  ("grad_allreduce_overlap", "overlap, gradient all-reduce [-]", True),
                  ("exposed_comm_s", "exposed comm, whole step [ms]", False),
                  ("attn_exposed_comm_s", "exposed comm, attention [ms]", False),
                  ("imbalance", "load imbalance, max/mean compute [-]", False))


# The bytes behind each overlap: NaN with none sent is "no such communication".
OVERLAP_BYTES = {"overlap": "bytes_sent_per_rank", "attn_overlap": "attn_bytes_sent_per_rank",
                 "grad_allreduce_overlap": "grad_allreduce_bytes_per_rank"}


def _nan_notes(df, keys, labels, lens):
    """`ring S=2048 overlap: <its note>` for each overlap that is NaN, in panel order."""
    out = []
    for col, _, quartiles in OVERLAP_PANELS:
        if not quartiles:
            continue
        for key in keys:
            d = df[(df["scheme"] == key[0]) & (df["pass"] == key[1])].groupby("seq_len").first().reindex(lens)
            for s in lens:
                if col in d and np.isnan(float(d.loc[s, col])) and not np.isnan(float(d.loc[s, "measured_time_s"])):
                    note = d.loc[s, f"{col}_note"] if f"{col}_note" in d else ""
                    if not (isinstance(note, str) and note):
                        sent = d.loc[s, OVERLAP_BYTES[col]] if OVERLAP_BYTES[col] in d else math.nan
                        note = "no such communication (0 bytes)" if sent == 0 else "no note in the file"
                    out.append(f"{labels[key]} S={s} {col}: {note}")
    return out


def overlap_figure(df, title):
    """Overlap (whole step, attention, gradient all-reduce) with its quartiles, exposed comm
    and imbalance per scheme against seq_len. A NaN figure is a grey x at the top of its
    panel, with its note below the plot; never a 0."""
    reg = table_registry(df)
    df = ok_cases(df)
    if df.empty:
        raise Skip(f"no case that ran in {title}")
    df = df[df["ranks"] > 1]
    if df.empty:
        raise Skip(f"no case on more than one rank (no communication) in {title}")
    lens = sorted(df["seq_len"].unique())
    labels = series_labels(df)
    keys = series_order(labels, reg)
    notes = _nan_notes(df, keys, labels, lens)
    columns = 1 if len(notes) <= 6 else 2
    per_column = -(-len(notes) // columns)
    note_h = 0.14 * per_column + 0.3 if notes else 0
    fig = Figure(figsize=(15, 7.5 + note_h), layout="constrained")
    grid = fig.add_gridspec(3 if notes else 2, 3, height_ratios=[3.6, 3.6] + ([note_h] if notes else []))
    axes = [fig.add_subplot(grid[i // 3, i % 3]) for i in range(6)]
    for ax, (col, ylabel, quartiles) in zip(axes, OVERLAP_PANELS):
        trans = blended_transform_factory(ax.transData, ax.transAxes)
        for i, key in enumerate(keys):
            d = df[(df["scheme"] == key[0]) & (df["pass"] == key[1])].groupby("seq_len").first().reindex(lens)
            x = np.arange(len(lens)) + (i - (len(keys) - 1) / 2) * 0.6 / max(len(keys), 1)
            scale = 1e3 if col.endswith("_s") else 1.0
            y = d[col].to_numpy(dtype=float) * scale if col in d else np.full(len(lens), np.nan)
            ax.plot(x, y, "o-", color=color(key[0], reg), label=labels[key], ms=4)
            if quartiles and f"{col}_q1" in d:
                q1, q3 = d[f"{col}_q1"].to_numpy(dtype=float), d[f"{col}_q3"].to_numpy(dtype=float)
                ok = ~(np.isnan(q1) | np.isnan(q3))
                ax.vlines(x[ok], q1[ok], q3[ok], color=color(key[0], reg), lw=1.2, alpha=0.7)
            missing = np.isnan(y) & ~np.isnan(d["measured_time_s"].to_numpy(dtype=float))
            ax.plot(x[missing], np.full(missing.sum(), 0.97), "x", color="black", ms=7, transform=trans,
                    label="_nan")
        if quartiles:
            ax.axhspan(0, 1, color="0.93", zorder=0)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xticks(range(len(lens)), [str(s) for s in lens])
        ax.set_xlabel("seq_len [tokens]")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=color(k[0], reg), marker="o", label=labels[k]) for k in keys]
    handles.append(Line2D([], [], color="0.3", lw=1.2, label="Q1-Q3 over the reps"))
    handles.append(Patch(color="0.93", label="the range [0, 1]"))
    handles.append(Line2D([], [], color="black", marker="x", ls="", label="NaN: not measured\n(why: below)"))
    axes[2].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    if notes:
        ax = fig.add_subplot(grid[2, :])
        ax.axis("off")
        for j in range(columns):
            part = notes[j * per_column:(j + 1) * per_column]
            ax.text(0.5 * j, 1.0, "\n".join(textwrap.shorten(n, 220 // columns) for n in part),
                    transform=ax.transAxes, fontsize=7, va="top", family="monospace")
    _title(fig, f"{title}: overlap, exposed communication and load imbalance (median rep, slowest rank)")
    return fig


# ----------------------------------------------------------------------------------- memory
def memory_rows(inputs, df):
    """One row per (case, rank): the Kokkos high-water mark and the model's prediction."""
    import h5py
    rows = []
    for _, c in ok_cases(df).iterrows():
        s = inputs.sources[int(c["src"])]
        with h5py.File(s.path, "r") as f:
            g = f["cases"][c["case"]]
            if "memory" not in g:
                continue
            for m in g["memory"][()]:
                rows.append({"source": c["source"], "case": c["case"], "scheme": c["scheme"], "pass": c["pass"],
                             "seq_len": c["seq_len"], "ranks": c["ranks"], "rank": int(m["rank"]),
                             "measured": float(m["kokkos_peak_bytes"]), "predicted": float(m["predicted_bytes"])})
    mem = pd.DataFrame(rows)
    mem.attrs["registry"] = table_registry(df)
    return mem


def memory_figure(mem, title, several_sources=False):
    """Measured Kokkos high-water mark against the memory model, per rank and case: measured
    against predicted (with the line where they agree), and the difference per case."""
    reg = table_registry(mem)
    mem = mem[(mem["predicted"] > 0) & (mem["measured"] > 0)] if not mem.empty else mem
    if mem.empty:
        raise Skip("no memory table with a prediction in the inputs")
    cases = list(dict.fromkeys(zip(mem["source"], mem["case"])))
    fig = Figure(figsize=(min(15 + 0.1 * max(len(cases) - 40, 0), 30), 6.5), layout="constrained")
    a, b = fig.subplots(1, 2, width_ratios=(1, 2))
    pos = {k: i for i, k in enumerate(cases)}
    for scheme in reg.in_order(mem["scheme"]):
        d = mem[mem["scheme"] == scheme]
        first = True
        for r in sorted(d["rank"].unique()):
            dr = d[d["rank"] == r]
            kw = dict(color=color(scheme, reg), marker=RANK_MARKERS[r % len(RANK_MARKERS)], s=22,
                      label=scheme if first else "_rank")
            a.scatter(dr["predicted"] / MIB, dr["measured"] / MIB, **kw)
            x = [pos[k] for k in zip(dr["source"], dr["case"])]
            b.scatter(x, (dr["measured"] - dr["predicted"]) / dr["predicted"] * 100, **kw)
            first = False
    lo, hi = (min(mem["predicted"].min(), mem["measured"].min()) / MIB * 0.8,
              max(mem["predicted"].max(), mem["measured"].max()) / MIB * 1.25)
    a.plot([lo, hi], [lo, hi], color="0.3", lw=0.8, label="_agree")
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("predicted by the memory model [MiB]")
    a.set_ylabel("measured Kokkos high-water mark [MiB]")
    a.set_title("per rank and case (line: agreement)", fontsize=10)
    dev = (mem["measured"] - mem["predicted"]) / mem["predicted"] * 100
    lim = max(1.0, 1.25 * float(dev.abs().max()))
    b.set_ylim(-lim, lim)
    b.axhline(0, color="0.3", lw=0.8)
    for y in (-15, 15):
        if abs(y) < lim:
            b.axhline(y, color="tab:red", lw=0.8, ls="--")
    ticks = [c if not several_sources else f"{s}: {c.split('_', 1)[-1]}" for s, c in cases]
    step = -(-len(ticks) // 120)
    b.set_xticks(range(0, len(ticks), step), ticks[::step], rotation=90, fontsize=6)
    b.set_xlabel("case")
    b.set_ylabel("(measured - predicted) / predicted [%]")
    inside = int((dev.abs() <= 15).sum())
    b.set_title(f"difference per case and rank: {inside} of {len(dev)} within the tests' bound of ±15% "
                f"(the model predicts the rank that holds most)", fontsize=10)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    ranks = sorted(mem["rank"].unique())
    handles = [Line2D([], [], color=color(s, reg), marker="o", ls="", label=s) for s in reg.in_order(mem["scheme"])]
    handles += [Line2D([], [], color="0.3", marker=RANK_MARKERS[r % len(RANK_MARKERS)], ls="", label=f"rank {r}")
                for r in ranks[:len(RANK_MARKERS)]]
    b.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    _title(fig, f"{title}: memory, measured against the model")
    return fig


# ----------------------------------------------------------------------------------- fabric
FABRIC_COLUMNS = ["fabric", "layout", "ranks", "nodes", "scheme", "pass", "seq_len", "measured_time_s",
                  "exposed_comm_s", "tokens_per_s", "alpha_us", "beta_fit_GBps", "beta_best_GBps"]
FABRIC_HEADERS = {"measured_time_s": "measured_time_s [s]", "exposed_comm_s": "exposed_comm_s [s]",
                  "tokens_per_s": "tokens_per_s [tokens/s]", "seq_len": "seq_len [tokens]",
                  "alpha_us": "alpha [us]", "beta_fit_GBps": "beta_fit [GB/s]", "beta_best_GBps": "beta_best [GB/s]"}


def fabric_table(df, fabric):
    """Step time per scheme per fabric profile and layout, with alpha and beta from the
    fabric study table where given."""
    d = ok_cases(df)
    d = d.assign(config=d["fabric"] + " " + d["layout"])
    if d["fabric"].nunique() < 2:
        raise Skip(f"one fabric profile in the inputs ({', '.join(d['fabric'].unique()) or 'none'}); "
                   f"give several profiles' files or the fabric study .csv")
    if fabric is not None:
        ab = fabric[["profile", "layout", "alpha_us", "beta_fit_GBps", "beta_best_GBps"]].rename(
            columns={"profile": "fabric"})
        d = d.merge(ab, on=["fabric", "layout"], how="left")
    for c in ("alpha_us", "beta_fit_GBps", "beta_best_GBps"):
        if c not in d:
            d[c] = np.nan
    out = d[FABRIC_COLUMNS + ["config"]]
    out.attrs["registry"] = table_registry(df)  # merge drops it
    return out


def _log_if_wide(ax, values, ratio=10):
    """A log y axis where the values span more than `ratio` (one outlier would flatten the rest)."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    v = v[v > 0]
    if len(v) and v.max() / v.min() > ratio:
        ax.set_yscale("log")


def fabric_figure(table, title):
    reg = table_registry(table)
    configs = list(dict.fromkeys(table["config"]))
    lens = sorted(table["seq_len"].unique())
    has_ab = table["alpha_us"].notna().any()
    n = len(lens) + (2 if has_ab else 0)
    fig = Figure(figsize=(max(10, 1.1 * len(configs) + 3), 2.9 * n + 0.8), layout="constrained")
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    schemes = reg.in_order(table["scheme"])
    w = 0.8 / len(schemes)
    x = np.arange(len(configs))
    for ax, s in zip(axes, lens):
        d = table[table["seq_len"] == s]
        for i, scheme in enumerate(schemes):
            v = d[d["scheme"] == scheme].groupby("config")["measured_time_s"].median().reindex(configs)
            ax.bar(x + (i - (len(schemes) - 1) / 2) * w, v.to_numpy(dtype=float), w, color=color(scheme, reg),
                   label=scheme)
        ax.set_ylabel("step time [s]")
        _log_if_wide(ax, d["measured_time_s"])
        ax.set_title(f"S = {s} tokens: step time per scheme (median rep, slowest rank)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncol=len(schemes))
    if has_ab:
        ab = table.groupby("config")[["alpha_us", "beta_fit_GBps", "beta_best_GBps"]].first().reindex(configs)
        axa, axb = axes[-2], axes[-1]
        axa.bar(x, ab["alpha_us"], 0.5, color="tab:gray", label="alpha (smallest message, half round trip)")
        axa.set_yscale("log")
        axa.set_ylabel("latency alpha [µs]")
        axa.legend(fontsize=8)
        axb.bar(x - 0.15, ab["beta_fit_GBps"], 0.3, color="tab:blue", label="beta (fit, messages >= 64 KiB)")
        axb.bar(x + 0.15, ab["beta_best_GBps"], 0.3, color="tab:orange", label="best measured bandwidth")
        axb.set_ylabel("bandwidth beta [GB/s]")
        _log_if_wide(axb, pd.concat([ab["beta_fit_GBps"], ab["beta_best_GBps"]]))
        axb.legend(fontsize=8)
        for ax in (axa, axb):
            ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xticks(x, configs, rotation=30, ha="right")
    axes[-1].set_xlabel("fabric profile and layout (nodes x ranks per node)")
    _title(fig, f"{title}: fabric comparison")
    return fig


def fabric_text(table):
    """The printed comparison: step time [s] per profile and layout (rows) and scheme, S."""
    p = table.pivot_table(index=["fabric", "layout"], columns=["scheme", "seq_len"], values="measured_time_s",
                          aggfunc="median", sort=False)
    p.columns = [f"{s} S={n} [s]" for s, n in p.columns]
    ab = table.groupby(["fabric", "layout"], sort=False)[["alpha_us", "beta_fit_GBps"]].first()
    if ab["alpha_us"].notna().any():
        p["alpha [us]"] = ab["alpha_us"]
        p["beta_fit [GB/s]"] = ab["beta_fit_GBps"]
    with pd.option_context("display.width", 10000, "display.max_columns", None, "display.max_rows", None):
        return p.to_string(float_format=lambda v: f"{v:.4g}")


# ------------------------------------------------------------------------------------ model
def model_figure(df, title):
    """Predicted against measured step time (band: ±15%), the ratio per seq_len and, where
    the file has them, per phase."""
    reg = table_registry(df)
    d = ok_cases(df).dropna(subset=["predicted_time_s", "measured_time_s"])
    if d.empty:
        raise Skip("no predicted_time_s in the inputs (run minicp with a calibration table)")
    phases = "predicted_phase_s" in d and d["predicted_phase_s"].map(lambda v: isinstance(v, np.ndarray)).any()
    fig = Figure(figsize=(16 if phases else 12, 5.5), layout="constrained")
    axes = fig.subplots(1, 3 if phases else 2)
    a, b = axes[0], axes[1]
    labels = series_labels(d)
    keys = series_order(labels, reg)
    for key in keys:
        s = d[(d["scheme"] == key[0]) & (d["pass"] == key[1])].sort_values("seq_len")
        m = PASS_MARKERS.get(key[1], "o")
        a.scatter(s["measured_time_s"], s["predicted_time_s"], color=color(key[0], reg), marker=m, label=labels[key],
                  s=24)
        b.plot(s["seq_len"], s["predicted_ratio"], marker=m, color=color(key[0], reg), label=labels[key])
    lo = min(d["measured_time_s"].min(), d["predicted_time_s"].min()) * 0.7
    hi = max(d["measured_time_s"].max(), d["predicted_time_s"].max()) * 1.4
    xs = np.geomspace(lo, hi, 50)
    a.plot(xs, xs, color="0.3", lw=0.8, label="_agree")
    a.fill_between(xs, xs * (1 - MODEL_BAND), xs * (1 + MODEL_BAND), color="0.9", zorder=0, label="_band")
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("measured step time [s]")
    a.set_ylabel("predicted step time [s]")
    a.set_title("per case (band: ±15%)", fontsize=10)
    b.axhspan(1 - MODEL_BAND, 1 + MODEL_BAND, color="0.9", zorder=0)
    b.axhline(1, color="0.3", lw=0.8)
    b.set_xlabel("seq_len [tokens]")
    b.set_xticks(sorted(d["seq_len"].unique()))
    b.set_ylabel("predicted / measured [-]")
    b.set_title("ratio per scheme (band: ±15%)", fontsize=10)
    if phases:
        c = axes[2]
        pn = None
        for _, r in d.iterrows():
            pred, meas = r.get("predicted_phase_s"), r.get("measured_phase_s")
            if not isinstance(pred, np.ndarray) or not isinstance(meas, np.ndarray) or len(pred) != len(meas):
                continue
            pn = names(r.get("predicted_phase_names")) or [str(i) for i in range(len(pred))]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(meas > 0, pred / meas, np.nan)
            jitter = (keys.index((r["scheme"], r["pass"])) - (len(keys) - 1) / 2) * 0.5 / max(len(keys), 1)
            c.scatter(np.arange(len(pred)) + jitter, ratio, color=color(r["scheme"], reg), s=14, label="_phase")
        if pn:
            c.set_xticks(range(len(pn)), pn, rotation=45, ha="right")
        c.axhspan(1 - MODEL_BAND, 1 + MODEL_BAND, color="0.9", zorder=0)
        c.axhline(1, color="0.3", lw=0.8)
        c.set_xlabel("phase")
        c.set_ylabel("predicted / measured [-]")
        c.set_title("per phase (each point: one case)", fontsize=10)
    for ax in axes:
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    inside = int(((d["predicted_ratio"] - 1).abs() <= MODEL_BAND).sum())
    _title(fig, f"{title}: model against measurement, {inside} of {len(d)} cases within ±15%")
    return fig


# -------------------------------------------------------------------------------------- run
def _say_saved(fig, out, name, dpi):
    path = os.path.join(out, name)
    write_whole("--out", path, lambda fh: fig.savefig(fh, dpi=dpi, format="png"), binary=True)
    print(f"wrote {path}")


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FABRIC_CSV = "fabric.csv"


def _own_entry(folder, name):
    """Whether an entry of the plots folder is a file this command writes: a PNG, or the
    fabric comparison table."""
    path = os.path.join(folder, name)
    if name.startswith(".") and name.endswith(".tmp"):  # a temporary of an interrupted write
        return True
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if name == FABRIC_CSV:
        want = ",".join(FABRIC_HEADERS.get(c, c) for c in FABRIC_COLUMNS)
        return head.split(b"\n", 1)[0].decode(errors="replace").rstrip("\r") == want
    return name.endswith(".png") and head.startswith(PNG_MAGIC)


def check_out_folder(out, names, inputs, overwrite):
    """Refuses a plots folder that is a file, that holds (without --overwrite) anything this
    command does not write, or where a file it would write is one of the inputs or (even with
    --overwrite) not a regular file."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out}: exists and is not a directory (give a folder for the PNGs)")
    for name in names:
        check_not_input("--out", os.path.join(out, name), inputs)
        check_regular("--out", os.path.join(out, name))
    if overwrite or not os.path.isdir(out):
        return
    foreign = sorted(n for n in os.listdir(out) if not _own_entry(out, n))
    if foreign:
        raise UsageError(f"--out {out}: holds files this command does not write ({listing(foreign, 5)}; it writes "
                         f"PNGs and {FABRIC_CSV}); give {OVERWRITE} to write into it, or another folder")


def _want(args):
    only = split_values(args.only)
    for o in only:
        if o not in PLOTS:
            raise UsageError(f"--only {o}: not a plot (allowed: {', '.join(PLOTS)})")
    return set(only or PLOTS)


def _timeline_case(df, case):
    """(source row, case id) of the timeline: --case, else the default ring-family case."""
    ok = ok_cases(df)
    if case is not None:
        hit = df[df["case"] == case]
        if hit.empty:
            raise UsageError(f"--case {case}: no such case in the inputs (cases that ran: "
                             f"{listing(ok['case'].drop_duplicates())})")
        return hit.iloc[0]
    row = default_timeline_case(df)
    if row is None:
        reg = table_registry(df)
        family = f"({', '.join(reg.in_order(reg.ring_family))})"
        raise Skip(f"no ring-family case {family} with a full-mode rep in the inputs; choose one with --case")
    return row


def fidelity_run(args, paths):
    """The fidelity study's file: fidelity.png (worst error ratio against P per scheme)."""
    from . import fidelity
    if len(paths) != 1 or len(args.inputs) != 1:
        raise UsageError("INPUT: a fidelity study file is plotted alone (give one, and no results files)")
    doc = fidelity.load(paths[0])
    out = args.out or os.path.join("results", "plots", os.path.splitext(os.path.basename(paths[0]))[0])
    check_out_folder(out, ["fidelity.png"], [("INPUT", paths[0])], args.overwrite)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot be made ({e.strerror})")
    print(fidelity.table_markdown(doc))
    title = (f"fidelity study: attention_isa {doc.get('attention_isa', '?')}, bf16 GEMMs "
             f"{doc.get('gemm_bf16_engine', '?')}")
    _say_saved(fidelity.figure(doc, title), out, "fidelity.png", args.dpi)
    return 0


def run(args):
    from . import fidelity
    if args.dpi < 20 or args.dpi > 600:
        raise UsageError(f"--dpi {args.dpi}: must be between 20 and 600")
    fid = [p for p in args.inputs if fidelity.is_fidelity_file(p)]
    if fid:
        return fidelity_run(args, fid)
    want = _want(args)
    inputs = load_inputs(args.inputs)
    df = case_table(inputs)
    for s in inputs.sources:
        if s.missing is not None:
            print(f"skipped {s.shown or s.label}: {s.missing}")
    out = args.out or os.path.join("results", "plots", inputs.first_stem)
    readable = [i for i, s in enumerate(inputs.sources) if s.missing is None]
    several = len(readable) > 1
    title_all = describe(df[df["status"] == "ok"], args.inputs)
    jobs = []  # (plot kind, file name, thunk)
    if "scaling" in want:
        for i in readable:
            d = df[df["src"] == i]
            suffix = f"_{inputs.sources[i].label}" if several else ""
            jobs.append(("scaling", f"scaling_seq_len{suffix}.png",
                         lambda d=d, i=i: scaling_seq_len_figure(d, source_title(inputs, i, d))))
        for xcol in ("ranks", "nodes"):
            jobs.append(("scaling", f"scaling_{xcol}.png", lambda x=xcol: scaling_count_figure(df, x, title_all)))
    if "timeline" in want:
        def timeline():
            row = _timeline_case(df, args.case)
            src = inputs.sources[int(row["src"])]
            return timeline_figure(src.path, row["case"], describe(df[df["src"] == row["src"]]))
        try:
            name = f"timeline_{_timeline_case(df, args.case)['case']}.png"
        except Skip:
            name = "timeline.png"
        jobs.append(("timeline", name, timeline))
    if "overlap" in want:
        for i in readable:
            d = df[df["src"] == i]
            suffix = f"_{inputs.sources[i].label}" if several else ""
            jobs.append(("overlap", f"overlap{suffix}.png",
                         lambda d=d, i=i: overlap_figure(d, source_title(inputs, i, d))))
    if "memory" in want:
        jobs.append(("memory", "memory.png",
                     lambda: memory_figure(memory_rows(inputs, df), title_all, several)))
    if "fabric" in want:
        def fabric():
            table = fabric_table(df, inputs.fabric)
            csv_path = os.path.join(out, FABRIC_CSV)
            shown = table.drop(columns="config").rename(columns=FABRIC_HEADERS)
            write_whole("--out", csv_path, lambda fh: shown.to_csv(fh, index=False, na_rep="NaN"))
            print(fabric_text(table))
            print(f"wrote {csv_path}")
            return fabric_figure(table, title_all)
        jobs.append(("fabric", "fabric.png", fabric))
    if "model" in want:
        jobs.append(("model", "model.png", lambda: model_figure(df, title_all)))
    check_out_folder(out, [name for _, name, _ in jobs] + [FABRIC_CSV], input_files(inputs, "INPUT"),
                     args.overwrite)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot be made ({e.strerror})")
    if not os.access(out, os.W_OK):
        raise UsageError(f"--out {out}: not writable")
    for kind, name, make in jobs:
        try:
            fig = make()
        except Skip as e:
            print(f"{name} skipped: {e}")
            continue
        _say_saved(fig, out, name, args.dpi)
    return 0
