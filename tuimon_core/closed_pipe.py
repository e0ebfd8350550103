"""A reader that stops reading (`tuimon status | head -1`) ends the command quietly, as
Unix tools end: no traceback, and the exit status a shell gives a tool killed by SIGPIPE.
A broken pipe anywhere else (a socket, a child process) is a fault and keeps its
traceback. A terminal that hung up ends it with SIGHUP's status (the app finds out
itself: tuimon.ui.hangup), its last buffered output dropped."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import sys
from collections.abc import Callable

# 128 + SIGPIPE: what `set -o pipefail` reports for `yes | head -1`.
CLOSED_PIPE_EXIT = 141
# 128 + SIGHUP: what a shell reports for a program its terminal's hangup ended.
HANGUP_EXIT = 129


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
        if code == HANGUP_EXIT:
            _to_devnull(sys.stdout, sys.stderr)
            return code
        sys.stdout.flush()  # the last buffered lines fail here, not at interpreter exit
        return code
    except BrokenPipeError:
        if not stdout_closed():
            raise
        _to_devnull(sys.stdout)
        return CLOSED_PIPE_EXIT
    except OSError as exc:
        if not hung_up(sys.stdout, exc):
            raise
        _to_devnull(sys.stdout, sys.stderr)  # the terminal hung up while it wrote
        return HANGUP_EXIT


def hung_up(stream: object, exc: OSError) -> bool:
    """Is `exc`, raised writing `stream`, its terminal's hangup (EIO from a terminal
    device that is no longer one), not a disk's error?"""
    if exc.errno != errno.EIO:
        return False
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        return stat.S_ISCHR(os.fstat(fd).st_mode) and not os.isatty(fd)
    except (OSError, ValueError, AttributeError):
        return False


def _to_devnull(*streams: object) -> None:
    """The interpreter flushes these again at exit, where what they still hold would
    fail a second time (and turn the status into 120): point them at /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in streams:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(devnull, stream.fileno())  # type: ignore[attr-defined]
    os.close(devnull)
