"""The run's report, `tuimon report`: what the relay's ledger reads for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuimon.model.slo import Slo
from tuimon.relay.ledger import Ledger

T0 = 1_800_000_000.0
SLO = Slo(0.9, 720)
HOSTILE = "<script>alert(1)</script>|x\ny"


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_ledgers_sli_by_period_adds_up_to_its_summary(tmp_path: Path) -> None:
    """The periods are the shortest that give at most 240 (minutes for a short run, hours
    for nine days, three hours for a month), and their sums are the summary's: the file's
    minutes, those not written yet, and a stop's lost time as it stands."""
    wall = Clock(T0)
    ledger = Ledger(tmp_path / "l.db", clock=wall, window_hours=24 * 40)
    for minute in range(30):
        ledger.add("job", T0 + 60 * minute + 30, 60.0, 54.0)
    assert ledger.flush()
    ledger.add("job", T0 + 60 * 30 + 30, 60.0, 30.0)  # not written yet
    wall.t = T0 + 60 * 31
    series = ledger.sli_series("job", T0 - 86400, wall.t)
    assert series is not None and series.every_s == 60.0
    assert series.total_s[:2] == [60.0, 60.0] and series.effective_s[-2] == 30.0
    summary = ledger.summary(wall.t)["job"]
    assert sum(series.total_s) == pytest.approx(summary["observed_h"] * 3600)
    wall.t = T0 + 60 * 40  # silent past its time: stopped, its lost time counts now
    ledger.note_stops(wall.t, lambda job: "node lost n1")
    wall.t = T0 + 86400 * 9
    series = ledger.sli_series("job", T0 - 3600, wall.t)
    summary = ledger.summary(wall.t)["job"]
    assert series is not None and series.every_s == 3600.0 and len(series.total_s) <= 240
    assert sum(series.total_s) == pytest.approx(summary["observed_h"] * 3600)
    assert sum(series.total_s) - sum(series.effective_s) == pytest.approx(
        summary["consumed_h"] * 3600)
    wall.t = T0 + 86400 * 29
    series = ledger.sli_series("job", T0 - 3600, wall.t)
    assert series is not None and series.every_s == 3 * 3600.0
    assert ledger.sli_series("job", T0 - 7200, T0 - 3600) is None  # bounded on both sides
    assert ledger.sli_series("nobody", T0 - 3600, wall.t) is None
    ledger.close()


def test_the_summary_gives_the_job_a_report_asks_for_in_full(tmp_path: Path) -> None:
    """The summary sends its causes and history for the most recent jobs only; a report
    asks for one job, which has them however many jobs ran since."""
    from tuimon_core.protocol.fields import MAX_DETAILED_JOBS

    wall = Clock(T0)
    ledger = Ledger(tmp_path / "l.db", clock=wall)
    ledger.add("old", T0 + 30, 60.0, 30.0)
    for i in range(MAX_DETAILED_JOBS):
        ledger.add(f"job{i}", T0 + 90 + 60 * i, 60.0, 30.0)
    wall.t = T0 + 60 * (MAX_DETAILED_JOBS + 2)
    assert "lost_h" not in ledger.summary()["old"]
    assert ledger.summary(job="old")["old"]["lost_h"] == [pytest.approx(30 / 3600)]
    assert "nobody" not in ledger.summary(job="nobody")
    ledger.close()
