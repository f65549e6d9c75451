"""python3 -m minicp_analysis {report,plots,trace} ...: see cli.py."""
import sys

try:
    import h5py  # noqa: F401
    import matplotlib  # noqa: F401
    import numpy  # noqa: F401
    import pandas  # noqa: F401
except ImportError as e:
    sys.stderr.write(f"minicp_analysis: {e.name} is missing from {sys.executable}: run it with Debian's "
                     f"/usr/bin/python3 (h5py, numpy, pandas, matplotlib)\n")
    sys.exit(2)

from .cli import main

sys.exit(main())
