"""The documents list what the code sends: every wire field and every metric."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import make_registry, render
from agent.sim.fake_nvml import FakeNvml
from tests.conftest import make_agent
from tests.trees import HW, diskstats_line, ib_port, nic, write
from tuimon_core.protocol import Event
from tuimon_core.protocol.fields import TABLES
from tuimon_core.serving.guard import ConnectionGuard

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_protocol_doc_lists_every_field_of_the_schema() -> None:
    """Every row of every table of the name table, with its type and bounds: the document
    cannot drift from what the decoder checks."""
    text = (DOCS / "protocol.md").read_text()
    rows = 0
    for name, fields in TABLES.items():
        for f in fields:
            row = f.doc_row()
            assert row in text, f"docs/protocol.md ({name}) lacks or differs from:\n{row}"
            rows += 1
    assert rows > 200


def test_metrics_doc_lists_every_exported_metric(proc_root: Path) -> None:
    ib_port(proc_root, "mlx5_0", counters={"port_xmit_wait": 2**32 - 1}, hw=HW)
    nic(proc_root, "eth0")
    write(proc_root / "proc/diskstats", diskstats_line(259, 0, "nvme0n1", reads=5, rsect=8))
    (proc_root / "data").mkdir()
    write(proc_root / "proc/self/mounts", "/dev/nvme0n1 /data xfs rw 0 0\n")
    fake = FakeNvml(2)
    fake.gpus[0].clock_events = 0x40
    agent = make_agent(proc_root, fake, steps_socket=str(proc_root / "steps.sock"))

    async def scrape() -> str:
        await agent.start(sampling=False)
        from agent.reporter import StepReporter

        StepReporter("job", 0, 1, socket_path=str(proc_root / "steps.sock")).report(1.0, 0.9)
        await asyncio.sleep(0.05)
        await agent.sample_once()
        await agent.sample_once()
        agent.emit_event(Event(0.0, "xid", "warning", "an event, so its counter shows"))
        await agent.stop()
        return render(make_registry(agent, ConnectionGuard())).decode()

    exposed = set()
    for family in text_string_to_metric_families(asyncio.run(scrape())):
        for sample in family.samples:
            exposed.add(sample.name)
    documented = set(re.findall(r"`(tuimon_[a-z0-9_]+)`", (DOCS / "metrics.md").read_text()))
    assert len(exposed) > 40
    assert exposed - documented == set()
