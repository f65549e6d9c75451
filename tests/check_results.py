#!/usr/bin/env python3
"""Checks a minicp results file (README, "The results file"): the root attributes, every case's
attributes and status, the timing, memory and events tables (columns, units, row counts, one
row per rank), the figures of merit (names, units, NaN only where not measured), the aligned
clock bound, and optionally the memory model against the Kokkos high-water mark.
Usage: check_results.py FILE.h5 [--cases N] [--ranks P] [--memory-tolerance 0.15] [--complete]"""
import argparse
import math
import sys

import h5py
import numpy as np

ROOT = ["minicp_version", "git_sha", "compiler", "compiler_flags", "kokkos_version", "kokkos_exec_space",
        "kokkos_concurrency", "comm_backend", "progress", "mpi_library", "hosts", "slurm_job_id",
        "slurm_job_nodelist", "start_time", "deck", "command_line", "complete", "file_kind"]
CASE = ["scheme", "pass", "mask", "dtype", "status", "seq_len", "ranks", "hidden", "heads", "kv_heads",
        "head_dim", "ffn", "layers", "complete"]
SUMMARY = ["measured_time_s", "layer_efficiency", "cp_efficiency", "overlap", "overlap_q1", "overlap_q3",
           "exposed_comm_s", "comm_wait_s", "imbalance", "flop_imbalance", "useful_flops_per_s",
           "exec_flops_per_s", "tokens_per_s", "bytes_sent_per_rank", "units"]
TIMING = ["mode", "rep", "rank", "layer", "pass", "phase", "seconds"]
MEMORY = ["rank", "kokkos_peak_bytes", "rss_peak_bytes", "predicted_bytes"]
EVENTS = ["rank", "rep", "mode", "layer", "pass", "step", "kind", "peer", "group", "label", "bytes", "flops",
          "t_begin", "t_end"]


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("file")
    ap.add_argument("--cases", type=int)
    ap.add_argument("--memory-tolerance", type=float)
    ap.add_argument("--complete", action="store_true", help="the run must have finished")
    ap.add_argument("--no-events", action="store_true", help="the run recorded no events")
    args = ap.parse_args()
    fails = []
    fail = fails.append
    with h5py.File(args.file, "r") as f:
        for k in ROOT:
            if k not in f.attrs:
                fail(f"root attribute {k} missing")
        if "file_kind" in f.attrs and text(f.attrs["file_kind"]) != "minicp results":
            fail(f"file_kind = {text(f.attrs.get('file_kind', ''))!r}, expected 'minicp results'")
        if args.complete and text(f.attrs.get("complete", "")) != "yes":
            fail("the file is not marked complete")
        cases = f.get("cases", {})
        if args.cases is not None and len(cases) != args.cases:
            fail(f"{len(cases)} cases, expected {args.cases}")
        worst_mem = 0.0
        for cid, g in cases.items():
            for k in CASE:
                if k not in g.attrs:
                    fail(f"{cid}: attribute {k} missing")
            status = text(g.attrs.get("status", ""))
            if status != "ok":
                if not status.startswith("refused: "):
                    fail(f"{cid}: status {status!r} is neither ok nor refused: ...")
                continue
            ranks, layers = int(g.attrs["ranks"]), int(g.attrs["layers"])
            train = text(g.attrs["pass"]) == "train"
            for name, cols in (("timing", TIMING), ("memory", MEMORY), ("events", EVENTS)):
                if name not in g or list(g[name].dtype.names) != cols:
                    fail(f"{cid}/{name}: columns {None if name not in g else g[name].dtype.names}, expected {cols}")
            if fails:
                continue
            t = g["timing"][()]
            if text(g["timing"].attrs.get("units", "")) != "seconds: s":
                fail(f"{cid}/timing: units attribute")
            modes = len(set(t["mode"]))
            reps = int(g.attrs["reps"])
            phases = len(text(g["timing"].attrs["phase_names"]).split(","))
            want = modes * reps * ranks * layers * (2 if train else 1) * phases
            if len(t) != want:
                fail(f"{cid}/timing: {len(t)} rows, expected {want} (modes x reps x ranks x layers x passes x phases)")
            if sorted(set(t["rank"])) != list(range(ranks)):
                fail(f"{cid}/timing: ranks {sorted(set(t['rank']))}")
            if np.any(t["seconds"] < 0) or not np.all(np.isfinite(t["seconds"])):
                fail(f"{cid}/timing: negative or non-finite seconds")
            m = g["memory"][()]
            if sorted(m["rank"]) != list(range(ranks)):
                fail(f"{cid}/memory: one row per rank expected, got ranks {list(m['rank'])}")
            if text(g["memory"].attrs.get("units", "")) != "bytes":
                fail(f"{cid}/memory: units attribute")
            for row in m:
                if row["kokkos_peak_bytes"] <= 0 or row["rss_peak_bytes"] <= 0 or row["predicted_bytes"] <= 0:
                    fail(f"{cid}/memory: rank {row['rank']}: {row}")
                err = abs(row["predicted_bytes"] - row["kokkos_peak_bytes"]) / row["kokkos_peak_bytes"]
                worst_mem = max(worst_mem, err)
                if args.memory_tolerance is not None and err > args.memory_tolerance:
                    fail(f"{cid}/memory: rank {row['rank']}: predicted {row['predicted_bytes']} B vs Kokkos peak "
                         f"{row['kokkos_peak_bytes']} B ({100 * err:.1f}% > {100 * args.memory_tolerance:.0f}%)")
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
            s = g["summary"].attrs
            for k in SUMMARY:
                if k not in s:
                    fail(f"{cid}/summary: {k} missing")
            if fails:
                continue
            for k in ("measured_time_s", "layer_efficiency", "tokens_per_s", "useful_flops_per_s", "imbalance"):
                if not (s[k] > 0 and math.isfinite(s[k])):
                    fail(f"{cid}/summary: {k} = {s[k]}")
            three = modes == 3 and ranks > 1  # overlap needs the three modes and communication
            if three != (int(s["overlap_measured"]) == 1) or three == math.isnan(s["overlap"]):
                fail(f"{cid}/summary: overlap {s['overlap']} with {modes} modes (NaN exactly when not measured)")
            if float(s.get("clock_uncertainty_s", 0)) > 50e-6:
                fail(f"{cid}/summary: clock uncertainty {s['clock_uncertainty_s']} s > 50 us (one host)")
        print(f"check_results: {args.file}: {len(cases)} cases; memory model worst error {100 * worst_mem:.1f}%")
    for x in fails:
        print("FAIL:", x)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
