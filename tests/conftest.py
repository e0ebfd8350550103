"""Shared fixtures: the hardware boundary (a fake pynvml, temporary /proc trees) and
real agents served over real sockets on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from agent.files import FileTree
from agent.node import AgentConfig, NodeAgent
from agent.server import build_app
from agent.sim.fake_nvml import FakeGpu, FakeNvml
from tuimon_core.protocol import decode

# Local times on the screens (events, findings' onsets) are read in one zone, whatever
# the machine's: the snapshots hold them.
os.environ["TZ"] = "UTC"
time.tzset()

PROC_STAT = """cpu  1000 0 500 8000 500 0 0 0 0 0
cpu0 500 0 250 4000 250 0 0 0 0 0
cpu1 500 0 250 4000 250 0 0 0 0 0
intr 1
"""
MEMINFO = """MemTotal:       16384000 kB
MemFree:         1000000 kB
MemAvailable:    8192000 kB
"""


def write_proc(root: Path, *, stat: str = PROC_STAT, loadavg: str = "1.50 1.25 1.00 2/300 42\n",
               meminfo: str = MEMINFO, uptime: str = "3600.50 7000.00\n") -> Path:
    proc = root / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text(stat)
    (proc / "loadavg").write_text(loadavg)
    (proc / "meminfo").write_text(meminfo)
    (proc / "uptime").write_text(uptime)
    (proc / "sys/kernel/random/boot_id").write_text("0b6f2bd6-6d3c-4b34-9c5a-1f0c6d1f6a11\n")
    return root


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    return write_proc(tmp_path / "root")


@pytest.fixture
def fake_nvml() -> Iterator[FakeNvml]:
    """Eight busy H100s behind a fake `pynvml`, installed in sys.modules."""
    gpus = [FakeGpu(i, util_gpu=90, util_mem=50, mem_used=60 * 1024**3, temp=60 + i,
                    power_mw=600_000, energy_mj=1_000_000 * (i + 1), clock_events=0,
                    procs=[(1000 + i, 50 * 1024**3)]) for i in range(8)]
    fake = FakeNvml(gpus)
    saved = sys.modules.get("pynvml")
    fake.install()
    yield fake
    if saved is not None:
        sys.modules["pynvml"] = saved
    else:
        sys.modules.pop("pynvml", None)


def make_agent(proc_root: Path, nvml: FakeNvml | None, **config: object) -> NodeAgent:
    cfg = AgentConfig(node_name=str(config.pop("node_name", "node-a")),
                      interval=float(config.pop("interval", 0.2)), root=str(proc_root),
                      xid_wait=float(config.pop("xid_wait", 0.2)),
                      **config)  # type: ignore[arg-type]
    if nvml is None:
        nvml = FakeNvml(0, driver=False)
    return NodeAgent(cfg, files=FileTree(proc_root), nvml_loader=lambda: nvml)


@contextlib.asynccontextmanager
async def serve(agent: NodeAgent, token: str | None = None) -> AsyncIterator[TestServer]:
    """A real aiohttp server for the agent on an ephemeral loopback port."""
    server = TestServer(build_app(agent, token=token), host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


async def receive(ws: aiohttp.ClientWebSocketResponse, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    msg = await asyncio.wait_for(ws.receive(), timeout)
    assert msg.type == aiohttp.WSMsgType.BINARY, msg
    return decode(msg.data)


# Simulated clusters listen on BASE..BASE+N-1. Ports handed out by the kernel for port 0
# (pytest-asyncio's unused_tcp_port_factory) are in the ephemeral range, where any other
# test's outgoing connection may be holding one of the N-1 after the base. Blocks below
# that range, checked free and never handed out twice, cannot collide that way.
PORT_BLOCK = 256
_handed_out: set[int] = set()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_range(low: int, top: int) -> tuple[int, int]:
    """This pytest-xdist worker's share of [low, top): workers are separate processes,
    so a block checked free by one could be taken by another before it binds."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    share = (top - low) // max(1, count)
    return low + index * share, low + (index + 1) * share


@pytest.fixture
def unused_tcp_port_factory() -> Iterator[Callable[[], int]]:
    """A free port with the PORT_BLOCK - 1 ports after it free too (for simulated
    clusters), below the ephemeral range; replaces pytest-asyncio's fixture. The blocks
    go back when the test ends."""
    low, top = _worker_range(10000, min(_ephemeral_floor(), 32768) - PORT_BLOCK)
    mine: set[int] = set()

    def take() -> int:
        for _ in range(500):
            base = random.randrange(low, top)
            block = range(base, base + PORT_BLOCK)
            if _handed_out.intersection(block):
                continue
            if all(_bindable(p) for p in block):
                _handed_out.update(block)
                mine.update(block)
                return base
        raise RuntimeError("no free block of ports below the ephemeral range")
    yield take
    _handed_out.difference_update(mine)


@pytest.fixture
def unused_tcp_port(unused_tcp_port_factory: Callable[[], int]) -> int:
    return unused_tcp_port_factory()


async def run_tuimon(*args: str, timeout: float = 60) -> tuple[int, str]:
    """`python -m tuimon.cli ARGS` from the checkout: its exit code, stdout then stderr."""
    root = Path(__file__).resolve().parent.parent
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tuimon.cli", *args, cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode() + err.decode()
