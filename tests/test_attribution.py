"""What a job's waiting is put down to (tuimon.model.attribution), one judgement at a time."""

from __future__ import annotations

import pytest

from tuimon.model.attribution import FOLDED, MAX_CAUSES, NO_FINDING, attribute
from tuimon.model.efficiency import EfficiencyView
from tuimon_core.findings import Finding


def _view(waits: dict[str, float]) -> EfficiencyView:
    eff = EfficiencyView()
    job = eff._job("llm")
    job.world = 2
    job.rank_where = {0: ("gpu001", 0), 1: ("gpu002", 0)}
    job.unattributed = waits
    return eff


def test_each_kind_goes_to_what_explains_it_by_strength() -> None:
    eff = _view({"comm": 10.0, "checkpoint": 4.0, "other": 1.0})
    findings = [
        Finding("warning", "congestion", "congestion under leaf03", leaf="leaf03",
                nodes=("gpu001", "gpu009"), score=1.0),
        Finding("info", "power", "power-capped", node="gpu002", score=0.25),
        Finding("warning", "storage", "/lustre at 131%", fs="/lustre", score=0.7),
        Finding("warning", "thermal", "hot", node="gpu777", score=0.6),  # not the job's
        Finding("critical", "burn_page", "llm burns", job="llm"),  # no score: a symptom
    ]
    attribute(eff, findings)
    causes = eff.jobs["llm"].causes
    assert causes[("comm", "congestion leaf03")] == pytest.approx(8.0)
    assert causes[("comm", "power gpu002")] == pytest.approx(2.0)
    assert causes[("checkpoint", "storage /lustre")] == pytest.approx(4.0)
    assert sum(v for (k, _), v in causes.items() if k == "other") == pytest.approx(1.0)
    assert not any("gpu777" in c or "burn" in c for _, c in causes)


def test_a_straggler_stands_for_the_causes_on_its_node_and_nothing_is_said_so() -> None:
    eff = _view({"comm": 6.0, "data": 2.0})
    findings = [
        Finding("warning", "straggler", "gpu002 GPU 0 slow; likely: thermal", node="gpu002",
                gpu=0, job="llm", score=0.7),
        Finding("warning", "thermal", "throttling", node="gpu002", gpu=0, score=0.6),
    ]
    attribute(eff, findings)
    causes = eff.jobs["llm"].causes
    assert causes == {("comm", "straggler gpu002 GPU 0"): pytest.approx(6.0),
                      ("data", NO_FINDING): pytest.approx(2.0)}


def test_names_from_outside_cannot_grow_the_causes_without_end() -> None:
    eff = _view({"comm": 1.0})
    for i in range(MAX_CAUSES + 50):
        eff.jobs["llm"].unattributed = {"comm": 1.0}
        attribute(eff, [Finding("warning", "congestion", "x", leaf=f"leaf{i}",
                                nodes=("gpu001",), score=0.5)])
    causes = eff.jobs["llm"].causes
    assert len(causes) <= MAX_CAUSES + 1 and ("comm", FOLDED) in causes
    assert sum(causes.values()) == pytest.approx(MAX_CAUSES + 50)


def test_the_drops_likely_cause_is_the_one_the_waiting_is_put_down_to() -> None:
    """Eight nodes writing one file system far above their level are one cause, weighed
    once, by the drop's `likely` and the budget's split alike: the same first cause."""
    from tuimon.model.attribution import likely, share
    from tuimon_core.findings import Finding

    surges = [Finding("info", "storage_surge", f"gpu00{i} writes /lustre", node=f"gpu00{i}",
                      fs="/lustre", score=0.6) for i in range(8)]
    slow = Finding("warning", "storage_latency", "NFS /home slow", fs="/home", score=0.5)
    found = [*surges, slow]
    split = share({"checkpoint": 100.0}, found)
    top = max(split, key=split.__getitem__)[1]
    assert top == "storage_surge /lustre"
    assert split[("checkpoint", "storage_surge /lustre")] == pytest.approx(100 * 0.6 / 1.1)
    first = likely({"checkpoint": 0.3}, found, "train", {f"gpu00{i}" for i in range(8)})[0]
    assert first.startswith(top), first
