"""SLO arithmetic, with docs/definitions.md's example reproduced exactly."""

from __future__ import annotations

import pytest

from tuimon.model.slo import BurnTracker, Slo, consumed_hours


def test_the_design_example_exactly() -> None:
    slo = Slo(target=0.90, window_hours=720)
    assert slo.budget_hours == pytest.approx(72.0)
    assert slo.remaining_hours(60.0) == pytest.approx(12.0)


def test_consumed_hours_is_the_sum_of_one_minus_sli_times_dt() -> None:
    # 10 h at SLI 0.95 and 20 h at SLI 0.80: 0.5 h + 4 h.
    assert consumed_hours([(0.95, 10.0), (0.80, 20.0)]) == pytest.approx(4.5)


def test_burn_rate_and_its_ceiling_follow_the_target() -> None:
    slo = Slo(0.90, 720)
    assert slo.burn_rate(0.2) == pytest.approx(2.0)
    assert slo.max_burn_rate == pytest.approx(10.0)
    # The classic 14.4x page (2 % of a 30-day budget in an hour) cannot fire at 0.90:
    # the derived threshold stays below 10x.
    assert slo.alert_threshold("1h", 0.02) < slo.max_burn_rate
    strict = Slo(0.999, 720)
    assert strict.alert_threshold("1h", 0.02) == pytest.approx(14.4)


def test_hours_to_exhaustion_at_the_current_burn() -> None:
    slo = Slo(0.90, 720)
    # 12 h left, burning at 2x: 0.2 budget hours an hour, so 60 h.
    assert slo.hours_to_exhaustion(60.0, 2.0) == pytest.approx(60.0)
    assert slo.hours_to_exhaustion(60.0, 0.0) is None


def test_burn_tracker_windows_and_multiwindow_alerts() -> None:
    slo = Slo(0.90, 720)
    tracker = BurnTracker(slo)
    t0 = 1_800_000_000.0
    for minute in range(120):  # two healthy hours
        tracker.add(t0 + 60 * minute, 60.0, 57.0)
    assert tracker.burn_rates(t0 + 7200)["1h"] == pytest.approx(0.5)
    assert tracker.firing(t0 + 7200) == []
    for minute in range(120, 180):  # an hour waiting on a broken fabric: SLI 0.05
        tracker.add(t0 + 60 * minute, 60.0, 3.0)
    now = t0 + 180 * 60
    rates = tracker.burn_rates(now)
    assert rates["5m"] == pytest.approx(9.5)
    assert rates["1h"] == pytest.approx(9.5)
    assert ("page", "1h", "5m", pytest.approx(9.0)) in tracker.firing(now)
    assert tracker.consumed_hours == pytest.approx(120 * 3 / 3600 + 60 * 57 / 3600)


def test_bad_slo_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="target"):
        Slo(1.5, 720)
    with pytest.raises(ValueError, match="window"):
        Slo(0.9, 0)


def test_an_overspent_budget_is_negative_and_already_exhausted() -> None:
    slo = Slo(0.90, 720)
    assert slo.remaining_hours(80.0) == pytest.approx(-8.0)
    assert slo.hours_to_exhaustion(80.0, 3.0) == 0.0


def test_a_window_not_yet_full_uses_the_time_there_is() -> None:
    slo = Slo(0.95, 24)
    tracker = BurnTracker(slo)
    t0 = 1_800_000_000.0
    for minute in range(10):  # ten minutes into a run: the 1 h and 1 d windows are short
        tracker.add(t0 + 60 * minute, 60.0, 54.0)
    rates = tracker.burn_rates(t0 + 600)
    assert rates["1h"] == pytest.approx(0.1 / 0.05)
    assert rates["1d"] == pytest.approx(rates["1h"])
    assert slo.budget_hours == pytest.approx(1.2)
    assert tracker.consumed_hours == pytest.approx(10 * 6 / 3600)


def test_a_job_that_restarts_is_charged_for_reported_time_only() -> None:
    slo = Slo(0.90, 720)
    tracker = BurnTracker(slo)
    t0 = 1_800_000_000.0
    for minute in range(30):
        tracker.add(t0 + 60 * minute, 60.0, 54.0)
    # The job restarts: 20 minutes with no step reports, then it reports again.
    for minute in range(50, 80):
        tracker.add(t0 + 60 * minute, 60.0, 54.0)
    assert tracker.consumed_hours == pytest.approx(60 * 6 / 3600)
    assert tracker.burn_rates(t0 + 80 * 60)["30m"] == pytest.approx(1.0)
    # Nothing reported in the last 5 minutes of a gap: no rate, not a zero.
    assert tracker.burn_rates(t0 + 100 * 60)["5m"] is None


def test_a_job_burning_slower_than_its_budget_never_alerts_on_a_short_run() -> None:
    """On a one-week run the 3d window's 10% share of the budget is 0.23x: a job at SLI
    0.97 (0.3x, which would leave 70% of the budget at the end) must not ticket."""
    slo = Slo(0.90, 168)
    assert min(slo.alert_threshold(w, share) for w, share in
               (("1h", 0.02), ("6h", 0.05), ("1d", 0.10), ("3d", 0.10))) == 1.0
    t = BurnTracker(slo)
    for minute in range(3 * 24 * 60):
        t.add(minute * 60.0, 60.0, 60.0 * 0.97)
    assert t.firing(3 * 24 * 3600.0) == []


@pytest.mark.parametrize("target", [0.01, 0.05, 0.09, 0.5, 0.9, 0.999])
def test_no_alert_threshold_is_under_1x_whatever_the_target(target: float) -> None:
    """At a target under 0.1 the cap (90% of the highest burn rate) is under 1x; the floor
    must win, or a job burning exactly its budget would page."""
    slo = Slo(target, 720)
    for w, share in (("1h", 0.02), ("6h", 0.05), ("1d", 0.10), ("3d", 0.10)):
        assert slo.alert_threshold(w, share) >= 1.0


def test_a_job_exactly_at_its_target_is_not_a_ticket_and_young_windows_say_so() -> None:
    """SLI equal to the target burns 1.0x: at the threshold, not above it, so nothing
    fires. A viewer with 90 s of data says how much of each window it knows instead of
    printing a 3-day rate, and raises nothing from it: an alert needs most of its short
    window (the page 4.5 of 5 min, the tickets 5.4 of 6 h); a rate that rounds to its
    threshold shows two decimals."""
    from tuimon.model.slo import BurnTracker

    slo = Slo(0.90, 720)
    at_target = BurnTracker(slo)
    now = 1_000_000.0
    for minute in range(4320):  # three days exactly at 0.90
        at_target.add(now - 259_200 + 60 * (minute + 1), 60.0, 54.0)
    assert at_target.firing(now) == []
    assert "ticket" not in at_target.text(now) and "of" not in at_target.text(now)
    young = BurnTracker(slo)
    for s in range(90):  # 90 s at SLI 0.70: 3x
        young.add(now - 90 + s + 1, 1.0, 0.7)
    text = young.text(now)
    assert young.firing(now) == [] and "ticket" not in text and "page" not in text, text
    assert text == "1h 3.0x (90 s of 1h) 5m 3.0x (90 s of 5m)", text
    for s in range(90, 5 * 3600 + 30 * 60):  # 5.5 h at 4x: the tickets' 6 h mostly seen
        young.add(now + s - 89, 1.0, 0.6)
    later = now + 5 * 3600 + 30 * 60 - 90
    assert [f[:3] for f in young.firing(later)] == [("ticket", "1d", "6h"),
                                                    ("ticket", "3d", "6h")]
    assert "1d 4.0x (5 h of 1d) 6h 4.0x, ticket at 3.0x" in young.text(later), \
        young.text(later)
    barely = BurnTracker(slo)
    for minute in range(4320):  # 1.04x: above the 1.0x floor, rounds to it
        barely.add(now - 259_200 + 60 * (minute + 1), 60.0, 60.0 * (1 - 0.104))
    assert "3d 1.04x" in barely.text(now) and "ticket at 1.0x" in barely.text(now)


def test_a_budget_from_prometheus_raises_no_alert_from_the_first_minutes_of_a_run() -> None:
    """Prometheus gives no run start: the run time its counters observed over the SLO
    window stands for how much of each window is covered, so its first two minutes at
    9.5x say so and page nobody, as the app's own count and `tuimon rules` do not."""
    from tuimon.model.slo import BURN_WINDOWS_S, LedgerBurn

    slo = Slo(0.90, 720)
    ratios = dict.fromkeys(BURN_WINDOWS_S, 0.95)
    young = LedgerBurn(slo, {"source": "prometheus", "observed_h": 2 / 60,
                             "error_ratio": ratios})
    assert young.firing(1e9) == [] and "(2 min of 5m)" in young.text(1e9), young.text(1e9)
    old = LedgerBurn(slo, {"source": "prometheus", "observed_h": 7.0, "error_ratio": ratios})
    assert [f[1] for f in old.firing(1e9)] == ["1h", "6h", "1d", "3d"]
