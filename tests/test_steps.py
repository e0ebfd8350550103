"""Step telemetry: the reporter a training script imports, and the agent's receiver."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import make_registry, render
from agent.protocol import Sample, decode, encode
from agent.reporter import StepReporter
from agent.sim.fake_nvml import FakeNvml
from agent.steps import StepAggregator, StepError, decode_step
from tests.conftest import make_agent


def test_reporter_without_an_agent_never_raises_and_counts_drops(tmp_path: Path) -> None:
    reporter = StepReporter("job", 0, 8, socket_path=str(tmp_path / "absent.sock"))
    for _ in range(3):
        with reporter.step(samples=32), reporter.waiting():
            pass
    assert reporter.sent == 0 and reporter.dropped == 3


def test_reporter_measures_compute_as_wall_minus_waiting(tmp_path: Path) -> None:
    path = str(tmp_path / "steps.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    try:
        reporter = StepReporter("llama", 3, 8, socket_path=path)
        import time

        with reporter.step(samples=16, tokens=4096):
            with reporter.waiting():
                time.sleep(0.05)
            time.sleep(0.02)
        step = decode_step(server.recv(4096))
        assert (step["job"], step["rank"], step["world"]) == ("llama", 3, 8)
        assert step["samples"] == 16 and step["tokens"] == 4096
        assert step["wall"] >= 0.07 and 0.015 <= step["compute"] <= step["wall"] - 0.045
        assert reporter.sent == 1 and reporter.dropped == 0
    finally:
        server.close()


async def test_agent_aggregates_steps_per_job_and_rank_and_exports_counters(
        proc_root: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "steps.sock")
    agent = make_agent(proc_root, FakeNvml(1), steps_socket=path)
    await agent.start(sampling=False)
    try:
        assert agent.hello.extra["steps_status"] is None
        reporters = [StepReporter("train", r, 2, socket_path=path) for r in range(2)]
        for r in reporters:
            r.report(wall=1.0, compute=0.8, samples=64)
            r.report(wall=1.0, compute=0.6, samples=64)
        bad = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        bad.sendto(b"\xc1garbage", path)
        bad.sendto(msgpack.packb({"v": 1, "t": "step", "job": "x", "rank": 5, "world": 2,
                                  "wall": 1.0, "compute": 0.5}), path)
        bad.close()
        await asyncio.sleep(0.1)
        sample = await agent.sample_once()
        steps = decode(encode(sample)).extra["steps"]  # and it is valid on the wire
        job = steps["jobs"][0]
        assert job["id"] == "train" and job["world"] == 2
        assert [(r["rank"], r["steps"], r["wall"], r["compute"], r["samples"])
                for r in job["ranks"]] == [(0, 2, 2.0, 1.4, 128), (1, 2, 2.0, 1.4, 128)]
        assert steps["rejected"] == 2 and steps["received"] == 4
        # The next interval starts empty; the totals keep counting for Prometheus.
        assert "steps" not in (await agent.sample_once()).extra or \
            not (await agent.sample_once()).extra["steps"]["jobs"]
        text = render(make_registry(agent)).decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        wall = {s.labels["rank"]: s.value for s in fams["tuimon_job_wall_seconds"].samples}
        assert wall == {"0": 2.0, "1": 2.0}
        compute = fams["tuimon_job_compute_seconds"].samples[0]
        assert compute.name == "tuimon_job_compute_seconds_total"
        assert compute.labels == {"job": "train", "rank": "0", "node": "node-a"}
        assert fams["tuimon_job_samples"].samples[0].value == 128
        assert fams["tuimon_agent_step_reports_rejected"].samples[0].value == 2
    finally:
        await agent.stop()
    assert not Path(path).exists()


async def test_an_unusable_socket_path_is_a_reason_not_a_crash(proc_root: Path) -> None:
    agent = make_agent(proc_root, None, steps_socket="/nonexistent/dir/steps.sock")
    await agent.start(sampling=False)
    try:
        assert "cannot listen for step reports" in agent.hello.extra["steps_status"]
        assert isinstance(await agent.sample_once(), Sample)
    finally:
        await agent.stop()


@pytest.mark.parametrize(("fields", "reason"), [
    ({"wall": -1.0, "compute": 0.0}, "wall"),
    ({"wall": 1.0, "compute": 2.0}, "compute time longer"),
    ({"wall": float("nan"), "compute": 0.0}, "wall"),
    ({"wall": 1.0, "compute": 0.5, "rank": 9}, "rank/world"),
    ({"wall": 1.0, "compute": 0.5, "job": ""}, "job"),
    ({"wall": 1.0, "compute": 0.5, "samples": -3}, "samples"),
])
def test_invalid_step_reports_are_rejected_with_a_reason(fields: dict, reason: str) -> None:
    m = {"v": 1, "t": "step", "job": "j", "rank": 0, "world": 4, **fields}
    with pytest.raises(StepError, match=reason):
        decode_step(msgpack.packb(m))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000))
def test_arbitrary_datagrams_never_break_the_aggregator(data: bytes) -> None:
    agg = StepAggregator()
    agg.add(data)
    assert agg.received + agg.rejected == 1
