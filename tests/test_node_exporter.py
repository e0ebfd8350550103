"""Side by side with node_exporter on the same /sys and /proc tree: counters agree.

node_exporter (Debian's prometheus-node-exporter) is the reference reader of these
files. `.ci/run` installs it; outside CI the test skips when it is missing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import make_registry, render
from agent.sim.fake_nvml import FakeNvml
from tests.conftest import make_agent
from tests.trees import HW, diskstats_line, ib_port, write

BINARY = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")

pytestmark = pytest.mark.skipif(
    BINARY is None and os.environ.get("CI") != "true",
    reason="node_exporter not installed (apt-get install prometheus-node-exporter); "
           "CI installs it")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k in (
                "device", "port")))
            out[(s.name, labels)] = s.value
    return out


def _scrape_node_exporter(root: Path) -> str:
    assert BINARY is not None, "CI must install prometheus-node-exporter"
    port = _free_port()
    proc = subprocess.Popen(
        [BINARY, f"--path.sysfs={root / 'sys'}", f"--path.procfs={root / 'proc'}",
         "--collector.disable-defaults", "--collector.infiniband", "--collector.diskstats",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return r.read().decode()
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(
                        "node_exporter did not serve: "
                        f"{proc.stderr.read().decode() if proc.stderr else ''}") from None
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)


def test_cumulative_counters_agree_with_node_exporter(proc_root: Path) -> None:
    # A modern port (64-bit values in counters/), a saturated legacy xmit_wait, symbol
    # errors, hw_counters; an old-kernel port with counters_ext; a disk.
    ib_port(proc_root, "mlx5_0", counters={"port_xmit_data": 2**33 + 7, "symbol_error": 7,
                                           "port_xmit_wait": 2**32 - 1, "link_downed": 2},
            hw=HW)
    ib_port(proc_root, "mlx4_0", ext={"port_xmit_data_64": 2**40, "port_rcv_data_64": 12345,
                                      "port_xmit_packets_64": 99, "port_rcv_packets_64": 98})
    write(proc_root / "proc/diskstats",
          diskstats_line(259, 0, "nvme0n1", reads=5, rsect=800, writes=3, wsect=1600)
          + diskstats_line(8, 0, "sda", reads=1, rsect=8))
    agent = make_agent(proc_root, FakeNvml(0))

    async def ours() -> str:
        await agent.start(sampling=False)
        await agent.sample_once()
        await agent.stop()
        return render(make_registry(agent)).decode()

    mine = _samples(asyncio.run(ours()))
    theirs = _samples(_scrape_node_exporter(proc_root))

    def both(our_name: str, their_name: str, device: str, port: str | None = "1") -> None:
        labels = (("device", device), ("port", port)) if port else (("device", device),)
        assert (our_name, labels) in mine, f"{our_name} {labels} missing from ours"
        assert mine[(our_name, labels)] == theirs[(their_name, labels)], (our_name, device)

    # The name table's pairs (tuimon_core.protocol.fields), checked on the real peer: every
    # counter both read on this port, and the port's gauges. xmit_wait is saturated on
    # mlx5_0 (below); the error counters node_exporter lacks a file for are skipped.
    from tuimon_core.protocol.fields import PORT_COUNTERS_READ, PORT_GAUGE_METRICS

    pairs = [(c.metric + "_total", c.node_exporter) for c in PORT_COUNTERS_READ
             if c.node_exporter and c.key != "xmit_wait"
             and (c.node_exporter, (("device", "mlx5_0"), ("port", "1"))) in theirs]
    pairs += [(ours, theirs_name) for _, ours, theirs_name, _ in PORT_GAUGE_METRICS]
    assert len(pairs) >= 10
    for ours_name, theirs_name in pairs:
        both(ours_name, theirs_name, "mlx5_0")
    # With counters_ext, we read the 64-bit counters, which node_exporter calls "legacy".
    both("tuimon_ib_port_transmit_bytes_total",
         "node_infiniband_legacy_data_transmitted_bytes_total", "mlx4_0")
    both("tuimon_ib_port_receive_bytes_total",
         "node_infiniband_legacy_data_received_bytes_total", "mlx4_0")
    both("tuimon_ib_port_transmit_packets_total",
         "node_infiniband_legacy_packets_transmitted_total", "mlx4_0")
    both("tuimon_ib_port_transmit_wait_total", "node_infiniband_port_transmit_wait_total",
         "mlx4_0")
    # A saturated counter: node_exporter shows 4294967295; we leave it out and say why.
    assert theirs[("node_infiniband_port_transmit_wait_total",
                   (("device", "mlx5_0"), ("port", "1")))] == 2**32 - 1
    assert ("tuimon_ib_port_transmit_wait_total", (("device", "mlx5_0"), ("port", "1"))) \
        not in mine
    from tuimon_core.protocol.fields import DISK_COUNTERS_READ

    for device in ("nvme0n1", "sda"):
        for c in DISK_COUNTERS_READ:
            both(c.metric + "_total", c.node_exporter or "", device, None)
