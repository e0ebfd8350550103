"""The programs in a real terminal (tmux): what an engineer's terminal would do with the
bytes they write. Hostile names from the network must not retitle the terminal, write
its clipboard or clear its screen; every command must draw, not crash."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.tmux import BIN, ROOT, Tmux, need_tmux


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def hostile_peer(mode: str, *victims: str) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.hostile_peer", str(port), mode,
                             *victims], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the hostile peer did not start"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_hostile_names_leave_a_real_terminal_as_it_was() -> None:
    need_tmux()
    with hostile_peer("names") as target, \
            Tmux([str(BIN / "tuimon"), "connect", target]) as term:
        term.wait_for(lambda s: "evil\\x1b" in s, what="the hostile node's escaped name")
        time.sleep(2.0)  # several samples and redraws of the map, strip and events
        screen = term.screen()
        assert term.title() == term.initial_title, "an OSC 0 in a node name retitled the pane"
        assert term.buffers() == [], "an OSC 52 in a node name wrote the clipboard"
        assert screen.splitlines()[0].lstrip().startswith("tuimon"), screen
        assert "XID 79 on evil\\x1b]0;pwned-title" in screen  # the events pane, escaped
        term.keys("Enter")  # the node screen: ports, file systems, events
        term.wait_for(lambda s: "mlx5_0:1\\x1b[2J" in s or "fabric" in s,
                      what="the node screen")
        time.sleep(1.0)
        assert term.title() == term.initial_title
        assert term.buffers() == []
        assert not term.dead()


def test_hostile_job_name_cannot_forge_a_status_line() -> None:
    with hostile_peer("names") as target:
        proc = subprocess.run([str(BIN / "tuimon"), "status", target], capture_output=True,
                              text=True, timeout=60, check=False)
    out = proc.stdout
    assert "train\\x0aOK: nodes 999 up" in out, out
    assert not any(line.startswith("OK: nodes 999") for line in out.splitlines()), out
    assert all(c.isprintable() for line in out.splitlines() for c in line), out


@pytest.mark.parametrize("args", [["connect", "--once"], ["status", "--json"]])
def test_plain_outputs_escape_hostile_names(args: list[str]) -> None:
    with hostile_peer("names") as target:
        proc = subprocess.run([str(BIN / "tuimon"), args[0], target, *args[1:]],
                              capture_output=True, text=True, timeout=60, check=False)
    text = proc.stdout + proc.stderr
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, text


@pytest.mark.parametrize("env,term", [
    ({"NO_COLOR": "1"}, "xterm-256color"),  # Textual's monochrome filter
    ({"TERM": "dumb"}, "xterm-256color"),  # no colour, no capabilities claimed
    ({}, "xterm-16color"),  # the 16 ANSI colours: themes mapped down
], ids=["NO_COLOR", "TERM=dumb", "16-colours"])
def test_the_demo_draws_in_plain_terminals(env: dict[str, str], term: str) -> None:
    need_tmux()
    # A port of its own: three test workers run demos at once.
    with Tmux([str(BIN / "tuimon"), "demo", "--nodes", "8", "--scenario", "hot-node",
               "--base-port", str(_free_port())], width=100, height=30, env=env,
              term=term) as t:
        t.wait_for(lambda s: "sim-node000" in s and "diagnosis" in s, timeout=60,
                   what="the map and the diagnosis")
        t.keys("Enter")
        t.wait_for(lambda s: "GPUs" in s and "fabric" in s, what="the node screen")
        # A key right after escape would arrive as alt+key: wait between them.
        t.keys("Escape")
        time.sleep(0.5)
        t.keys("?")
        t.wait_for(lambda s: "Moving" in s, what="the help")
        t.keys("Escape")
        time.sleep(0.5)
        t.keys("t")  # another theme, mapped to what the terminal has
        time.sleep(1.5)
        screen = t.screen()
        assert not t.dead(), screen
        assert "Traceback" not in screen and "Error" not in screen, screen
        assert screen.splitlines()[0].lstrip().startswith("tuimon"), screen


def test_a_c_locale_gets_an_ascii_map_and_no_color_gets_no_colour() -> None:
    """A terminal under LANG=C (a tmux whose client is not UTF-8 shows every other
    character as `_`) gets ASCII only, the heat scale kept by the characters' order; and
    NO_COLOR gets no colour escape at all (Textual's own answer sends greys)."""
    demo = [str(BIN / "tuimon"), "demo", "--nodes", "8", "--base-port", str(_free_port())]
    tmux = Tmux(demo, width=100, height=30, env={"LANG": "C", "LC_ALL": ""})
    try:
        screen = tmux.wait_for(lambda s: "sim-node007" in s, what="the map")
        assert screen.isascii(), sorted({c for c in screen if not c.isascii()})
        assert ".:-=+*#@" in screen  # the legend: the cells' own scale, in ASCII
    finally:
        tmux.close()
    demo[-1] = str(_free_port())
    tmux = Tmux(demo, width=100, height=30, env={"NO_COLOR": "1"})
    try:
        tmux.wait_for(lambda s: "sim-node007" in s, what="the map")
        drawn = tmux._run("capture-pane", "-p", "-e", "-t", "t")
        params = {p for e in re.findall(r"\x1b\[([0-9;]*)m", drawn) for p in e.split(";")}
        colours = {p for p in params if p in ("38", "48") or (
            len(p) == 2 and p[0] in "349" and p not in ("39", "49"))}
        assert not colours, (colours, params)
        assert "7" in params  # the cursor, marked by reverse video instead
    finally:
        tmux.close()


def test_the_app_takes_its_terminals_size_over_exported_columns_and_lines() -> None:
    """COLUMNS=80 LINES=24 exported (a wrapper script, a parent that loaded readline)
    in a 160x40 terminal: the app fills the terminal, and follows it when it is
    resized, instead of drawing 80x24 in its corner."""
    demo = [str(BIN / "tuimon"), "demo", "--nodes", "8", "--base-port", str(_free_port())]
    with Tmux(demo, width=160, height=40, env={"COLUMNS": "80", "LINES": "24"}) as t:
        screen = t.wait_for(lambda s: "sim-node007" in s and "diagnosis" in s, timeout=60,
                            what="the map")
        lines = screen.splitlines()
        assert len(lines[0].rstrip()) > 100, lines[0]  # the wide header, not 80 columns
        assert lines[-1].strip(), screen  # the footer on the terminal's last line, not 24th
        t._run("resize-window", "-t", "t", "-x", "120", "-y", "30")
        screen = t.wait_for(lambda s: len(s.splitlines()) == 30 and s.splitlines()[-1].strip()
                            and "sim-node007" in s, what="the app at 120x30")
        assert max(len(line.rstrip()) for line in screen.splitlines()) <= 120, screen
