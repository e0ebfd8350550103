"""Counters to rates: never negative, never absurd.

Drivers reset counters, narrow counters wrap or saturate, and clocks jump. A rate is
computed only from two reads of the same counter with monotonic time between them;
anything that cannot give an honest rate gives None.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


def counter_rate(before: int | float | None, now: int | float | None, dt: float, *,
                 wrap_bits: int | None = None) -> float | None:
    """The rule every rate follows: per second from two reads `dt` seconds apart; None
    for a missing read or no time passed; a decrease is a reset (None), or with
    `wrap_bits` one wrap at 2**wrap_bits (mlx5 hw_counters)."""
    if before is None or now is None or dt <= 0:
        return None
    delta = now - before
    if delta < 0:
        if wrap_bits is None:
            return None
        delta += 1 << wrap_bits
        if delta < 0:
            return None
    return delta / dt


@dataclass(slots=True)
class _Last:
    value: int | float
    t: float


class RateTracker:
    """Remembers the last read of each counter and turns the next read into a rate."""

    def __init__(self) -> None:
        self._last: dict[Hashable, _Last] = {}

    def rate(
        self,
        key: Hashable,
        value: int | float | None,
        t: float,
        *,
        wrap_bits: int | None = None,
    ) -> float | None:
        """Per-second rate of `value` since the previous call with the same key.

        `t` is a monotonic time in seconds. With `wrap_bits`, a counter that went down
        is taken to have wrapped once at 2**wrap_bits (mlx5 hw_counters); without it a
        decrease is a reset, and the baseline restarts (None this time).
        """
        if value is None:
            self._last.pop(key, None)
            return None
        last = self._last.get(key)
        self._last[key] = _Last(value, t)
        if last is None:
            return None
        return counter_rate(last.value, value, t - last.t, wrap_bits=wrap_bits)

    def forget(self, prefix: Hashable) -> None:
        """Drop every counter whose key is a tuple starting with `prefix` (device gone)."""
        for key in [k for k in self._last if isinstance(k, tuple) and k and k[0] == prefix]:
            del self._last[key]


class CounterSet:
    """Rates of several counters read together (a disk's line of /proc/diskstats): one
    remembered read per entity, each counter's rate by RateTracker's rules without wrap
    (a decrease is a reset: None this time, and the baseline restarts)."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[float, tuple[int | float | None, ...]]] = {}

    def rates(self, key: Hashable, values: tuple[int | float | None, ...],
              t: float) -> list[float | None]:
        last = self._last.get(key)
        self._last[key] = (t, values)
        if last is None or t - last[0] <= 0:
            return [None] * len(values)
        dt = t - last[0]
        return [counter_rate(old, new, dt) for new, old in zip(values, last[1])]

    def forget(self, key: Hashable) -> None:
        self._last.pop(key, None)
