"""Whether the terminal the app draws on has hung up.

The kernel sends SIGHUP on a hangup to the terminal's session leader only. Where that
is the login shell, it passes the signal on and the app ends; where it is something
else that stays (`make demo`, a wrapper script, a batch system's pseudo-terminal), the
app gets no signal at all. Its terminal is gone all the same: every read of it is an
end of file, on which Textual's input thread loops without waiting (a core at 100 %),
and every write fails. A monitor nobody can see any more should not stay and spin:
the app asks once a second whether its terminal is still one, and ends if not.
"""

from __future__ import annotations

import os
import sys

from tuimon_core.closed_pipe import HANGUP_EXIT

__all__ = ["HANGUP_EXIT", "HangupWatch"]


class HangupWatch:
    """The terminal the app started on, if it started on one (a headless test app, a
    pipe: nothing to watch)."""

    def __init__(self, headless: bool) -> None:
        stdin = sys.__stdin__
        fd = stdin.fileno() if stdin is not None and not stdin.closed else -1
        self._fd = fd if not headless and fd >= 0 and os.isatty(fd) else None

    def hung_up(self) -> bool:
        """Has the terminal gone (the other end closed: no longer a terminal)?"""
        return self._fd is not None and not os.isatty(self._fd)
