"""SLO arithmetic for training runs, exactly as docs/definitions.md defines it.

- SLI = effective compute time / total time, over a window.
- Error budget hours = (1 - target) x window hours; consumed = sum of (1 - SLI) x dt;
  remaining = budget - consumed. Target 0.90 over a 720 h run: 72 h of budget; with
  60 h consumed, 12 h are left.
- Burn rate = error ratio / (1 - target). The error ratio cannot exceed 1, so the
  highest possible burn rate is 1 / (1 - target): 10x at 0.90. Alert thresholds are
  derived from the target so that they can fire (the classic 14.4x page cannot at 0.90).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tuimon_core.efficiency_drop import BURN_SHORT_S
from tuimon_core.wait_kinds import add_waits, split_wait
from tuimon_core.wording import duration_text

BURN_WINDOWS_S = {"5m": int(BURN_SHORT_S), "30m": 1800, "1h": 3600, "6h": 21600, "1d": 86400,
                  "3d": 259200}

# Multi-window alerts (long window, short window, share of the budget the long window
# may spend): the SRE workbook's page and ticket conditions for a 30-day window.
ALERTS = (
    ("page", "1h", "5m", 0.02),
    ("page", "6h", "30m", 0.05),
    ("ticket", "1d", "6h", 0.10),
    ("ticket", "3d", "6h", 0.10),
)
# An alert fires only once the data covers this much of its short window: the short
# window is what says the budget burns now, and a rate over a few seconds of it (a
# one-shot status, a viewer just opened, a run just begun) is a few samples' noise, not
# a burn. So the 1h/5m page can fire after 4.5 min of data, the tickets after 5.4 h.
COVERED_TO_ALERT = 0.9
# "Above the threshold", beyond float dust: a job exactly at its target burns 1x, which
# floats compute as 1.0000000000000002 (0.1 / 0.09999999999999998).
ABOVE = 1 + 1e-9


def coverage_text(seen: float | None, window: str, seconds: float) -> str:
    """` (90 s of 1h)` where the data covers less than most of the window (as an alert
    needs it: COVERED_TO_ALERT), else nothing: a figure over a window it has not seen
    says how much of it it saw, at least that much."""
    if seen is None or seen >= COVERED_TO_ALERT * seconds:
        return ""
    return f" ({duration_text(seen, places=0, down=True)} of {window})"


def burn_parts(rates: dict[str, float | None],
               firing: list[tuple[str, str, str, float]],
               covered: dict[str, float | None] | None = None) -> tuple[str, str]:
    """Burn rates named the same way everywhere (strip, status, diagnosis): the windows
    of the most urgent alert that fires, long then short, else the page windows 1h and
    5m (`1d 3.1x 6h 3.4x`); and the alert, if one fires (`ticket at 3.0x`). A window
    the data covers only in part says how much (`3d 3.0x (90 s of 3d)`): a rate from
    90 s is not three days' rate. A rate that rounds to its threshold is shown to two
    decimals, so what fires reads above what it fires at."""
    if firing:
        severity, long_w, short_w, threshold = firing[0]
    else:
        severity, long_w, short_w, threshold = "", "1h", "5m", 0.0
    parts = []
    for w in (long_w, short_w):
        rate = rates.get(w)
        if rate is None:
            continue
        digits = 2 if severity and round(rate, 1) == round(threshold, 1) else 1
        parts.append(f"{w} {rate:.{digits}f}x"
                     + coverage_text((covered or {}).get(w), w, BURN_WINDOWS_S[w]))
    return " ".join(parts) or "-", (f"{severity} at {threshold:.1f}x" if severity else "")


def burn_text(rates: dict[str, float | None],
              firing: list[tuple[str, str, str, float]],
              covered: dict[str, float | None] | None = None) -> str:
    shown, alert = burn_parts(rates, firing, covered)
    return f"{shown}, {alert}" if alert else shown


# The SLO every command assumes unless told: a target of 0.90 over a 720-hour (30-day)
# window; the one place these defaults are written.
DEFAULT_TARGET = 0.90
DEFAULT_HOURS = 720.0


@dataclass(frozen=True, slots=True)
class Slo:
    target: float  # e.g. 0.90
    window_hours: float  # rolling days x 24, or the run's planned hours

    def __post_init__(self) -> None:
        if not 0 < self.target < 1:
            raise ValueError(f"SLO target must be between 0 and 1, got {self.target}")
        if self.window_hours <= 0:
            raise ValueError(f"SLO window must be positive, got {self.window_hours} h")

    @property
    def budget_hours(self) -> float:
        return (1 - self.target) * self.window_hours

    def remaining_hours(self, consumed_hours: float) -> float:
        return self.budget_hours - consumed_hours

    @property
    def max_burn_rate(self) -> float:
        return 1 / (1 - self.target)

    def burn_rate(self, error_ratio: float) -> float:
        return error_ratio / (1 - self.target)

    def alert_threshold(self, long_window: str, budget_share: float) -> float:
        """Burn rate at which `budget_share` of the budget goes in `long_window`, never
        below 1x (a job burning slower than that never runs out: on a one-week run the
        3d window's share would otherwise ticket a healthy job at 0.23x) and capped below
        the highest possible burn rate so that the alert can fire at all. The floor wins
        over the cap: under a target below 0.1 the highest burn rate is barely above 1x,
        and an alert there must still mean "the budget runs out"."""
        hours = BURN_WINDOWS_S[long_window] / 3600
        classic = budget_share * self.window_hours / hours
        return max(1.0, min(classic, 0.9 * self.max_burn_rate))

    def hours_to_exhaustion(self, consumed_hours: float, burn_rate: float) -> float | None:
        """At the current burn, hours until the budget is gone (None: not burning)."""
        spend_per_hour = burn_rate * (1 - self.target)  # budget hours per hour
        if spend_per_hour <= 0:
            return None
        return max(0.0, self.remaining_hours(consumed_hours)) / spend_per_hour


def consumed_hours(intervals: list[tuple[float, float]]) -> float:
    """Sum of (1 - SLI) x dt over (SLI, hours) intervals."""
    return sum((1 - min(1.0, max(0.0, sli))) * hours for sli, hours in intervals)


class BurnReadout:
    """Burn rates and alerts from error ratios over the standard windows; the ratios come
    from the viewer's own buckets (BurnTracker) or from a relay's ledger (LedgerBurn)."""

    slo: Slo
    consumed_hours: float
    # What the consumed hours were spent waiting on, by kind (tuimon_core.wait_kinds).
    spent_hours: dict[str, float]

    def error_ratio(self, window: str, now: float) -> float | None:
        raise NotImplementedError

    def burn_rates(self, now: float) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for window in BURN_WINDOWS_S:
            ratio = self.error_ratio(window, now)
            out[window] = None if ratio is None else self.slo.burn_rate(ratio)
        return out

    def firing(self, now: float) -> list[tuple[str, str, str, float]]:
        """Alerts whose long and short windows both burn above the threshold: above, not
        at (a job exactly at its target burns 1x and is fine), beyond float dust; and
        whose short window the data covers enough of to say so (COVERED_TO_ALERT)."""
        rates = self.burn_rates(now)
        out = []
        for severity, long_w, short_w, share in ALERTS:
            threshold = self.slo.alert_threshold(long_w, share)
            above = threshold * ABOVE
            long_r, short_r = rates[long_w], rates[short_w]
            seen = self.covered(short_w, now)
            if seen is not None and seen < COVERED_TO_ALERT * BURN_WINDOWS_S[short_w]:
                continue
            if long_r is not None and short_r is not None and long_r > above \
                    and short_r > above:
                out.append((severity, long_w, short_w, threshold))
        return out

    def covered(self, window: str, now: float) -> float | None:
        """Seconds of the window the data covers (None: unknown)."""
        return None

    def text(self, now: float) -> str:
        """The burn as every view says it (burn_text), with each window's coverage."""
        return burn_text(self.burn_rates(now), self.firing(now), self.coverage(now))

    def coverage(self, now: float) -> dict[str, float | None]:
        return {w: self.covered(w, now) for w in BURN_WINDOWS_S}


class BurnTracker(BurnReadout):
    """Per-minute buckets of (total, effective) seconds, for burn rates over windows."""

    def __init__(self, slo: Slo, keep_s: int = max(BURN_WINDOWS_S.values()),
                 nodes_saw: Callable[[float, float], tuple[float, float] | None] | None = None
                 ) -> None:
        self.slo = slo
        # (SLI, seconds covered) of a window as the job's nodes summed it, where they
        # send sums (JobState.sli_from_nodes): a window reads whichever covers more of
        # it, theirs or this tracker's own count, so a one-shot that counted seconds
        # says the hour its nodes counted, as a viewer that watched it does.
        self.nodes_saw = nodes_saw
        self.keep = keep_s // 60 + 1
        self._buckets: deque[list[float]] = deque()  # [minute, total_s, effective_s]
        self.consumed_hours = 0.0
        self.spent_hours = {}
        self._first = 0.0  # when the first seconds were added

    def add(self, ts: float, total_s: float, effective_s: float,
            waits: dict[str, float] | None = None) -> None:
        """Run seconds: total, effective and what the rest waited on by kind (the part
        no kind names is `other`)."""
        if not self._buckets:
            self._first = ts - total_s  # the seconds added end at ts
        minute = int(ts // 60)
        if self._buckets and self._buckets[-1][0] == minute:
            bucket = self._buckets[-1]
        else:
            bucket = [minute, 0.0, 0.0]
            self._buckets.append(bucket)
            while len(self._buckets) > self.keep:
                self._buckets.popleft()
        effective_s = min(effective_s, total_s)
        bucket[1] += total_s
        bucket[2] += effective_s
        self.consumed_hours += (total_s - effective_s) / 3600
        add_waits(self.spent_hours, {k: v / 3600 for k, v in
                                     split_wait(waits, total_s - effective_s).items()})

    def covered(self, window: str, now: float) -> float | None:
        return self._read(window, now)[1]

    def error_ratio(self, window: str, now: float) -> float | None:
        return self._read(window, now)[0]

    def _read(self, window: str, now: float) -> tuple[float | None, float | None]:
        """(error ratio, seconds covered) of the window: the nodes' or this count's,
        whichever covers more."""
        own = (self._own_ratio(window, now), max(0.0, min(
            float(BURN_WINDOWS_S[window]), now - self._first)) if self._buckets else None)
        theirs = (self.nodes_saw(float(BURN_WINDOWS_S[window]), now)
                  if self.nodes_saw is not None else None)
        if theirs is not None and theirs[1] >= (own[1] or 0.0):
            return 1 - theirs[0], theirs[1]
        return own

    def _own_ratio(self, window: str, now: float) -> float | None:
        first = int(now // 60) - BURN_WINDOWS_S[window] // 60
        total = effective = 0.0
        for minute, t, e in reversed(self._buckets):
            if minute <= first:
                break
            total += t
            effective += e
        return None if total <= 0 else 1 - effective / total


def budget_scope(burn: BurnReadout | None) -> str:
    """Whose count the budget is: `run` (a relay's ledger), `prometheus` (the job
    counters over the SLO window) or `session` (this viewer's own, since it started)."""
    if isinstance(burn, LedgerBurn):
        return "prometheus" if burn.source == "prometheus" else "run"
    return "session"


class LedgerBurn(BurnReadout):
    """The run's budget as a relay's ledger reports it (`batch.budget`): consumed hours
    over the relay's window and error ratios per burn window, computed on the relay."""

    def __init__(self, slo: Slo, summary: dict) -> None:
        self.slo = slo
        self.consumed_hours = float(summary.get("consumed_h") or 0.0)
        self.since: float | None = summary.get("since")
        # The run time the source observed over the SLO window (Prometheus: the job's
        # wall counter's increase over its ranks), where it gives no `since`.
        observed = summary.get("observed_h")
        self.observed_s: float | None = None if observed is None else float(observed) * 3600
        self.window_hours: float | None = summary.get("window_h")
        self.error: str | None = summary.get("error")
        # Hours the relay credited from the agents' totals for time it missed.
        self.recovered_hours = float(summary.get("recovered_h") or 0.0)
        # What of it was lost, by the kinds the agents' totals named (`other`: none).
        self.recovered_spent_hours: dict[str, float] = {}
        add_waits(self.recovered_spent_hours, summary.get("recovered_spent_h"))
        self.spent_hours = {}
        add_waits(self.spent_hours, summary.get("spent_h"))
        # The job's best per-GPU throughput over 10 minutes of the run, where known.
        self.best_per_gpu: float | None = summary.get("best_per_gpu")
        # "prometheus" when the job counters in Prometheus gave it; else a relay's ledger.
        self.source: str | None = summary.get("source")
        # kind -> cause -> hours over the window, as the relay put them down (its ledger).
        self.causes_hours: dict[str, dict[str, float]] = summary.get("causes_h") or {}
        # The hours lost in each period from `lost_from` (the burn-down's history).
        self.lost_from: float | None = summary.get("lost_from")
        self.lost_every_h: float = float(summary.get("lost_every_h") or 1.0)
        self.lost_hours: list[float] = list(summary.get("lost_h") or ())
        # Set while the job's ranks are all silent: since when, and what held then.
        self.stopped_since: float | None = summary.get("stopped_since")
        self.stopped_cause: str | None = summary.get("stopped_cause")
        self._ratios = summary.get("error_ratio") or {}

    def covered(self, window: str, now: float) -> float | None:
        if self.since is not None:
            return max(0.0, min(float(BURN_WINDOWS_S[window]), now - self.since))
        if self.observed_s is not None:
            return max(0.0, min(float(BURN_WINDOWS_S[window]), self.observed_s))
        return None

    def error_ratio(self, window: str, now: float) -> float | None:
        value = self._ratios.get(window)
        return float(value) if value is not None else None
