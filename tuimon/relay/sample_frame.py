"""A sample as the agent sent it, encoded for each viewer's families once: the agent's
own bytes of the families kept under a new map header, nothing decoded or encoded again
(the relay's fan-out, tuimon.relay.fanout)."""

from __future__ import annotations

from functools import partial
from typing import Any

import msgpack

from tuimon_core.protocol import Sample, encode_map, unpack
from tuimon_core.protocol.codec import map_header, sample_spans
from tuimon_core.protocol.families import FAMILY_KEYS, keep_families
from tuimon_core.protocol.overview_layout import OVERVIEW_FORM, first_form

# `steps` as the agent sent them (no sums merged in from samples it replaced).
AS_SENT = object()
_pack = partial(msgpack.packb, use_bin_type=True)


# The sample keys each family owns, to drop for a subscriber without that family.
_FAMILY_OF_KEY = {key: family for family, key in FAMILY_KEYS.items()}


_FAMILIES_IN: dict[tuple[str, ...], frozenset[str]] = {}


def _families_in(keys: tuple[str, ...]) -> frozenset[str]:
    """The families a sample with these top-level keys carries (frames of one agent
    version share their keys: a small cache)."""
    found = _FAMILIES_IN.get(keys)
    if found is None:
        if len(_FAMILIES_IN) > 256:
            _FAMILIES_IN.clear()
        found = _FAMILIES_IN[keys] = frozenset(
            _FAMILY_OF_KEY[k] for k in keys if k in _FAMILY_OF_KEY)
    return found


class SampleFrame:
    """A sample as the agent's bytes. However the relay decoded it (whole, where it
    judges; else its envelope, steps and findings only), the decode kept the sample's
    top-level keys, and `sample_spans` says where each one's bytes lie, so an encoding
    with fewer families is the agent's own bytes of the families kept, under a new map
    header: nothing encoded again. Only step sums merged from
    samples it replaced, and the overview the relay built for an agent that predates
    overviews (`added`), are encoded here. Each encoding is made once per family set.
    A viewer that reads only the overview's first form gets it re-encoded (the slow,
    general way: such viewers are the exception), naming the hello's `port_ids`."""

    __slots__ = ("_cache", "_first", "added", "message", "port_ids", "raw", "steps")

    def __init__(self, message: Sample, raw: bytes, steps: Any = AS_SENT,
                 added: dict[str, Any] | None = None,
                 port_ids: list[str] | None = None) -> None:
        self.message = message
        self.raw = raw
        self.steps = steps
        self.added = added
        self.port_ids = port_ids or []
        self._cache: dict[frozenset[str] | None, bytes] = {}
        self._first: dict[frozenset[str] | None, bytes] | None = None

    def steps_sent(self) -> dict[str, Any] | None:
        return self.message.extra.get("steps") if self.steps is AS_SENT else self.steps

    def encoded(self, families: frozenset[str] | None, form: int = OVERVIEW_FORM) -> bytes:
        if form < OVERVIEW_FORM and self._sends_overview(families):
            return self._first_form(families)
        data = self._cache.get(families)
        if data is None:
            if self.steps is AS_SENT and not self.added and (
                    families is None or self._within(families)):
                data = self.raw  # nothing to leave out: the agent's bytes as they came
            else:
                data = self._encode(families)
            self._cache[families] = data
        return data

    def _sends_overview(self, families: frozenset[str] | None) -> bool:
        if families is not None and "overview" not in families:
            return False
        keys = self.message.keys
        return bool(self.added) or (
            "overview" in keys if keys is not None else "overview" in self.message.extra)

    def _first_form(self, families: frozenset[str] | None) -> bytes:
        if self._first is None:
            self._first = {}
        data = self._first.get(families)
        if data is None:
            wire = unpack(self.raw)
            wire.update(self.added or {})
            if self.steps is not AS_SENT:
                wire["steps"] = self.steps
            keep_families(wire, families)
            if "overview" in wire:
                wire["overview"] = first_form(wire["overview"], self.port_ids)
            data = self._first[families] = encode_map(wire)
        return data

    def _within(self, families: frozenset[str]) -> bool:
        keys = self.message.keys
        return keys is not None and _families_in(keys) <= families

    def _encode(self, families: frozenset[str] | None) -> bytes:
        spans = self.message.spans
        if spans is None and self.message.keys is not None:
            spans = self.message.spans = sample_spans(self.raw)
        replaced = dict(self.added or {})
        if self.steps is not AS_SENT:
            replaced["steps"] = self.steps
        if spans is None:  # not read by the envelope path: the slow, general way
            wire = unpack(self.raw)
            wire.update(replaced)
            return encode_map(keep_families(wire, families))
        parts = []
        for key, (start, end) in spans.items():
            family = _FAMILY_OF_KEY.get(key)
            if key in replaced or (families is not None and family is not None
                                   and family not in families):
                continue
            parts.append(self.raw[start:end])
        for key, value in replaced.items():
            family = _FAMILY_OF_KEY.get(key)
            if value is not None and (families is None or family is None or family in families):
                parts.append(_pack(key) + _pack(value))
        return map_header(len(parts)) + b"".join(parts)
