"""Compact units for panes: rates and sizes in a few characters."""

from __future__ import annotations


def rate(v: float | None) -> str:
    if v is None:
        return "-"
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B/s"


def size(v: float | None) -> str:
    if v is None:
        return "-"
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B"
