"""One rep of one case as a Chrome trace-event / Perfetto JSON trace (the `traceEvents` format
that ui.perfetto.dev and chrome://tracing load): a process per rank, compute, comm and wait
on their own tracks, one complete event ("ph": "X") per row of the events table."""
import json
import os
import sys

from . import UsageError
from .data import MODES, NO_CASE, TRACKS, check_results_file, lanes, mode_code, median_rep, open_case, read_events
from .outputs import check_output, write_whole

def event_name(row):
    kind = row.kind_name
    if row.track == "grad all-reduce":  # its step is only the one in force when it was posted
        return f"grad all-reduce layer {row.layer}"
    if kind == "kernel":
        return row.label_name or "kernel"
    if kind == "compute":
        return f"attention step {row.step}" if row.step >= 0 else "attention"
    if kind == "wait":
        return f"wait step {row.step}" if row.step >= 0 else "wait"
    return f"{kind} step {row.step}" if row.step >= 0 else kind


def build(path, case, rep=None, mode="full"):
    """The trace (a dict ready for json.dump) of one rep (default: the median one) and mode."""
    f, g = open_case(path, case)
    with f:
        code = mode_code(g, mode)
        ev = read_events(g)
        reps = sorted(set(int(r) for r in ev.loc[ev["mode"] == code, "rep"]))
        if rep is None:
            rep = median_rep(g, code)
        elif rep not in reps:
            raise UsageError(f"--rep {rep}: no such rep of {case} in mode {mode} (reps: "
                             f"{', '.join(map(str, reps)) or 'none'}; warm-ups are not recorded)")
    sel = ev[(ev["rep"] == rep) & (ev["mode"] == code)].sort_values(["rank", "t_begin"], kind="stable")
    if sel.empty:
        with_events = [MODES[m] for m in sorted(set(int(m) for m in ev["mode"])) if m < len(MODES)]
        raise UsageError(f"--mode {mode}: the events table of {case} has no row in this mode"
                         f"{f' and rep {rep}' if reps else ''} (modes with events: {', '.join(with_events)})")
    t0 = float(sel["t_begin"].min())
    out = []
    for rank in sorted(set(int(r) for r in sel["rank"])):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        mine = sel[sel["rank"] == rank]
        for ti, track in enumerate(TRACKS):
            rows = list(mine[mine["track"] == track].itertuples(index=False))
            # µs rounded to the ns: begin and end rounded alone, so that touching events still touch
            spans = [(round((r.t_begin - t0) * 1e6, 3), round((r.t_end - t0) * 1e6, 3)) for r in rows]
            lane_of = lanes(spans)
            for lane in sorted(set(lane_of)):
                tid = 1 + ti + 10 * lane
                out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                            "args": {"name": track if lane == 0 else f"{track} {lane + 1}"}})
                out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                            "args": {"sort_index": 10 * ti + lane}})
            for r, (ts, end), lane in zip(rows, spans, lane_of):
                out.append({"ph": "X", "name": event_name(r), "cat": track, "pid": rank, "tid": 1 + ti + 10 * lane,
                            "ts": ts, "dur": max(round(end - ts, 3), 0.0),
                            "args": {"step": int(r.step), "layer": int(r.layer), "pass": r.pass_name,
                                     "kind": r.kind_name, "label": r.label_name, "bytes": int(r.bytes),
                                     "peer": int(r.peer), "group": int(r.group), "flops": float(r.flops),
                                     "rep": int(r.rep), "mode": mode}})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"file": path, "case": case, "rep": rep, "mode": mode, "origin_s": t0,
                          "clock": "ts: microseconds from the first event of this rep, on rank 0's aligned clock",
                          "args": "step -1, layer -1, peer -1, group -1: not applicable"}}


def default_out(path, case, rep, mode):
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.join("results", "traces", stem, f"{case}_rep{rep}_{mode}.json")


def is_trace(path):
    """Whether a file is a trace this command wrote (its traceEvents and otherData)."""
    try:
        with open(path) as fh:
            t = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(t, dict) and isinstance(t.get("traceEvents"), list) and \
        isinstance(t.get("otherData"), dict) and "case" in t["otherData"]


def check_trace_out(out, args):
    check_output("--out", out, [("FILE", args.file)], is_trace, "a trace written by minicp_analysis trace",
                 args.overwrite)


def run(args):
    if args.rep is not None and args.rep < 0:
        raise UsageError(f"--rep {args.rep}: must be 0 or more (0-based, warm-ups excluded)")
    if not check_results_file(args.file, "FILE"):
        raise UsageError(f"FILE {args.file}: {NO_CASE}")
    if args.out not in (None, "-"):
        check_trace_out(args.out, args)
    trace = build(args.file, args.case, args.rep, args.mode)
    rep = trace["otherData"]["rep"]
    if args.out == "-":
        json.dump(trace, sys.stdout)
        sys.stdout.write("\n")
        return 0
    out = args.out
    if out is None:  # its name holds the rep, known only now
        out = default_out(args.file, args.case, rep, args.mode)
        check_trace_out(out, args)
    write_whole("--out", out, lambda fh: json.dump(trace, fh))
    n = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
    ranks = sum(1 for e in trace["traceEvents"] if e["name"] == "process_name")
    print(f"wrote {out}: {args.case} rep {rep} ({'median' if args.rep is None else 'chosen'}), {args.mode} mode, "
          f"{n} events on {ranks} ranks (open it in https://ui.perfetto.dev)")
    return 0
