"""Sparklines: a series as a line of eighth-block glyphs."""

from __future__ import annotations

from collections.abc import Iterable

SPARKS = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"


def sparkline(values: Iterable[float], width: int, top: float | None = None) -> str:
    data = list(values)[-width:]
    if not data:
        return ""
    peak = top or max(data) or 1.0
    return "".join(SPARKS[min(7, max(0, int(v / peak * 7.999)))] for v in data)
