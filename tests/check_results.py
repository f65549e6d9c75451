#!/usr/bin/env python3
"""Checks a minicp results file (docs/results-file.md): the root attributes (build,
BLAS, CPU, environment, launcher), every case's attributes and status, the timing, steps,
memory and events tables (columns, units, row counts, one row per rank), and the figures of
merit, several of them recomputed a second way from the raw tables: measured_time_s from
the steps table, forward + backward = measured, every step's phases against it and against
the timing table, every figure inside its range or flagged in out_of_range with its reason,
an unresolved overlap with its reason, the events' clock alignment against its own bound.
With run.rounds > 1: every case holds rounds x reps reps, and the rounds interleave the
cases (round k of a case ends before round k of the next begins, which ends before round
k+1 of the first begins: the events' times say so). Optionally the memory model against the
Kokkos high-water mark and the BLAS core that was recorded.
What a busy machine does to a valid file (phases short of the step by more than 1%, a clock
bound above 50 us) is a WARNING; only defects fail (exit 1). A file that cannot be read (no
such file, not HDF5, truncated): one message on stderr, exit 2.
Usage: check_results.py FILE.h5 [--cases N] [--memory-tolerance 0.15] [--complete]
                        [--blas-core NAME] [--blas-not-generic] [--blas-source-has TEXT]"""
import argparse
import json
import math
import os
import re
import sys

import h5py
import numpy as np

ROOT = ["minicp_version", "git_sha", "git_dirty", "compiler", "compiler_flags", "kernel_flags", "kokkos_version",
        "kokkos_exec_space", "kokkos_concurrency", "attention_tiles", "gemm_backend", "blas", "blas_library",
        "blas_version", "blas_config", "blas_core", "blas_core_source", "blas_warning", "cpu_model", "cpu_flags",
        "cpu_isa", "comm_backend", "scheme_registry", "figure_catalog", "progress", "progress_poll_us", "progress_cpus", "mpi_library", "hosts",
        "world_ranks", "slurm_job_id", "slurm_job_nodelist", "environment", "cpu_affinity", "launcher",
        "launcher_command_line", "start_time", "deck", "command_line", "sgemm_flops_per_s_per_rank", "complete",
        "file_kind"]
CASE = ["scheme", "pass", "mask", "dtype", "status", "seq_len", "ranks", "tp", "dp", "rank_order", "hidden", "heads", "kv_heads",
        "head_dim", "ffn", "layers", "complete", "documents", "documents_count", "documents_max_tokens"]
CASE_RUN = ["start_time", "end_time"]
TIMING = ["mode", "rep", "rank", "layer", "pass", "phase", "seconds"]
STEPS = ["mode", "rep", "rank", "forward_s", "backward_s", "step_s", "phases_s", "attn_s", "attn_comm_wait_s",
         "grad_allreduce_s", "grad_allreduce_busy_s", "tp_comm_s"]
MEMORY = ["rank", "kokkos_peak_bytes", "space_peak_bytes", "rss_peak_bytes", "predicted_bytes"]
EVENTS = ["rank", "rep", "mode", "layer", "pass", "step", "kind", "peer", "group", "label", "bytes", "flops",
          "t_begin", "t_end"]
def catalog(f):
    """The figures the file says its summaries hold (figure_catalog: the C++ table of the run,
    name, unit, range, definition)."""
    entries = json.loads(text(f.attrs["figure_catalog"]))
    if not entries or not all({"name", "unit", "range", "definition", "required"} <= set(e) for e in entries):
        raise ValueError(f"figure_catalog attribute: {entries[:3]}")
    return entries


def figure_ranges(f):
    """Each figure with a range, as the file records them (the catalog's ranges: the C++ table
    the run checked its figures against, docs/figures-of-merit.md); outside it only when
    out_of_range says so. An open end is null there, infinity here."""
    ranges = {e["name"]: (e["range"][0], math.inf if e["range"][1] is None else e["range"][1])
              for e in catalog(f) if e["range"] is not None}
    if not ranges or any(not lo < hi for lo, hi in ranges.values()):
        raise ValueError(f"figure_catalog ranges: {ranges}")
    return ranges


def uncatalogued(f, g):
    """The summary attributes of case group g that no catalog entry names (`<phase>` stands for
    each phase of the case's timing table)."""
    phases = text(g["timing"].attrs["phase_names"]).split(",")
    names = set()
    for e in catalog(f):
        names |= {e["name"].replace("<phase>", p) for p in phases} if "<phase>" in e["name"] else {e["name"]}
    return sorted(set(g["summary"].attrs) - names)


GENERIC_CORES = {"prescott", "core2", "penryn", "dunnington", "nehalem", "katmai", "coppermine", "northwood",
                 "banias", "atom", "athlon", "opteron", "opteron_sse3", "barcelona", "nano", "bobcat", "generic"}
# A step brackets its phases on one rank's clock, and the layers' `other` phase takes what
# no phase timed inside the stack's calls, so the phases add up to the step less the few
# microseconds between the calls (a call, a fence). Above the step by more than the clock's
# rounding (PHASE_OVER) is a defect: a phase counted twice, timers that overlap. Below it by
# more than 1% or 0.2 ms is a busy machine: the rank lost its core between the calls (on an
# oversubscribed machine, for one or more scheduler slices) -- a warning, as the figures of
# the step stay right. What would make phases go missing is checked exactly instead: phases_s
# against the timing table's totals, each layer's total against its phases.
PHASE_REL, PHASE_ABS = 0.01, 200e-6
PHASE_OVER = 1e-6
SUM_TOL = 1e-9  # relative: sums of the same doubles in another order
# The clock alignment's bound, half the best round trip of its exchanges, is below 50 us on
# one idle host; above it the exchanges waited for a core (a busy machine: a warning). A
# defect is an alignment that contradicts its own bound: every step starts after a barrier,
# so no rank's event of a step may end, on the aligned clock, later than 2 x the bound plus
# the drift's error after another rank's first event of the next step began.
CLOCK_BUSY = 50e-6


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def check_root(f, args, fail):
    for k in ROOT:
        if k not in f.attrs:
            fail(f"root attribute {k} missing")
    if "file_kind" in f.attrs and text(f.attrs["file_kind"]) != "minicp results":
        fail(f"file_kind = {text(f.attrs.get('file_kind', ''))!r}, expected 'minicp results'")
    if args.complete and text(f.attrs.get("complete", "")) != "yes":
        fail("the file is not marked complete")
    core = text(f.attrs.get("blas_core", ""))
    if args.blas_core is not None and core != args.blas_core:
        fail(f"blas_core {core!r}, expected {args.blas_core!r}")
    if args.blas_not_generic and (not core or core.lower() in GENERIC_CORES):
        fail(f"blas_core {core!r} is a generic core (or none): {text(f.attrs.get('blas_config', ''))}")
    source = text(f.attrs.get("blas_core_source", ""))
    if args.blas_source_has is not None and args.blas_source_has not in source:
        fail(f"blas_core_source {source!r} lacks {args.blas_source_has!r}")


def job_ranks(a):
    """A case's ranks: its mesh's, tp x ranks (its CP degree) x dp; every table has a row per rank."""
    return int(a["tp"]) * int(a["ranks"]) * int(a["dp"])


def check_tables(cid, g, fail):
    """Columns, units and row counts of the per-rank tables; returns the timing rows or None."""
    ranks, layers = job_ranks(g.attrs), int(g.attrs["layers"])
    train = text(g.attrs["pass"]) == "train"
    for name, cols in (("timing", TIMING), ("steps", STEPS), ("memory", MEMORY), ("events", EVENTS)):
        if name not in g or list(g[name].dtype.names) != cols:
            fail(f"{cid}/{name}: columns {None if name not in g else g[name].dtype.names}, expected {cols}")
            return None
    t = g["timing"][()]
    if text(g["timing"].attrs.get("units", "")) != "seconds: s":
        fail(f"{cid}/timing: units attribute")
    modes, reps = len(set(t["mode"])), int(g.attrs["reps"]) * int(g.attrs.get("rounds", 1))
    phases = len(text(g["timing"].attrs["phase_names"]).split(","))
    want = modes * reps * ranks * layers * (2 if train else 1) * phases
    if len(t) != want:
        fail(f"{cid}/timing: {len(t)} rows, expected {want} (modes x reps x ranks x layers x passes x phases)")
    if sorted(set(t["rank"])) != list(range(ranks)):
        fail(f"{cid}/timing: ranks {sorted(set(t['rank']))}")
    if np.any(t["seconds"] < 0) or not np.all(np.isfinite(t["seconds"])):
        fail(f"{cid}/timing: negative or non-finite seconds")
    st = g["steps"][()]
    if len(st) != modes * reps * ranks or len({(r["mode"], r["rep"], r["rank"]) for r in st}) != len(st):
        fail(f"{cid}/steps: {len(st)} rows, expected one per mode, rep and rank ({modes * reps * ranks})")
    return t


def step_name(r):
    return f"rank {r['rank']} rep {r['rep']} mode {r['mode']}"


def check_phases(cid, g, fail, warn):
    """Every step's phases against the step (above it: a defect; below it: a busy machine),
    phases_s against the timing table, each layer's total against its phases."""
    st, t = g["steps"][()], g["timing"][()]
    over = st["phases_s"] - st["step_s"]
    bad = over > PHASE_OVER + SUM_TOL * st["step_s"]
    if np.any(bad):
        r = st[np.argmax(over)]
        fail(f"{cid}/steps: {int(bad.sum())} steps whose phases add up to more than the step (a phase counted "
             f"twice?) (worst: {step_name(r)}: phases {r['phases_s']:.6f} s, step {r['step_s']:.6f} s)")
    short = -over > np.maximum(PHASE_REL * st["step_s"], PHASE_ABS)
    if np.any(short):
        r = st[np.argmax(-over)]
        warn(f"{cid}/steps: {int(short.sum())} of {len(st)} steps whose phases miss the step by more than 1% and "
             f"0.2 ms (worst: {step_name(r)}: phases {r['phases_s']:.6f} s, step {r['step_s']:.6f} s): time outside "
             f"every phase, between the stack's calls: the rank waited for a core")
    total = text(g["timing"].attrs["phase_names"]).split(",").index("total")
    tot = t[t["phase"] == total]
    layers = {}  # (mode, rep, rank) -> sum of the layers' totals
    for r in tot:
        key = (r["mode"], r["rep"], r["rank"])
        layers[key] = layers.get(key, 0.0) + r["seconds"]
    for r in st:
        got = layers.get((r["mode"], r["rep"], r["rank"]), math.nan)
        if not abs(got - r["phases_s"]) <= SUM_TOL * max(r["phases_s"], 1e-3):
            fail(f"{cid}/steps: {step_name(r)}: phases_s {r['phases_s']} s but its layers' totals in the timing "
                 f"table add up to {got} s")
            break
    parts = t[t["phase"] != total]
    key = ["mode", "rep", "rank", "layer", "pass"]
    sums = {}
    for r in parts:
        k = tuple(int(r[c]) for c in key)
        sums[k] = sums.get(k, 0.0) + r["seconds"]
    for r in tot:
        k = tuple(int(r[c]) for c in key)
        if not abs(sums.get(k, math.nan) - r["seconds"]) <= SUM_TOL * max(r["seconds"], 1e-3):
            fail(f"{cid}/timing: (mode, rep, rank, layer, pass) {k}: total {r['seconds']} s but its phases add up "
                 f"to {sums.get(k)} s")
            break


def check_steps(cid, g, s, fail):
    """The step figures recomputed from the steps table."""
    st = g["steps"][()]
    train = text(g.attrs["pass"]) == "train"
    if np.any(np.abs(st["forward_s"] + st["backward_s"] - st["step_s"]) > 1e-9):
        fail(f"{cid}/steps: forward_s + backward_s != step_s")
    steps = sorted(r["step_s"] for r in slowest_per_rep(st, 0))
    median = steps[len(steps) // 2]  # the quartile rule of docs/figures-of-merit.md
    if abs(median - s["measured_time_s"]) > 1e-12:
        fail(f"{cid}/summary: measured_time_s {s['measured_time_s']} but the steps table gives {median}")
    both = s["forward_time_s"] + (s["backward_time_s"] if train else 0.0)
    if abs(both - s["measured_time_s"]) > 1e-9 * max(1.0, s["measured_time_s"]):
        fail(f"{cid}/summary: forward {s['forward_time_s']} + backward {s['backward_time_s']} != measured "
             f"{s['measured_time_s']}")
    if train == math.isnan(s["backward_time_s"]):
        fail(f"{cid}/summary: backward_time_s {s['backward_time_s']} for pass {text(g.attrs['pass'])}")


def slowest_per_rep(st, mode):
    """The slowest rank's row of each rep of one mode, in rep order; of equal step times the
    lowest rank's (docs/figures-of-merit.md)."""
    rows = st[st["mode"] == mode]
    return [max(rows[rows["rep"] == rep], key=lambda r: (r["step_s"], -r["rank"])) for rep in sorted(set(rows["rep"]))]


def check_overlaps(cid, g, s, fail):
    """Each overlap recomputed from the steps table by the definition in docs/figures-of-merit.md."""
    st = g["steps"][()]
    if len(set(st["mode"])) != 3:
        return
    parts = {"": lambda r: r["step_s"], "attn_": lambda r: r["attn_s"],
             "grad_allreduce_": lambda r: r["step_s"] - r["attn_s"]}
    for prefix, part in parts.items():
        v = float(s[prefix + "overlap"])
        if math.isnan(v):
            continue
        full, comp, comm = ([part(r) for r in slowest_per_rep(st, m)] for m in (0, 1, 2))
        if prefix == "grad_allreduce_":  # alone: the collective thread's run time, where one ran it
            rows = st[st["mode"] == 2]
            busy = [max(rows[rows["rep"] == rep]["grad_allreduce_busy_s"]) for rep in sorted(set(rows["rep"]))]
            if not any(math.isnan(b) for b in busy):
                comm = busy
        diff = sorted(f - c for f, c in zip(full, comp))
        raw = 1 - diff[len(diff) // 2] / sorted(comm)[len(comm) // 2]
        note = text(s[prefix + "overlap_note"])
        m = re.match(r"set to \S+ from (\S+):", note)
        want = float(m.group(1)) if m else v
        if abs(raw - want) > 1e-3:
            fail(f"{cid}/summary: {prefix}overlap {v} (note {note!r}) but the steps table gives {raw}")


def check_figures(cid, g, s, modes, fail):
    for k in ("measured_time_s", "layer_efficiency", "tokens_per_s", "useful_flops_per_s", "imbalance",
              "gemm_ceiling_flops_per_s"):
        if not (s[k] > 0 and math.isfinite(s[k])):
            fail(f"{cid}/summary: {k} = {s[k]}")
    flagged = text(s["out_of_range"])
    for k, (lo, hi) in figure_ranges(g.file).items():
        v = float(s[k])
        if not math.isnan(v) and not lo <= v <= hi and not re.search(rf"(^|[ ,;]){re.escape(k)}=", flagged):
            fail(f"{cid}/summary: {k} = {v} outside [{lo}, {hi}] and not flagged in out_of_range")
    if (int(s["figures_in_range"]) == 1) != (flagged == ""):
        fail(f"{cid}/summary: figures_in_range {s['figures_in_range']} with out_of_range {flagged!r}")
    ranks = job_ranks(g.attrs)
    three = modes == 3 and ranks > 1  # overlap needs the three modes and communication
    if (not three and not math.isnan(s["overlap"])) or (three and math.isnan(s["overlap"]) and not text(s["overlap_note"])):
        fail(f"{cid}/summary: overlap {s['overlap']} ({text(s['overlap_note'])!r}) with {modes} modes on {ranks} ranks "
             f"(NaN without the three modes and communication; NaN with them only with a reason)")
    if int(s["overlap_measured"]) != (0 if math.isnan(s["overlap"]) else 1):
        fail(f"{cid}/summary: overlap_measured {s['overlap_measured']} with overlap {s['overlap']}")
    for part in ("attn_", "grad_allreduce_"):
        if three and math.isnan(s[part + "overlap"]) and s[part.rstrip("_") + ("_bytes_sent_per_rank" if part == "attn_" else "_bytes_per_rank")] > 0 \
                and not text(s[part + "overlap_note"]):
            fail(f"{cid}/summary: {part}overlap is NaN without a reason")
    for scheme, setting in (("usp", "ulysses"), ("doublering", "inner_ring")):
        if text(g.attrs["scheme"]) == scheme and int(g.attrs[setting]) < 1:
            fail(f"{cid}: {setting} = {int(g.attrs[setting])}, not the value that ran")
    if s["exec_flops_per_s"] < s["useful_flops_per_s"] * (1 - 1e-9):
        fail(f"{cid}/summary: executed FLOP/s {s['exec_flops_per_s']} below useful {s['useful_flops_per_s']}")
    if modes == 3 and math.isnan(s["compute_only_time_s"]):
        fail(f"{cid}/summary: compute_only_time_s NaN though compute-only ran")
    if abs(s["bytes_sent_per_rank"] - s["attn_bytes_sent_per_rank"] - s["grad_allreduce_bytes_per_rank"]
           - s["tp_bytes_sent_per_rank"]) > 0.5:
        fail(f"{cid}/summary: bytes_sent_per_rank != attention + gradient all-reduce + TP bytes")


def check_documents(cid, g, fail):
    """The packed documents against the attributes that describe them: the lengths (a case of
    sweep.documents) sum to seq_len, their count and longest are documents_count and
    documents_max_tokens; without them, one document of seq_len (or of doc_len each).
    Returns the lengths."""
    a = g.attrs
    S, count, longest = int(a["seq_len"]), int(a["documents_count"]), int(a["documents_max_tokens"])
    if text(a["documents"]):
        if "documents" not in g:
            fail(f"{cid}: documents {text(a['documents'])!r} but no /documents dataset")
            return [S]
        lengths = [int(x) for x in g["documents"][...]]
        if sum(lengths) != S or min(lengths) < 1:
            fail(f"{cid}/documents: lengths sum to {sum(lengths)} (min {min(lengths)}), expected {S} (each >= 1)")
        if (count, longest) != (len(lengths), max(lengths)):
            fail(f"{cid}: documents_count {count}, documents_max_tokens {longest}; the lengths: {len(lengths)}, "
                 f"{max(lengths)}")
        return lengths
    L = int(a.get("doc_len", 0)) if text(a["mask"]) == "documents" else 0
    want = (-(-S // L), min(L, S)) if L > 0 else (1, S)
    if (count, longest) != want:
        fail(f"{cid}: documents_count {count}, documents_max_tokens {longest}, expected {want}")
    return [L] * (S // L) + ([S % L] if S % L else []) if L > 0 else [S]


def mask_area(a, lengths):
    """Visible (query, key) pairs of a train or prefill case's mask over the whole sequence,
    from its definition: causal S(S+1)/2, full S^2, a window W: sum of min(q + 1, W), documents
    sum L(L+1)/2 over their lengths (causal inside each)."""
    S, mask = int(a["seq_len"]), text(a["mask"])
    if mask == "full":
        return S * S
    if mask == "window":
        W = int(a["window"])
        return sum(min(q + 1, W) for q in range(S))
    return sum(L * (L + 1) // 2 for L in lengths)


def check_area(cid, g, s, lengths, fail):
    """attention_area_pairs, the schedules' count, against the mask's area times the heads and
    the DP replicas; area_imbalance 1 on one rank."""
    a = g.attrs
    if text(a["pass"]) != "decode":
        want = mask_area(a, lengths) * int(a["heads"]) * int(a["dp"])
        if float(s["attention_area_pairs"]) != want:
            fail(f"{cid}/summary: attention_area_pairs {float(s['attention_area_pairs']):.0f}, the mask's area x heads "
                 f"{want}")
    if int(a["ranks"]) == 1 and abs(float(s["area_imbalance"]) - 1) > 1e-12:
        fail(f"{cid}/summary: area_imbalance {float(s['area_imbalance'])} on one rank")


def check_memory(cid, g, args, fail):
    worst = 0.0
    ranks = job_ranks(g.attrs)
    m = g["memory"][()]
    if sorted(m["rank"]) != list(range(ranks)):
        fail(f"{cid}/memory: one row per rank expected, got ranks {list(m['rank'])}")
    if text(g["memory"].attrs.get("units", "")) != "bytes":
        fail(f"{cid}/memory: units attribute")
    for row in m:
        if row["kokkos_peak_bytes"] <= 0 or row["rss_peak_bytes"] <= 0 or row["predicted_bytes"] <= 0:
            fail(f"{cid}/memory: rank {row['rank']}: {row}")
        # The tensors' space is one of the spaces counted; a host build has no other.
        host_only = text(g.file.attrs.get("kokkos_exec_space", "")) in ("OpenMP", "Serial", "Threads")
        if not 0 < row["space_peak_bytes"] <= row["kokkos_peak_bytes"] or (
                host_only and row["space_peak_bytes"] != row["kokkos_peak_bytes"]):
            fail(f"{cid}/memory: rank {row['rank']}: space_peak_bytes {row['space_peak_bytes']} against "
                 f"kokkos_peak_bytes {row['kokkos_peak_bytes']} ({'host build: equal' if host_only else 'at most'})")
        err = abs(row["predicted_bytes"] - row["kokkos_peak_bytes"]) / row["kokkos_peak_bytes"]
        worst = max(worst, err)
        if args.memory_tolerance is not None and err > args.memory_tolerance:
            fail(f"{cid}/memory: rank {row['rank']}: predicted {row['predicted_bytes']} B vs Kokkos peak "
                 f"{row['kokkos_peak_bytes']} B ({100 * err:.1f}% > {100 * args.memory_tolerance:.0f}%)")
    return worst


def check_events(cid, g, args, fail):
    ranks = job_ranks(g.attrs)
    e = g["events"][()]
    kinds = text(g["events"].attrs["kind_names"]).split(",")
    if args.no_events:
        if len(e):
            fail(f"{cid}/events: {len(e)} events with --no-events")
    elif len(e) == 0:
        fail(f"{cid}/events: empty")
    elif np.any(e["t_end"] < e["t_begin"]):
        fail(f"{cid}/events: t_end < t_begin")
    elif sorted(set(e["rank"])) != list(range(ranks)):
        fail(f"{cid}/events: ranks {sorted(set(e['rank']))}")
    elif "kernel" not in kinds or not np.any(e["kind"] == kinds.index("kernel")):
        fail(f"{cid}/events: no kernel events")
    elif ranks > 1 and not np.any(e["bytes"] > 0):
        fail(f"{cid}/events: no event moved bytes on {ranks} ranks")
    elif np.any((e["mode"] == 1) & (e["bytes"] > 0)):
        bad = e[(e["mode"] == 1) & (e["bytes"] > 0)]
        fail(f"{cid}/events: compute-only mode sent bytes: {len(bad)} events, kinds "
             f"{sorted({kinds[k] for k in bad['kind']})}")
    elif ranks > 1 and text(g.attrs["pass"]) == "train" and int(g.attrs["layers"]) > 1:
        # The gradient all-reduce of each layer carries the layer that posted it.
        ar = e[(e["kind"] == kinds.index("allreduce")) & (e["bytes"] > 1 << 12)]
        if len(ar) and sorted(set(ar["layer"])) != list(range(int(g.attrs["layers"]))):
            fail(f"{cid}/events: gradient all-reduces stamped with layers {sorted(set(ar['layer']))}")


def check_clock(cid, g, s, fail, warn):
    """The events' alignment against its own bound (see CLOCK_BUSY); a bound above 50 us is
    a busy machine's."""
    u = float(s.get("clock_uncertainty_s", math.nan))
    if not (u >= 0 and math.isfinite(u)):
        fail(f"{cid}/summary: clock_uncertainty_s {u} (expected a bound >= 0 s)")
        return
    if u > CLOCK_BUSY:
        warn(f"{cid}/summary: clock uncertainty {1e6 * u:.0f} us > 50 us: the clock exchanges waited for a core (the "
             f"events are aligned within that bound; the figures do not use it)")
    e = g["events"][()]
    if len(e) == 0 or job_ranks(g.attrs) < 2:
        return
    steps = {}  # (mode, rep) -> (first t_begin, last t_end) over every rank
    for k in set(zip(e["mode"].tolist(), e["rep"].tolist())):
        sel = e[(e["mode"] == k[0]) & (e["rep"] == k[1])]
        steps[k] = (float(sel["t_begin"].min()), float(sel["t_end"].max()))
    order = sorted(steps, key=lambda k: steps[k][0])
    slack = 2 * u + 1e-6
    for a, b in zip(order, order[1:]):
        if steps[a][1] > steps[b][0] + slack:
            fail(f"{cid}/events: step (mode {a[0]}, rep {a[1]}) ends {1e6 * (steps[a][1] - steps[b][0]):.1f} us after "
                 f"step (mode {b[0]}, rep {b[1]}) began, though a barrier parts them: the aligned clock is off by "
                 f"more than twice its bound ({1e6 * u:.1f} us)")
            return


def check_rounds(f, fail):
    """Consecutive cases that ran, round by round: [A0][B0]...[A1][B1]... on the aligned clock."""
    spans = []  # per case that ran, in run order: [(first t_begin, last t_end)] per round
    for cid in sorted(f["cases"]):
        g = f["cases"][cid]
        rounds, reps = int(g.attrs.get("rounds", 1)), int(g.attrs["reps"])
        if rounds < 2 or text(g.attrs["status"]) != "ok" or "events" not in g or not len(g["events"]):
            continue
        ev = g["events"][()]
        per = []
        for k in range(rounds):
            e = ev[(ev["rep"] >= k * reps) & (ev["rep"] < (k + 1) * reps)]
            if not len(e):
                fail(f"{cid}: no events in round {k + 1} of {rounds} (reps {k * reps}..{(k + 1) * reps - 1})")
                return
            per.append((float(e["t_begin"].min()), float(e["t_end"].max())))
        spans.append((cid, per))
    for (a, pa), (b, pb) in zip(spans, spans[1:]):
        for k in range(len(pa)):
            if not pa[k][1] <= pb[k][0]:
                fail(f"round {k + 1}: {a} ends at {pa[k][1]:.6f} s, after {b} begins ({pb[k][0]:.6f} s)")
            if k + 1 < len(pa) and not pb[k][1] <= pa[k + 1][0]:
                fail(f"{b}'s round {k + 1} ends at {pb[k][1]:.6f} s, after {a}'s round {k + 2} begins: not interleaved")
    return len(spans)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("file")
    ap.add_argument("--cases", type=int)
    ap.add_argument("--memory-tolerance", type=float)
    ap.add_argument("--complete", action="store_true", help="the run must have finished")
    ap.add_argument("--no-events", action="store_true", help="the run recorded no events")
    ap.add_argument("--blas-core", help="the BLAS core the run must have recorded")
    ap.add_argument("--blas-not-generic", action="store_true", help="the recorded core must not be a generic one")
    ap.add_argument("--blas-source-has", help="text the recorded blas_core_source must contain")
    args = ap.parse_args()
    why = unreadable(args.file)
    if why:
        print(f"check_results: FILE {args.file}: {why}", file=sys.stderr)
        return 2
    fails, warnings = [], []
    fail, warn = fails.append, warnings.append
    worst_mem = 0.0
    with h5py.File(args.file, "r") as f:
        check_root(f, args, fail)
        cases = f.get("cases", {})
        required = [e["name"] for e in catalog(f) if e["required"]]
        if args.cases is not None and len(cases) != args.cases:
            fail(f"{len(cases)} cases, expected {args.cases}")
        for cid, g in cases.items():
            for k in CASE:
                if k not in g.attrs:
                    fail(f"{cid}: attribute {k} missing")
            status = text(g.attrs.get("status", ""))
            if status != "ok":
                if not status.startswith("refused: "):
                    fail(f"{cid}: status {status!r} is neither ok nor refused: ...")
                continue
            for k in CASE_RUN:
                if k not in g.attrs:
                    fail(f"{cid}: attribute {k} missing")
            n = len(fails)
            t = check_tables(cid, g, fail)
            s = g["summary"].attrs
            for k in required:
                if k not in s:
                    fail(f"{cid}/summary: {k} missing (the figure_catalog marks it required)")
            for k in uncatalogued(f, g):
                fail(f"{cid}/summary: {k} is not in the file's figure_catalog (minicp --list-figures)")
            if len(fails) > n or t is None:
                continue
            check_area(cid, g, s, check_documents(cid, g, fail), fail)
            check_steps(cid, g, s, fail)
            check_phases(cid, g, fail, warn)
            check_figures(cid, g, s, len(set(t["mode"])), fail)
            check_clock(cid, g, s, fail, warn)
            check_overlaps(cid, g, s, fail)
            worst_mem = max(worst_mem, check_memory(cid, g, args, fail))
            check_events(cid, g, args, fail)
        interleaved = check_rounds(f, fail)
        print(f"check_results: {args.file}: {len(cases)} cases; memory model worst error {100 * worst_mem:.1f}%"
              + (f"; the rounds of {interleaved} cases checked" if interleaved else ""))
    for x in warnings:
        print("WARNING (busy machine, not a defect):", x)
    for x in fails:
        print("FAIL:", x)
    return 1 if fails else 0


def unreadable(path):
    """Why a path cannot be checked (missing, a directory, not HDF5, truncated), or None."""
    if not os.path.exists(path):
        return "no such file (expected a minicp results file, .h5)"
    if os.path.isdir(path):
        return "is a directory (expected a minicp results file, .h5)"
    if not h5py.is_hdf5(path):
        return "not an HDF5 file (expected a minicp results file, .h5)"
    try:
        h5py.File(path, "r").close()
    except OSError as e:
        return f"an HDF5 file that cannot be opened ({str(e).splitlines()[0]}: a truncated file?)"
    return None


if __name__ == "__main__":
    sys.exit(main())
