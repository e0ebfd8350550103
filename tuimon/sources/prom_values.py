"""A series' value as a protocol field holds it: whole numbers, GPU indices from their
labels, and DCGM's marks for a value it has not."""

from __future__ import annotations

from typing import Any

from tuimon_core.protocol.fields import GPU_FIELDS
from tuimon_core.protocol.schema import INT, NUM, Int, WireType

# DCGM marks a value it has not (blank, not found, not supported, no permission) with
# numbers from these up (dcgm_structs.h DCGM_INT64_BLANK, DCGM_INT32_BLANK), and
# dcgm-exporter writes them as they are: 9223372036854775794 is "not supported".
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_INT32_BLANK = 0x7FFFFFF0
# Fields DCGM keeps in 32 bits (a link's generation or width, a state): for these the
# 32-bit marks apply too.
_SMALL_FIELDS = frozenset(f.key for f in GPU_FIELDS if isinstance(f.type, Int)
                          and f.type.hi is not None and f.type.hi < DCGM_INT32_BLANK)

# A GPU's index as its label writes it, read without int() for the usual ones.
INDEX = {str(i): i for i in range(1024)}


def dcgm_blank(key: str, value: float) -> bool:
    return value >= DCGM_INT64_BLANK or (key in _SMALL_FIELDS and value >= DCGM_INT32_BLANK)


def as_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def whole(v: float | None) -> int | None:
    """A count from a float series: nil where it is none (negative, past 2^63, NaN)."""
    return round(v) if v is not None and 0 <= v < 2.0 ** 63 else None


def as_field(kind: WireType, v: Any) -> Any:
    """A series' value as its field holds it: a whole number for an Int, and nil for
    what the field cannot hold (a count past 2^64, an infinite rate): one exporter's odd
    value is that value's, not the refresh's."""
    if v is None:
        return None
    # Most values: a float within a Num's bounds, kept as it is (half a million a
    # refresh at 1024 nodes; the type's own fit is three calls).
    num: Any = kind
    if type(v) is float:
        code = num.code
        if code == NUM and num.lo <= v <= num.hi and (num.above is None or v > num.above):
            return v
        if code == INT and 0 <= v < 2.0 ** 63 and num.lo <= v and (
                num.hi is None or v <= num.hi):
            return round(v)  # a count as whole() makes it, within the Int's bounds
    if isinstance(kind, Int) and isinstance(v, float):
        v = whole(v)
    return None if v is None else kind.fit(v)
