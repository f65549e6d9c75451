"""The summary table of the cases: one row per case, the figures of merit with their units in
the column headers (`measured_time_s [s]`), filtered and sorted as asked."""
import csv
import math
import re
import sys

import pandas as pd

from . import UsageError
from .data import PASSES, Registry, case_table, load_inputs
from .outputs import check_output, input_files, write_whole

# The columns shown by default, in order; predicted_* only when some case has them.
DEFAULT_COLUMNS = ["file", "case", "scheme", "pass", "mask", "dtype", "seq_len", "ranks", "status", "measured_time_s",
                   "tokens_per_s", "cp_efficiency", "cp_efficiency_core_scaled", "overlap", "attn_overlap",
                   "exposed_comm_s", "imbalance", "bytes_sent_per_rank", "peak_kokkos_bytes", "predicted_bytes",
                   "predicted_time_s", "predicted_ratio"]
TEXT_COLUMNS = {"file", "source", "case", "scheme", "pass", "mask", "dtype", "status", "fabric", "layout", "scaling",
                "task", "modes", "complete", "units", "out_of_range"}
# Integer columns that are no scheme's setting; the schemes' settings are counts too, read from
# the inputs' scheme_registry (count_columns).
COUNT_COLUMNS = {"ranks", "nodes", "world_ranks", "src", "reps", "decode_tokens", "figures_in_range",
                 "overlap_measured", "cp_efficiency_measured"}


def count_columns(registry):
    """The integer columns of tables of inputs with this Registry: the fixed ones and every
    scheme setting the inputs' minicp names (a new setting is a count without an edit here)."""
    return COUNT_COLUMNS | set(registry.settings)


def unit(name, registry=Registry()):
    """The unit of a column: the results file's figure_catalog for a summary figure, else the
    naming rules of the summary (docs/results-file.md, files written before the catalog):
    None for text and counts (the Registry's settings among them), '-' for dimensionless figures."""
    if name in TEXT_COLUMNS or name in count_columns(registry) or name.endswith("_note"):
        return None
    catalogued = registry.unit_of(name)  # the file's own word (figure_catalog), where it has one
    if catalogued is not None:
        return {"1": "-", "flag": None, "text": None}.get(catalogued, catalogued)
    if name in ("seq_len", "decode_tokens"):
        return "tokens"
    if name == "tokens_per_s":
        return "tokens/s"
    if name.endswith("flops_per_s"):
        return "FLOP/s"
    if "bytes" in name:
        return "B"
    if name.endswith("_s"):
        return "s"
    return "-"


def header(name, registry=Registry()):
    u = unit(name, registry)
    return name if u is None else f"{name} [{u}]"


def bare(col):
    """A column as the user may name it: `measured_time_s` or `measured_time_s [s]`."""
    return re.sub(r"\s*\[[^\]]*\]$", "", col.strip())


def split_values(values):
    """Repeatable options that also take comma lists: ['a,b', 'c'] -> ['a', 'b', 'c']."""
    out = []
    for v in values or []:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


def apply_filters(df, schemes, passes, seq_lens):
    """Keeps the cases of the given schemes, passes and seq_lens (each: any of the list)."""
    schemes, passes, seq_lens = split_values(schemes), split_values(passes), split_values(seq_lens)
    present = sorted(x for x in df.get("scheme", pd.Series(dtype=str)).dropna().unique() if x)
    for s in schemes:
        if s not in present:
            raise UsageError(f"--scheme {s}: no case of this scheme in the inputs (present: {', '.join(present)})")
    for p in passes:
        if p not in PASSES:
            raise UsageError(f"--pass {p}: not a pass (allowed: {', '.join(PASSES)})")
    lens = []
    for v in seq_lens:
        if not re.fullmatch(r"[0-9]+", v) or int(v) <= 0:
            raise UsageError(f"--seq-len {v}: not a positive whole number of tokens")
        lens.append(int(v))
    if schemes:
        df = df[df["scheme"].isin(schemes)]
    if passes:
        df = df[df["pass"].isin(passes)]
    if lens:
        df = df[df["seq_len"].isin(lens)]
    return df


def choose_columns(df, columns):
    """The columns to show: the defaults, or those asked for (bare names or headers)."""
    if not columns:
        cols = [c for c in DEFAULT_COLUMNS if c in df]
        if df["predicted_time_s"].isna().all():
            cols = [c for c in cols if c not in ("predicted_time_s", "predicted_ratio")]
        if "scaling" in df and df["scaling"].notna().any():
            cols.insert(1, "scaling")
        for extra in ("nodes", "fabric"):  # several files of a study: what tells them apart
            if extra in df and df[extra].nunique(dropna=True) > 1:
                cols.insert(cols.index("ranks") + 1, extra)
        return cols
    cols = []
    allowed = table_columns(df)
    for c in split_values(columns):
        b = bare(c)
        if b not in allowed:
            raise UsageError(f"--columns {c}: not a column (allowed: {', '.join(allowed)})")
        cols.append(b)
    return cols


def table_columns(df):
    """The columns a user may name: every one with one value per case (not the arrays of
    predicted_phase_s and the like, nor the internal `src`)."""
    return [c for c in df.columns if c != "src" and not df[c].map(lambda v: hasattr(v, "__len__") and
                                                                   not isinstance(v, str)).any()]


def sort_table(df, column, desc):
    if column is None:
        return df
    b = bare(column)
    if b not in table_columns(df):
        raise UsageError(f"--sort {column}: not a column (allowed: {', '.join(table_columns(df))})")
    return df.sort_values(b, ascending=not desc, kind="stable", na_position="last")


def build(paths, schemes=None, passes=None, seq_lens=None, sort=None, desc=False, columns=None, inputs=None):
    """The report table (a DataFrame whose headers carry units) of the inputs."""
    inputs = inputs or load_inputs(paths, flag="FILE")
    df = case_table(inputs)
    df = apply_filters(df, schemes, passes, seq_lens)
    df = sort_table(df, sort, desc)
    cols = choose_columns(df, columns)
    out = df[cols].copy()
    out.columns = [header(c, inputs.registry) for c in cols]
    return out.reset_index(drop=True)


def _fmt(v):
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return f"{v:.0f}" if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    return str(v)


def render(table, filtered=False):
    """The table as aligned text (NaN shown as NaN; 4 significant digits)."""
    if table.empty:
        return "(no case matches the filters)" if filtered else "(no case in the inputs)"
    shown = table.copy()
    headers = []
    for c in shown.columns:
        if shown[c].dtype.kind == "f":
            # whole values (byte counts; counts made floats by a NaN) print whole
            shown[c] = [_fmt(v) for v in shown[c]]
        elif shown[c].dtype.kind == "O":  # text left-aligned: padded to the column's width
            width = max([len(c)] + [len(str(v)) for v in shown[c]])
            shown[c] = [str(v).ljust(width) for v in shown[c]]
            c = c.ljust(width)
        headers.append(c)
    shown.columns = headers
    with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 10000,
                           "display.max_colwidth", 80):
        return shown.to_string(index=False)


def is_report_csv(path, registry=Registry()):
    """Whether a file is a table this command wrote: a CSV header whose every column is
    spelt as `header` spells it (units in brackets; the Registry's settings without), so that
    a study index or a fabric study table (columns without units) is not one."""
    try:
        with open(path, newline="") as f:
            cols = next(csv.reader([f.readline()]), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return bool(cols) and all(c and header(bare(c), registry) == c for c in cols)


def run(args):
    inputs = load_inputs(args.files, flag="FILE")
    if args.csv not in (None, "-"):
        check_output("--csv", args.csv, input_files(inputs, "FILE"), lambda p: is_report_csv(p, inputs.registry),
                     "a CSV table written by minicp_analysis report", args.overwrite)
    table = build(args.files, args.scheme, args.pass_, args.seq_len, args.sort, args.desc, args.columns, inputs)
    if args.csv == "-":
        table.to_csv(sys.stdout, index=False, na_rep="NaN")
        return 0
    print(render(table, filtered=bool(args.scheme or args.pass_ or args.seq_len)))
    if args.csv:
        write_whole("--csv", args.csv, lambda fh: table.to_csv(fh, index=False, na_rep="NaN"))
        print(f"wrote {args.csv}")
    return 0
