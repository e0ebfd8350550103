"""How counts and durations are said in every text tuimon writes: a finding's message, a
status line, a screen, a report. One place, so `1 node` / `3 nodes` and `12 min` read the
same whichever reader shows them."""

from __future__ import annotations

import math
import time


def plural(n: int, word: str) -> str:
    """`1 node`, `3 nodes`, `0 times`: the count with its noun."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def duration_text(seconds: float, places: int = 1, down: bool = False) -> str:
    """A span of time at the precision one reads it at: `45 s`, `12 min`, `5.0 h`, `3.0 d`
    (`places` for hours and days: 0 where it sits beside a window's name, `2 h of 6h`).
    Each unit up to where it would round to the next (119.6 s is `2 min`); `down`
    truncates instead of rounding, for "at least this much" (`2 d of 3d`, never `3 d`)."""
    seconds = max(0.0, seconds)

    def shown(value: float, digits: int) -> float:
        step = 10 ** digits
        return (math.floor(value * step) if down else round(value * step)) / step

    if shown(seconds, 0) < 120:
        return f"{shown(seconds, 0):.0f} s"
    if shown(seconds / 60, 0) < 120:
        return f"{shown(seconds / 60, 0):.0f} min"
    if shown(seconds / 3600, places) < 48:
        return f"{shown(seconds / 3600, places):.{places}f} h"
    return f"{shown(seconds / 86400, places):.{places}f} d"


def clock_text(ts: float) -> str:
    """A moment as a finding's `since` says it: local time, to the second (`02:41:07`)."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def onset_text(since: float, now: float) -> str:
    """`02:13 (47 min)`: when a finding began, local time, and how long ago. An onset
    after `now` (a relay's clock ahead of the reader's) is said as now."""
    since = min(since, now)
    day = "%H:%M" if now - since < 20 * 3600 else "%a %H:%M"
    return f"{time.strftime(day, time.localtime(since))} ({duration_text(now - since)})"


def held_text(text: str, since: float | None, now: float) -> str:
    """A finding's words with since when it holds, as every reader of people shows it
    (`tuimon status`, the app's diagnosis): `...; since 02:13 (47 min)`. A reader that
    cuts long words cuts them before this, so that the onset is never what is cut."""
    return text if since is None else f"{text}; since {onset_text(since, now)}"


def hours_text(hours: float) -> str:
    """Budget hours as every cost is said: `1.5 h`, `42 min` under an hour, `30 s` under
    a minute (`0.0 h spent` early in a run answers nothing)."""
    # Each unit up to where it would round to the next: 59.99 min is `1.0 h`, not `60 min`.
    if hours * 3600 < 59.5:
        return f"{max(0.0, hours) * 3600:.0f} s"
    return f"{hours * 60:.0f} min" if hours * 60 < 59.5 else f"{hours:.1f} h"
