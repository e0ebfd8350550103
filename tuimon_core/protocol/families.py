"""The families a viewer may subscribe to, and a message's encodings per family set.

A sample carries one top-level key per family; a subscriber that asked for fewer gets
the sample without the others. The agent's hub sends every frame through `Frame`, and
the relay's fan-out its hellos and events (its samples go through
tuimon.relay.sample_frame.SampleFrame, which works from the agent's bytes), so a message
is encoded once per distinct family set, however many subscribers share it.
"""

from __future__ import annotations

from typing import Any

from tuimon_core.protocol.codec import encode_map
from tuimon_core.protocol.messages import Event, Hello, Sample
from tuimon_core.protocol.overview_layout import OVERVIEW_FORM, first_form

# Which top-level sample key each subscribable family owns ("events" is a family too:
# it selects event messages, not a sample key).
FAMILY_KEYS: dict[str, str] = {
    "gpu": "gpus",
    "host": "host",
    "fabric": "fabric",
    "storage": "storage",
    "steps": "steps",
    "overview": "overview",
    "findings": "findings",
}


def keep_families(wire: dict[str, Any], families: frozenset[str] | None) -> dict[str, Any]:
    """Drop, in place, the sample keys of families not in `families` (None: all)."""
    if families is not None:
        for family, key in FAMILY_KEYS.items():
            if family not in families:
                wire.pop(key, None)
    return wire


def wants_events(families: frozenset[str] | None) -> bool:
    return families is None or "events" in families


class Frame:
    """One message to send, its encodings cached per family set. `raw` is the message's
    bytes as received (a relay forwards an agent's own bytes when nothing is filtered).
    `port_ids` are the sender's hello's ports: what a first-form overview must name."""

    __slots__ = ("_cache", "_first", "message", "port_ids")

    def __init__(self, message: Hello | Sample | Event, raw: bytes = b"",
                 port_ids: list[str] | None = None) -> None:
        self.message = message
        self.port_ids = port_ids or []
        self._cache: dict[frozenset[str] | None, bytes] = {}
        self._first: dict[frozenset[str] | None, bytes] | None = None
        if raw:
            self._cache[None] = raw

    def wire(self, families: frozenset[str] | None,
             form: int = OVERVIEW_FORM) -> dict[str, Any]:
        wire = self.message.to_wire()
        if not isinstance(self.message, Sample):
            return wire
        keep_families(wire, families)
        if form < OVERVIEW_FORM and "overview" in wire:
            wire["overview"] = first_form(wire["overview"], self.port_ids)
        return wire

    def encoded(self, families: frozenset[str] | None, dropped: int = 0,
                form: int = OVERVIEW_FORM) -> bytes:
        if dropped and isinstance(self.message, Sample):
            wire = self.wire(families, form)
            wire["dropped"] = dropped
            return encode_map(wire)
        cache = self._cache
        if form < OVERVIEW_FORM and isinstance(self.message, Sample) and \
                "overview" in self.message.extra:
            cache = self._first = self._first if self._first is not None else {}
        data = cache.get(families)
        if data is None:
            data = cache[families] = encode_map(self.wire(families, form))
        return data
