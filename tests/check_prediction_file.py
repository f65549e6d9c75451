#!/usr/bin/python3
"""Checks the performance model's figures in a results file that minicp wrote with
run.calibration = "measure", against the file itself and against `minicp --predict --against`:
  - the table kept in the file (root attribute `calibration`) holds the links measured alone
    (a `link` row with the all-reduce's rate) and beside compute (`busy` rows, exchange and
    all-reduce, with a wire rate > 0 and a loss >= 0);
  - the table holds `coll` rows (blocking collectives at the deck's sizes): every all-to-all
    size a ulysses case waited for is a row or lies between two, and the rows agree within 10x
    with the median of those calls as the file's comm-only reps timed them (a second
    measurement; the median, as a row's mean may or may not hold one of the rare calls that
    wait for a descheduled rank, milliseconds long on oversubscribed cores);
  - the table holds `posted` rows (non-blocking all-gathers and reduce-scatters timed as the
    allgather scheme's pipeline posts them beside compute) at every size the file's allgather
    training cases moved, seconds per call in [0, 0.1);
  - the table holds a `layer` row for the rows per rank of every training case on both ranks,
    and each agrees within 3x with the layer's phases other than attention as the file's
    compute-only reps of those cases timed them (a second measurement of the same kernels; 3x,
    as the tiny deck's layer takes tens of microseconds on oversubscribed cores); likewise at
    the decode tokens of every decode case on both ranks (forward only); and every layer row
    holds its GEMMs timed beside it, between 1/20 (the tiny layer is mostly launches and
    element-wise kernels) and 1.5x of the layer that runs them;
  - every case that ran has a finite predicted_time_s > 0, and its predicted phases add up to it;
  - `minicp --predict --against FILE` exits 0, prints the links beside compute, and predicts each
    case as the run did (same table, same drift scale: the two computations agree to the 4
    digits printed);
  - `minicp --advise` on the file's deck and table (as run, and at S = 2048 where schemes tie):
    each group ranked by predicted step with its percentage over the first, one line per refused
    case, and the schemes within 5% of the first named as a tie, exactly those.
Usage: check_prediction_file.py --minicp BIN --file FILE.h5"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

import h5py
import numpy

from check_analysis import fail, text, verdict  # the same failure list, attribute reading and verdict


def table_rows(table):
    """The calibration table's rows, split into fields (comments and blank lines left out)."""
    return [ln.split() for ln in table.splitlines() if ln.strip() and not ln.startswith("#")]


def check_table(table):
    rows = table_rows(table)
    links = [r for r in rows if r[0] == "link"]
    busy = {(r[2], r[3]): (float(r[4]), float(r[5])) for r in rows if r[0] == "busy"}
    if not links or len(links[0]) < 7 or float(links[0][6]) <= 0:
        fail(f"calibration: no link row with the all-reduce's rate: {links}")
    for kind in ("p2p", "allreduce"):
        if ("intra", kind) not in busy:
            fail(f"calibration: no 'busy <fabric> intra {kind}' row (rows: {sorted(busy)})")
            continue
        wire, cpu = busy[("intra", kind)]
        if not (wire > 0 and cpu >= 0 and math.isfinite(wire) and math.isfinite(cpu)):
            fail(f"calibration: busy intra {kind}: wire {wire} B/s, loss {cpu} B/s out of range")


def check_colls(f, table):
    """The all-to-alls the ulysses cases waited for (comm-only reps, bytes = the payload at 2
    ranks) against the table's alltoall rows over 2 ranks."""
    rows = {int(r[5]): float(r[6]) for r in table_rows(table)
            if r[0] == "coll" and r[3] == "alltoall" and r[4] == "2"}
    if not rows:
        fail("calibration: no 'coll <fabric> intra alltoall 2 ...' rows")
        return
    checked = 0
    for cid, g in f["cases"].items():
        if "_ulysses_" not in cid or text(g.attrs["status"]) != "ok" or "events" not in g:
            continue
        ev = g["events"][:]
        modes, kinds = (text(g["events"].attrs[k]).split(",") for k in ("mode_names", "kind_names"))
        if "comm-only" not in modes:
            continue
        comm_only, a2a = modes.index("comm-only"), kinds.index("alltoall")
        calls = ev[(ev["mode"] == comm_only) & (ev["kind"] == a2a)]
        for size in sorted(set(int(b) for b in calls["bytes"])):
            d = calls[calls["bytes"] == size]
            typical = float(numpy.median(d["t_end"] - d["t_begin"]))
            if size in rows:
                row = rows[size]
            elif min(rows) < size < max(rows):
                lo, hi = max(r for r in rows if r < size), min(r for r in rows if r > size)
                row = rows[lo] + (size - lo) / (hi - lo) * (rows[hi] - rows[lo])
            else:
                fail(f"{cid}: alltoall of {size} B: no coll row at or around it (rows at {sorted(rows)})")
                continue
            if not (0.1 * row <= typical <= 10 * row):
                fail(f"{cid}: alltoall of {size} B took {typical * 1e6:.1f} us per call (median) in comm-only reps, "
                     f"the table says {row * 1e6:.1f} us")
            checked += 1
    if not checked:
        fail("no ulysses all-to-all found in the file's comm-only reps")


def check_posted(f, table):
    """The posted rows against the sizes the allgather training cases moved (events of kind
    allgather and reduce_scatter)."""
    rows = table_rows(table)
    posted = {(r[3], int(r[5])): float(r[6]) for r in rows if r[0] == "posted" and r[4] == "2"}
    checked = 0
    for cid, g in f["cases"].items():
        if "_train_allgather_" not in cid or text(g.attrs["status"]) != "ok" or "events" not in g:
            continue
        ev = g["events"][:]
        kinds = text(g["events"].attrs["kind_names"]).split(",")
        for op in ("allgather", "reduce_scatter"):
            for size in sorted(set(int(b) for b in ev[ev["kind"] == kinds.index(op)]["bytes"])):
                if (op, size) not in posted:
                    fail(f"{cid}: {op} of {size} B: no 'posted ... {op} 2 {size}' row "
                         f"(rows at {sorted(k for k in posted if k[0] == op)})")
                    continue
                s = posted[(op, size)]
                if not (0 <= s < 0.1 and math.isfinite(s)):
                    fail(f"calibration: posted {op} of {size} B: {s} s per call out of range")
                checked += 1
    if not checked:
        fail("no allgather training case moved an all-gather or a reduce-scatter")


def check_layers(f, table):
    """The table's layer rows against the compute-only reps of the cases: training cases
    (forward and backward, at S/P rows) and decode cases (forward only, at decode_tokens rows;
    their rows' backward is 0), each at the ranks it ran on (the ranks computing at once)."""
    rows = {}
    for r in table_rows(table):  # the layer's GEMMs timed beside it: a part of the layer's kernels
        if r[0] != "layer":
            continue
        if len(r) != 13:
            fail(f"layer row {' '.join(r)}: want the GEMM seconds timed beside the layer and the ranks computing")
            continue
        rows[(int(r[7]), int(r[12]))] = (float(r[8]), float(r[9]))
        for layer_s, gemm_s, what in ((float(r[8]), float(r[10]), "forward"), (float(r[9]), float(r[11]), "backward")):
            if (layer_s > 0) != (gemm_s > 0) or (gemm_s > 0 and not layer_s / 20 <= gemm_s <= 1.5 * layer_s):
                fail(f"layer row {' '.join(r)}: its GEMMs' {what} {gemm_s} s against the layer's {layer_s} s "
                     f"(want both 0, or the GEMMs within 1/20 to 1.5x of the layer that runs them)")
    kernels = ("norm", "qkv", "rope", "out_proj", "mlp")
    checked = set()
    for cid, g in f["cases"].items():
        pass_ = text(g.attrs["pass"])
        if text(g.attrs["status"]) != "ok" or pass_ not in ("train", "decode"):
            continue
        P = int(g.attrs["ranks"])
        n = int(g.attrs["seq_len"]) // P if pass_ == "train" else int(g.attrs["decode_tokens"])
        if (n, P) not in rows:
            fail(f"{cid}: no layer row at {n} rows per rank with {P} ranks computing (rows, ranks: {sorted(rows)})")
            continue
        n = (n, P)
        t = g["timing"][:]
        phases = text(g["timing"].attrs["phase_names"]).split(",")
        co = t[t["mode"] == 1]  # compute-only
        if not len(co):
            continue
        want = numpy.isin(co["phase"], [phases.index(k) for k in kernels])
        layers = len(set(co["layer"]))
        if pass_ == "decode" and rows[n][1] != 0:
            fail(f"{cid}: the layer row at (rows, ranks) {n} (a decode case's) has a backward time, {rows[n][1]} s")
        for direction in ((0, 1) if pass_ == "train" else (0,)):
            measured = rows[n][direction]
            d = co[want & (co["pass"] == direction)]
            per_rep = [d[(d["rep"] == r) & (d["rank"] == k)]["seconds"].sum() / layers
                       for r in sorted(set(d["rep"])) for k in sorted(set(d["rank"]))]
            typical = float(numpy.median(per_rep))
            if not (measured / 3 <= typical <= 3 * measured):
                fail(f"{cid}: a layer's kernels took {typical * 1e6:.1f} us ({'backward' if direction else 'forward'}) "
                     f"in the compute-only reps, the table's layer row at (rows, ranks) {n} says {measured * 1e6:.1f} us")
        checked.add((pass_, P))
    for want in (("train", 1), ("train", 2), ("decode", 2)):
        if want not in checked:
            fail(f"no {want[0]} case on {want[1]} rank(s) with compute-only reps to check the layer rows with")
    # The rows are measured again in every round: the table says over how many.
    rounds = {int(g.attrs["rounds"]) for g in f["cases"].values()}
    said = [r[2] for r in table_rows(table) if r[0] == "info" and r[1] == "layer_rows_rounds"]
    if max(rounds) > 1 and said != [str(max(rounds))]:
        fail(f"the run had {max(rounds)} rounds; the table says its layer rows are the median of {said} "
             "(want one 'info layer_rows_rounds' row naming the rounds)")


def advise_groups(minicp, deck, table, sets):
    """`minicp --advise` parsed: [(group, [(scheme, s/step, percent)], [refused scheme], [tied scheme])]."""
    argv = [minicp, "--advise", "--deck", deck, "--calibration", table]
    for kv in sets:
        argv += ["--set", kv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail(f"{' '.join(argv)}: exit {out.returncode}: {out.stderr}")
    groups = []
    for line in out.stdout.splitlines():
        if re.match(r"^(train|decode), S = \d+, \d+ ranks(, documents \S+)?:$", line):
            groups.append((line[:-1], [], [], []))
        elif groups and (m := re.match(r"^  \d+\. (\S+) +(\S+) s/step +([+-][0-9.]+)%", line)):
            groups[-1][1].append((m.group(1), float(m.group(2)), float(m.group(3))))
        elif groups and (m := re.match(r"^     (\S+) +refused: ", line)):
            groups[-1][2].append(m.group(1))
        elif groups and (m := re.match(r"^     within 5% of (\S+): (.*) \(a tie at the model's accuracy\)$", line)):
            groups[-1][3].extend(m.group(2).split(", "))
    return groups


def check_advise(minicp, deck, table, sets, refused_cases):
    groups = advise_groups(minicp, deck, table, sets)
    if not groups:
        fail(f"--advise {sets}: no groups printed")
    refused = 0
    for name, ranked, refused_here, tied in groups:
        refused += len(refused_here)
        times = [t for _, t, _ in ranked]
        if times != sorted(times):
            fail(f"--advise {name}: not ranked by predicted step: {ranked}")
        for scheme, t, pct in ranked:
            # the steps are printed to 4 significant digits: their rounding grows with the ratio
            if abs(pct - 100 * (t / times[0] - 1)) > 0.15 + 0.1 * t / times[0]:
                fail(f"--advise {name}: {scheme} {pct}% over the first, its step says {100 * (t / times[0] - 1):.2f}%")
        want = [sch for sch, t, _ in ranked[1:] if t <= 1.05 * times[0] * (1 - 1e-3)]
        maybe = {sch for sch, t, _ in ranked[1:] if abs(t - 1.05 * times[0]) <= 1.05e-3 * times[0]}
        if not set(want) <= set(tied) or not set(tied) <= set(want) | maybe:
            fail(f"--advise {name}: tied {tied}, within 5% of the first by the printed steps: {want}")
    if refused_cases is not None and refused != refused_cases:
        fail(f"--advise: {refused} refused lines, the file has {refused_cases} refused cases")
    return groups


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minicp", required=True)
    ap.add_argument("--file", required=True)
    a = ap.parse_args()
    stored = {}
    refused_cases = 0
    with h5py.File(a.file, "r") as f:
        check_table(text(f.attrs["calibration"]))
        check_colls(f, text(f.attrs["calibration"]))
        check_posted(f, text(f.attrs["calibration"]))
        check_layers(f, text(f.attrs["calibration"]))
        deck_text, table_text = text(f.attrs["deck"]), text(f.attrs["calibration"])
        refused_cases = sum(text(g.attrs["status"]).startswith("refused") for g in f["cases"].values())
        for cid, g in f["cases"].items():
            if text(g.attrs["status"]) != "ok":
                continue
            s = g["summary"].attrs
            t = float(s["predicted_time_s"])
            if not (math.isfinite(t) and t > 0):
                fail(f"{cid}: predicted_time_s {t}")
                continue
            phases = sum(float(v) for k, v in s.items() if k.startswith("predicted_") and k.endswith("_s")
                         and k not in ("predicted_time_s", "predicted_forward_time_s", "predicted_backward_time_s"))
            if abs(phases - t) > 1e-6 * t:
                fail(f"{cid}: predicted phases add up to {phases:.6g} s, the step is {t:.6g} s")
            stored[cid] = t
    if not stored:
        fail("no case ran")
    out = subprocess.run([a.minicp, "--predict", "--against", a.file], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail(f"minicp --predict --against: exit {out.returncode}: {out.stderr}")
    for what in ("intra-node exchange", "intra-node all-reduce"):
        if not re.search(rf"beside compute, {what}: [0-9.e+-]+ GB/s; compute loses", out.stdout):
            fail(f"--against does not print the {what} beside compute:\n{out.stdout}")
    if not re.search(r"blocking alltoall over 2 ranks, intra-node: [0-9.e+-]+ us at ", out.stdout):
        fail(f"--against does not print the blocking all-to-alls it was given:\n{out.stdout}")
    if not re.search(r"layer kernels as run at [0-9]+ rows, [0-9]+ ranks? computing: [0-9.]+x forward, [0-9.]+x backward", out.stdout):
        fail(f"--against does not print the layer rows it was given:\n{out.stdout}")
    seen = 0
    for line in out.stdout.splitlines():
        f = line.split()
        if f and f[0] in stored:
            seen += 1
            predicted = float(f[2])
            if abs(predicted - stored[f[0]]) > 1e-3 * stored[f[0]]:
                fail(f"{f[0]}: --against predicts {predicted} s, the run stored {stored[f[0]]:.6g} s")
    if seen != len(stored):
        fail(f"--against printed {seen} of the {len(stored)} cases that ran:\n{out.stdout}")
    with tempfile.TemporaryDirectory() as work:
        deck, table = os.path.join(work, "deck.toml"), os.path.join(work, "table.txt")
        with open(deck, "w") as f:
            f.write(deck_text)
        with open(table, "w") as f:
            f.write(table_text)
        check_advise(a.minicp, deck, table, [], refused_cases)
        tied = check_advise(a.minicp, deck, table, ["sweep.seq_len=[2048]", 'run.pass="train"'], None)
        if not any(g[3] for g in tied):
            fail("--advise at S = 2048: no tie named, though the ring schemes predict within 1% there")
    return verdict(f"model figures of {len(stored)} cases")


if __name__ == "__main__":
    sys.exit(main())
