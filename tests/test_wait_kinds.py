"""What a step waited on: the reporter's kinds, through the agent's sums, the wire, the
viewer's credit and /metrics, to what status says the job's step time went to."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import make_registry, render
from agent.reporter import StepReporter
from agent.reporter_torch import TorchStepTimer
from agent.sim.fake_nvml import FakeNvml
from agent.steps import StepError, decode_step
from tests.conftest import make_agent
from tuimon.model.step_credit import StepCredit, merge_steps
from tuimon_core.protocol import Sample, decode, encode
from tuimon_core.wait_kinds import said, split_wait


def _received(tmp_path: Path, body) -> dict:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "steps.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    try:
        reporter = StepReporter("llama", 0, 8, socket_path=path)
        body(reporter)
        return decode_step(server.recv(4096))
    finally:
        server.close()


def test_the_reporter_times_each_kind_of_waiting(tmp_path: Path) -> None:
    def body(r: StepReporter) -> None:
        with r.step(samples=8):
            with r.waiting("data"):
                time.sleep(0.03)
            with r.waiting("comm"):
                time.sleep(0.05)
            with r.waiting():  # unnamed: other
                time.sleep(0.01)
            with r.waiting("pipeline-bubble"):  # a kind this version does not know
                time.sleep(0.01)

    step = _received(tmp_path, body)
    waits = step["waits"]
    assert set(waits) == {"data", "comm", "other"}
    # Lower bounds only: a loaded machine may oversleep, never undersleep.
    assert waits["data"] >= 0.03 and waits["comm"] >= 0.05 and waits["other"] >= 0.02
    assert abs(sum(waits.values()) - (step["wall"] - step["compute"])) < 1e-6


def test_the_torch_timer_without_a_gpu_passes_the_kind_on(tmp_path: Path) -> None:
    def body(r: StepReporter) -> None:
        timer = TorchStepTimer(r, use_cuda=False)
        with timer.step(samples=4), timer.waiting("checkpoint"):
            time.sleep(0.02)

    assert _received(tmp_path, body)["waits"]["checkpoint"] >= 0.02


class _Event:
    """A CUDA event as torch.cuda gives it: record(), query(), elapsed_time() in ms."""

    clock = 0.0

    def __init__(self, enable_timing: bool = True) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = _Event.clock

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: _Event) -> float:
        return (other.at - self.at) * 1000.0


class _Cuda:
    Event = _Event


def test_the_torch_timer_on_cuda_events_splits_the_wait_by_kind(tmp_path: Path) -> None:
    def body(r: StepReporter) -> None:
        timer = TorchStepTimer(r, cuda=_Cuda())
        with timer.step(samples=4):
            _Event.clock = 0.0
            with timer.waiting("data"):
                _Event.clock += 0.1
            _Event.clock += 0.5  # compute
            with timer.waiting("comm"):
                _Event.clock += 0.3
            with timer.waiting("comm"):
                _Event.clock += 0.1

    step = _received(tmp_path, body)
    assert step["wall"] == pytest.approx(1.0) and step["compute"] == pytest.approx(0.5)
    assert step["waits"] == pytest.approx({"data": 0.1, "comm": 0.4})


@pytest.mark.parametrize("waits, reason", [
    ({"comm": -1.0}, "waits.'comm'"),
    ({"comm": float("nan")}, "waits.'comm'"),
    ({"comm": "1"}, "waits.'comm'"),
    ({"comm": 2.0}, "expected seconds within the step"),
    ([1.0], "waits: expected a map"),
    ({"x" * 40: 0.1}, "kind names"),
])
def test_a_report_with_bad_waits_is_refused_with_a_reason(waits: object, reason: str) -> None:
    data = msgpack.packb({"v": 1, "t": "step", "job": "j", "rank": 0, "world": 1,
                          "wall": 1.0, "compute": 0.5, "waits": waits})
    with pytest.raises(StepError, match=reason.replace("(", r"\(")):
        decode_step(data)


def test_a_wait_inside_another_is_counted_once_not_refused(tmp_path: Path) -> None:
    """waiting("checkpoint") around waiting("comm"): the reported kinds add up to more
    than the step; the step still counts, its waiting split in their shares."""
    def body(r: StepReporter) -> None:
        with r.step(samples=1), r.waiting("checkpoint"):
            time.sleep(0.02)
            with r.waiting("comm"):
                time.sleep(0.02)

    step = _received(tmp_path, body)
    assert sum(step["waits"].values()) > step["wall"]
    credited = split_wait(step["waits"], step["wall"] - step["compute"])
    assert sum(credited.values()) == pytest.approx(step["wall"] - step["compute"])
    assert credited["checkpoint"] > credited["comm"] > 0


def test_credited_waiting_keeps_the_reported_shares() -> None:
    # Cut to a tenth by the time allowance: each kind gets its share of what is left.
    assert split_wait({"comm": 2.0}, 0.5, 5.0) == pytest.approx({"comm": 0.2, "other": 0.3})
    assert split_wait({"comm": 1.0, "new-kind": 1.0}, 3.0) == {"comm": 1.0, "other": 2.0}
    assert split_wait(None, 2.0) == {"other": 2.0}  # an older reporter: all of it other
    assert split_wait({"comm": 1.0}, 0.0) == {}
    assert said({"comm": 0.123, "other": 0.004, "data": 0.02}) == "comm 12%, data 2%"


async def test_the_agent_sums_waits_by_kind_onto_the_wire_and_into_metrics(
        proc_root: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "steps.sock")
    agent = make_agent(proc_root, FakeNvml(1), steps_socket=path)
    await agent.start(sampling=False)
    try:
        ranks = [StepReporter("train", r, 2, socket_path=path) for r in range(2)]
        for _ in range(2):
            ranks[0].report(1.0, 0.7, 64, waits={"comm": 0.2, "data": 0.1})
            ranks[1].report(1.0, 0.8, 64, waits={"comm": 0.1})  # and 0.1 s unnamed
        await asyncio.sleep(0.1)
        sample = decode(encode(await agent.sample_once()))  # valid on the wire
        job = sample.extra["steps"]["jobs"][0]
        by_rank = {r["rank"]: r["waits"] for r in job["ranks"]}
        assert by_rank[0] == pytest.approx({"comm": 0.4, "data": 0.2})
        assert by_rank[1] == pytest.approx({"comm": 0.2, "other": 0.2})
        assert job["total"]["waits"] == pytest.approx({"comm": 0.6, "data": 0.2,
                                                       "other": 0.2})
        assert job["windows"][0]["waits"] == pytest.approx(job["total"]["waits"])
        text = render(make_registry(agent)).decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        got = {(s.labels["rank"], s.labels["kind"]): s.value
               for s in fams["tuimon_job_wait_seconds"].samples}
        assert got[("0", "comm")] == pytest.approx(0.4)
        assert got[("1", "other")] == pytest.approx(0.2)
        assert got[("1", "checkpoint")] == 0.0  # every kind, zero until waited on
        assert fams["tuimon_job_wait_seconds"].samples[0].name == \
            "tuimon_job_wait_seconds_total"
    finally:
        await agent.stop()


def test_the_viewer_credits_waits_and_a_relay_merges_them() -> None:
    def steps(comm: float, other: float) -> dict:  # type: ignore[type-arg]
        return {"jobs": [{"id": "j", "world": 1, "ranks": [
            {"rank": 0, "steps": 1, "wall": 1.0, "compute": 1.0 - comm - other,
             "samples": 1, "waits": {"comm": comm, "other": other}}]}]}

    merged = merge_steps(steps(0.2, 0.1), steps(0.3, 0.0))
    assert merged is not None
    # A relay merging a hostile node's sums sends on only what a reader takes.
    hostile = {"jobs": [{"id": "j", "world": 1, "ranks": [
        {"rank": 0, "steps": 1, "wall": 1.0, "compute": 0.0, "waits": {"comm": 1e18}}]}]}
    big = merge_steps(hostile, hostile)
    assert big is not None
    decode(encode(Sample(seq=1, ts=1.0, interval=1.0, extra={"steps": big})))
    assert merged["jobs"][0]["ranks"][0]["waits"] == pytest.approx({"comm": 0.5, "other": 0.1})
    credit = StepCredit(first_s=1.0)
    job = credit.credit("node-a", merged, now=0.0)[0]  # 2 s claimed, 1 s allowed
    assert job.wall == pytest.approx(1.0)
    assert job.waits == pytest.approx({"comm": 0.25, "other": 0.05})


def test_a_viewers_own_budget_says_what_it_was_spent_on() -> None:
    from tuimon.model.slo import BurnTracker, LedgerBurn, Slo

    tracker = BurnTracker(Slo(0.9, 720))
    tracker.add(60.0, 60.0, 30.0, {"comm": 20.0, "data": 4.0})
    tracker.add(120.0, 60.0, 60.0)
    tracker.add(180.0, 60.0, 48.0)  # an older reporter: its waiting is unnamed
    assert tracker.spent_hours == pytest.approx({"comm": 20 / 3600, "data": 4 / 3600,
                                                 "other": 18 / 3600})
    assert sum(tracker.spent_hours.values()) == pytest.approx(tracker.consumed_hours)
    # A newer relay's kinds this version does not know count as other.
    ledger = LedgerBurn(Slo(0.9, 720), {"consumed_h": 3.0,
                                        "spent_h": {"comm": 2.0, "bubble": 0.5,
                                                    "other": 0.5}})
    assert ledger.spent_hours == {"comm": 2.0, "other": 1.0}


def test_merging_a_rank_with_waits_then_one_without_keeps_both() -> None:
    """Two samples of two ranks, the first rank's with waits: the merge goes on to the
    second rank of the same job (a name reused inside the loop once broke this)."""
    def steps(waits: dict[str, float] | None) -> dict:  # type: ignore[type-arg]
        r0 = {"rank": 0, "steps": 1, "wall": 1.0, "compute": 0.5}
        if waits:
            r0["waits"] = waits  # type: ignore[assignment]
        return {"jobs": [{"id": "j", "world": 2, "ranks": [
            r0, {"rank": 1, "steps": 1, "wall": 1.0, "compute": 0.5}]}]}

    merged = merge_steps(steps({"comm": 0.5}), steps({"comm": 0.5}))
    assert merged is not None
    ranks = {r["rank"]: r for r in merged["jobs"][0]["ranks"]}
    assert ranks[0]["waits"] == {"comm": 1.0} and ranks[1]["wall"] == 2.0
