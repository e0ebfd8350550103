"""Making text from the network safe to show, and compact units."""

from __future__ import annotations

from textual.markup import escape

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), 0x7F)}


def safe(text: str, width: int | None = None) -> str:
    """Escape control characters (no terminal injection through a host name) and markup."""
    cleaned = text.translate(_CONTROL)
    cleaned = "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in cleaned)
    if width is not None:
        cleaned = cleaned[:width]
    return escape(cleaned)


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


SPARKS = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"


def sparkline(values: list[float] | tuple[float, ...], width: int, top: float | None = None) -> str:
    data = list(values)[-width:]
    if not data:
        return ""
    peak = top or max(data) or 1.0
    return "".join(SPARKS[min(7, max(0, int(v / peak * 7.999)))] for v in data)
