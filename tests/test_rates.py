from __future__ import annotations

from agent.rates import CounterSet, RateTracker


def test_first_read_has_no_rate_then_delta_over_time() -> None:
    r = RateTracker()
    assert r.rate("c", 100, 10.0) is None
    assert r.rate("c", 300, 12.0) == 100.0


def test_counter_reset_restarts_baseline_never_negative() -> None:
    r = RateTracker()
    r.rate("c", 1_000_000, 0.0)
    assert r.rate("c", 10, 1.0) is None  # driver reset: no rate, not a negative one
    assert r.rate("c", 110, 2.0) == 100.0


def test_wrap_at_width() -> None:
    r = RateTracker()
    r.rate("c", 2**32 - 10, 0.0)
    assert r.rate("c", 20, 1.0, wrap_bits=32) == 30.0


def test_clock_not_advancing_gives_none() -> None:
    r = RateTracker()
    r.rate("c", 1, 5.0)
    assert r.rate("c", 2, 5.0) is None
    assert r.rate("c", 3, 4.0) is None


def test_unreadable_value_forgets_baseline() -> None:
    r = RateTracker()
    r.rate("c", 100, 0.0)
    assert r.rate("c", None, 1.0) is None
    assert r.rate("c", 200, 2.0) is None
    assert r.rate("c", 300, 3.0) == 100.0


def test_a_counter_set_rates_each_counter_by_the_same_rules() -> None:
    rates = CounterSet()
    assert rates.rates("nvme0n1", (100, 5, None), 0.0) == [None, None, None]  # first read
    assert rates.rates("nvme0n1", (300, 2, 7), 2.0) == [100.0, None, None]  # reset, unknown
    assert rates.rates("nvme0n1", (500, 6, 9), 4.0) == [100.0, 2.0, 1.0]  # baselines again
    assert rates.rates("nvme0n1", (600, 7, 10), 4.0) == [None, None, None]  # no time passed
    assert rates.rates("nvme1n1", (1, 1, 1), 5.0) == [None, None, None]  # its own baseline
