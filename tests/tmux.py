"""A real terminal for tests: a private tmux server running one command in one pane.

What the user's terminal would do with the program's bytes, tmux does: escape sequences
set the pane title (OSC 0/2), write tmux's paste buffers (OSC 52 with set-clipboard on),
clear the screen. Tests read the pane back with capture-pane and ask tmux for the title
and buffers. tmux is a Debian package that `.ci/run` installs; outside CI a test that
needs it skips and says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"


def _server_env() -> dict[str, str]:
    """The environment the private server (and so the program in its pane) starts with:
    this process's, without COLUMNS and LINES. GNU readline, once loaded (pytest loads
    it), writes both into the C environment that children inherit though `os.environ`
    never shows them, and a program that finds them believes them over its terminal
    (80x24 in a 160x40 pane). Passing the environment explicitly leaves them out."""
    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def need_tmux() -> str:
    path = shutil.which("tmux")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is missing under CI: .ci/run must install it")
        pytest.skip("tmux is not installed (CI installs it): no real terminal to test in")
    return path


class Tmux:
    """One detached session on a server of its own (`-L`), killed on close."""

    def __init__(self, command: list[str], *, width: int = 160, height: int = 40,
                 env: Mapping[str, str] | None = None, term: str = "xterm-256color") -> None:
        self.tmux = need_tmux()
        self.socket = f"tuimon-test-{uuid.uuid4().hex[:10]}"
        self._run("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(width),
                  "-y", str(height), "sleep 3600")
        # A paste buffer appears when an application writes the clipboard (OSC 52).
        self._run("set-option", "-g", "set-clipboard", "on")
        self._run("set-option", "-g", "allow-rename", "on")
        self._run("set-option", "-g", "default-terminal", term)
        self._run("set-option", "-g", "remain-on-exit", "on")
        exports = " ".join(f"{k}={_quote(v)}" for k, v in (env or {}).items())
        line = " ".join(_quote(c) for c in command)
        self._run("respawn-pane", "-k", "-t", "t", f"env {exports} {line}".strip())
        self.initial_title = self.title()

    def _run(self, *args: str) -> str:
        proc = subprocess.run([self.tmux, "-L", self.socket, *args], capture_output=True,
                              text=True, timeout=10, check=False, env=_server_env())
        if proc.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def screen(self) -> str:
        return self._run("capture-pane", "-p", "-t", "t")

    def title(self) -> str:
        return self._run("display-message", "-p", "-t", "t", "#{pane_title}").rstrip("\n")

    def buffers(self) -> list[str]:
        out = self._run("list-buffers", "-F", "#{buffer_name}")
        return [line for line in out.splitlines() if line]

    def dead(self) -> bool:
        return self._run("display-message", "-p", "-t", "t", "#{pane_dead}").strip() == "1"

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", "t", *keys)

    def wait_for(self, check: Callable[[str], bool], timeout: float = 30.0,
                 what: str = "") -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if check(screen):
                return screen
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what or 'the screen'}:\n{screen}")

    def close(self) -> None:
        subprocess.run([self.tmux, "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=10, check=False)

    def __enter__(self) -> Tmux:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
