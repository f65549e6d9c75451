"""Reading the inputs: minicp results files (.h5, docs/results-file.md), a Slurm study index
(index.csv of slurm/submit collect or slurm/scaling-study: a `file` column, relative to the
index) and the fabric study table (fabric_study.csv of studies/fabric_study.py:
profile, layout, alpha_us, beta_*, file). Everything else works on what this returns: the
sources (one per results file) and the case table (one row per case)."""
import csv
import dataclasses
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field

import h5py
import numpy as np
import pandas as pd

from . import UsageError

MODES = ("full", "compute-only", "comm-only")
PASSES = ("train", "prefill", "decode")
# Integer case attributes of the problem, not of a scheme (the schemes' settings come from
# the inputs' scheme_registry).
PROBLEM_COLUMNS = ("decode_tokens",)
# Summary attributes the C++ may not write yet: NaN when absent.
PHASES = ("norm", "qkv", "rope", "attn_compute", "attn_comm", "out_proj", "mlp", "tp_comm", "grad_allreduce", "other")
OPTIONAL_SUMMARY = ("predicted_time_s", "predicted_forward_time_s", "predicted_backward_time_s")
# The summary's text attributes in files written before the figure catalog (whose unit
# "text" names them since), and its per-phase arrays of files written before the one
# attribute per phase; every other summary attribute is one number.
TEXT_SUMMARY = ("out_of_range", "units", "predicted_phase_names")
ARRAY_SUMMARY = ("predicted_phase_s", "measured_phase_s")


def text(v):
    """An HDF5 string attribute as str (h5py gives bytes for some)."""
    return v.decode() if isinstance(v, bytes) else str(v)


def names(attr_value):
    """A comma list attribute (`kind_names`, `mode_names`...) as a list."""
    return [n.strip() for n in text(attr_value).split(",")] if attr_value is not None else []


@dataclass
class Source:
    """One results file of the inputs. `shown` is the path as the user (or the index) gave it,
    `label` a short name unique among the inputs (for titles and file names), `meta` the
    index's or fabric table's row, `missing` why there is no file to read (a task that did not
    finish), else None."""
    path: str
    shown: str
    label: str
    meta: dict = field(default_factory=dict)
    missing: str = None


@dataclass(frozen=True)
class Registry:
    """The schemes as the minicp that wrote the inputs describes them (the root attribute
    `scheme_registry`, the same JSON as `minicp --list-schemes --json`), so that the package
    keeps no copy of its own that a new scheme or setting would leave behind. `schemes`: the
    names in registry order (the plots' order and colours); `ring_family`: those that pass
    blocks around a ring step by step (their timeline shows one compute and one transfer per
    ring step); `settings`: the schemes' setting names (integer case attributes);
    `described`: whether any input carried the attribute (every results file does:
    check_results_file refuses one without it)."""
    schemes: tuple = ()
    ring_family: frozenset = frozenset()
    settings: tuple = ()
    described: bool = False
    # {figure name or pattern with <phase>: unit} of the summaries, from the files'
    # figure_catalog (minicp --list-figures --json).
    units: tuple = ()

    def unit_of(self, name):
        """The catalog's unit of a summary figure ("s", "FLOP/s", "1", "flag", "text", ...), None
        when the catalog does not name it."""
        for pattern, unit in self.units:
            if pattern == name or ("<phase>" in pattern and re.fullmatch(
                    re.escape(pattern).replace(re.escape("<phase>"), "[a-z_]+"), name)):
                return unit
        return None

    def key(self, scheme):
        """Sort key of a scheme: registry order, then the schemes it does not know alphabetically."""
        return (self.schemes.index(scheme), "") if scheme in self.schemes else (len(self.schemes), scheme)

    def in_order(self, schemes):
        """The distinct schemes of `schemes` in registry order (unknown ones last, alphabetically)."""
        return sorted(set(schemes), key=self.key)


def _described_list(f, where, flag, attr, fields, kind, listing):
    """The objects of one open results file's JSON list attribute `attr` that minicp writes of
    itself ([] without one); refuses (exit 2) one that is not a list of objects whose `fields`
    have their types (the name a string), what `minicp <listing> --json` prints."""
    raw = f.attrs.get(attr)
    if raw is None:
        return []
    try:
        entries = json.loads(text(raw))
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag} {where}: attribute {attr} is not JSON ({e})")
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("name"), str)
            and all(isinstance(e.get(k, t()), t) for k, t in fields.items()) for e in entries):
        raise UsageError(f"{flag} {where}: attribute {attr} is not a list of {kind} "
                         f"({{\"name\", {', '.join(chr(34) + k + chr(34) for k in fields)}, ...}}, as minicp "
                         f"{listing} --json)")
    return entries


def _registry_entries(f, where, flag):
    """The scheme objects of one open results file's scheme_registry."""
    return _described_list(f, where, flag, "scheme_registry", {"settings": list}, "schemes", "--list-schemes")


def _catalog_entries(f, where, flag):
    """The figure objects of one open results file's figure_catalog."""
    return _described_list(f, where, flag, "figure_catalog", {"unit": str}, "figures", "--list-figures")


def registry_of(files, flag="INPUT"):
    """The Registry of one results file (a path or an open h5py.File) or of several: their
    scheme_registry attributes united, each scheme and setting in first-seen order, a scheme
    described by two files as the first describes it (files of two minicp versions can be
    compared), and the units of their figure_catalog attributes, alike. Files without the
    attributes add nothing; none with scheme_registry gives the empty Registry
    (Registry.described false)."""
    if isinstance(files, (str, os.PathLike, h5py.File)):
        files = [files]
    lists, units = [], {}

    def read(f, where):
        if "scheme_registry" in f.attrs:
            lists.append(_registry_entries(f, where, flag))
        for e in _catalog_entries(f, where, flag):
            units.setdefault(e["name"], e["unit"])

    for item in files:
        if isinstance(item, h5py.File):
            read(item, item.filename)
        else:
            with h5py.File(item, "r") as f:
                read(f, item)
    return dataclasses.replace(registry_from(lists), units=tuple(units.items()))


def registry_from(lists):
    """The Registry of registry lists as minicp writes them (`minicp --list-schemes --json`, a
    results file's attribute, minicp-fidelity's `scheme_registry`), united in first-seen order;
    no list: the empty Registry."""
    schemes, settings, ring = {}, {}, set()
    for entries in lists:
        for e in entries:
            if e["name"] in schemes:
                continue
            schemes[e["name"]] = e
            if e.get("ring_family") is True:
                ring.add(e["name"])
            for st in e.get("settings", []):
                if isinstance(st, dict) and isinstance(st.get("name"), str):
                    settings.setdefault(st["name"], None)
    return Registry(schemes=tuple(schemes), ring_family=frozenset(ring), settings=tuple(settings),
                    described=bool(lists))


def table_registry(df):
    """The Registry a case table was made with (case_table keeps it in `df.attrs`, which
    pandas carries through filtering and copies); the empty one for a table made otherwise."""
    return df.attrs.get("registry", Registry())


# Why a results file gives no row of figures: a run that ended before its first case was
# written keeps a file without cases.
NO_CASE = "holds no complete case (a run stopped in its first case?)"


@dataclass
class Inputs:
    sources: list
    given: list = field(default_factory=list)  # the paths as given
    fabric: pd.DataFrame = None      # the fabric study table, when one was given
    indexes: list = field(default_factory=list)  # study index paths given
    first_stem: str = ""             # the stem of the first input path (the default plot folder)
    registry: Registry = field(default_factory=Registry)  # the readable results files' scheme_registry
    flag: str = "INPUT"              # what the messages call the inputs (FILE, INPUT)


def _csv_rows(path, flag):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UsageError(f"{flag} {path}: cannot be read as CSV ({e})")
    return rows


def _find_listed(listed, csv_path):
    """A file named by a CSV row: as written, else relative to the CSV's folder, else the
    same name in that folder (a study moved as a whole)."""
    here = os.path.dirname(os.path.abspath(csv_path))
    for p in (listed if os.path.isabs(listed) else None, os.path.join(here, listed),
              os.path.join(here, os.path.basename(listed))):
        if p and os.path.isfile(p):
            return p
    return None


# What minicp writes of itself into every results file, which the package reads instead of
# keeping copies (scheme order, ring family, settings; units).
DESCRIBED = ("scheme_registry", "figure_catalog")


def check_results_file(path, flag):
    """Refuses (exit 2) a path that is not a readable minicp results file, naming why (one
    without scheme_registry or figure_catalog among them); returns the number of cases it holds."""
    if not os.path.exists(path):
        raise UsageError(f"{flag} {path}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a directory (give a results .h5, or a study index / fabric study .csv)")
    if not h5py.is_hdf5(path):
        raise UsageError(f"{flag} {path}: not a minicp results file (not an HDF5 file; allowed: a results .h5, "
                         f"a study index .csv or a fabric study .csv)")
    try:
        with h5py.File(path, "r") as f:
            kind = text(f.attrs.get("file_kind", ""))
            if kind != "minicp results":
                raise UsageError(f"{flag} {path}: not a minicp results file (file_kind {kind!r})")
            absent = [a for a in DESCRIBED if a not in f.attrs]
            if absent:
                raise UsageError(f"{flag} {path}: a results file without the root attribute "
                                 f"{' and '.join(absent)}, which the analysis reads (written by a minicp "
                                 f"before it had them; run the deck again with this minicp)")
            cases = f.get("cases")
            return len(cases) if isinstance(cases, h5py.Group) else 0
    except OSError as e:
        raise UsageError(f"{flag} {path}: not a minicp results file (cannot be opened: {e})")


def _csv_sources(path, flag):
    """The sources a study index or a fabric study CSV lists, and the fabric table (or None)."""
    rows = _csv_rows(path, flag)
    cols = set(rows[0].keys()) if rows else set()
    if {"profile", "alpha_us", "file"} <= cols:
        kind = "fabric"
    elif "file" in cols and ({"task", "status"} & cols):
        kind = "index"
    else:
        raise UsageError(f"{flag} {path}: neither a study index (columns task, nodes, file, status: slurm/submit "
                         f"collect) nor a fabric study table (columns profile, layout, alpha_us, file), "
                         f"columns: {', '.join(sorted(cols)) or 'none'}")
    sources = []
    for r in rows:
        found = _find_listed(r["file"], path) if r.get("file") else None
        if kind == "fabric":
            label = f"{r['profile']}_{r.get('layout', '')}".rstrip("_")
            meta = {"fabric": r["profile"], "layout": r.get("layout", ""), "fabric_kind": r.get("kind", "")}
            for k in ("alpha_us", "beta_fit_GBps", "beta_best_GBps"):
                meta[k] = _float(r.get(k))
        else:
            label = f"{r['scaling']}_{r['task']}" if r.get("scaling") else (r.get("task") or
                                                                          os.path.splitext(os.path.basename(r["file"]))[0])
            meta = {k: r[k] for k in ("scaling", "task", "fabric", "status", "reason") if r.get(k) not in (None, "")}
            if r.get("nodes", "").strip().isdigit():
                meta["nodes"] = int(r["nodes"])
        missing = None
        if kind == "index" and r.get("status", "finished") != "finished":
            missing = f"task {r.get('status')}: {r.get('reason', '')}".rstrip(": ")
        elif found is None:
            missing = f"no file {r.get('file', '')!r} (listed in {path})"
        shown = r.get("file", "") if found is None else os.path.relpath(found)
        if found is not None and missing is None and not check_results_file(found, f"{flag} {path}: file"):
            missing = NO_CASE
        sources.append(Source(path=found, shown=shown, label=label, meta=meta, missing=missing))
    table = None
    if kind == "fabric":
        table = pd.DataFrame(rows)
        for k in ("alpha_us", "beta_fit_GBps", "beta_best_GBps", "ranks"):
            if k in table:
                table[k] = pd.to_numeric(table[k], errors="coerce")
    return kind, sources, table


def _float(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def load_inputs(paths, flag="INPUT"):
    """The sources of the given paths (.h5 files, study indexes, fabric study tables), each
    results file once (a fabric table and its own files may both be given)."""
    if not paths:
        raise UsageError(f"{flag}: at least one results .h5 or study .csv is required")
    sources, fabric, indexes = [], None, []
    by_real = {}
    for p in paths:
        if not os.path.exists(p):
            raise UsageError(f"{flag} {p}: no such file")
        if p.lower().endswith(".csv"):
            kind, listed, table = _csv_sources(p, flag)
            if kind == "fabric":
                fabric = table if fabric is None else pd.concat([fabric, table], ignore_index=True)
            else:
                indexes.append(p)
        else:
            empty = not check_results_file(p, flag)
            listed = [Source(path=p, shown=p, label=os.path.splitext(os.path.basename(p))[0],
                             missing=NO_CASE if empty else None)]
        for s in listed:
            real = os.path.realpath(s.path) if s.path else None
            if real in by_real:  # the same file again: merge what the tables say of it
                by_real[real].meta.update(s.meta)
                if s.meta.get("fabric"):
                    by_real[real].label = s.label
                continue
            if real:
                by_real[real] = s
            sources.append(s)
    refuse_without_cases(sources, flag)
    seen = {}
    for s in sources:  # unique labels: a second N1_none becomes N1_none_2
        n = seen.get(s.label, 0)
        seen[s.label] = n + 1
        if n:
            s.label = f"{s.label}_{n + 1}"
    return Inputs(sources=sources, given=list(paths), fabric=fabric, indexes=indexes,
                  first_stem=os.path.splitext(os.path.basename(paths[0]))[0],
                  registry=registry_of([s.path for s in sources if s.missing is None], flag), flag=flag)


def refuse_without_cases(sources, flag):
    """Refuses (exit 2) inputs of which no results file holds a case while one is a file
    without cases; with a case elsewhere, such a file is only a row (or a line) saying so."""
    empty = [s for s in sources if s.missing == NO_CASE]
    if empty and all(s.missing is not None for s in sources):
        raise UsageError(f"{flag} {empty[0].shown}: {NO_CASE}" +
                         (f" (and {len(empty) - 1} more such files, no results file with a case)"
                          if len(empty) > 1 else ""))


def _deck_name(f):
    """`default.toml (cpu-small)`: the deck of the run's command line and its model preset."""
    words = text(f.attrs.get("command_line", "")).split()
    deck = next((os.path.basename(words[i + 1]) for i, w in enumerate(words[:-1]) if w == "--deck"), "")
    try:
        preset = tomllib.loads(text(f.attrs.get("deck", ""))).get("model", {}).get("preset", "")
    except tomllib.TOMLDecodeError:
        preset = ""
    return f"{deck} ({preset})" if deck and preset else deck or preset


def _file_info(f, source):
    hosts = [h for h in text(f.attrs.get("hosts", "")).split(",") if h]
    ranks = int(f.attrs.get("world_ranks", 0))
    nodes = source.meta.get("nodes") or max(len(hosts), 1)
    fabric = source.meta.get("fabric") or text(f.attrs.get("fabric", "")) or "default"
    layout = source.meta.get("layout") or (f"{nodes}x{ranks // nodes}" if ranks and nodes else "")
    return {"nodes": int(nodes), "world_ranks": ranks, "fabric": fabric, "layout": layout, "deck": _deck_name(f)}


def _summary_value(k, v, registry, where):
    """One summary attribute as the tools use it: text as str, a number as float, an old
    file's per-phase array as floats; refuses (exit 2) one of another type, which every
    figure and plot would otherwise take as it is. `where`: the file and case, for the message."""
    unit = registry.unit_of(k)
    wants_text = unit == "text" or (unit is None and (k in TEXT_SUMMARY or k.endswith("_note")))
    is_text = isinstance(v, (bytes, str))
    a = None if is_text else np.asarray(v)
    if wants_text and is_text:
        return text(v)
    if not wants_text and a is not None and a.dtype.kind in "biuf":
        if k in ARRAY_SUMMARY:  # whatever unit the catalog's measured_<phase>_s gives the name
            return a.astype(float).reshape(-1)
        if a.size == 1:
            return float(a.reshape(-1)[0])
    if is_text:
        got = f"text {text(v)!r}"
    elif a.size != 1:
        got = f"an array of {a.size} values"
    elif a.dtype.kind in "biuf":
        got = f"the number {a.reshape(-1)[0]}"
    else:
        got = f"of type {a.dtype}"
    raise UsageError(f"{where}: summary attribute {k} is {got}; expected {'text' if wants_text else 'a number'}")


def _summary(g, registry, where):
    """A case's summary attributes (_summary_value), with the optional ones NaN and the
    per-phase figures gathered."""
    out = {}
    if "summary" not in g:
        return out
    for k, v in g["summary"].attrs.items():
        out[k] = _summary_value(k, v, registry, where)
    for k in OPTIONAL_SUMMARY:
        out.setdefault(k, math.nan)
    # minicp writes one attribute per phase (predicted_<phase>_s, measured_<phase>_s, the
    # phases of the timing table's phase_names): gathered here into the arrays the model plot reads.
    names = [p for p in PHASES if f"predicted_{p}_s" in out]
    if names and "predicted_phase_s" not in out:
        out["predicted_phase_names"] = ",".join(names)
        out["predicted_phase_s"] = np.array([out[f"predicted_{p}_s"] for p in names], dtype=float)
        out["measured_phase_s"] = np.array([out.get(f"measured_{p}_s", math.nan) for p in names], dtype=float)
    return out


def case_table(inputs):
    """One row per case of every readable source (and one per source that could not be read,
    with its reason as the status): the case's attributes, every summary attribute, the
    memory table's maxima, and where it came from (`file`, `source`, `src`: the source's
    position). The inputs' Registry goes with it as `df.attrs["registry"]` (table_registry):
    the plots take the schemes' order and ring family from there."""
    rows = []
    counts = inputs.registry.settings + tuple(k for k in PROBLEM_COLUMNS if k not in inputs.registry.settings)
    for i, s in enumerate(inputs.sources):
        base = {"file": s.shown, "source": s.label, "src": i, **{k: v for k, v in s.meta.items()
                                                                 if k in ("scaling", "task")}}
        if s.missing is not None:
            rows.append({**base, "case": "", "status": s.missing, "nodes": s.meta.get("nodes", math.nan),
                         "fabric": s.meta.get("fabric", "")})
            continue
        with h5py.File(s.path, "r") as f:
            info = _file_info(f, s)
            for cid, g in f["cases"].items():
                a = g.attrs
                row = {**base, **info, "case": cid, "scheme": text(a.get("scheme", "")), "pass": text(a.get("pass", "")),
                       "mask": text(a.get("mask", "")), "dtype": text(a.get("dtype", "")),
                       "seq_len": int(a.get("seq_len", 0)), "ranks": int(a.get("ranks", 0)),
                       "dispatch": text(a.get("dispatch", "")), "documents": text(a.get("documents_label", "")),
                       "status": text(a.get("status", "")),
                       "reps": int(a.get("reps", 0)) * int(a.get("rounds", 1)), "complete": text(a.get("complete", ""))}
                for k in counts:
                    if k in a:
                        row[k] = int(a[k])
                row.update(_summary(g, inputs.registry, f"{inputs.flag} {s.shown}: case {cid}"))
                if "memory" in g and len(g["memory"]):
                    m = g["memory"][()]
                    row["peak_kokkos_bytes"] = float(m["kokkos_peak_bytes"].max())
                    row["peak_rss_bytes"] = float(m["rss_peak_bytes"].max())
                    row["predicted_bytes"] = float(m["predicted_bytes"].max())
                if "steps" in g:
                    row["modes"] = ",".join(names(g["steps"].attrs.get("mode_names"))[int(x)]
                                            for x in sorted(set(g["steps"]["mode"][()])))
                rows.append(row)
    df = pd.DataFrame(rows)
    for k in ("measured_time_s", "predicted_time_s", "peak_kokkos_bytes", "predicted_bytes", "seq_len", "ranks"):
        if k not in df:
            df[k] = math.nan
    df["predicted_ratio"] = df["predicted_time_s"] / df["measured_time_s"]
    df.attrs["registry"] = inputs.registry
    return df


def ok_cases(df):
    """The cases that ran (status ok), with their figures."""
    return df[df["status"] == "ok"].copy()


def listing(ids, most=40):
    """`a, b, c` or `a, b, ... (12 more)`: the allowed values in a message."""
    ids = list(ids)
    return ", ".join(ids[:most]) + (f", ... ({len(ids) - most} more)" if len(ids) > most else "")


def open_case(path, case, flag="--case"):
    """The case group's file handle and group; refuses an unknown or refused case (exit 2)."""
    f = h5py.File(path, "r")
    if "cases" not in f or not len(f["cases"]):
        f.close()
        raise UsageError(f"FILE {path}: {NO_CASE}")
    if case not in f["cases"]:
        ran = [c for c, g in f["cases"].items() if text(g.attrs.get("status", "")) == "ok"]
        f.close()
        raise UsageError(f"{flag} {case}: no such case in {path} (cases that ran: {listing(ran)})")
    g = f["cases"][case]
    if text(g.attrs.get("status", "")) != "ok" or "events" not in g:
        status = text(g.attrs.get("status", ""))
        f.close()
        raise UsageError(f"{flag} {case}: the case did not run ({status}); choose a case with status ok")
    try:  # the case's figures as the report reads them: a file it refuses is refused here too
        _summary(g, registry_of(f, "FILE"), f"FILE {path}: case {case}")
    except UsageError:
        f.close()
        raise
    return f, g


def read_events(g):
    """The events table as a DataFrame with the codes named: kind_name, label_name, pass_name."""
    ds = g["events"]
    ev = pd.DataFrame(ds[()])
    kinds, labels = names(ds.attrs.get("kind_names")), names(ds.attrs.get("label_names"))
    ev["kind_name"] = [kinds[k] if 0 <= k < len(kinds) else str(k) for k in ev["kind"]]
    ev["label_name"] = [labels[k] if 0 <= k < len(labels) else "" for k in ev["label"]]
    passes = names(g["timing"].attrs.get("pass_names")) if "timing" in g else ["forward", "backward"]
    ev["pass_name"] = [passes[p] if 0 <= p < len(passes) else str(p) for p in ev["pass"]]
    ev["track"] = event_tracks(ev)
    return ev


def mode_code(g, mode, flag="--mode"):
    """The code of a mode name in this case's tables (refused when the case did not run it)."""
    ds = g["steps"]
    known = names(ds.attrs.get("mode_names")) or list(MODES)
    if mode not in known:
        raise UsageError(f"{flag} {mode}: not a mode (allowed: {', '.join(known)})")
    code = known.index(mode)
    present = sorted(set(int(m) for m in ds["mode"][()]))
    if code not in present:
        raise UsageError(f"{flag} {mode}: the case did not run this mode (it ran: "
                         f"{', '.join(known[m] for m in present)})")
    return code


def median_rep(g, mode):
    """The median rep of a mode: by the slowest rank's step, the sample at index floor(n/2)
    of the sorted reps (docs/figures-of-merit.md, "Median and quartiles")."""
    st = pd.DataFrame(g["steps"][()])
    st = st[st["mode"] == mode]
    slowest = st.groupby("rep")["step_s"].max().sort_values(kind="stable")
    return int(slowest.index[len(slowest) // 2])


TRACKS = ("compute", "comm", "grad all-reduce", "wait")


def event_tracks(ev):
    """The track of each event (a DataFrame of read_events): `compute` (kernels and attention
    blocks), `wait` (time blocked), `grad all-reduce` (an all-reduce of the backward posted
    after the last attention block of its rep, rank, layer and pass: the weight gradients'; its
    step is only the one in force when posted) and `comm` (the scheme's calls)."""
    kind = ev["kind_name"]
    key = ["mode", "rep", "rank", "layer", "pass"]
    attn = ev[kind == "compute"].groupby(key)["t_end"].max()
    last = pd.Series([attn.get(k, -math.inf) for k in zip(*(ev[c] for c in key))], index=ev.index)
    grad = (kind == "allreduce") & (ev["pass_name"] == "backward") & (ev["t_begin"] >= last)
    return pd.Series(np.select([kind.isin(["kernel", "compute"]), kind == "wait", grad],
                               ["compute", "wait", "grad all-reduce"], "comm"), index=ev.index)


def lanes(spans):
    """Greedy lanes for (begin, end) spans in time order: the lane of each, so that spans of
    one lane never overlap (a trace wants a thread's slices nested; a plot, bars apart)."""
    ends, out = [], []
    for begin, end in spans:
        for i, e in enumerate(ends):
            if begin >= e:
                ends[i] = end
                out.append(i)
                break
        else:
            ends.append(end)
            out.append(len(ends) - 1)
    return out


def default_timeline_case(df):
    """The first ring-family case (of the table's Registry) at the largest seq_len that ran
    full mode, or None."""
    ok = ok_cases(df)
    full = ok.get("modes", pd.Series("", index=ok.index)).str.contains("full")
    ring = ok[ok["scheme"].isin(table_registry(df).ring_family) & full]
    if ring.empty:
        return None
    return ring[ring["seq_len"] == ring["seq_len"].max()].iloc[0]
