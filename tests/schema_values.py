"""Values made from the wire's schema (tuimon_core.protocol.fields): hypothesis
strategies for what each type allows, and for each field the values it must refuse.

The fuzz tests build whole frames from these, so every field the name table declares is
tried, and a field added to the table is tried without a test naming it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import msgpack
from hypothesis import strategies as st

from tuimon_core.protocol.schema import (
    MAX_NUM,
    MAX_STR,
    AnyOf,
    Bin,
    Int,
    ListOf,
    MapOf,
    Num,
    Record,
    Str,
    WireType,
)

# Lists of a few items are enough to reach every branch; long ones only slow the search.
FEW = 3


def valid(t: WireType, *, nil: bool = True) -> st.SearchStrategy[Any]:
    """What `t` accepts (nil too where `nil`)."""
    inner = _valid(t)
    return st.none() | inner if nil else inner


def _valid(t: WireType) -> st.SearchStrategy[Any]:
    if isinstance(t, Num):
        lo = t.lo if t.lo is not None else -1e12
        hi = t.hi if t.hi is not None else 1e15
        floats = st.floats(lo, hi, allow_nan=False, allow_infinity=False,
                           exclude_min=t.above is not None and t.above >= lo)
        if t.above is not None:
            floats = floats.filter(lambda v, a=t.above: v > a)
        ints = st.integers(math.ceil(lo), math.floor(hi))
        if t.above is not None:
            ints = ints.filter(lambda v, a=t.above: v > a)
        return floats | ints
    if isinstance(t, Int):
        return st.integers(t.lo, t.hi if t.hi is not None else 2**63 - 1)
    if isinstance(t, Str):
        if t.choices is not None:
            return st.sampled_from(sorted(t.choices))
        return st.text(max_size=min(t.max_len, 24))
    if isinstance(t, Bin):
        return st.binary(max_size=min(t.max_len, 16))
    if isinstance(t, AnyOf):
        return st.one_of([_valid(x) for x in t.types])
    if isinstance(t, ListOf):
        return st.lists(valid(t.item, nil=t.nil), max_size=min(FEW, t.max_items))
    if isinstance(t, MapOf):
        keys = st.text(min_size=1, max_size=min(12, t.key_len))
        return st.dictionaries(keys, valid(t.value, nil=t.nil), max_size=min(FEW, t.max_items))
    if isinstance(t, Record):
        required = {f.key: _valid(f.type) for f in t.fields if f.required}
        optional = {f.key: valid(f.type) for f in t.fields if not f.required}
        return st.fixed_dictionaries(required, optional=optional)
    raise TypeError(f"no strategy for {t!r}")


def example(t: WireType) -> Any:
    """A small valid value of `t`, the same every time: what mutants are set inside."""
    if isinstance(t, Num):
        if t.above is not None:
            return t.hi
        return t.lo if t.lo > -MAX_NUM else 1.5
    if isinstance(t, Int):
        return t.lo
    if isinstance(t, Str):
        return sorted(t.choices)[0] if t.choices is not None else "x"
    if isinstance(t, Bin):
        return b""
    if isinstance(t, AnyOf):
        return example(t.types[0])
    if isinstance(t, ListOf):
        return [example(t.item)]
    if isinstance(t, MapOf):
        return {"k": example(t.value)}
    if isinstance(t, Record):
        return {f.key: example(f.type) for f in t.fields}
    raise TypeError(f"no example for {t!r}")


def wrong(t: WireType) -> Iterator[Any]:
    """Values `t` must refuse: another type, out of bounds, too long, too deep."""
    deep: Any = 1
    for _ in range(400):  # msgpack packs at most 511 deep; DEEP_FRAME below is deeper
        deep = [deep]
    if isinstance(t, (Num, Int)):
        yield from ("abc", True, [1], {"a": 1}, b"1", deep)
        if isinstance(t, Num):
            yield from (math.nan, math.inf)
            if t.lo is not None:
                yield t.lo - max(1.0, abs(t.lo) / 1000)
            yield t.hi + max(1.0, abs(t.hi) / 1000)
            if t.above is not None:
                yield t.above
        else:
            yield 1.5
            yield t.lo - 1
            if t.hi is not None:
                yield t.hi + 1
    elif isinstance(t, Str):
        yield from (7, 1.5, True, ["a"], {"a": "b"}, b"abc", deep)
        yield "x" * (t.max_len + 1)
        if t.choices is not None:
            yield "[/]"
    elif isinstance(t, AnyOf):
        yield from ([1], {"a": 1}, 1.5, deep)
    elif isinstance(t, ListOf):
        yield from ("abc", 7, {"a": 1})
        # One item too many, each as small as allowed: the frame stays under its byte
        # limit, so the list's bound is what refuses it.
        yield [_least(t.item)] * (t.max_items + 1)
        for bad in _inner(t.item):
            yield [bad]
    elif isinstance(t, MapOf):
        yield from ("abc", 7, ["a"])
        yield {f"k{i}": example(t.value) for i in range(t.max_items + 1)}
        yield {"k" * (t.key_len + 1): example(t.value)}
        for bad in _inner(t.value):
            yield {"k": bad}
    elif isinstance(t, Record):
        yield from ("abc", 7, ["a"], deep)
    elif isinstance(t, Bin):
        yield from ("abc", 7, b"x" * (t.max_len + 1))


def _inner(t: WireType) -> Iterator[Any]:
    """A few wrong items for a container's item type (its first wrong values)."""
    for i, bad in enumerate(wrong(t)):
        if i >= 3:
            return
        yield bad


def mutants(t: Record, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """For every field of the record (and of the records inside it), a copy of the
    record's example with that one field set to each value it must refuse, or with a
    required field missing: (the field's path, the record)."""
    base = example(t)
    for f in t.fields:
        path = f"{where}.{f.key}" if where else f.key
        for bad in wrong(f.type):
            yield path, {**base, f.key: bad}
        if f.required:
            yield path, {k: v for k, v in base.items() if k != f.key}
        inner = f.type.item if isinstance(f.type, ListOf) else f.type
        if isinstance(inner, Record):
            for sub, record in mutants(inner, path):
                value = [record] if isinstance(f.type, ListOf) else record
                yield sub, {**base, f.key: value}


def _least(t: Any) -> Any:
    """The smallest value of a type: a record with only its required fields."""
    if isinstance(t, Record):
        return {f.key: example(f.type) for f in t.fields if f.required}
    return example(t)


__all__ = ["MAX_STR", "example", "mutants", "valid", "wrong"]


def deep_frame(depth: int = 995) -> bytes:
    """A ~1 KB sample whose overview is a list nested `depth` deep: deeper than Python
    recurses when it prints it (msgpack's packer cannot write it, so it is built by
    hand: fixarray headers)."""
    head = msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0})
    # the map header counts five pairs: make it six, then add "overview": [[[...]]]
    return bytes([head[0] + 1]) + head[1:] + msgpack.packb("overview") + \
        b"\x91" * depth + b"\xc0"


# Strings a hostile peer sends: markup that would end a view or restyle it, escapes.
HOSTILE_TEXT = ("[/]", "[reverse][b]PWNED", "[@click=app.quit]QUIT[/]", "x\x1b[2J\x07",
                "\u202eevil", "[$error]red", "\\")


def random_valid(t: WireType, rng: Any, depth: int = 0) -> Any:
    """A valid value of `t` drawn with `rng` (random.Random), leaning on the edges a
    reader's arithmetic and formatting must survive: bounds, zero, huge values,
    hostile text, empty and full-ish lists."""
    if isinstance(t, Num):
        lo, hi = t.lo, t.hi
        # The edges: the bounds, zero, and the smallest positive numbers (a reader that
        # divides by them gets infinity, or zero where it divides by a world size).
        edges = [hi, lo, 0.0, 5e-324, 1e-300, 1e-9, rng.uniform(max(lo, -1e6), min(hi, 1e6))]
        v = rng.choice([e for e in edges if lo <= e <= hi and
                        (t.above is None or e > t.above)] or [hi])
        return v if rng.random() < 0.8 or v != int(v) else int(v)
    if isinstance(t, Int):
        hi = t.hi if t.hi is not None else 2**64 - 1
        return rng.choice([t.lo, hi, min(hi, 2**53), rng.randint(t.lo, min(hi, t.lo + 1000))])
    if isinstance(t, Str):
        if t.choices is not None:
            return rng.choice(sorted(t.choices))
        text = rng.choice((*HOSTILE_TEXT, "gpu001", "", "lustre", "x" * t.max_len))
        return text[:t.max_len]
    if isinstance(t, Bin):
        return b""
    if isinstance(t, AnyOf):
        return random_valid(rng.choice(t.types), rng, depth)
    if isinstance(t, ListOf):
        n = rng.choice([0, 1, 2, min(t.max_items, 3)])
        return [None if t.nil and rng.random() < 0.2 else random_valid(t.item, rng, depth + 1)
                for _ in range(n)]
    if isinstance(t, MapOf):
        n = rng.choice([0, 1, 2])
        return {rng.choice((*HOSTILE_TEXT[:3], "READ", "symbol_errors")) + str(i):
                None if t.nil and rng.random() < 0.2 else random_valid(t.value, rng, depth + 1)
                for i in range(n)}
    if isinstance(t, Record):
        out = {}
        for f in t.fields:
            if f.required or rng.random() < 0.7:
                out[f.key] = (None if not f.required and rng.random() < 0.15 else
                              random_valid(f.type, rng, depth + 1))
        return out
    raise TypeError(f"no value for {t!r}")
