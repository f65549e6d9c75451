"""Analysis of minicp results files (docs/results-file.md): a summary table of the cases
(`report`), plots (`plots`) and a Perfetto / Chrome trace of one case (`trace`).

Run with Debian's /usr/bin/python3 (h5py, numpy, pandas, matplotlib):
    PYTHONPATH=analysis /usr/bin/python3 -m minicp_analysis {report,plots,trace} --help
"""

__all__ = ["UsageError"]


class UsageError(Exception):
    """Bad input: the command line names a flag or value that cannot be used. The message
    names it and what is allowed; the command line prints it and exits with status 2."""
