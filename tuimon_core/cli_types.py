"""Argument types both command lines share: a bad value is refused by argparse itself,
with the option's name and the usage line, before anything starts."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable


def positive_float(most: float, least: float = 0.0) -> Callable[[str], float]:
    """A number in (least, most] (or [least, most] when least > 0)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = value >= least if least > 0 else value > 0
        if math.isnan(value) or not low_ok or value > most:
            bound = f"[{least:g}, {most:g}]" if least > 0 else f"(0, {most:g}]"
            raise argparse.ArgumentTypeError(f"must be in {bound}, got {text}")
        return value

    parse.__name__ = "number"  # argparse names the type in its messages
    return parse


def positive_int(most: int, least: int = 1) -> Callable[[str], int]:
    """A whole number in least..most (1..most unless told)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"must be in {least}..{most}, got {text}")
        return value

    parse.__name__ = "count"
    return parse


def slo_target(text: str) -> float:
    """An SLO target: a ratio strictly between 0 and 1 (0.90, not 90)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (e.g. 0.9), got {text}")
    return value


MAX_HEADER_VALUE = 256


def header_value(text: str) -> str:
    """A value sent as an HTTP header (a tenant): visible ASCII only, at most
    MAX_HEADER_VALUE characters. A CR or LF would end the header (aiohttp refuses it
    at every request, far from the option that set it)."""
    if not text or len(text) > MAX_HEADER_VALUE or not all("!" <= ch <= "~" for ch in text):
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r}: expected 1 to {MAX_HEADER_VALUE} visible ASCII characters "
            "(no spaces, line breaks or control characters)")
    return text


header_value.__name__ = "header value"


_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def duration(text: str) -> float:
    """`90`, `90s`, `30m`, `6h`, `2d`, `1w` -> seconds (at most 400 days)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    unit = _UNITS.get(m.group(2) or "s") if m else None
    if m is None or unit is None or not 0 < float(m.group(1)) * unit <= 400 * 86400:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: expected a duration such as 90s, "
                                         "30m, 6h or 2d (at most 400 days)")
    return float(m.group(1)) * unit


duration.__name__ = "duration"
