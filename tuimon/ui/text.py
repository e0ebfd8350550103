"""Making text from the network safe to show, and compact units."""

from __future__ import annotations

from collections.abc import Iterable

from tuimon_core.protocol.text import clean


def safe(text: str, width: int | None = None) -> str:
    """Text for Textual markup: cleaned (tuimon_core.protocol.text, the one sanitising path;
    strings from outside were already cleaned where they entered, this is the last guard)
    and every markup bracket escaped.

    Every `[` is escaped, not only those that look like tags (textual.markup.escape's
    rule): Textual's parser opens a tag at any `[`, so `\x1b[2J` in a name would swallow
    the markup after it. A trailing backslash would escape the caller's next `[`, so it
    gets a zero-width space after it.
    """
    cleaned = clean(text)
    if width is not None:
        cleaned = cleaned[:width]
    cleaned = cleaned.replace("[", "\\[")
    return cleaned + "\u200b" if cleaned.endswith("\\") else cleaned


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


def sparkline(values: Iterable[float], width: int, top: float | None = None) -> str:
    data = list(values)[-width:]
    if not data:
        return ""
    peak = top or max(data) or 1.0
    return "".join(SPARKS[min(7, max(0, int(v / peak * 7.999)))] for v in data)
