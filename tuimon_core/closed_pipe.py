"""A reader that stops reading (`tuimon status | head -1`) ends the command quietly, as
Unix tools end: no traceback, and the exit status a shell gives a tool killed by SIGPIPE.
A broken pipe anywhere else (a socket, a child process) is a fault and keeps its
traceback."""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable

# 128 + SIGPIPE: what `set -o pipefail` reports for `yes | head -1`.
CLOSED_PIPE_EXIT = 141


def stdout_closed() -> bool:
    """Whether nobody reads standard output any more (its pipe's read end is closed:
    poll says POLLERR)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def quiet_on_closed_pipe(run: Callable[[], int]) -> int:
    """`run()`, whose writes to a pipe nobody reads any more end it with 141, silently."""
    try:
        code = run()
        sys.stdout.flush()  # the last buffered lines fail here, not at interpreter exit
        return code
    except BrokenPipeError:
        if not stdout_closed():
            raise
        # The interpreter flushes stdout again at exit, which would raise a second time:
        # point it at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return CLOSED_PIPE_EXIT
