"""Step telemetry: the reporter a training script imports, and the agent's receiver."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import make_registry, render
from agent.reporter import StepReporter
from agent.sim.fake_nvml import FakeNvml
from agent.steps import StepAggregator, StepError, decode_step
from tests.conftest import make_agent
from tuimon_core.protocol import Sample, decode, encode


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


# -- a local user on the step socket (docs/security.md, "the step socket") ----------------


def _step(job: str = "train", rank: int = 0, world: int = 2, wall: float = 1.0,
          compute: float = 0.8, **extra: object) -> bytes:
    return msgpack.packb({"v": 1, "t": "step", "job": job, "rank": rank, "world": world,
                          "wall": wall, "compute": compute, **extra})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_datagram_cannot_burn_a_day_of_budget() -> None:
    clock = Clock()
    agg = StepAggregator(interval=1.0, clock=clock)
    agg.add(_step(wall=86400.0, compute=0.0))
    first = agg.take()["jobs"][0]["ranks"][0]
    assert first["wall"] <= 6.0  # the agent's interval plus the slack, not a day
    # Then no more than real time: ten more such datagrams in one second count 1 s.
    clock.now += 1.0
    for _ in range(10):
        agg.add(_step(wall=86400.0, compute=0.0))
    burst = agg.take()["jobs"][0]["ranks"][0]
    assert burst["wall"] == pytest.approx(1.0) and burst["compute"] == 0.0
    assert agg.clipped == 11
    # An honest rank reporting its steps as they happen is never cut.
    for _ in range(30):
        clock.now += 0.5
        agg.add(_step(rank=1, wall=0.5, compute=0.4))
    honest = agg.take()["jobs"][0]["ranks"]
    assert [(r["rank"], r["steps"], r["wall"]) for r in honest] == [(1, 30, 15.0)]


def test_names_and_cardinality_are_capped_and_counted_and_age_out(
        caplog: pytest.LogCaptureFixture) -> None:
    from agent.steps import IDLE_S, MAX_JOBS, MAX_RANKS

    clock = Clock()
    agg = StepAggregator(interval=1.0, clock=clock)
    agg.add(_step(job="llm-pretrain"))  # the legitimate job, first
    for i in range(10_000):
        clock.now += 0.001
        agg.add(_step(job=f"{i:06d}" + "x" * 194))  # 200-character names
    assert agg.refused["name_too_long"] == 10_000
    for i in range(10_000):
        clock.now += 0.001
        agg.add(_step(job=f"junk-{i}", rank=i % 8, world=8))
    steps = agg.take()
    assert len(steps["jobs"]) == MAX_JOBS and len(agg._ranks) <= MAX_RANKS
    assert steps["refused"]["too_many_jobs"] == 10_000 - (MAX_JOBS - 1)
    assert any(j["id"] == "llm-pretrain" for j in steps["jobs"])
    frame = encode(Sample(seq=1, ts=1.0, interval=1.0, extra={"steps": steps}))
    assert len(frame) < 64 * 1024  # the node stays on the wire, far under 1 MiB
    # Logged, but once a minute per reason with a count, not once per datagram.
    refusals = [r for r in caplog.records if "step report refused" in r.message]
    assert 1 <= len(refusals) <= 3, [r.message for r in refusals]
    # The junk goes quiet: after IDLE_S it is forgotten and new jobs come in again.
    clock.now += IDLE_S + 1
    agg.take()
    agg.add(_step(job="next-run"))
    assert [j["id"] for j in agg.take()["jobs"]] == ["next-run"]


def test_a_job_belongs_to_the_user_who_reported_it_first() -> None:
    clock = Clock()
    agg = StepAggregator(interval=1.0, clock=clock)
    agg.add(_step(job="alice-run", rank=0), uid=1000)
    agg.add(_step(job="alice-run", rank=1, wall=80.0, compute=0.0), uid=1001)
    agg.add(_step(job="alice-run", rank=0, wall=80.0, compute=0.0), uid=1001)
    steps = agg.take()
    assert steps["refused"] == {"not_owner": 2}
    assert [(r["rank"], r["compute"]) for r in steps["jobs"][0]["ranks"]] == [(0, 0.8)]


def test_a_flood_from_one_user_does_not_starve_another() -> None:
    clock = Clock()
    agg = StepAggregator(interval=1.0, clock=clock)
    honest = 0
    for i in range(55_000):  # one second of a 55k datagrams/s flood
        clock.now += 1 / 55_000
        agg.add(_step(job="flood", rank=i % 8, world=8, wall=0.0, compute=0.0), uid=1001)
        if i % 5500 == 0:
            agg.add(_step(job="train", wall=0.1, compute=0.09, seq=honest, pid=7), uid=1000)
            honest += 1
    steps = agg.take()
    train = next(j for j in steps["jobs"] if j["id"] == "train")
    assert train["ranks"][0]["steps"] == honest == 10
    assert steps["refused"]["flood"] >= 55_000 - 3 * 2000  # all but a burst and 1 s


async def test_reports_lost_in_a_flood_are_counted_not_silent(proc_root: Path,
                                                              tmp_path: Path) -> None:
    """A real socket: a flood fills it while a rank reports; every report the rank sent
    either arrives or is counted lost (its sequence numbers have a gap)."""
    path = str(tmp_path / "steps.sock")
    agent = make_agent(proc_root, FakeNvml(1), steps_socket=path, interval=1.0)
    await agent.start(sampling=False)
    try:
        rank = StepReporter("train", 0, 1, socket_path=path)
        flood = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        flood.setblocking(False)
        junk = _step(job="flood", wall=0.0, compute=0.0)
        for _ in range(200):
            for _ in range(500):
                with contextlib.suppress(BlockingIOError):
                    flood.sendto(junk, path)
            rank.report(wall=0.001, compute=0.001)
            await asyncio.sleep(0)  # the agent reads a batch now and then
        flood.close()
        await asyncio.sleep(0.2)
        rank.report(wall=0.001, compute=0.001)  # arrives: a gap before it shows the loss
        await asyncio.sleep(0.2)
        steps = (await agent.sample_once()).extra["steps"]
        train = next(j for j in steps["jobs"] if j["id"] == "train")
        got = train["ranks"][0]["steps"]
        lost = train.get("lost", 0)
        assert got + lost + rank.dropped == rank.sent + rank.dropped == 201
        assert got + lost == rank.sent and agent.steps.lost == lost
    finally:
        await agent.stop()


@pytest.mark.skipif(not hasattr(socket, "SO_PASSCRED"), reason="SO_PASSCRED is Linux's")
async def test_the_kernel_says_who_sent_a_report(proc_root: Path, tmp_path: Path) -> None:
    import os
    import shutil
    import tempfile

    run = tempfile.mkdtemp(prefix="tuimon-run-")  # like /run/tuimon: any user may enter
    os.chmod(run, 0o755)
    path = os.path.join(run, "steps.sock")
    agent = make_agent(proc_root, FakeNvml(1), steps_socket=path)
    await agent.start(sampling=False)
    try:
        StepReporter("mine", 0, 1, socket_path=path).report(1.0, 0.5)
        await asyncio.sleep(0.1)
        assert agent.steps._owners == {"mine": os.getuid()}
        if os.getuid() != 0:
            return  # another user's report needs root to send as someone else
        pid = os.fork()
        if pid == 0:  # the child: a local user who is not the job's owner
            try:
                os.setuid(65534)
                StepReporter("mine", 1, 2, socket_path=path).report(100.0, 0.0)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        await asyncio.sleep(0.1)
        steps = (await agent.sample_once()).extra["steps"]
        assert steps["refused"] == {"not_owner": 1}
        assert [r["rank"] for r in steps["jobs"][0]["ranks"]] == [0]
    finally:
        await agent.stop()
        shutil.rmtree(run, ignore_errors=True)


async def test_a_second_agent_never_removes_a_live_agents_socket(proc_root: Path,
                                                                 tmp_path: Path) -> None:
    path = str(tmp_path / "steps.sock")
    first = make_agent(proc_root, FakeNvml(1), steps_socket=path)
    second = make_agent(proc_root, FakeNvml(1), steps_socket=path)
    await first.start(sampling=False)
    try:
        await second.start(sampling=False)
        assert "in use by a running agent" in second.hello.extra["steps_status"]
        await second.stop()
        StepReporter("train", 0, 1, socket_path=path).report(1.0, 0.5)
        await asyncio.sleep(0.1)
        steps = (await first.sample_once()).extra["steps"]
        assert steps["received"] == 1 and steps["jobs"][0]["id"] == "train"
    finally:
        await first.stop()
    assert not Path(path).exists()


# -- what a reader that connects now needs: windows, totals, the node's verdict ----------


def test_the_node_sends_its_last_minute_and_hour_and_judges_a_drop() -> None:
    """Two ranks at SLI 0.9 for ten minutes, then 0.6: the node's windows say the last
    minute and how much of the hour it counted, its totals only grow, and it judges the
    drop from the SLI the job had before the fault, holding it while the fault lasts and
    ending it when the job is back."""
    clock = Clock()
    agg = StepAggregator(interval=1.0, clock=clock, wall_clock=lambda: 1.7e9 + clock.now)

    def second(sli: float) -> dict:
        clock.now += 1.0
        for rank in (0, 1):
            agg.add(_step(rank=rank, wall=1.0, compute=sli))
        return agg.take()["jobs"][0]

    for _ in range(600):
        job = second(0.9)
    minute, hour, five = job["windows"]
    assert (minute["s"], hour["s"], five["s"]) == (60.0, 3600.0, 300.0)
    assert minute["covered"] == 60.0 and 590 <= hour["covered"] <= 600  # 10 min old
    # ...and the burn page's five minutes, whole, at the same SLI.
    assert five["covered"] == 300.0 and five["compute"] / five["wall"] == pytest.approx(0.9)
    assert minute["compute"] / minute["wall"] == pytest.approx(0.9)
    assert "drop" not in job
    since = job["total"]["since"]
    for t in range(300):
        job = second(0.6)
        if t == 10:
            assert "drop" not in job  # ten seconds in: the minute is 0.85
    assert job["drop"]["from"] == pytest.approx(0.9, abs=0.02)  # before the fault
    assert job["drop"]["held"] >= 200
    assert job["total"]["since"] == since and job["total"]["steps"] == 2 * 900
    assert job["total"]["wall"] == pytest.approx(1800.0)
    for _ in range(90):
        job = second(0.9)
    assert "drop" not in job  # back within a few points of where it was


def test_a_sequence_that_jumps_is_a_restart_not_loss() -> None:
    """Sequence numbers alternating 2^64-1 and 0 claim nothing lost; a real gap of three
    reports is three."""
    clock = Clock()
    agg = StepAggregator(interval=1.0, clock=clock)
    for i in range(100):
        clock.now += 0.01
        agg.add(_step(seq=(1 << 64) - 1 if i % 2 else 0, pid=7))
    assert agg.take()["lost"] == 0 and agg.lost == 0
    for seq in (10, 11, 15):
        clock.now += 0.5
        agg.add(_step(seq=seq, pid=7))
    assert agg.lost == 3


def test_a_refused_datagram_is_information_a_cap_a_warning() -> None:
    """One malformed datagram (or another user's report) costs its sender alone: the
    node's finding is information, and `status` stays OK. Reports refused at the node's
    caps may be a real job's: a warning."""
    from tuimon_core.node_rules import NodeRules

    clock = Clock()
    agg = StepAggregator(interval=1.0, clock=clock)
    rules = NodeRules("n1")

    def judged() -> list[tuple[str, str]]:
        steps = agg.take() or {}
        rules.observe(None, Sample(seq=1, ts=clock.now, interval=1.0, gpus=None, host={},
                                   extra={"steps": steps}), clock.now)
        return [(f.severity, f.kind) for f in rules.conditions(clock.now)]

    agg.add(_step())
    judged()  # the counts as they start
    agg.add(b"\x00not msgpack")
    assert judged() == [("info", "steps_refused")]
    for i in range(70):
        agg.add(_step(job=f"job-{i}"))
    assert judged() == [("warning", "steps_refused")]
