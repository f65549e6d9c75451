"""The command line: `python3 -m minicp_analysis report|plots|trace ...`. Bad input (a flag,
a value or a file that cannot be used) prints one message naming it and what is allowed,
and exits with status 2."""
import argparse
import sys

from . import UsageError
from .outputs import OVERWRITE, OVERWRITE_HELP

PROG = "minicp_analysis"


def _commands():
    """Each command: its one-line help, its description, and its arguments as
    (flags, add_argument keywords), in the order --help lists them."""
    from .plots import PLOTS
    overwrite = ((OVERWRITE,), dict(action="store_true", help=OVERWRITE_HELP))
    report = [
        (("files",), dict(nargs="+", metavar="FILE",
                          help="minicp results .h5 files, or a study index .csv (slurm/submit collect) or the fabric "
                               "study .csv, which list results files (required)")),
        (("--scheme",), dict(action="append", metavar="NAME",
                             help="only these schemes (repeatable, or a comma list; default: all)")),
        (("--pass",), dict(dest="pass_", action="append", metavar="PASS",
                           help="only these passes: train, prefill, decode (repeatable, or a comma list; "
                                "default: all)")),
        (("--seq-len",), dict(action="append", metavar="N",
                              help="only these sequence lengths in tokens (repeatable, or a comma list; "
                                   "default: all)")),
        (("--sort",), dict(metavar="COLUMN",
                           help="sort by this column, ascending, NaN last (a header or its name without the unit; "
                                "default: file order, then case id)")),
        (("--desc",), dict(action="store_true", help="with --sort: descending (default: off)")),
        (("--columns",), dict(action="append", metavar="LIST",
                              help="show these columns, in this order (a comma list, repeatable; any column of the "
                                   "case table, every summary attribute too; default: file, case, scheme, pass, "
                                   "mask, dtype, seq_len, ranks, status, measured time, tokens/s, CP efficiency, "
                                   "overlaps, exposed comm, imbalance, bytes sent, peak and predicted memory, "
                                   "predicted time and ratio when present)")),
        (("--csv",), dict(metavar="FILE", help="also write the table as CSV to FILE; '-' writes only the CSV, to "
                                               "stdout; an existing FILE must be a table this command wrote "
                                               "(default: none)")),
        overwrite,
    ]
    plots = [
        (("inputs",), dict(nargs="+", metavar="INPUT",
                           help="minicp results .h5 files, a study index .csv, the fabric study .csv, or the fidelity study .json "
                                "(alone: fidelity.png) (required)")),
        (("--out",), dict(metavar="DIR",
                          help="folder for the PNGs; an existing one may hold only what this command writes (PNGs, "
                               "fabric.csv) (default: results/plots/<stem of the first input>/)")),
        (("--case",), dict(metavar="ID", help="the case of the timeline (default: the first ring-family case at the "
                                              "largest seq_len with a full-mode rep)")),
        (("--only",), dict(action="append", metavar="LIST",
                           help=f"make only these plots (a comma list, repeatable; of {', '.join(PLOTS)}; "
                                f"default: all)")),
        (("--dpi",), dict(type=int, default=120, metavar="N", help="resolution of the PNGs (default: %(default)s)")),
        overwrite,
    ]
    trace = [
        (("file",), dict(metavar="FILE", help="a minicp results .h5 (required)")),
        (("--case",), dict(required=True, metavar="ID",
                           help="the case id, e.g. 019_train_ring_S3072_P2 (required)")),
        (("--rep",), dict(type=int, metavar="N",
                          help="the rep, 0-based, warm-ups excluded (default: the median rep of the mode)")),
        (("--mode",), dict(default="full", choices=["full", "compute-only", "comm-only"],
                           help="the mode (default: %(default)s)")),
        (("--out",), dict(metavar="FILE", help="the JSON file, '-' for stdout; an existing FILE must be a trace "
                                               "this command wrote (default: "
                                               "results/traces/<file stem>/<case>_rep<N>_<mode>.json)")),
        overwrite,
    ]
    return {
        "report": ("the summary table of every case (text, or CSV)",
                   "The summary table of every case of the given results files: figures of merit with their units "
                   "in the headers, refused cases with their status.", report),
        "plots": ("PNG plots of results files or a study",
                  "PNG plots of the inputs: scaling, timeline of one case, overlap, memory, fabric comparison, model "
                  "against measurement. Prints one line per file written and why a plot is skipped.", plots),
        "trace": ("a Perfetto / Chrome trace (JSON) of one case",
                  "One rep of one case as Chrome trace-event JSON (open it in https://ui.perfetto.dev): a process "
                  "per rank, compute, comm, gradient all-reduce and wait tracks, ring step, layer, pass, bytes, "
                  "peer and FLOPs in each event's args.", trace),
    }


def parser():
    ap = argparse.ArgumentParser(prog=PROG, description="Analysis of minicp results files "
                                                        "(docs/results-file.md): report, plots, trace.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (short, description, arguments) in _commands().items():
        p = sub.add_parser(name, help=short, description=description)
        for flags, kw in arguments:
            p.add_argument(*flags, **kw)
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        if args.command == "report":
            from . import report
            return report.run(args)
        if args.command == "plots":
            from . import plots
            return plots.run(args)
        from . import trace
        return trace.run(args)
    except UsageError as e:
        sys.stdout.flush()
        sys.stderr.write(f"{PROG} {args.command}: {e}\n")
        return 2
    except BrokenPipeError:  # `... | head`
        return 0
