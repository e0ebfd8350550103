"""The full-screen app's size is its terminal's.

Textual reads a terminal's size as Python's `shutil.get_terminal_size` does: COLUMNS
and LINES first, where set, and the terminal only where not; on a resize it reads them
again. A shell or tool that exports them (a wrapper script, a `.profile` that sets
COLUMNS for line tools, a parent process that loaded GNU readline, which writes both
into the environment its children inherit) would fix the app at that size in a larger
terminal, whatever the user resizes it to. On a terminal the full-screen app drops
them (for itself and what it starts); no other command reads them.
"""

from __future__ import annotations

import os
import sys


def trust_the_terminal() -> None:
    """Where standard output is a terminal, forget COLUMNS and LINES (this process and
    its children): its own size, and each resize, is what the app lays out for."""
    out = sys.__stdout__
    if out is not None and out.isatty():
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
