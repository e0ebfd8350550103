"""A terminal that hangs up ends the app and the plain readout, whoever gets the SIGHUP.

The kernel signals a hangup to the terminal's session leader only. Under `make demo`, a
wrapper script or a batch system's pseudo-terminal that is not the app, and the leader
stays: found by hand, `make demo` in a tmux pane that was then killed left the app
running with no terminal, its input thread reading end-of-file in a loop at 84 % of a
core, for as long as nobody killed it."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import time
from pathlib import Path

import pytest

from tests.peers import free_port
from tests.tmux import BIN
from tuimon_core.closed_pipe import HANGUP_EXIT


def _read_until(fd: int, text: bytes, seconds: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + seconds
    while text not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"never drew {text!r}; the terminal showed: {seen[-2000:]!r}"
        if select.select([fd], [], [], min(left, 0.5))[0]:
            with contextlib.suppress(OSError):
                seen += os.read(fd, 65536)
    return seen


@pytest.mark.parametrize("plain", [False, True], ids=["app", "plain readout"])
def test_the_app_ends_when_its_terminal_hangs_up_and_no_sighup_reaches_it(
        tmp_path: Path, plain: bool) -> None:
    log = tmp_path / "tuimon.log"
    # A shell as the session leader that takes the SIGHUP and stays, as make does.
    line = (f"trap 'echo hangup' HUP; {BIN / 'tuimon'} demo --nodes 2 --gpus 1 "
            f"--base-port {free_port()} --log-file {log}{' --plain' if plain else ''}; "
            f"echo $? > {tmp_path / 'code'}")
    pid, fd = pty.fork()
    if pid == 0:  # the child: the session leader of the new terminal
        os.environ.update(TERM="xterm-256color", COLUMNS="100", LINES="30")
        # Buffered, as on a user's machine: what the output still holds when the
        # terminal is gone must not turn the status into 120.
        os.environ.pop("PYTHONUNBUFFERED", None)
        os.execv("/bin/sh", ["/bin/sh", "-c", line])
    try:
        _read_until(fd, b"sim-node001", 60)  # its nodes drawn
        time.sleep(2.0)  # drawing, its nodes streaming
        os.close(fd)  # the terminal hangs up (an SSH connection that dropped)
        deadline = time.monotonic() + 20
        status = None
        while status is None and time.monotonic() < deadline:
            done, code = os.waitpid(pid, os.WNOHANG)
            status = code if done else None
            time.sleep(0.2)
        assert status is not None, "the app outlived its terminal by 20 s"
        assert os.waitstatus_to_exitcode(status) == 0  # the shell's own end
        if not plain:  # (the readout logs to its terminal: gone)
            said = log.read_text()
            assert "the terminal hung up" in said, said[-2000:]
        # Its status says why it ended, as a shell's for a hung-up program does.
        assert int((tmp_path / "code").read_text()) == HANGUP_EXIT == 128 + signal.SIGHUP
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
