"""A Prometheus query answer's bytes read into (labels, value) pairs.

A refresh at a large site reads hundreds of thousands of samples, and reading them is a
good part of its cost. An answer of the documented shape (`status` "success", an
instant vector of `{"metric": {label: string}, "value": [time, "number"]}`) is decoded
by msgspec straight into label dicts and value strings, checked as it is read; measured
on one 1024-node refresh's answers (docs/operations.md), that takes about a third less
time than `json.loads` and a walk over its lists. Any other answer (an error, another
result type, a label that is not a string, an item of another shape) is read again by
the tolerant path, which keeps what it can and skips the rest, as before.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec

Series = list[tuple[dict[str, str], float]]


class _Sample(msgspec.Struct):
    metric: dict[str, str]
    # The value is a string ("42", "NaN"); read as a number by the decoder (`strict`
    # off). One it cannot read ("+Inf", past a float) sends the answer to the tolerant
    # path.
    value: tuple[float, float]


class _Vector(msgspec.Struct):
    resultType: str  # the API's name
    result: list[_Sample]


class _Answer(msgspec.Struct):
    status: str
    data: _Vector


_DECODER = msgspec.json.Decoder(_Answer, strict=False)


class NotJson(ValueError):
    """The answer is not JSON (a proxy's HTML page, a cut body, nesting past any
    answer's depth)."""


def read_answer(body: bytes | bytearray) -> tuple[Any, Series | None]:
    """(the parsed answer when it is not a successful instant vector, else None; the
    vector's samples, or None when there is no vector). Raises NotJson."""
    try:
        answer = _DECODER.decode(body)
    except (msgspec.MsgspecError, RecursionError):  # a field it skips nested past its depth
        return _tolerant(body)
    if answer.status != "success" or answer.data.resultType != "vector":
        return _tolerant(body)
    isfinite = math.isfinite
    return None, [(s.metric, s.value[1]) for s in answer.data.result if isfinite(s.value[1])]


def _tolerant(body: bytes | bytearray) -> tuple[Any, Series | None]:
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        raise NotJson from None
    if not isinstance(parsed, dict) or parsed.get("status") != "success":
        return parsed, None
    data = parsed.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        return None, []
    result = data.get("result")
    return None, series(result) if isinstance(result, list) else []


_TEXT = {str}


def series(result: list[Any]) -> Series:
    """An instant vector's samples as (labels, value), skipping what is not one (a NaN,
    an item of another shape); the labels are JSON's own dict where every value is a
    string, as they nearly always are."""
    out: Series = []
    append = out.append
    isfinite = math.isfinite
    for item in result:
        try:
            labels = item["metric"]
            value = float(item["value"][1])
            if set(map(type, labels.values())) - _TEXT:
                labels = {str(k): str(v) for k, v in labels.items()}
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError):
            continue  # not a sample of an instant vector (a JSON integer past a float)
        if isfinite(value):
            append((labels, value))
    return out
