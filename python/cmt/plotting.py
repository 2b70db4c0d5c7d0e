"""matplotlib, for the PNG plots only: an optional extra (`pip install 'cudamemcpy-tuner[plot]'`).

Without it every result (JSON, recordings, tables) is still written; the plot is skipped with one
line on stderr. Imported only where a PNG is drawn: matplotlib is slow to load and large to install.
"""

from __future__ import annotations

from typing import Any

INSTALL = "pip install 'cudamemcpy-tuner[plot]'"


class Unavailable(Exception):
    """matplotlib cannot be imported; the message is the line to show."""


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display), or Unavailable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        why = ("matplotlib is not installed" if e.name in (None, "matplotlib")
               else f"matplotlib cannot be imported ({e})")
        raise Unavailable(f"PNG plot skipped: {why} ({INSTALL})") from None
    return plt
